"""Reading an internal log back, record by record: how the broker's own tables start.

The committed-offsets log (groups/offsets_store.py) and the transaction log
(transactions/coordinator.py) are keyed tables written as records; on start each
replays its log from the log start to the end, the last record of a key winning.
Compaction may have left offset holes; a read returns whole batches, so records
below the position already replayed are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

from trio_broker.protocol.records import iter_batches
from trio_broker.storage.log_protocol import Log

#: How much of the log one read during replay asks for.
REPLAY_CHUNK_BYTES = 1 << 20


def iter_log_records(log: Log) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of ``log``."""
    position = log.log_start_offset
    end = log.log_end_offset
    while position < end:
        regions = log.read(position, REPLAY_CHUNK_BYTES, end)
        if not regions:
            break
        for region in regions:
            for batch in iter_batches(region.read_bytes()):
                for record in batch.records():
                    offset = batch.offset_of(record)
                    if offset >= position:
                        yield offset, record.key, record.value
                position = max(position, batch.last_offset + 1)
