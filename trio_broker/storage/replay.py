"""Reading an internal log back, record by record: how the broker's own tables start.

The committed-offsets log (groups/offsets_store.py), the transaction log
(transactions/coordinator.py) and the share-state log (groups/share_state.py) are
keyed tables written as records; on start each replays its log from the log start to
the end, the last record of a key winning (:func:`replay_table`, the one replay loop).
Compaction may have left offset holes; a read returns whole batches, so records
below the position already replayed are skipped.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from typing import TypeVar

from trio_broker.protocol.errors import ProtocolError
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


Decoded = TypeVar("Decoded")

#: What a record the table cannot read raises while decoded: a record from a newer
#: broker, or damage the CRC did not catch. Such a record is skipped, with a warning.
UNREADABLE = (ValueError, UnicodeDecodeError, struct.error, ProtocolError)


def replay_table(
    log: Log,
    decode: Callable[[bytes, bytes | None], Decoded],
    apply: Callable[[Decoded, int], None],
    logger: logging.Logger,
    what: str,
) -> int:
    """Replay ``log`` into a table: every keyed record decoded (``decode(key, value)``;
    a None value is a tombstone) and applied with its offset, in log order; unkeyed
    records are passed over, unreadable ones skipped with a warning naming ``what``.
    Returns how many records were read."""
    count = 0
    for offset, key, value in iter_log_records(log):
        count += 1
        if key is None:
            continue
        try:
            decoded = decode(key, value)
        except UNREADABLE as exc:
            logger.warning("skipping unreadable %s record at %d: %s", what, offset, exc)
            continue
        apply(decoded, offset)
    return count
