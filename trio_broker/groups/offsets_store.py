"""Committed offsets: an in-memory table backed by an internal log.

Every commit (and every deletion, as a tombstone) is one record in the log of a
``__consumer_offsets`` partition; one store per partition the broker leads, over that
partition's log (:meth:`OffsetsStore.over`): a cluster's replica, or a broker alone's
only partition, ``<data_dir>/__consumer_offsets-0`` (a ``MemoryLog`` with ``--storage
memory``, :func:`open_offsets_log`).
Records are laid out as Kafka 4.4 lays out the records it has (its group
coordinator's ``common/message`` schemas; the key's int16 version is the record type),
so that Kafka's ``OffsetsMessageFormatter`` and ``GroupMetadataMessageFormatter`` and
tools like Burrow read the topic: a committed offset is Kafka's OffsetCommit (key type
1: group, topic, partition; value OffsetCommitValue version 4, the one Kafka 4.4
writes), a classic group's completed generation (members, assignment) Kafka's
GroupMetadata (key type 2: the group; value GroupMetadataValue version 3), so a new
coordinator restores the group without a rebalance. Our records Kafka lays out another
way or not at all (a transaction's staged offsets and its end, where Kafka writes
OffsetCommit records in a transactional batch and a control marker; a KIP-848 group's
snapshot; a share group's records) carry key types from :data:`OWN_RECORD_BASE` on,
which Kafka's deserializer does not know and its formatters skip.

Data dirs written before (main's numbering, key versions 1-11, our own values) load
unchanged: every record tells its layout by itself, without a marker that compaction
or a truncation could take away (:func:`decode_record`): a plain offset's value by its
version (ours was 1, Kafka's is 3 or 4), key type 2 by its key's length (a group alone
is Kafka's GroupMetadata, more is our old staged offset), and key types 3-11 are only
ever old records (we write none of Kafka's types 3-16 yet). On startup the log is
replayed into the table; the last record for a key wins, exactly as log compaction
would keep it.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from trio_broker.partition.append import Appended, Origin
from trio_broker.partition.append import append as partition_append
from trio_broker.partition.partition import coordinator_partition
from trio_broker.protocol.records import build_batch
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.local_replication import OwnLog
from trio_broker.state.group import GroupRecord, MemberRecord
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.own_log import open_compacted_log
from trio_broker.storage.replay import replay_table

log = logging.getLogger("trio_broker.groups")

#: Directory of the internal log under the data dir (Kafka's topic name, partition 0).
OFFSETS_LOG_NAME = "__consumer_offsets-0"
#: Kafka's record types (the key's version): OffsetCommit and GroupMetadata.
KEY_VERSION = 1
GROUP_METADATA_RECORD_TYPE = 2
#: The OffsetCommitValue and GroupMetadataValue versions Kafka 4.4 writes.
OFFSET_VALUE_VERSION = 4
GROUP_METADATA_VALUE_VERSION = 3
#: Our own records' kinds. They were their key versions until Kafka's layout (main's
#: numbering, still read); now a record of kind ``n`` is written with key type
#: ``OWN_RECORD_BASE + n``, a type Kafka's deserializer does not know.
TXN_OFFSET_KEY_VERSION = 2
TXN_END_KEY_VERSION = 3
#: Main's key version of a classic group's metadata (now Kafka's type 2).
GROUP_METADATA_KEY_VERSION = 4
#: Kind of a KIP-848 group's snapshot (state/consumer_group.py encodes the value).
CONSUMER_GROUP_KEY_VERSION = 5
#: Kinds of a share group's records, Kafka's ShareGroupMetadata and
#: ShareGroupStatePartitionMetadata (groups/share_records.py encodes their values).
SHARE_GROUP_METADATA_KEY_VERSION = 6
SHARE_GROUP_PARTITIONS_KEY_VERSION = 7
#: And of its membership, keyed by the group and a member (Kafka's ShareGroupMemberMetadata,
#: ShareGroupTargetAssignmentMember and ShareGroupCurrentMemberAssignment), and of its
#: target assignment's metadata, keyed by the group (ShareGroupTargetAssignmentMetadata).
SHARE_GROUP_MEMBER_KEY_VERSION = 8
SHARE_GROUP_TARGET_METADATA_KEY_VERSION = 9
SHARE_GROUP_TARGET_MEMBER_KEY_VERSION = 10
SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION = 11
#: The share group's records keyed by a member too.
SHARE_GROUP_MEMBER_KEY_VERSIONS = (
    SHARE_GROUP_MEMBER_KEY_VERSION,
    SHARE_GROUP_TARGET_MEMBER_KEY_VERSION,
    SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION,
)
SHARE_GROUP_KEY_VERSIONS = (
    SHARE_GROUP_METADATA_KEY_VERSION,
    SHARE_GROUP_PARTITIONS_KEY_VERSION,
    SHARE_GROUP_TARGET_METADATA_KEY_VERSION,
    *SHARE_GROUP_MEMBER_KEY_VERSIONS,
)
#: Key types from here on are ours (Kafka 4.4's go up to 23): ``OWN_RECORD_BASE + kind``.
OWN_RECORD_BASE = 32000
#: Main's value versions: its offset value (also inside a staged offset) and group value.
OLD_VALUE_VERSION = 1
OLD_GROUP_METADATA_VALUE_VERSION = 1
#: The broker of a store used on its own (a tool, a test): a cluster of one of no
#: broker in particular, whose write keeps its batch's epoch.
NO_BROKER = -1
TXN_END_VALUE_VERSION = 1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OLD_VALUE_HEAD = struct.Struct(">hqiq")  # version, offset, leader epoch, commit timestamp
_OFFSET_VALUE_HEAD = struct.Struct(">hqi")  # version, offset, leader epoch
_TXN_END_VALUE = struct.Struct(">hhb")  # version, producer epoch, committed


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


@attrs.frozen
class TxnOffset:
    """An offset staged by producer ``producer_id``'s transaction (TxnOffsetCommit)."""

    producer_id: int
    producer_epoch: int
    key: OffsetKey
    #: None: the staged offset is done with (written with the transaction's end), so
    #: compaction of the offsets log may drop the staged record and this tombstone.
    value: OffsetAndMetadata | None


@attrs.frozen
class TxnEnd:
    """Producer ``producer_id``'s transaction ended for ``group_id``: commit or abort."""

    group_id: str
    producer_id: int
    producer_epoch: int
    committed: bool


@attrs.frozen
class GroupMetadata:
    """A group's stored generation; ``value`` None is its tombstone (group removed)."""

    group_id: str
    value: GroupRecord | None


@attrs.frozen
class ConsumerGroupSnapshot:
    """A KIP-848 group as a whole (epochs, target, members); None is its tombstone.
    Kafka writes one record per member and per target; one snapshot per change is
    simpler, and these groups are small."""

    group_id: str
    value: bytes | None


@attrs.frozen
class ShareGroupRecord:
    """One of a share group's records, keyed by the group and ``key_version`` (which
    of Kafka's records it is), and by ``member_id`` for a member's records (empty for
    the group's own); ``value`` None is its tombstone. The store keeps the latest of
    each and leaves the values to the group coordinator."""

    key_version: int
    group_id: str
    value: bytes | None
    member_id: str = ""


#: One record of the offsets log.
StoreRecord = Entry | TxnOffset | TxnEnd | GroupMetadata | ConsumerGroupSnapshot | ShareGroupRecord


def group_of(record: StoreRecord) -> str:
    if isinstance(record, TxnOffset):
        return record.key.group_id
    if isinstance(record, TxnEnd | GroupMetadata | ConsumerGroupSnapshot | ShareGroupRecord):
        return record.group_id
    return record[0].group_id


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


#: The longest group id a key of the offsets log holds: its group id is an int16-length
#: string, as in Kafka's keys. A flexible request's compact string can carry a longer one.
MAX_GROUP_ID_BYTES = 0x7FFF


def storable_group_id(group_id: str) -> bool:
    """Whether the offsets log can key a record by ``group_id`` (its UTF-8 fits an
    int16-length string). Called per group request: a short id (at most 4 bytes a
    character) is not encoded to find out."""
    if len(group_id) * 4 <= MAX_GROUP_ID_BYTES:
        return True
    return len(group_id.encode()) <= MAX_GROUP_ID_BYTES


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


def _put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _get_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise ValueError("bad varint")
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n, pos
        shift += 7


def encode_value(value: OffsetAndMetadata) -> bytes:
    """Kafka's OffsetCommitValue v4 (flexible): offset, leader epoch, metadata (a compact
    string), commit timestamp, no tagged fields."""
    out = bytearray(_OFFSET_VALUE_HEAD.pack(OFFSET_VALUE_VERSION, value.offset, value.leader_epoch))
    raw = value.metadata.encode()
    _put_uvarint(out, len(raw) + 1)
    out += raw
    out += _I64.pack(value.commit_timestamp_ms)
    out.append(0)  # no tagged fields (Kafka's topic id is one, left out)
    return bytes(out)


def decode_value(buf: bytes) -> OffsetAndMetadata:
    """An offset's value: Kafka's OffsetCommitValue v3 or v4, or main's own (version 1:
    offset, leader epoch, commit timestamp, metadata with an int32 length). Kafka's v1
    is never written by us, and version 1 is read as ours."""
    (version,) = _I16.unpack_from(buf, 0)
    if version == OLD_VALUE_VERSION:
        _, offset, epoch, timestamp = _OLD_VALUE_HEAD.unpack_from(buf, 0)
        metadata, _ = _get_str(buf, _OLD_VALUE_HEAD.size, _I32)
        return OffsetAndMetadata(offset, epoch, metadata, timestamp)
    if version == 3:
        _, offset, epoch = _OFFSET_VALUE_HEAD.unpack_from(buf, 0)
        metadata, pos = _get_str(buf, _OFFSET_VALUE_HEAD.size, _I16)
        (timestamp,) = _I64.unpack_from(buf, pos)
        return OffsetAndMetadata(offset, epoch, metadata, timestamp)
    if version == OFFSET_VALUE_VERSION:
        _, offset, epoch = _OFFSET_VALUE_HEAD.unpack_from(buf, 0)
        size, pos = _get_uvarint(buf, _OFFSET_VALUE_HEAD.size)
        if size == 0 or pos + size - 1 > len(buf):
            raise ValueError("bad metadata string")
        metadata = buf[pos : pos + size - 1].decode()
        (timestamp,) = _I64.unpack_from(buf, pos + size - 1)
        # Tagged fields after it (Kafka's topic id): nothing we keep.
        return OffsetAndMetadata(offset, epoch, metadata, timestamp)
    raise ValueError(f"unknown offset value version {version}")


def _put_nullable(out: bytearray, text: str | None) -> None:
    if text is None:
        out += _I16.pack(-1)
    else:
        _put_str(out, text, _I16)


def _get_nullable(buf: bytes, pos: int) -> tuple[str | None, int]:
    (size,) = _I16.unpack_from(buf, pos)
    if size == -1:
        return None, pos + _I16.size
    return _get_str(buf, pos, _I16)


def _put_bytes(out: bytearray, raw: bytes) -> None:
    out += _I32.pack(len(raw))
    out += raw


def _get_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    (size,) = _I32.unpack_from(buf, pos)
    pos += _I32.size
    if size < 0 or pos + size > len(buf):
        raise ValueError("bytes run past the record")
    return bytes(buf[pos : pos + size]), pos + size


def encode_group_value(value: GroupRecord) -> bytes:
    """Kafka's GroupMetadataValue v3: a group without a protocol type has "" (Kafka's
    rule, read back as none), no state timestamp kept (-1, Kafka's default)."""
    out = bytearray(_I16.pack(GROUP_METADATA_VALUE_VERSION))
    _put_str(out, value.protocol_type or "", _I16)
    out += _I32.pack(value.generation_id)
    _put_nullable(out, value.protocol_name)
    _put_nullable(out, value.leader_id)
    out += _I64.pack(-1)  # currentStateTimestamp
    _put_members(out, value.members)
    return bytes(out)


def _put_members(out: bytearray, members: Sequence[MemberRecord]) -> None:
    out += _I32.pack(len(members))
    for member in members:
        _put_str(out, member.member_id, _I16)
        _put_nullable(out, member.group_instance_id)
        _put_str(out, member.client_id, _I16)
        _put_str(out, member.client_host, _I16)
        out += _I32.pack(member.rebalance_timeout_ms)
        out += _I32.pack(member.session_timeout_ms)
        _put_bytes(out, member.subscription)
        _put_bytes(out, member.assignment)


def decode_group_value(buf: bytes) -> GroupRecord:
    """Kafka's GroupMetadataValue v3, or main's own (version 1: a nullable protocol type,
    no state timestamp, the members as Kafka's v3 lays them out)."""
    (version,) = _I16.unpack_from(buf, 0)
    if version == GROUP_METADATA_VALUE_VERSION:
        protocol_type: str | None
        protocol_type, pos = _get_str(buf, 2, _I16)
        protocol_type = protocol_type or None
        (generation,) = _I32.unpack_from(buf, pos)
        protocol_name, pos = _get_nullable(buf, pos + _I32.size)
        leader_id, pos = _get_nullable(buf, pos)
        pos += _I64.size  # currentStateTimestamp
    elif version == OLD_GROUP_METADATA_VALUE_VERSION:
        protocol_type, pos = _get_nullable(buf, 2)
        (generation,) = _I32.unpack_from(buf, pos)
        protocol_name, pos = _get_nullable(buf, pos + _I32.size)
        leader_id, pos = _get_nullable(buf, pos)
    else:
        # Members are laid out one after another, so another layout cannot be read in
        # part: the record is skipped and the group's members rejoin (one rebalance).
        raise ValueError(f"unknown group metadata value version {version}")
    (count,) = _I32.unpack_from(buf, pos)
    pos += _I32.size
    if count < 0 or count > len(buf):
        raise ValueError("bad member count")
    members = []
    for _ in range(count):
        member_id, pos = _get_str(buf, pos, _I16)
        instance_id, pos = _get_nullable(buf, pos)
        client_id, pos = _get_str(buf, pos, _I16)
        client_host, pos = _get_str(buf, pos, _I16)
        rebalance_timeout, session_timeout = struct.unpack_from(">ii", buf, pos)
        subscription, pos = _get_bytes(buf, pos + 8)
        assignment, pos = _get_bytes(buf, pos)
        members.append(MemberRecord(
            member_id, instance_id, client_id, client_host, rebalance_timeout,
            session_timeout, subscription, assignment,
        ))  # fmt: skip
    return GroupRecord(protocol_type, generation, protocol_name, leader_id, tuple(members))


def encode_record(record: StoreRecord) -> tuple[bytes, bytes | None]:
    if isinstance(record, ShareGroupRecord):
        out = bytearray(_I16.pack(OWN_RECORD_BASE + record.key_version))
        _put_str(out, record.group_id, _I16)
        if record.key_version in SHARE_GROUP_MEMBER_KEY_VERSIONS:
            # 32 bits: a member id is the client's, of any length (a compact string).
            _put_str(out, record.member_id, _I32)
        return bytes(out), record.value
    if isinstance(record, ConsumerGroupSnapshot):
        out = bytearray(_I16.pack(OWN_RECORD_BASE + CONSUMER_GROUP_KEY_VERSION))
        _put_str(out, record.group_id, _I16)
        return bytes(out), record.value
    if isinstance(record, GroupMetadata):
        out = bytearray(_I16.pack(GROUP_METADATA_RECORD_TYPE))
        _put_str(out, record.group_id, _I16)
        return bytes(out), None if record.value is None else encode_group_value(record.value)
    if isinstance(record, TxnOffset):
        out = bytearray(_I16.pack(OWN_RECORD_BASE + TXN_OFFSET_KEY_VERSION))
        _put_str(out, record.key.group_id, _I16)
        _put_str(out, record.key.topic, _I16)
        out += _I32.pack(record.key.partition)
        out += _I64.pack(record.producer_id)
        out += _I16.pack(record.producer_epoch)
        return bytes(out), None if record.value is None else encode_value(record.value)
    if isinstance(record, TxnEnd):
        out = bytearray(_I16.pack(OWN_RECORD_BASE + TXN_END_KEY_VERSION))
        _put_str(out, record.group_id, _I16)
        out += _I64.pack(record.producer_id)
        end = _TXN_END_VALUE.pack(TXN_END_VALUE_VERSION, record.producer_epoch, record.committed)
        return bytes(out), end
    key, offset = record
    return encode_key(key), None if offset is None else encode_value(offset)


def decode_record(key: bytes, value: bytes | None) -> StoreRecord:
    """A record of either numbering (module docstring): Kafka's types 1 and 2 and ours
    from :data:`OWN_RECORD_BASE`, or main's key versions 1-11."""
    (version,) = _I16.unpack_from(key, 0)
    if version == KEY_VERSION:  # one key layout in both; the value tells (decode_value)
        return decode_key(key), None if value is None else decode_value(value)
    if version == GROUP_METADATA_RECORD_TYPE:
        group_id, pos = _get_str(key, 2, _I16)
        if pos == len(key):  # Kafka's GroupMetadata: the group alone
            return GroupMetadata(group_id, None if value is None else decode_group_value(value))
        return _decode_own(TXN_OFFSET_KEY_VERSION, key, value)  # main's staged offset
    if version > OWN_RECORD_BASE:
        return _decode_own(version - OWN_RECORD_BASE, key, value)
    if version == GROUP_METADATA_KEY_VERSION:  # main's: the group, and our old value
        group_id, _ = _get_str(key, 2, _I16)
        return GroupMetadata(group_id, None if value is None else decode_group_value(value))
    if version in (TXN_END_KEY_VERSION, CONSUMER_GROUP_KEY_VERSION, *SHARE_GROUP_KEY_VERSIONS):
        return _decode_own(version, key, value)  # main's numbering: kind = key version
    raise ValueError(f"unknown offset key version {version}")


def _decode_own(kind: int, key: bytes, value: bytes | None) -> StoreRecord:
    """One of our own records of ``kind``; its key's fields start after the version."""
    if kind == TXN_OFFSET_KEY_VERSION:
        group_id, pos = _get_str(key, 2, _I16)
        topic, pos = _get_str(key, pos, _I16)
        (partition,) = _I32.unpack_from(key, pos)
        (producer_id,) = _I64.unpack_from(key, pos + _I32.size)
        (epoch,) = _I16.unpack_from(key, pos + _I32.size + _I64.size)
        where = OffsetKey(group_id, topic, partition)
        return TxnOffset(producer_id, epoch, where, None if value is None else decode_value(value))
    if kind == TXN_END_KEY_VERSION:
        group_id, pos = _get_str(key, 2, _I16)
        (producer_id,) = _I64.unpack_from(key, pos)
        if value is None:
            raise ValueError("a transaction end without a value")
        value_version, epoch, committed = _TXN_END_VALUE.unpack_from(value, 0)
        if value_version < TXN_END_VALUE_VERSION:
            raise ValueError(f"unknown transaction end value version {value_version}")
        return TxnEnd(group_id, producer_id, epoch, bool(committed))
    if kind == CONSUMER_GROUP_KEY_VERSION:
        group_id, _ = _get_str(key, 2, _I16)
        return ConsumerGroupSnapshot(group_id, None if value is None else bytes(value))
    if kind in SHARE_GROUP_KEY_VERSIONS:
        group_id, pos = _get_str(key, 2, _I16)
        member_id = ""
        if kind in SHARE_GROUP_MEMBER_KEY_VERSIONS:
            member_id, _ = _get_str(key, pos, _I32)
        value = None if value is None else bytes(value)
        return ShareGroupRecord(kind, group_id, value, member_id)
    raise ValueError(f"unknown record kind {OWN_RECORD_BASE + kind}")


# ------------------------------------------------------------------------- the store


@attrs.define(eq=False)
class PendingWrite:
    """Records appended at ``base_offset`` .. ``last_offset``, not yet durable."""

    entries: tuple[StoreRecord, ...]
    base_offset: int
    last_offset: int
    #: Set by :meth:`OffsetsStore.apply`: a write is applied once, whoever waits for it.
    applied: bool = False
    #: The store it was appended to (its log is the one to wait for).
    store: OffsetsStore | None = attrs.field(default=None, repr=False)


#: Kafka's offsets.topic.segment.bytes: segments roll, so the cleaner can compact them.
OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024


def open_offsets_log(data_dir: Path | None, config: LogConfig) -> Log:
    """A node alone's ``__consumer_offsets-0``: ``<data_dir>/__consumer_offsets-0``, or a
    ``MemoryLog`` if ``data_dir`` is None."""
    return open_compacted_log(data_dir, OFFSETS_LOG_NAME, config, OFFSETS_SEGMENT_BYTES)


class OffsetsStore:
    def __init__(self, offsets_log: Log, partition: int = 0) -> None:
        self.log = offsets_log
        #: The ``__consumer_offsets`` partition this store holds (0 on a broker alone).
        self.partition = partition
        self._table: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        #: key -> log offset of the record that last set (or deleted) it.
        self._applied_at: dict[OffsetKey, int] = {}
        #: group -> producer id -> (topic, partition) -> (staged offset, its record's offset).
        self._pending: dict[str, dict[int, dict[tuple[str, int], tuple[OffsetAndMetadata, int]]]]
        self._pending = {}
        #: producer id -> the newest epoch of its transactional records here: an older
        #: epoch is a fenced producer (Kafka's producer-state check on __consumer_offsets).
        self._producer_epochs: dict[int, int] = {}
        #: Appended writes not applied yet, for :meth:`apply_through`.
        self._unapplied: list[PendingWrite] = []
        #: The committed offsets the transaction end just applied set: key -> the offset of
        #: the staged record that won. The plain records right after the end, in its batch,
        #: are their rewrites (:meth:`end_records`) and count from there too, as Kafka
        #: counts a transactional offset from its own record: a rewrite dated at its own
        #: place would beat another transaction's offset staged after the winner's.
        self._rewrites_due: dict[OffsetKey, tuple[int, OffsetAndMetadata]] = {}
        #: The last log offset the end's batch can reach (the end, then a rewrite and a
        #: tombstone per staged offset): a record past it is another write's.
        self._rewrites_until = -1
        #: group -> (its stored generation, the log offset of that record).
        self._metadata: dict[str, tuple[GroupRecord, int]] = {}
        #: group -> log offset of its newest metadata record or tombstone.
        self._metadata_at: dict[str, int] = {}
        #: KIP-848 groups: group -> its latest snapshot, and the log offset it came from.
        self._snapshots: dict[str, bytes] = {}
        self._snapshots_at: dict[str, int] = {}
        #: Share groups: group -> (key version, member id) -> its latest record's value,
        #: and the log offset of the latest record or tombstone of each key.
        self._share_records: dict[str, dict[tuple[int, str], bytes]] = {}
        self._share_records_at: dict[tuple[str, int, str], int] = {}

    @classmethod
    def open(cls, data_dir: Path | None, config: LogConfig) -> OffsetsStore:
        """Open the internal log (memory if ``data_dir`` is None) and replay it."""
        store = cls(open_offsets_log(data_dir, config))
        store.load()
        return store

    @classmethod
    def over(cls, partition_log: Log, partition: int) -> OffsetsStore:
        """The table of ``__consumer_offsets-<partition>``, replayed from its log (a
        cluster's replica, owned by the topic manager: the store never closes it)."""
        store = cls(partition_log, partition)
        store.load()
        return store

    def close(self) -> None:
        self.log.close()

    # ------------------------------------------------------------------ replay

    def load(self) -> int:
        """Replay the log into the table; returns how many records were read."""
        return replay_table(self.log, decode_record, self._apply_record, log, "offset")

    # ------------------------------------------------------------------ writes

    def append(
        self,
        entries: Sequence[StoreRecord],
        now_ms: int,
        append_batch: Callable[[Any], Appended] | None = None,
    ) -> PendingWrite:
        """Write one batch holding ``entries``; call :meth:`apply` once it is durable.

        ``append_batch`` appends the encoded batch through the partition's write path
        (the group coordinator's: marked for the group commit, in a cluster with the
        leader epoch); by default a coordinator's write no flusher keeps (a store used
        alone)."""
        if not entries:
            raise ValueError("nothing to write")
        records = [encode_record(entry) for entry in entries]
        batch = build_batch(records, base_timestamp=now_ms)
        if append_batch is None:
            alone = coordinator_partition(
                OwnLog(NO_BROKER, self.log), CONSUMER_OFFSETS, self.partition, self.log
            )
            result = partition_append(
                alone, batch, origin=Origin.COORDINATOR, now_ms=now_ms, durability=None,
                messages=len(records),
            )  # fmt: skip
        else:
            result = append_batch(batch)
        write = PendingWrite(tuple(entries), result.base_offset, result.last_offset, store=self)
        self._unapplied.append(write)
        return write

    def apply(self, write: PendingWrite) -> None:
        if write.applied:
            return
        write.applied = True
        if write in self._unapplied:
            self._unapplied.remove(write)
        for i, entry in enumerate(write.entries):
            self._apply_record(entry, write.base_offset + i)

    def apply_counted(self, write: PendingWrite) -> None:
        """Apply ``write`` once it counts (durable; in a cluster below the high
        watermark): so does every write before it in the log, and those are applied
        first, in log order. The coordinator's waiters resume in any order; a producer's
        next transaction staging an offset of a partition was applied before the end of
        its previous one (appended earlier), replaced that transaction's staged offset,
        and the end then settled nothing: the live table and a replay of the same log
        answered differently (statemachine/test_offsets_store_machine.py found it)."""
        self.apply_through(write.last_offset)
        self.apply(write)

    def apply_through(self, last_offset: int) -> None:
        """Apply, in log order, every write up to ``last_offset`` (the caller knows it durable)."""
        for write in sorted(self._unapplied, key=lambda w: w.base_offset):
            if write.last_offset <= last_offset:
                self.apply(write)

    def end_records(
        self, group_id: str, producer_id: int, producer_epoch: int, committed: bool
    ) -> list[StoreRecord]:
        """The records that end the producer's transaction for the group (one batch).

        Besides the end itself, each ended staged offset gets a tombstone, and a
        committed one that wins (no newer record of its partition, Kafka's rule) is
        written again as a plain offset: the log then says the same thing after
        compaction keeps only the latest record per key. Call after every earlier
        write was applied (:meth:`apply_through`), so "newer" is decided on all of them.
        """
        records: list[StoreRecord] = [TxnEnd(group_id, producer_id, producer_epoch, committed)]
        staged = self._pending.get(group_id, {}).get(producer_id, {})
        for (topic, partition), (value, staged_at) in sorted(staged.items()):
            key = OffsetKey(group_id, topic, partition)
            if committed and self._applied_at.get(key, -1) <= staged_at:
                records.append((key, value))
            records.append(TxnOffset(producer_id, producer_epoch, key, None))
        return records

    def _apply_record(self, record: StoreRecord, log_offset: int) -> None:
        staged_at = self._rewrite_of_the_end(record, log_offset)
        if staged_at is not None and isinstance(record, tuple):
            self._set(record, staged_at)  # the end's rewrite: dated like its original
            return
        if isinstance(record, ShareGroupRecord):
            at = (record.group_id, record.key_version, record.member_id)
            if self._share_records_at.get(at, -1) > log_offset:
                return
            self._share_records_at[at] = log_offset
            kept = self._share_records.setdefault(record.group_id, {})
            if record.value is None:
                kept.pop((record.key_version, record.member_id), None)
                if not kept:
                    del self._share_records[record.group_id]
            else:
                kept[record.key_version, record.member_id] = record.value
            return
        if isinstance(record, ConsumerGroupSnapshot):
            if self._snapshots_at.get(record.group_id, -1) > log_offset:
                return
            self._snapshots_at[record.group_id] = log_offset
            if record.value is None:
                self._snapshots.pop(record.group_id, None)
            else:
                self._snapshots[record.group_id] = record.value
            return
        if isinstance(record, GroupMetadata):
            if self._metadata_at.get(record.group_id, -1) > log_offset:
                return  # a later record of the group is already in
            self._metadata_at[record.group_id] = log_offset
            if record.value is None:
                self._metadata.pop(record.group_id, None)
            else:
                self._metadata[record.group_id] = (record.value, log_offset)
            return
        if isinstance(record, TxnOffset | TxnEnd):
            known = self._producer_epochs.get(record.producer_id, -1)
            self._producer_epochs[record.producer_id] = max(known, record.producer_epoch)
        if isinstance(record, TxnOffset):
            self._stage(record, log_offset)
        elif isinstance(record, TxnEnd):
            self._end_transaction(record, log_offset)
        else:
            if record[1] is None:
                self._drop_pending(record[0], log_offset)
            self._set(record, log_offset)

    def _rewrite_of_the_end(self, record: StoreRecord, log_offset: int) -> int | None:
        """The staged record's offset if ``record`` rewrites an offset the transaction end
        just applied committed (in the end's batch, the same key and value), else None."""
        due, self._rewrites_due = self._rewrites_due, {}
        if not due or log_offset > self._rewrites_until:
            return None
        if isinstance(record, TxnOffset) and record.value is None:
            self._rewrites_due = due  # the end batch's tombstones: still in it
            return None
        if isinstance(record, tuple):
            original = due.get(record[0])
            if original is not None and original[1] == record[1]:
                del due[record[0]]
                self._rewrites_due = due
                return original[0]
        return None

    def _stage(self, record: TxnOffset, log_offset: int) -> None:
        key = record.key
        if record.value is None:  # done with: ended or deleted
            staged = self._pending.get(key.group_id, {}).get(record.producer_id, {})
            current = staged.get((key.topic, key.partition))
            if current is not None and current[1] < log_offset:
                self._unstage(key.group_id, record.producer_id, (key.topic, key.partition))
            return
        deleted_later = self._applied_at.get(key, -1) > log_offset and (
            self.get(key.group_id, key.topic, key.partition) is None
        )
        if deleted_later:
            return  # a later tombstone, already applied, dropped it
        staged = self._pending.setdefault(key.group_id, {}).setdefault(record.producer_id, {})
        current = staged.get((key.topic, key.partition))
        if current is None or current[1] < log_offset:
            staged[key.topic, key.partition] = (record.value, log_offset)

    def _unstage(self, group_id: str, producer_id: int, partition: tuple[str, int]) -> None:
        producers = self._pending.get(group_id, {})
        staged = producers.get(producer_id, {})
        staged.pop(partition, None)
        if not staged:
            producers.pop(producer_id, None)
        if not producers:
            self._pending.pop(group_id, None)

    def _drop_pending(self, key: OffsetKey, log_offset: int) -> None:
        """A tombstone drops every producer's staged offset of the partition (Kafka's rule)."""
        producers = self._pending.get(key.group_id, {})
        for producer_id, staged in list(producers.items()):
            current = staged.get((key.topic, key.partition))
            if current is not None and current[1] < log_offset:
                del staged[key.topic, key.partition]
            if not staged:
                del producers[producer_id]
        if not producers:
            self._pending.pop(key.group_id, None)

    def _end_transaction(self, record: TxnEnd, log_offset: int) -> None:
        producers = self._pending.get(record.group_id, {})
        staged = producers.get(record.producer_id, {})
        self._rewrites_until = log_offset + 2 * len(staged)
        for (topic, partition), (value, staged_at) in list(staged.items()):
            if staged_at > log_offset:
                continue  # staged by the producer's next transaction
            del staged[topic, partition]
            if record.committed:
                # The offset counts from its own record's place in the log: a plain
                # commit appended after it (but before the end) still wins.
                key = OffsetKey(record.group_id, topic, partition)
                if self._applied_at.get(key, -1) <= staged_at:
                    self._set((key, value), staged_at)
                    self._rewrites_due[key] = (staged_at, value)
        if not staged:
            producers.pop(record.producer_id, None)
        if not producers:
            self._pending.pop(record.group_id, None)

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
        """Groups with committed or pending offsets, or a stored generation."""
        return list(
            self._table.keys() | self._pending.keys() | self._metadata.keys()
            | self._snapshots.keys()
        )  # fmt: skip

    def share_group_ids(self) -> set[str]:
        """Share groups with a stored record."""
        return set(self._share_records)

    def share_group_record(
        self, group_id: str, key_version: int, member_id: str = ""
    ) -> bytes | None:
        """The value of the share group's latest record of that key (None: none)."""
        return self._share_records.get(group_id, {}).get((key_version, member_id))

    def share_group_records(self, group_id: str) -> Mapping[tuple[int, str], bytes]:
        """The share group's stored records: (key version, member id) -> value."""
        return self._share_records.get(group_id, {})

    def consumer_group_snapshot(self, group_id: str) -> bytes | None:
        """The KIP-848 group's stored snapshot (None: none, or removed)."""
        return self._snapshots.get(group_id)

    def group_metadata(self, group_id: str) -> GroupRecord | None:
        """The group's stored generation (None: none, or removed by a tombstone)."""
        stored = self._metadata.get(group_id)
        return None if stored is None else stored[0]

    def has_offsets(self, group_id: str) -> bool:
        """Committed or pending: either keeps the group alive."""
        return bool(self._table.get(group_id)) or group_id in self._pending

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """Does some open transaction hold an offset of this partition for the group?"""
        return any(
            (topic, partition) in staged for staged in self._pending.get(group_id, {}).values()
        )

    def pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        return {tp for staged in self._pending.get(group_id, {}).values() for tp in staged}

    def pending_offsets(
        self, group_id: str, producer_id: int
    ) -> Mapping[tuple[str, int], OffsetAndMetadata]:
        staged = self._pending.get(group_id, {}).get(producer_id, {})
        return {tp: value for tp, (value, _) in staged.items()}

    def producer_epoch(self, producer_id: int) -> int:
        """The newest epoch of the producer's transactional records, -1 if none."""
        return self._producer_epochs.get(producer_id, -1)

    def pending_records(self, group_id: str) -> list[tuple[int, OffsetKey]]:
        """(producer id, key) of every staged offset of the group."""
        return [
            (producer_id, OffsetKey(group_id, topic, partition))
            for producer_id, staged in self._pending.get(group_id, {}).items()
            for topic, partition in staged
        ]

    def pending_producers(self, group_id: str) -> list[int]:
        return list(self._pending.get(group_id, {}))

    def groups_pending_for(self, producer_id: int) -> list[str]:
        """Groups holding offsets staged by the producer's open transaction."""
        return [group_id for group_id, staged in self._pending.items() if producer_id in staged]
