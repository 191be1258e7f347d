"""The consumer's embedded protocol: what a classic consumer puts in JoinGroup's protocol
metadata (ConsumerProtocolSubscription) and what SyncGroup hands it back
(ConsumerProtocolAssignment), versions 0-3 of Kafka's schemas.

A classic member of a consumer-protocol group (KIP-848's migration) is assigned by the
coordinator, which must read its subscription and write its assignment itself. Decoding
raises :class:`ValueError` on anything malformed, and checks every length against the
bytes present before it allocates (a member's metadata is a client's input).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import attrs

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

#: The newest version of either schema; a newer one is answered with this.
MAX_VERSION = 3

TopicPartition = tuple[str, int]


@attrs.frozen
class Subscription:
    """A decoded ConsumerProtocolSubscription."""

    version: int
    topics: tuple[str, ...]
    #: The partitions the member still owns (v1+; empty before: an eager consumer gives
    #: everything up before it rejoins).
    owned: frozenset[TopicPartition] = frozenset()
    rack_id: str | None = None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0

    def _take(self, size: int) -> memoryview:
        if size < 0 or self.pos + size > len(self.view):
            raise ValueError("consumer protocol: truncated")
        chunk = self.view[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def int16(self) -> int:
        value: int = _I16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack(self._take(4))[0]
        return value

    def count(self, least_bytes_each: int) -> int:
        """An array length, no larger than the bytes left could hold."""
        n = self.int32()
        if n < 0 or n * least_bytes_each > len(self.view) - self.pos:
            raise ValueError(f"consumer protocol: bad array length {n}")
        return n

    def string(self) -> str:
        return bytes(self._take(self.int16())).decode()

    def nullable_string(self) -> str | None:
        size = self.int16()
        return None if size == -1 else bytes(self._take(size)).decode()

    def nullable_bytes(self) -> None:
        size = self.int32()
        if size != -1:
            self._take(size)

    def at_end(self) -> bool:
        return self.pos >= len(self.view)

    def topic_partitions(self) -> frozenset[TopicPartition]:
        out: set[TopicPartition] = set()
        for _ in range(self.count(6)):
            topic = self.string()
            out.update((topic, self.int32()) for _ in range(self.count(4)))
        return frozenset(out)


def metadata_version(metadata: bytes) -> int:
    """The version a member wrote its metadata in (its assignment is answered in it,
    up to :data:`MAX_VERSION`); 0 for metadata too short to say."""
    if len(metadata) < 2:
        return 0
    version: int = _I16.unpack_from(metadata)[0]
    return max(0, min(version, MAX_VERSION))


def decode_subscription(metadata: bytes) -> Subscription:
    """ConsumerProtocolSubscription, any version (fields of newer versions than 3 are
    ignored, as Kafka's schemas allow); raises ValueError."""
    reader = _Reader(metadata)
    try:
        version = reader.int16()
        if version < 0:
            raise ValueError(f"consumer protocol: version {version}")
        topics = tuple(reader.string() for _ in range(reader.count(2)))
        reader.nullable_bytes()  # user data: the client's own assignor's
        owned: frozenset[TopicPartition] = frozenset()
        rack_id = None
        # Fields of later versions are "ignorable": an older client's bytes end early.
        if version >= 1 and not reader.at_end():
            owned = reader.topic_partitions()
        if version >= 2 and not reader.at_end():
            reader.int32()  # generation id
        if version >= 3 and not reader.at_end():
            rack_id = reader.nullable_string()
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"consumer protocol: {exc}") from None
    return Subscription(version, topics, owned, rack_id)


def decode_assignment(data: bytes) -> frozenset[TopicPartition]:
    """ConsumerProtocolAssignment's partitions (empty bytes: nothing assigned yet);
    raises ValueError."""
    if not data:
        return frozenset()
    reader = _Reader(data)
    try:
        if reader.int16() < 0:
            raise ValueError("consumer protocol: negative assignment version")
        return reader.topic_partitions()
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"consumer protocol: {exc}") from None


def encode_assignment(partitions: Iterable[TopicPartition], version: int) -> bytes:
    """ConsumerProtocolAssignment (every version has the same fields), topics sorted,
    no user data."""
    per_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        per_topic.setdefault(topic, []).append(partition)
    out = [_I16.pack(max(0, min(version, MAX_VERSION))), _I32.pack(len(per_topic))]
    for topic in sorted(per_topic):
        name = topic.encode()
        parts = sorted(per_topic[topic])
        out += [_I16.pack(len(name)), name, _I32.pack(len(parts))]
        out += [_I32.pack(p) for p in parts]
    out.append(_I32.pack(-1))  # user data: null
    return b"".join(out)


def encode_subscription(
    topics: Iterable[str], version: int = 1, owned: Iterable[TopicPartition] = ()
) -> bytes:
    """ConsumerProtocolSubscription v0 or v1 (tests, and a downgraded group's members
    before they rejoin with their own)."""
    out = [_I16.pack(version)]
    names = sorted(set(topics))
    out.append(_I32.pack(len(names)))
    for topic in names:
        raw = topic.encode()
        out += [_I16.pack(len(raw)), raw]
    out.append(_I32.pack(-1))  # user data: null
    if version >= 1:
        per_topic: dict[str, list[int]] = {}
        for topic, partition in owned:
            per_topic.setdefault(topic, []).append(partition)
        out.append(_I32.pack(len(per_topic)))
        for topic in sorted(per_topic):
            raw = topic.encode()
            parts = sorted(per_topic[topic])
            out += [_I16.pack(len(raw)), raw, _I32.pack(len(parts))]
            out += [_I32.pack(p) for p in parts]
    return b"".join(out)
