"""A share group's records in ``__consumer_offsets``: what its group coordinator keeps.

Kafka's group coordinator writes a share group as several records keyed by the group:
ShareGroupMetadata (the group epoch), ShareGroupStatePartitionMetadata (the topics
whose share partitions were initialized, are being initialized, or are being deleted),
and one record per member and per target assignment. This coordinator keeps the first
two, in our own binary layout (versioned like the offsets log's other values): what it
needs to find every share partition a group has after it restarts or moves to another
broker (describe without topics, DeleteGroups, a topic's deletion). Members are not
stored: they rejoin, as docs/share-groups.md says. No I/O, no Trio.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Mapping

import attrs

from trio_broker.groups.offsets_store import (
    SHARE_GROUP_METADATA_KEY_VERSION,
    SHARE_GROUP_PARTITIONS_KEY_VERSION,
    ShareGroupRecord,
)

METADATA_VALUE_VERSION = 1
PARTITIONS_VALUE_VERSION = 1

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
class StoredShareGroup:
    """What the group coordinator knows durably of a share group."""

    #: The group epoch (ShareGroupMetadata).
    epoch: int = 0
    #: Topic id -> the topic and its partitions whose share state the group has, or may
    #: have (assigned to a member, or reset by AlterShareGroupOffsets): Kafka's
    #: InitializedTopics. A share partition is recorded before it is first written.
    initialized: Mapping[uuid.UUID, StoredTopic] = attrs.field(factory=dict)
    #: Topic id -> name of the topics whose share state is being deleted (Kafka's
    #: DeletingTopics). Read, and written as read: this coordinator keeps a deleted
    #: topic in ``initialized`` until its share state is deleted everywhere (its id,
    #: naming no topic, is what marks it), so it writes none of its own.
    deleting: Mapping[uuid.UUID, str] = attrs.field(factory=dict)

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        """(topic id, partition) of every share partition initialized."""
        return {(t, p) for t, topic in self.initialized.items() for p in topic.partitions}

    def with_partitions(
        self, added: Iterable[tuple[uuid.UUID, str, int]], epoch: int | None = None
    ) -> StoredShareGroup:
        """Also the (topic id, name, partition)s ``added``, at ``epoch`` if given."""
        initialized = dict(self.initialized)
        for topic_id, name, partition in added:
            known = initialized.get(topic_id, StoredTopic(name))
            initialized[topic_id] = StoredTopic(known.name, known.partitions | {partition})
        return attrs.evolve(
            self, epoch=self.epoch if epoch is None else epoch, initialized=initialized
        )

    def without_topics(self, topic_ids: Iterable[uuid.UUID]) -> StoredShareGroup:
        """The topics' share state gone (deleted offsets, a topic deleted and told)."""
        gone = set(topic_ids)
        return attrs.evolve(
            self,
            initialized={t: v for t, v in self.initialized.items() if t not in gone},
            deleting={t: v for t, v in self.deleting.items() if t not in gone},
        )


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


def _get_count(buf: bytes, pos: int) -> tuple[int, int]:
    (count,) = _I32.unpack_from(buf, pos)
    if count < 0 or count > len(buf):
        raise ValueError("bad count")
    return count, pos + _I32.size


def encode_partitions(stored: StoredShareGroup) -> bytes:
    out = bytearray(_I16.pack(PARTITIONS_VALUE_VERSION))
    out += _I32.pack(len(stored.initialized))
    for topic_id, topic in sorted(stored.initialized.items()):
        out += topic_id.bytes
        _put_str(out, topic.name)
        out += _I32.pack(len(topic.partitions))
        for partition in sorted(topic.partitions):
            out += _I32.pack(partition)
    out += _I32.pack(len(stored.deleting))
    for topic_id, name in sorted(stored.deleting.items()):
        out += topic_id.bytes
        _put_str(out, name)
    return bytes(out)


def decode_partitions(
    buf: bytes,
) -> tuple[dict[uuid.UUID, StoredTopic], dict[uuid.UUID, str]]:
    (version,) = _I16.unpack_from(buf, 0)
    if version != PARTITIONS_VALUE_VERSION:
        raise ValueError(f"unknown share group partitions value version {version}")
    initialized: dict[uuid.UUID, StoredTopic] = {}
    count, pos = _get_count(buf, _I16.size)
    for _ in range(count):
        topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
        name, pos = _get_str(buf, pos + 16)
        n, pos = _get_count(buf, pos)
        partitions = frozenset(_I32.unpack_from(buf, pos + 4 * i)[0] for i in range(n))
        pos += 4 * n
        initialized[topic_id] = StoredTopic(name, partitions)
    deleting: dict[uuid.UUID, str] = {}
    count, pos = _get_count(buf, pos)
    for _ in range(count):
        topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
        deleting[topic_id], pos = _get_str(buf, pos + 16)
    return initialized, deleting


def records_of(group_id: str, stored: StoredShareGroup | None) -> list[ShareGroupRecord]:
    """The group's two records (their tombstones for None: the group is deleted)."""
    if stored is None:
        return [
            ShareGroupRecord(SHARE_GROUP_METADATA_KEY_VERSION, group_id, None),
            ShareGroupRecord(SHARE_GROUP_PARTITIONS_KEY_VERSION, group_id, None),
        ]
    return [
        ShareGroupRecord(
            SHARE_GROUP_METADATA_KEY_VERSION, group_id,
            _METADATA.pack(METADATA_VALUE_VERSION, stored.epoch),
        ),
        ShareGroupRecord(SHARE_GROUP_PARTITIONS_KEY_VERSION, group_id, encode_partitions(stored)),
    ]  # fmt: skip


def decode_group(metadata: bytes | None, partitions: bytes | None) -> StoredShareGroup | None:
    """The group as its stored records' values say (None: neither is stored); raises
    ValueError for a value this broker cannot read (a newer layout, damage)."""
    if metadata is None and partitions is None:
        return None
    try:
        epoch = 0
        if metadata is not None:
            version, epoch = _METADATA.unpack_from(metadata, 0)
            if version != METADATA_VALUE_VERSION:
                raise ValueError(f"unknown share group metadata value version {version}")
        if partitions is None:
            return StoredShareGroup(epoch)
        initialized, deleting = decode_partitions(partitions)
    except struct.error as exc:
        raise ValueError(f"share group record: {exc}") from exc
    return StoredShareGroup(epoch, initialized, deleting)
