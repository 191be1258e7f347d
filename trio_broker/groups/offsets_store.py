"""Committed offsets: an in-memory table backed by an internal log.

Every commit (and every deletion, as a tombstone) is one record in the log
``<data_dir>/__consumer_offsets-0`` (a ``MemoryLog`` with ``--storage memory``).
A record's key is (group, topic, partition) and its value the offset, leader
epoch, metadata and commit time -- in our own small binary format, versioned so
it can grow. On startup the log is replayed into the table; the last record for
a key wins, exactly as log compaction would keep it.

The table changes only when a write is *durable* (:meth:`OffsetsStore.apply`
after the flusher's fsync), so an OffsetFetch never returns an offset a crash
could still take back. Writes may become durable out of order with respect to
their waiters waking up; each key remembers the log offset it was last set
from, and an older write never overwrites a newer one.

Sync and trio-free: the coordinator owns the waiting.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from trio_broker.protocol.errors import ProtocolError
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.memory import MemoryLog

log = logging.getLogger("trio_broker.groups")

#: Directory of the internal log under the data dir (Kafka's topic name, partition 0).
OFFSETS_LOG_NAME = "__consumer_offsets-0"
KEY_VERSION = 1
VALUE_VERSION = 1
#: How much of the log one read during replay asks for.
REPLAY_CHUNK_BYTES = 1 << 20

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqiq")  # version, offset, leader epoch, commit timestamp


@attrs.frozen
class OffsetKey:
    group_id: str
    topic: str
    partition: int


@attrs.frozen
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1


Entry = tuple[OffsetKey, OffsetAndMetadata | None]  # None deletes (a tombstone)


# ------------------------------------------------------------------------- record format


def _put_str(out: bytearray, text: str, width: struct.Struct) -> None:
    raw = text.encode()
    out += width.pack(len(raw))
    out += raw


def _get_str(buf: bytes, pos: int, width: struct.Struct) -> tuple[str, int]:
    (size,) = width.unpack_from(buf, pos)
    pos += width.size
    if size < 0 or pos + size > len(buf):
        raise ValueError("string runs past the record")
    return buf[pos : pos + size].decode(), pos + size


def encode_key(key: OffsetKey) -> bytes:
    out = bytearray(_I16.pack(KEY_VERSION))
    _put_str(out, key.group_id, _I16)
    _put_str(out, key.topic, _I16)
    out += _I32.pack(key.partition)
    return bytes(out)


def decode_key(buf: bytes) -> OffsetKey:
    (version,) = _I16.unpack_from(buf, 0)
    if version != KEY_VERSION:
        raise ValueError(f"unknown offset key version {version}")
    group_id, pos = _get_str(buf, 2, _I16)
    topic, pos = _get_str(buf, pos, _I16)
    (partition,) = _I32.unpack_from(buf, pos)
    return OffsetKey(group_id, topic, partition)


def encode_value(value: OffsetAndMetadata) -> bytes:
    out = bytearray(
        _VALUE_HEAD.pack(VALUE_VERSION, value.offset, value.leader_epoch, value.commit_timestamp_ms)
    )
    # int32 length: metadata is bounded by offset.metadata.max.bytes, not by int16.
    _put_str(out, value.metadata, _I32)
    return bytes(out)


def decode_value(buf: bytes) -> OffsetAndMetadata:
    version, offset, epoch, timestamp = _VALUE_HEAD.unpack_from(buf, 0)
    if version < VALUE_VERSION:
        raise ValueError(f"unknown offset value version {version}")
    # Later versions only append fields: read what we know.
    metadata, _ = _get_str(buf, _VALUE_HEAD.size, _I32)
    return OffsetAndMetadata(offset, epoch, metadata, timestamp)


# ------------------------------------------------------------------------- the store


@attrs.frozen
class PendingWrite:
    """Entries appended at ``base_offset`` .. ``last_offset``, not yet durable."""

    entries: tuple[Entry, ...]
    base_offset: int
    last_offset: int


class OffsetsStore:
    def __init__(self, offsets_log: Any) -> None:
        #: PartitionLog or MemoryLog.
        self.log = offsets_log
        self._table: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        #: key -> log offset of the record that last set (or deleted) it.
        self._applied_at: dict[OffsetKey, int] = {}

    @classmethod
    def open(cls, data_dir: Path | None, config: LogConfig) -> OffsetsStore:
        """Open the internal log (memory if ``data_dir`` is None) and replay it."""
        # Offsets must outlive any retention setting: nothing is ever deleted by age.
        config = attrs.evolve(config, retention_ms=None, retention_bytes=None)
        if data_dir is None:
            store = cls(MemoryLog(config))
        else:
            store = cls(PartitionLog.open(Path(data_dir) / OFFSETS_LOG_NAME, config))
        store.load()
        return store

    def close(self) -> None:
        close = getattr(self.log, "close", None)  # MemoryLog may have nothing to close
        if close is not None:
            close()

    # ------------------------------------------------------------------ replay

    def _records(self) -> Iterator[tuple[int, bytes | None, bytes | None]]:
        position = self.log.log_start_offset
        end = self.log.log_end_offset
        while position < end:
            regions = self.log.read(position, REPLAY_CHUNK_BYTES, end)
            if not regions:
                break
            for region in regions:
                for batch in iter_batches(region.read_bytes()):
                    for record in batch.records():
                        offset = batch.offset_of(record)
                        if offset >= position:
                            yield offset, record.key, record.value
                    position = max(position, batch.last_offset + 1)

    def load(self) -> int:
        """Replay the log into the table; returns how many records were read."""
        count = 0
        for offset, key, value in self._records():
            count += 1
            if key is None:
                continue
            try:
                entry = (decode_key(key), None if value is None else decode_value(value))
            except (ValueError, UnicodeDecodeError, struct.error, ProtocolError) as exc:
                # A record from a newer broker, or damage the CRC did not catch.
                log.warning("skipping unreadable offset record at %d: %s", offset, exc)
                continue
            self._set(entry, offset)
        return count

    # ------------------------------------------------------------------ writes

    def append(self, entries: Sequence[Entry], now_ms: int) -> PendingWrite:
        """Write one batch holding ``entries``; call :meth:`apply` once it is durable."""
        if not entries:
            raise ValueError("nothing to write")
        records = [
            (encode_key(key), None if value is None else encode_value(value))
            for key, value in entries
        ]
        result = self.log.append(build_batch(records, base_timestamp=now_ms), now_ms=now_ms)
        return PendingWrite(tuple(entries), result.base_offset, result.last_offset)

    def apply(self, write: PendingWrite) -> None:
        for i, entry in enumerate(write.entries):
            self._set(entry, write.base_offset + i)

    def _set(self, entry: Entry, log_offset: int) -> None:
        key, value = entry
        if self._applied_at.get(key, -1) > log_offset:
            return  # a later write of this key is already in
        self._applied_at[key] = log_offset
        group = self._table.setdefault(key.group_id, {})
        if value is None:
            group.pop((key.topic, key.partition), None)
            if not group:
                del self._table[key.group_id]
        else:
            group[key.topic, key.partition] = value

    # ------------------------------------------------------------------ reads

    def get(self, group_id: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        return self._table.get(group_id, {}).get((topic, partition))

    def group_offsets(self, group_id: str) -> Mapping[tuple[str, int], OffsetAndMetadata]:
        return self._table.get(group_id, {})

    def group_ids(self) -> list[str]:
        return list(self._table)

    def has_offsets(self, group_id: str) -> bool:
        return bool(self._table.get(group_id))
