"""A share group's records in the offsets log (groups/share_records.py): their layout,
the replay that brings them back (latest record wins, tombstones), what an unreadable
value does, only the changed records written (a member's heartbeat, a member leaving),
and a group's members brought back by the replay."""

from __future__ import annotations

import struct
import uuid

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.groups.offsets_store import (
    SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION,
    SHARE_GROUP_MEMBER_KEY_VERSION,
    SHARE_GROUP_METADATA_KEY_VERSION,
    SHARE_GROUP_PARTITIONS_KEY_VERSION,
    SHARE_GROUP_TARGET_MEMBER_KEY_VERSION,
    SHARE_GROUP_TARGET_METADATA_KEY_VERSION,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    ShareGroupRecord,
    decode_record,
    encode_record,
)
from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.groups.share_records import (
    StoredMember,
    StoredShareGroup,
    StoredTopic,
    decode_group,
    decode_member,
    encode_member,
    record_values,
    records_of,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.state.share_group import ShareGroup, ShareHeartbeat
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)

topics = st.dictionaries(
    st.uuids(),
    st.builds(StoredTopic, st.text(max_size=20), st.frozensets(st.integers(0, 2**31 - 1))),
    max_size=5,
)
names = st.text(max_size=12)
assignments = st.frozensets(st.tuples(names, st.integers(0, 2**31 - 1)), max_size=4)
members = st.builds(
    StoredMember,
    st.none() | names,
    names,
    names,
    st.lists(names, max_size=3).map(tuple),
    st.integers(0, 2**31 - 1),
    st.integers(-1, 2**31 - 1),
    assignments,
    assignments,
)
groups = st.builds(
    StoredShareGroup,
    st.integers(0, 2**31 - 1),
    topics,
    st.dictionaries(st.uuids(), st.text(max_size=20), max_size=3),
    st.dictionaries(names, st.integers(0, 2**31 - 1), max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=12), members, max_size=3),
    topics,
)


def stored(group_id: str, store: OffsetsStore) -> StoredShareGroup | None:
    return decode_group(store.share_group_records(group_id))


def replayed(*writes: list[tuple[bytes, bytes | None]]) -> OffsetsStore:
    log = MemoryLog(LogConfig())
    for records in writes:
        log.append(build_batch(records, base_timestamp=0), now_ms=0)
    store = OffsetsStore(log)
    store.load()
    return store


@given(st.text(min_size=1, max_size=30), groups)
def test_records_round_trip_through_the_offsets_log(group_id: str, group: StoredShareGroup) -> None:
    encoded = [encode_record(r) for r in records_of(group_id, group)]
    assert [decode_record(k, v) for k, v in encoded] == records_of(group_id, group)
    assert stored(group_id, replayed(encoded)) == group


def test_the_partitions_value_is_version_1_without_initializing_topics() -> None:
    """Version 1 (initialized and deleting topics) is what a group without partitions
    being initialized writes, byte for byte as before initializing topics were kept, so
    a broker reading version 1 only still reads it; version 2 appends them."""
    settled = StoredShareGroup(initialized={T1: StoredTopic("t", frozenset({0, 1}))})
    value = record_values(settled)[SHARE_GROUP_PARTITIONS_KEY_VERSION, ""]
    assert value[:2] == b"\x00\x01"
    assert decode_group({(SHARE_GROUP_PARTITIONS_KEY_VERSION, ""): value}) == settled
    initializing = settled.with_initializing([(T2, "u", 3)])
    value = record_values(initializing)[SHARE_GROUP_PARTITIONS_KEY_VERSION, ""]
    assert value[:2] == b"\x00\x02"
    assert decode_group({(SHARE_GROUP_PARTITIONS_KEY_VERSION, ""): value}) == initializing
    # Initialized at last: out of the initializing topics, and version 1 again.
    done = initializing.with_partitions([(T2, "u", 3)])
    assert done.initializing == {}
    assert done.initialized[T2] == StoredTopic("u", frozenset({3}))
    assert record_values(done)[SHARE_GROUP_PARTITIONS_KEY_VERSION, ""][:2] == b"\x00\x01"
    # A failed initialization leaves neither.
    assert initializing.without_initializing([(T2, "u", 3)]) == settled
    assert initializing.partitions() == {(T1, 0), (T1, 1), (T2, 3)}


def test_the_latest_record_wins_and_tombstones_remove_the_group() -> None:
    first = StoredShareGroup(3).with_partitions([(T1, "a", 0), (T1, "a", 1)])
    later = first.with_partitions([(T2, "b", 4)], epoch=5).without_topics([T1])
    commit = encode_record((OffsetKey("other", "t", 0), OffsetAndMetadata(7)))
    store = replayed(
        [encode_record(r) for r in records_of("g", first)],
        [commit, *(encode_record(r) for r in records_of("g", later))],
    )
    assert (
        stored("g", store) == later == StoredShareGroup(5, {T2: StoredTopic("b", frozenset({4}))})
    )
    assert store.share_group_ids() == {"g"}
    # Share groups are not classic groups: the coordinator's classic restore skips them.
    assert store.group_ids() == ["other"]
    store = replayed(
        [encode_record(r) for r in records_of("g", later)],
        [encode_record(r) for r in records_of("g", None)],
    )
    assert stored("g", store) is None and store.share_group_ids() == set()


@pytest.mark.parametrize("cut", [1, 3, 7, 25])
def test_a_damaged_value_is_refused(cut: int) -> None:
    group = StoredShareGroup(2).with_partitions([(T1, "topic", 3)])
    _, partitions = encode_record(records_of("g", group)[1])
    assert partitions is not None
    with pytest.raises(ValueError):
        decode_group({(SHARE_GROUP_PARTITIONS_KEY_VERSION, ""): partitions[:cut]})
    with pytest.raises(ValueError):
        decode_group({(SHARE_GROUP_METADATA_KEY_VERSION, ""): (9).to_bytes(2, "big") + b"\0\0\0\1"})


@given(st.text(min_size=1, max_size=30), groups, groups)
def test_a_change_writes_what_changed_and_replays_to_the_new_group(
    group_id: str, before: StoredShareGroup, after: StoredShareGroup
) -> None:
    """The records from ``before`` to ``after``, replayed over ``before``'s, give
    ``after``; a record is written only if its value changed or it is gone."""
    change = records_of(group_id, after, before)
    store = replayed(
        [encode_record(r) for r in records_of(group_id, before)],
        [encode_record(r) for r in change] or [encode_record(records_of(group_id, after)[0])],
    )
    assert stored(group_id, store) == after
    assert records_of(group_id, after, after) == []


def heartbeat(group: ShareGroup, member: str, epoch: int, now_ms: int = 0) -> int:
    result = group.heartbeat(ShareHeartbeat(member, epoch, None, ("t",)), {"t": 2}, now_ms)
    assert result.error is ErrorCode.NONE, result
    return result.member_epoch


def test_members_come_back_with_their_epochs_and_a_leave_is_tombstoned() -> None:
    """Two members join and heartbeat (a record set per change, each replayed); the
    replay brings back each member's epochs, assignment and target, and the group's
    epoch and metadata; a member that then left has its three records' tombstones."""
    group = ShareGroup("g")
    heartbeat(group, "m1", 0)
    written: list[list[tuple[bytes, bytes | None]]] = []
    known: StoredShareGroup | None = None

    def store() -> list[tuple[int, str, bytes | None]]:
        nonlocal known
        now = StoredShareGroup().with_membership(group)
        change = records_of("g", now, known)
        written.append([encode_record(r) for r in change])
        known = now
        return [(r.key_version, r.member_id, r.value) for r in change]

    store()
    epoch = heartbeat(group, "m2", 0)
    store()
    # m1 moves to the new epoch at its own heartbeat: only its current assignment changes.
    assert heartbeat(group, "m1", 1) == epoch
    [(version, member, _)] = store()
    assert (version, member) == (SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, "m1")

    back = stored("g", replayed(*written))
    assert back is not None and back.epoch == epoch == group.group_epoch
    assert back.metadata == {"t": 2}
    for member_id, member in group.members.items():
        restored = back.members[member_id].restored(member_id, deadline_ms=99)
        assert restored == attrs.evolve(member, deadline_ms=99)
        assert back.members[member_id].target == group.target[member_id]

    heartbeat(group, "m2", -1)
    gone = store()
    assert {(v, m, value) for v, m, value in gone if m == "m2"} == {
        (SHARE_GROUP_MEMBER_KEY_VERSION, "m2", None),
        (SHARE_GROUP_TARGET_MEMBER_KEY_VERSION, "m2", None),
        (SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, "m2", None),
    }
    back = stored("g", replayed(*written))
    assert back is not None and set(back.members) == {"m1"}
    # Deleted: every record's tombstone, the group's target metadata too.
    tombstones = records_of("g", None, known)
    assert all(r.value is None for r in tombstones)
    assert {r.key_version for r in tombstones} >= {SHARE_GROUP_TARGET_METADATA_KEY_VERSION}
    written.append([encode_record(r) for r in tombstones])
    assert stored("g", replayed(*written)) is None


def test_a_member_without_a_current_assignment_is_not_restored() -> None:
    """Its epochs are in that record: without it the member rejoins."""
    group = ShareGroup("g")
    heartbeat(group, "m1", 0)
    values = [
        encode_record(r)
        for r in records_of("g", StoredShareGroup().with_membership(group))
        if r.key_version != SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION
    ]
    back = stored("g", replayed(values))
    assert back is not None and back.members == {} and back.epoch == group.group_epoch


def test_a_member_with_a_damaged_record_is_left_out_and_the_others_stay() -> None:
    group = ShareGroup("g")
    heartbeat(group, "m1", 0)
    heartbeat(group, "m2", 0)
    values = [encode_record(r) for r in records_of("g", StoredShareGroup().with_membership(group))]
    damaged = [ShareGroupRecord(SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, "g", b"\0\1\0", "m2")]
    back = stored("g", replayed(values, [encode_record(r) for r in damaged]))
    assert back is not None and set(back.members) == {"m1"}


def test_a_member_and_rack_id_past_32_kib_round_trip() -> None:
    """A client's member and rack ids are compact strings, of any length (Kafka refuses
    none): the membership records take them (a 16-bit length could not)."""
    long_id, long_rack = "m" * 40_000, "r" * 40_000
    group = ShareGroup("g")
    result = group.heartbeat(ShareHeartbeat(long_id, 0, long_rack, ("t",)), {"t": 1}, 0)
    assert result.error is ErrorCode.NONE
    now = StoredShareGroup().with_membership(group)
    back = stored("g", replayed([encode_record(r) for r in records_of("g", now)]))
    assert back == now and back.members[long_id].rack_id == long_rack


def test_assignments_carry_topic_ids_and_a_recreated_topics_are_dropped_at_a_load() -> None:
    """The members' assignments are stored with their topics' ids (value version 2); a
    load leaves out the partitions of a topic whose id is not the stored one (deleted,
    perhaps created again under its name: another topic), from what the member was told
    and from its target. A version 1 value (names only) still reads, and keeps all."""
    group = ShareGroup("g")
    result = group.heartbeat(ShareHeartbeat("m1", 0, None, ("t", "u")), {"t": 1, "u": 1}, 0)
    assert result.assignment == frozenset({("t", 0), ("u", 0)})
    ids = {"t": T1, "u": T2}
    back = stored("g", replayed([encode_record(r) for r in records_of(
        "g", StoredShareGroup().with_membership(group, ids))]))  # fmt: skip
    assert back is not None and back.members["m1"].topic_ids == ids
    # "t" was deleted and created again (a new id); "u" is the same topic.
    now = {"t": uuid.UUID(int=3), "u": T2}
    shares = ShareGroups(ShareGroupsConfig())
    shares.recall_groups(["g"])
    shares.restore_members({"g": back}, now_ms=0, topic_ids=now)
    restored = shares.groups["g"]
    assert restored.members["m1"].assignment == frozenset({("u", 0)})
    assert restored.target["m1"] == frozenset({("u", 0)})
    # Without the ids now (a caller that has none), or from version 1, nothing is left out.
    shares = ShareGroups(ShareGroupsConfig())
    shares.recall_groups(["g"])
    shares.restore_members({"g": back}, now_ms=0)
    assert shares.groups["g"].members["m1"].assignment == result.assignment
    current_v1 = b"\x00\x01" + struct.pack(">iii", 1, 0, 1) + struct.pack(">i", 1) + b"t"
    current_v1 += struct.pack(">i", 0)
    member = encode_member(back.members["m1"])
    old = decode_member(member, None, current_v1)
    assert old is not None and old.assignment == frozenset({("t", 0)}) and old.topic_ids == {}
    assert old.same_topics(old.assignment, now) == old.assignment
