"""Durable share-partition state (KIP-932): snapshots in ``__share_group_state``.

Kafka's share coordinator keeps each share partition's state in the compacted topic
``__share_group_state``: one snapshot per (group, topic id, partition) holding the
share-partition start offset (SPSO), the state epoch and the *state batches*, runs of
offsets above the SPSO whose state is not the default (acknowledged, archived, or
available again after some deliveries) with their delivery counts. This module is that
record's key and value in our own binary layout with Kafka's fields
(ShareSnapshotKey/ShareSnapshotValue), and the table replayed from the log: the last
record of a key wins, as compaction keeps it; a null value (tombstone) removes it.

Acquisition locks are not durable, as in Kafka: a record acquired when the snapshot is
taken is written as what losing its lock makes it (available with its delivery count, or
archived when that count has reached the limit), so after a restart it is delivered
again with its delivery count kept.

Sync and trio-free: the share coordinator appends the encoded batch
(handlers/share_group_state.py, through its partition's leadership) and waits for it
to count.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from trio_broker.protocol.records import build_batch
from trio_broker.state.share_partition import FINISHED, InFlight, RecordState, SharePartition
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.own_log import open_compacted_log
from trio_broker.storage.replay import replay_table

log = logging.getLogger("trio_broker.groups")

SHARE_GROUP_STATE = "__share_group_state"
#: Directory of the log under the data dir (Kafka's topic name, partition 0).
STATE_LOG_NAME = f"{SHARE_GROUP_STATE}-0"
#: Key version of a snapshot; a broker meeting another version skips the record.
SNAPSHOT_KEY_VERSION = 1
SNAPSHOT_VALUE_VERSION = 1
#: Segments roll so the cleaner can compact them (Kafka's share.coordinator.state.topic.segment.bytes).
STATE_SEGMENT_BYTES = 100 * 1024 * 1024

_I16 = struct.Struct(">h")
_KEY_TAIL = struct.Struct(">16si")  # topic id, partition
# version, snapshot epoch, state epoch, leader epoch, start offset, write time, batches
_VALUE_HEAD = struct.Struct(">hiiiqqi")
_BATCH = struct.Struct(">qqbh")  # first offset, last offset, delivery state, delivery count

#: The states a snapshot may hold (Kafka: 0 available, 2 acknowledged, 4 archived).
DURABLE_STATES = (RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@attrs.frozen
class ShareKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int


@attrs.frozen
class StateBatch:
    first_offset: int
    last_offset: int
    delivery_state: RecordState
    delivery_count: int


@attrs.frozen
class ShareSnapshot:
    start_offset: int
    batches: tuple[StateBatch, ...] = ()
    #: Raised when the share partition starts over (a reset of its start offset).
    state_epoch: int = 0
    #: Raised by every snapshot written for the key.
    snapshot_epoch: int = 0
    leader_epoch: int = 0
    write_timestamp_ms: int = -1

    def same_state(self, other: ShareSnapshot) -> bool:
        """Whether writing ``other`` after this one would change what a replay restores."""
        return (self.start_offset, self.state_epoch, self.batches) == (
            other.start_offset, other.state_epoch, other.batches,
        )  # fmt: skip


# ------------------------------------------------------------------------- record format


def encode_key(key: ShareKey) -> bytes:
    raw = key.group_id.encode()
    return (
        _I16.pack(SNAPSHOT_KEY_VERSION)
        + _I16.pack(len(raw))
        + raw
        + _KEY_TAIL.pack(key.topic_id.bytes, key.partition)
    )


def decode_key(buf: bytes) -> ShareKey:
    (version,) = _I16.unpack_from(buf, 0)
    if version != SNAPSHOT_KEY_VERSION:
        raise ValueError(f"unknown share state key version {version}")
    (size,) = _I16.unpack_from(buf, 2)
    if size < 0 or 4 + size + _KEY_TAIL.size != len(buf):
        raise ValueError("bad share state key length")
    group_id = buf[4 : 4 + size].decode()
    topic_id, partition = _KEY_TAIL.unpack_from(buf, 4 + size)
    return ShareKey(group_id, uuid.UUID(bytes=topic_id), partition)


def encode_value(snapshot: ShareSnapshot) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(
        SNAPSHOT_VALUE_VERSION, snapshot.snapshot_epoch, snapshot.state_epoch,
        snapshot.leader_epoch, snapshot.start_offset, snapshot.write_timestamp_ms,
        len(snapshot.batches),
    ))  # fmt: skip
    for b in snapshot.batches:
        out += _BATCH.pack(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
    return bytes(out)


def decode_value(buf: bytes) -> ShareSnapshot:
    version, snap_epoch, state_epoch, leader_epoch, start, written, count = _VALUE_HEAD.unpack_from(
        buf, 0
    )
    if version != SNAPSHOT_VALUE_VERSION:
        raise ValueError(f"unknown share state value version {version}")
    if count < 0 or _VALUE_HEAD.size + count * _BATCH.size != len(buf):
        raise ValueError("bad state batch count")
    batches = []
    previous_last = start - 1
    for i in range(count):
        first, last, state, delivery_count = _BATCH.unpack_from(
            buf, _VALUE_HEAD.size + i * _BATCH.size
        )
        if not previous_last < first <= last or state not in DURABLE_STATES:
            raise ValueError(f"bad state batch [{first}, {last}] state {state}")
        batches.append(StateBatch(first, last, RecordState(state), delivery_count))
        previous_last = last
    return ShareSnapshot(start, tuple(batches), state_epoch, snap_epoch, leader_epoch, written)


# ------------------------------------------------------------------------- state <-> snapshot


def snapshot_of(share_partition: SharePartition) -> ShareSnapshot:
    """The partition's durable state now (epochs and time are the store's to fill in)."""
    batches: list[StateBatch] = []
    limit = share_partition.delivery_count_limit
    for offset in sorted(share_partition.records):
        record = share_partition.records[offset]
        state = record.state
        if state is RecordState.ACQUIRED:
            # What the record becomes when its lock is lost (a restart): given back.
            exhausted = record.delivery_count >= limit
            state = RecordState.ARCHIVED if exhausted else RecordState.AVAILABLE
        last = batches[-1] if batches else None
        if (
            last is not None
            and last.last_offset + 1 == offset
            and (last.delivery_state, last.delivery_count) == (state, record.delivery_count)
        ):
            batches[-1] = attrs.evolve(last, last_offset=offset)
        else:
            batches.append(StateBatch(offset, offset, state, record.delivery_count))
    # Archiving an acquired record at the start moves the start, as it would in memory.
    start = share_partition.start_offset
    while batches and batches[0].first_offset == start and batches[0].delivery_state in FINISHED:
        start = batches.pop(0).last_offset + 1
    return ShareSnapshot(start, tuple(batches), state_epoch=share_partition.state_epoch)


def restore(
    snapshot: ShareSnapshot,
    *,
    lock_duration_ms: int,
    delivery_count_limit: int,
    max_in_flight: int,
) -> SharePartition:
    """A share partition as the snapshot left it: nothing acquired."""
    share_partition = SharePartition(
        snapshot.start_offset,
        lock_duration_ms=lock_duration_ms,
        delivery_count_limit=delivery_count_limit,
        max_in_flight=max_in_flight,
        state_epoch=snapshot.state_epoch,
    )
    for batch in snapshot.batches:
        if batch.last_offset < snapshot.start_offset:
            continue
        for offset in range(max(batch.first_offset, snapshot.start_offset), batch.last_offset + 1):
            share_partition.records[offset] = InFlight(batch.delivery_state, batch.delivery_count)
        share_partition.end_offset = max(share_partition.end_offset, batch.last_offset + 1)
    return share_partition


# ------------------------------------------------------------------------- the table

Entry = tuple[ShareKey, ShareSnapshot | None]  # None: a tombstone


def encode_batch(entries: Sequence[Entry], now_ms: int) -> bytearray:
    records = [
        (encode_key(key), None if snap is None else encode_value(snap)) for key, snap in entries
    ]
    return build_batch(records, base_timestamp=now_ms)


def open_share_state_log(data_dir: Path | None, config: LogConfig) -> Log:
    """A node alone's ``__share_group_state-0``: ``<data_dir>/__share_group_state-0`` (the
    file a node alone kept its snapshots in before its share coordinator, same records),
    or a ``MemoryLog`` if ``data_dir`` is None. Compacted like the offsets log."""
    return open_compacted_log(data_dir, STATE_LOG_NAME, config, STATE_SEGMENT_BYTES)


class ShareStateStore:
    """The snapshots of every share partition, over the log they are replayed from."""

    def __init__(self, state_log: Log) -> None:
        self.log = state_log
        #: The newest snapshot appended (or replayed) per key.
        self.snapshots: dict[ShareKey, ShareSnapshot] = {}

    def load(self) -> int:
        """Replay the log into the table; returns how many records were read."""

        def decode(key: bytes, value: bytes | None) -> tuple[ShareKey, ShareSnapshot | None]:
            return decode_key(key), None if value is None else decode_value(value)

        def apply(entry: tuple[ShareKey, ShareSnapshot | None], _offset: int) -> None:
            self._set(*entry)

        return replay_table(self.log, decode, apply, log, "share state")

    def _set(self, key: ShareKey, snapshot: ShareSnapshot | None) -> None:
        if snapshot is None:
            self.snapshots.pop(key, None)
        else:
            self.snapshots[key] = snapshot

    def tombstones(self, keys: Iterable[ShareKey]) -> list[Entry]:
        """Deletions of the stored snapshots among ``keys``."""
        return [(key, None) for key in keys if key in self.snapshots]

    def appended(self, entries: Sequence[Entry]) -> None:
        """``entries`` are in the log (maybe not durable yet)."""
        for key, snapshot in entries:
            self._set(key, snapshot)
