"""A share group's records in ``__consumer_offsets``: what its group coordinator keeps.

Kafka's group coordinator writes a share group as several records keyed by the group:
ShareGroupMetadata (the group epoch), ShareGroupStatePartitionMetadata (the topics
whose share partitions were initialized, are being initialized, or are being deleted),
ShareGroupTargetAssignmentMetadata (the target's epoch), and per member its
ShareGroupMemberMetadata (subscriptions, client), ShareGroupTargetAssignmentMember (its
target) and ShareGroupCurrentMemberAssignment (its epochs and what it was told). This
coordinator writes the same records, in our own binary layout (versioned like the
offsets log's other values, under record types of our own that Kafka's formatters skip:
``offsets_store.OWN_RECORD_BASE`` + the record's kind), and only those whose value changed: after it restarts or
the group moves to another broker, the group's share partitions are found (describe
without topics, DeleteGroups, a topic's deletion) and its members go on heartbeating
with the epochs they hold, as docs/share-groups.md says. No I/O, no Trio.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Mapping

import attrs

from trio_broker.groups.offsets_store import (
    SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION,
    SHARE_GROUP_MEMBER_KEY_VERSION,
    SHARE_GROUP_METADATA_KEY_VERSION,
    SHARE_GROUP_PARTITIONS_KEY_VERSION,
    SHARE_GROUP_TARGET_MEMBER_KEY_VERSION,
    SHARE_GROUP_TARGET_METADATA_KEY_VERSION,
    ShareGroupRecord,
)
from trio_broker.state.share_group import Assignment, ShareGroup, ShareMember

METADATA_VALUE_VERSION = 1
#: Version 1 has the initialized and the deleting topics; version 2 adds the
#: initializing ones after them, and is written only when there are some (so a
#: broker that reads version 1 only still reads the common case).
PARTITIONS_VALUE_VERSION = 1
PARTITIONS_WITH_INITIALIZING_VERSION = 2
MEMBER_VALUE_VERSION = 1
TARGET_METADATA_VALUE_VERSION = 1
#: Version 1 names each assigned partition by topic name; version 2 adds the topic's
#: id (Kafka's records carry ids), so that after a load a partition of a topic deleted
#: and created again under its name is not taken for the new topic's. Both are read.
TARGET_MEMBER_VALUE_VERSION = 2
CURRENT_MEMBER_VALUE_VERSION = 2
NAMES_ONLY_VALUE_VERSION = 1
#: What version 2 stores for a topic whose id was not known when it was written.
NO_TOPIC_ID = uuid.UUID(int=0)

#: A stored record's key within its group: (its kind, ``offsets_store``'s
#: ``SHARE_GROUP_*_KEY_VERSION``; member id, "" for the group's).
RecordKey = tuple[int, str]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_METADATA = struct.Struct(">hi")  # value version, group epoch


@attrs.frozen
class StoredTopic:
    """A topic of the group's share partitions: its name when they were recorded (for
    the tools, as Kafka's TopicPartitionsInfo) and the partitions."""

    name: str
    partitions: frozenset[int] = frozenset()


@attrs.frozen
class StoredMember:
    """A member as its three records say: ShareGroupMemberMetadata (``rack_id`` ..
    ``subscribed``), ShareGroupCurrentMemberAssignment (its epochs and ``assignment``,
    what it was last told) and ShareGroupTargetAssignmentMember (``target``)."""

    rack_id: str | None
    client_id: str
    client_host: str
    subscribed: tuple[str, ...]
    member_epoch: int
    previous_epoch: int
    assignment: Assignment
    target: Assignment = frozenset()
    #: The ids of the topics ``assignment`` and ``target`` name, when they were stored
    #: (a topic missing: not known then, or read from a version 1 record).
    topic_ids: Mapping[str, uuid.UUID] = attrs.field(factory=dict)

    @classmethod
    def of(
        cls, member: ShareMember, target: Assignment, topic_ids: Mapping[str, uuid.UUID]
    ) -> StoredMember:
        named = {t for t, _ in member.assignment | target}
        return cls(
            member.rack_id, member.client_id, member.client_host, member.subscribed,
            member.member_epoch, member.previous_epoch, member.assignment, target,
            {t: topic_ids[t] for t in named if t in topic_ids},
        )  # fmt: skip

    def same_topics(
        self, assignment: Assignment, topic_ids: Mapping[str, uuid.UUID] | None
    ) -> Assignment:
        """``assignment`` without the partitions of topics whose id is not the one the
        name has now (``topic_ids``; None: keep all): a topic deleted since, perhaps
        created again under its name, which is another topic."""
        if topic_ids is None:
            return assignment
        return frozenset(
            (t, p)
            for t, p in assignment
            if t not in self.topic_ids or topic_ids.get(t) == self.topic_ids[t]
        )

    def restored(
        self, member_id: str, deadline_ms: int, topic_ids: Mapping[str, uuid.UUID] | None = None
    ) -> ShareMember:
        """The member in memory again, its session running until ``deadline_ms``; what
        it was told keeps only the partitions of topics that are still the same topic
        (``topic_ids``: each existing topic's id now)."""
        return ShareMember(
            member_id, self.member_epoch, self.rack_id, self.client_id, self.client_host,
            self.subscribed, self.same_topics(self.assignment, topic_ids), deadline_ms,
            self.previous_epoch,
        )  # fmt: skip


@attrs.frozen
class StoredShareGroup:
    """What the group coordinator knows durably of a share group."""

    #: The group epoch (ShareGroupMetadata).
    epoch: int = 0
    #: Topic id -> the topic and its partitions whose share state is durable at their
    #: share coordinators (initialized on assignment, or reset by
    #: AlterShareGroupOffsets): Kafka's InitializedTopics. Only these are assigned.
    initialized: Mapping[uuid.UUID, StoredTopic] = attrs.field(factory=dict)
    #: Topic id -> name of the topics whose share state is being deleted (Kafka's
    #: DeletingTopics). Read, and written as read: this coordinator keeps a deleted
    #: topic in ``initialized`` until its share state is deleted everywhere (its id,
    #: naming no topic, is what marks it), so it writes none of its own.
    deleting: Mapping[uuid.UUID, str] = attrs.field(factory=dict)
    #: The topics' partition counts the target assignment was computed from (at
    #: ``epoch``; Kafka keeps a hash of them in ShareGroupMetadata): the same counts
    #: after a load are no reason for a new epoch.
    metadata: Mapping[str, int] = attrs.field(factory=dict)
    #: Member id -> the member, as stored.
    members: Mapping[str, StoredMember] = attrs.field(factory=dict)
    #: Topic id -> the topic and its partitions whose share state is being initialized
    #: (Kafka's InitializingTopics): recorded before the share coordinators are asked,
    #: so that a coordinator that restarts meanwhile knows to try again, and a deletion
    #: reaches state that may have been written. Not assignable until initialized.
    initializing: Mapping[uuid.UUID, StoredTopic] = attrs.field(factory=dict)

    def with_membership(
        self, group: ShareGroup, topic_ids: Mapping[str, uuid.UUID] | None = None
    ) -> StoredShareGroup:
        """Its epoch, target and members as ``group`` has them now; ``topic_ids``: each
        existing topic's id, stored with the partitions assigned."""
        ids = topic_ids or {}
        members = {
            member_id: StoredMember.of(member, group.target.get(member_id, frozenset()), ids)
            for member_id, member in group.members.items()
        }
        return attrs.evolve(
            self, epoch=group.group_epoch, metadata=dict(group.metadata), members=members
        )

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        """(topic id, partition) of every share partition initialized or being
        initialized (either may have share state at its coordinator)."""
        return {(t, p) for t, topic in self.recorded_topics().items() for p in topic.partitions}

    def recorded_topics(self) -> dict[uuid.UUID, StoredTopic]:
        """The initialized and the initializing topics, their partitions merged."""
        merged = dict(self.initialized)
        for topic_id, topic in self.initializing.items():
            known = merged.get(topic_id, StoredTopic(topic.name))
            merged[topic_id] = StoredTopic(known.name, known.partitions | topic.partitions)
        return merged

    def with_partitions(
        self, added: Iterable[tuple[uuid.UUID, str, int]], epoch: int | None = None
    ) -> StoredShareGroup:
        """Also the (topic id, name, partition)s ``added`` initialized (no longer
        initializing), at ``epoch`` if given."""
        added = list(added)
        return attrs.evolve(
            self,
            epoch=self.epoch if epoch is None else epoch,
            initialized=_with(self.initialized, added),
            initializing=_without(self.initializing, added),
        )

    def with_initializing(self, added: Iterable[tuple[uuid.UUID, str, int]]) -> StoredShareGroup:
        """Also the (topic id, name, partition)s ``added`` being initialized."""
        return attrs.evolve(self, initializing=_with(self.initializing, added))

    def without_initializing(self, gone: Iterable[tuple[uuid.UUID, str, int]]) -> StoredShareGroup:
        """The (topic id, name, partition)s ``gone`` no longer being initialized (their
        initialization failed: a later heartbeat tries again)."""
        return attrs.evolve(self, initializing=_without(self.initializing, gone))

    def without_topics(self, topic_ids: Iterable[uuid.UUID]) -> StoredShareGroup:
        """The topics' share state gone (deleted offsets, a topic deleted and told)."""
        gone = set(topic_ids)
        return attrs.evolve(
            self,
            initialized={t: v for t, v in self.initialized.items() if t not in gone},
            deleting={t: v for t, v in self.deleting.items() if t not in gone},
            initializing={t: v for t, v in self.initializing.items() if t not in gone},
        )


def _with(
    topics: Mapping[uuid.UUID, StoredTopic], added: Iterable[tuple[uuid.UUID, str, int]]
) -> dict[uuid.UUID, StoredTopic]:
    out = dict(topics)
    for topic_id, name, partition in added:
        known = out.get(topic_id, StoredTopic(name))
        out[topic_id] = StoredTopic(known.name, known.partitions | {partition})
    return out


def _without(
    topics: Mapping[uuid.UUID, StoredTopic], gone: Iterable[tuple[uuid.UUID, str, int]]
) -> dict[uuid.UUID, StoredTopic]:
    out = dict(topics)
    for topic_id, _, partition in gone:
        known = out.get(topic_id)
        if known is not None:
            left = known.partitions - {partition}
            if left:
                out[topic_id] = StoredTopic(known.name, left)
            else:
                del out[topic_id]
    return out


# ------------------------------------------------------------------------- layout


def _put_str(out: bytearray, text: str) -> None:
    raw = text.encode()
    out += _I16.pack(len(raw))
    out += raw


def _get_str(buf: bytes, pos: int) -> tuple[str, int]:
    (length,) = _I16.unpack_from(buf, pos)
    pos += _I16.size
    if length < 0 or pos + length > len(buf):
        raise ValueError("string runs past the record")
    return buf[pos : pos + length].decode(), pos + length


def _put_text(out: bytearray, text: str) -> None:
    """A string of the membership records: a 32-bit length, as a client's member and
    rack ids (compact strings on the wire) may pass 32 KiB; Kafka refuses no length."""
    raw = text.encode()
    out += _I32.pack(len(raw))
    out += raw


def _get_text(buf: bytes, pos: int) -> tuple[str, int]:
    (length,) = _I32.unpack_from(buf, pos)
    pos += _I32.size
    if length < 0 or pos + length > len(buf):
        raise ValueError("string runs past the record")
    return buf[pos : pos + length].decode(), pos + length


def _get_count(buf: bytes, pos: int) -> tuple[int, int]:
    (count,) = _I32.unpack_from(buf, pos)
    if count < 0 or count > len(buf):
        raise ValueError("bad count")
    return count, pos + _I32.size


def _put_topics(out: bytearray, topics: Mapping[uuid.UUID, StoredTopic]) -> None:
    out += _I32.pack(len(topics))
    for topic_id, topic in sorted(topics.items()):
        out += topic_id.bytes
        _put_str(out, topic.name)
        out += _I32.pack(len(topic.partitions))
        for partition in sorted(topic.partitions):
            out += _I32.pack(partition)


def _get_topics(buf: bytes, pos: int) -> tuple[dict[uuid.UUID, StoredTopic], int]:
    topics: dict[uuid.UUID, StoredTopic] = {}
    count, pos = _get_count(buf, pos)
    for _ in range(count):
        topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
        name, pos = _get_str(buf, pos + 16)
        n, pos = _get_count(buf, pos)
        partitions = frozenset(_I32.unpack_from(buf, pos + 4 * i)[0] for i in range(n))
        pos += 4 * n
        topics[topic_id] = StoredTopic(name, partitions)
    return topics, pos


def encode_partitions(stored: StoredShareGroup) -> bytes:
    version = (
        PARTITIONS_WITH_INITIALIZING_VERSION if stored.initializing else PARTITIONS_VALUE_VERSION
    )
    out = bytearray(_I16.pack(version))
    _put_topics(out, stored.initialized)
    out += _I32.pack(len(stored.deleting))
    for topic_id, name in sorted(stored.deleting.items()):
        out += topic_id.bytes
        _put_str(out, name)
    if stored.initializing:
        _put_topics(out, stored.initializing)
    return bytes(out)


def decode_partitions(
    buf: bytes,
) -> tuple[dict[uuid.UUID, StoredTopic], dict[uuid.UUID, str], dict[uuid.UUID, StoredTopic]]:
    """(initialized, deleting, initializing) topics."""
    (version,) = _I16.unpack_from(buf, 0)
    if version not in (PARTITIONS_VALUE_VERSION, PARTITIONS_WITH_INITIALIZING_VERSION):
        raise ValueError(f"unknown share group partitions value version {version}")
    initialized, pos = _get_topics(buf, _I16.size)
    deleting: dict[uuid.UUID, str] = {}
    count, pos = _get_count(buf, pos)
    for _ in range(count):
        topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
        deleting[topic_id], pos = _get_str(buf, pos + 16)
    initializing: dict[uuid.UUID, StoredTopic] = {}
    if version == PARTITIONS_WITH_INITIALIZING_VERSION:
        initializing, pos = _get_topics(buf, pos)
    return initialized, deleting, initializing


def _put_strings(out: bytearray, texts: Iterable[str]) -> None:
    texts = list(texts)
    out += _I32.pack(len(texts))
    for text in texts:
        _put_text(out, text)


def _get_strings(buf: bytes, pos: int) -> tuple[tuple[str, ...], int]:
    count, pos = _get_count(buf, pos)
    texts = []
    for _ in range(count):
        text, pos = _get_text(buf, pos)
        texts.append(text)
    return tuple(texts), pos


def _put_assignment(
    out: bytearray, assignment: Assignment, topic_ids: Mapping[str, uuid.UUID]
) -> None:
    """Version 2: each partition's topic name, partition and topic id."""
    out += _I32.pack(len(assignment))
    for topic, partition in sorted(assignment):
        _put_text(out, topic)
        out += _I32.pack(partition)
        out += topic_ids.get(topic, NO_TOPIC_ID).bytes


def _get_assignment(
    buf: bytes, pos: int, version: int, topic_ids: dict[str, uuid.UUID]
) -> tuple[Assignment, int]:
    """An assignment of ``version`` (1: names only); the ids read go to ``topic_ids``."""
    count, pos = _get_count(buf, pos)
    got = []
    for _ in range(count):
        topic, pos = _get_text(buf, pos)
        (partition,) = _I32.unpack_from(buf, pos)
        got.append((topic, partition))
        pos += _I32.size
        if version != NAMES_ONLY_VALUE_VERSION:
            if pos + 16 > len(buf):
                raise ValueError("topic id runs past the record")
            topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
            pos += 16
            if topic_id != NO_TOPIC_ID:
                topic_ids[topic] = topic_id
    return frozenset(got), pos


def _check_version(buf: bytes, expected: int, what: str) -> int:
    (version,) = _I16.unpack_from(buf, 0)
    if version != expected:
        raise ValueError(f"unknown share group {what} value version {version}")
    return _I16.size


def _assignment_version(buf: bytes, what: str) -> tuple[int, int]:
    """(version, position after it) of a target or current assignment value: 1 or 2."""
    (version,) = _I16.unpack_from(buf, 0)
    if version not in (NAMES_ONLY_VALUE_VERSION, TARGET_MEMBER_VALUE_VERSION):
        raise ValueError(f"unknown share group {what} value version {version}")
    return version, _I16.size


def encode_member(member: StoredMember) -> bytes:
    """ShareGroupMemberMetadata's value: rack (-1 for none), client id and host, topics."""
    out = bytearray(_I16.pack(MEMBER_VALUE_VERSION))
    if member.rack_id is None:
        out += _I32.pack(-1)
    else:
        _put_text(out, member.rack_id)
    _put_text(out, member.client_id)
    _put_text(out, member.client_host)
    _put_strings(out, member.subscribed)
    return bytes(out)


def encode_target_metadata(stored: StoredShareGroup) -> bytes:
    out = bytearray(_I16.pack(TARGET_METADATA_VALUE_VERSION))
    out += _I32.pack(stored.epoch)
    out += _I32.pack(len(stored.metadata))
    for topic, count in sorted(stored.metadata.items()):
        _put_text(out, topic)
        out += _I32.pack(count)
    return bytes(out)


def encode_target_member(member: StoredMember) -> bytes:
    out = bytearray(_I16.pack(TARGET_MEMBER_VALUE_VERSION))
    _put_assignment(out, member.target, member.topic_ids)
    return bytes(out)


def encode_current_member(member: StoredMember) -> bytes:
    out = bytearray(_I16.pack(CURRENT_MEMBER_VALUE_VERSION))
    out += _I32.pack(member.member_epoch)
    out += _I32.pack(member.previous_epoch)
    _put_assignment(out, member.assignment, member.topic_ids)
    return bytes(out)


def record_values(stored: StoredShareGroup) -> dict[RecordKey, bytes]:
    """Every record the group has, by key: the group's own, then its members'."""
    values = {
        (SHARE_GROUP_METADATA_KEY_VERSION, ""): _METADATA.pack(
            METADATA_VALUE_VERSION, stored.epoch
        ),
        (SHARE_GROUP_PARTITIONS_KEY_VERSION, ""): encode_partitions(stored),
    }
    if stored.members or stored.metadata:
        values[SHARE_GROUP_TARGET_METADATA_KEY_VERSION, ""] = encode_target_metadata(stored)
    for member_id, member in sorted(stored.members.items()):
        values[SHARE_GROUP_MEMBER_KEY_VERSION, member_id] = encode_member(member)
        values[SHARE_GROUP_TARGET_MEMBER_KEY_VERSION, member_id] = encode_target_member(member)
        values[SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, member_id] = encode_current_member(member)
    return values


def records_of(
    group_id: str, stored: StoredShareGroup | None, before: StoredShareGroup | None = None
) -> list[ShareGroupRecord]:
    """The records that take the group from ``before`` (None: nothing stored) to
    ``stored`` (None: deleted): those whose value changed, and the tombstones of those
    gone (a member that left, every record of a deleted group; a deleted group's two
    own records are always among them)."""
    old = {} if before is None else record_values(before)
    if stored is None:
        gone = {(SHARE_GROUP_METADATA_KEY_VERSION, ""), (SHARE_GROUP_PARTITIONS_KEY_VERSION, "")}
        return [
            ShareGroupRecord(version, group_id, None, member_id)
            for version, member_id in sorted(gone | old.keys())
        ]
    new = record_values(stored)
    return [
        ShareGroupRecord(version, group_id, value, member_id)
        for (version, member_id), value in new.items()
        if old.get((version, member_id)) != value
    ] + [
        ShareGroupRecord(version, group_id, None, member_id)
        for version, member_id in sorted(old.keys() - new.keys())
    ]


def decode_member(
    member: bytes, target: bytes | None, current: bytes | None
) -> StoredMember | None:
    """A member from its records' values (None: no current assignment is stored, so
    there is no epoch to go on from: the member rejoins)."""
    if current is None:
        return None
    pos = _check_version(member, MEMBER_VALUE_VERSION, "member")
    (rack_length,) = _I32.unpack_from(member, pos)
    rack_id = None
    if rack_length == -1:
        pos += _I32.size
    else:
        rack_id, pos = _get_text(member, pos)
    client_id, pos = _get_text(member, pos)
    client_host, pos = _get_text(member, pos)
    subscribed, _ = _get_strings(member, pos)
    topic_ids: dict[str, uuid.UUID] = {}
    version, pos = _assignment_version(current, "current assignment")
    member_epoch, previous_epoch = struct.unpack_from(">ii", current, pos)
    assignment, _ = _get_assignment(current, pos + 8, version, topic_ids)
    goal: Assignment = frozenset()
    if target is not None:
        version, pos = _assignment_version(target, "target assignment")
        goal, _ = _get_assignment(target, pos, version, topic_ids)
    return StoredMember(
        rack_id, client_id, client_host, subscribed, member_epoch, previous_epoch,
        assignment, goal, topic_ids,
    )  # fmt: skip


def decode_target_metadata(buf: bytes) -> dict[str, int]:
    pos = _check_version(buf, TARGET_METADATA_VALUE_VERSION, "target metadata")
    count, pos = _get_count(buf, pos + _I32.size)  # the epoch: the group's
    metadata = {}
    for _ in range(count):
        topic, pos = _get_text(buf, pos)
        (metadata[topic],) = _I32.unpack_from(buf, pos)
        pos += _I32.size
    return metadata


def decode_group(values: Mapping[RecordKey, bytes]) -> StoredShareGroup | None:
    """The group as its stored records' values say (None: neither of its own two is
    stored); raises ValueError for a value of the group's own this broker cannot read
    (a newer layout, damage). A member whose records cannot be read is left out: it
    rejoins, the others go on."""
    metadata = values.get((SHARE_GROUP_METADATA_KEY_VERSION, ""))
    partitions = values.get((SHARE_GROUP_PARTITIONS_KEY_VERSION, ""))
    if metadata is None and partitions is None:
        return None
    try:
        epoch = 0
        if metadata is not None:
            pos = _check_version(metadata, METADATA_VALUE_VERSION, "metadata")
            (epoch,) = _I32.unpack_from(metadata, pos)
        initialized: dict[uuid.UUID, StoredTopic] = {}
        deleting: dict[uuid.UUID, str] = {}
        initializing: dict[uuid.UUID, StoredTopic] = {}
        if partitions is not None:
            initialized, deleting, initializing = decode_partitions(partitions)
        target_metadata = values.get((SHARE_GROUP_TARGET_METADATA_KEY_VERSION, ""))
        topics = {} if target_metadata is None else decode_target_metadata(target_metadata)
    except struct.error as exc:
        raise ValueError(f"share group record: {exc}") from exc
    members = {}
    for (version, member_id), value in values.items():
        if version != SHARE_GROUP_MEMBER_KEY_VERSION:
            continue
        try:
            member = decode_member(
                value,
                values.get((SHARE_GROUP_TARGET_MEMBER_KEY_VERSION, member_id)),
                values.get((SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, member_id)),
            )
        except (ValueError, UnicodeDecodeError, struct.error):
            member = None  # unreadable (a newer layout, damage): this member rejoins
        if member is not None:
            members[member_id] = member
    return StoredShareGroup(epoch, initialized, deleting, topics, members, initializing)
