"""Durable share-partition state (trio_broker/groups/share_state.py): the snapshot
record's layout, a share partition restored from its snapshot, and the table replayed
from the log."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.groups.share_state import (
    ShareKey,
    ShareSnapshot,
    ShareStateStore,
    StateBatch,
    decode_key,
    decode_value,
    encode_batch,
    encode_key,
    encode_value,
    restore,
    snapshot_of,
)
from trio_broker.partition.append import Origin, append
from trio_broker.partition.partition import Partition, coordinator_partition
from trio_broker.protocol.records import build_batch
from trio_broker.services.local_replication import OwnLog
from trio_broker.state.share_partition import RecordState, SharePartition
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.memory import MemoryLog

TOPIC = uuid.UUID(int=7)
LIMIT = 3


@st.composite
def snapshots(draw: st.DrawFn) -> ShareSnapshot:
    start = draw(st.integers(0, 2**40))
    batches, at = [], start
    for _ in range(draw(st.integers(0, 6))):
        first = at + draw(st.integers(0, 5))
        last = first + draw(st.integers(0, 5))
        state = draw(st.sampled_from([RecordState.AVAILABLE, RecordState.ACKNOWLEDGED,
                                      RecordState.ARCHIVED]))  # fmt: skip
        batches.append(StateBatch(first, last, state, draw(st.integers(0, 2**15 - 1))))
        at = last + 1
    ints = st.integers(-(2**31), 2**31 - 1)
    return ShareSnapshot(start, tuple(batches), draw(ints), draw(ints), draw(ints),
                         draw(st.integers(-1, 2**50)))  # fmt: skip


@given(group=st.text(max_size=20), partition=st.integers(0, 2**31 - 1), snap=snapshots())
def test_snapshot_records_round_trip(group: str, partition: int, snap: ShareSnapshot) -> None:
    key = ShareKey(group, uuid.uuid4(), partition)
    assert decode_key(encode_key(key)) == key
    assert decode_value(encode_value(snap)) == snap


def test_unreadable_snapshots_are_refused() -> None:
    good = encode_value(ShareSnapshot(10, (StateBatch(10, 12, RecordState.ARCHIVED, 1),)))
    assert decode_value(good).start_offset == 10
    with pytest.raises(ValueError):
        decode_value(good[:-1])  # truncated
    with pytest.raises(ValueError):
        decode_value(b"\x00\x02" + good[2:])  # a newer layout
    overlapping = ShareSnapshot(0, (StateBatch(0, 3, RecordState.AVAILABLE, 1),
                                    StateBatch(3, 4, RecordState.AVAILABLE, 1)))  # fmt: skip
    with pytest.raises(ValueError):
        decode_value(encode_value(overlapping))
    acquired = ShareSnapshot(0, (StateBatch(0, 0, RecordState.ACQUIRED, 1),))
    with pytest.raises(ValueError):
        decode_value(encode_value(acquired))  # locks are never stored
    with pytest.raises(ValueError):
        decode_key(b"\x00\x09" + encode_key(ShareKey("g", TOPIC, 0))[2:])


# A share partition driven at random: acquisitions by two members, acknowledgements,
# members leaving, locks running out, records deleted from the log.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from("ab"), st.integers(1, 6)),
        st.tuples(
            st.just("ack"),
            st.sampled_from("ab"),
            st.integers(0, 30),
            st.integers(0, 4),
            st.sampled_from([0, 1, 2, 3]),
        ),
        st.tuples(st.just("leave"), st.sampled_from("ab")),
        st.tuples(st.just("time"), st.integers(0, 200)),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=40,
)


def drive(steps: list[tuple[Any, ...]]) -> tuple[SharePartition, int]:
    share_partition = SharePartition(0, lock_duration_ms=100, delivery_count_limit=LIMIT)
    now = 0
    for step in steps:
        kind = step[0]
        if kind == "acquire":
            share_partition.acquire(str(step[1]), 30, int(step[2]), now)
        elif kind == "ack":
            first = int(step[2])
            share_partition.acknowledge(str(step[1]), first, first + int(step[3]),
                                        [int(step[4])], now)  # fmt: skip
        elif kind == "leave":
            share_partition.release_member(str(step[1]))
        elif kind == "time":
            now += int(step[1])
        else:
            share_partition.skip_to(int(step[1]))
    return share_partition, now


@settings(max_examples=300)
@given(steps=ops)
def test_a_restored_partition_is_the_old_one_with_every_lock_lost(
    steps: list[tuple[Any, ...]],
) -> None:
    share_partition, now = drive(steps)
    restored = restore(decode_value(encode_value(snapshot_of(share_partition))),
                       lock_duration_ms=100, delivery_count_limit=LIMIT, max_in_flight=2_000)  # fmt: skip
    # The model: the same partition after its members' locks are gone.
    model = copy.deepcopy(share_partition)
    for member in "ab":
        model.release_member(member)
    assert restored.start_offset == model.start_offset
    for offset in range(0, 40):
        assert restored.state_of(offset) == model.state_of(offset), offset
        if offset in model.records:
            assert restored.records[offset].delivery_count == model.records[offset].delivery_count
    # And it goes on the same way: the next acquisition gets the same records.
    assert restored.acquire("c", 30, 50, now) == model.acquire("c", 30, 50, now)


def test_an_acquired_record_on_its_last_delivery_is_archived_by_a_restart() -> None:
    share_partition = SharePartition(0, delivery_count_limit=1)
    assert [r.last_offset for r in share_partition.acquire("a", 3, 10, 0)] == [2]
    share_partition.acknowledge("a", 0, 0, [1], 0)
    snapshot = snapshot_of(share_partition)
    # 1 and 2 would be archived when their locks ran out: the start moves past them.
    assert (snapshot.start_offset, snapshot.batches) == (3, ())
    restored = restore(snapshot, lock_duration_ms=100, delivery_count_limit=1, max_in_flight=10)
    assert restored.acquire("b", 3, 10, 0) == []


def own(log: Log) -> Partition:
    """``log`` as a share coordinator of one writes it (a node alone's ``OwnLog``)."""
    return coordinator_partition(OwnLog(0, log), "__share_group_state", 0, log)


def write(store: ShareStateStore, entries: list[tuple[ShareKey, ShareSnapshot | None]]) -> None:
    append(own(store.log), encode_batch(entries, 0), origin=Origin.COORDINATOR, now_ms=0,
           durability=None)  # fmt: skip
    store.appended(entries)


def test_the_table_is_replayed_from_the_log_last_record_wins() -> None:
    store = ShareStateStore(MemoryLog(LogConfig()))
    key, other = ShareKey("g", TOPIC, 0), ShareKey("g", TOPIC, 1)
    write(store, [(key, ShareSnapshot(5, write_timestamp_ms=1_000)), (other, ShareSnapshot(0))])
    changed = (key, ShareSnapshot(8, snapshot_epoch=1, write_timestamp_ms=3_000))
    write(store, [changed, (other, None)])
    # A record this broker cannot read (a newer key version) is skipped.
    append(own(store.log), build_batch([(b"\x00\x63junk", b"")], base_timestamp=0),
           origin=Origin.COORDINATOR, now_ms=0, durability=None)  # fmt: skip
    replayed = ShareStateStore(store.log)
    assert replayed.load() == 5
    assert replayed.snapshots == {key: changed[1]}  # the last of the key, no tombstoned one
    assert replayed.snapshots == store.snapshots


def test_share_groups_restore_their_partitions_and_an_empty_group() -> None:
    shares = ShareGroups(ShareGroupsConfig(delivery_count_limit=LIMIT))
    snapshot = ShareSnapshot(4, (StateBatch(4, 4, RecordState.AVAILABLE, 2),
                                 StateBatch(5, 5, RecordState.ACKNOWLEDGED, 1)))  # fmt: skip
    shares.restore({ShareKey("g", TOPIC, 0): snapshot})
    group = shares.group("g", 0)
    assert group is not None and group.state == "Empty"
    found = shares.partition("g", TOPIC, 0)
    assert found is not None and found.start_offset == 4
    # Made again on assignment, it is the restored one, not a fresh one at the log end.
    assert shares.ensure_partition("g", TOPIC, 0, 100) is found
    assert [(r.first_offset, r.last_offset, r.delivery_count)
            for r in found.acquire("m", 7, 10, 0)] == [(4, 4, 3), (6, 6, 1)]  # fmt: skip


def test_a_state_epoch_is_kept_and_deletions_are_tombstones() -> None:
    """A share partition started over (InitializeShareGroupState: a new state epoch) keeps
    that epoch through its snapshots; deleting stored keys writes their tombstones."""
    snapshot = ShareSnapshot(4, state_epoch=1)
    found = restore(decode_value(encode_value(snapshot)), lock_duration_ms=1,
                    delivery_count_limit=1, max_in_flight=1)  # fmt: skip
    assert (found.start_offset, found.state_epoch, found.records) == (4, 1, {})
    assert snapshot_of(found).state_epoch == 1
    store = ShareStateStore(MemoryLog(LogConfig()))
    key = ShareKey("g", TOPIC, 0)
    write(store, [(key, snapshot)])
    assert store.tombstones([key, ShareKey("g", TOPIC, 9)]) == [(key, None)]


def test_share_partitions_belong_to_a_topic_id_and_go_with_the_topic() -> None:
    """A topic created again under its name has another id: no share state of its own;
    deleting a topic drops every group's share partitions of it."""
    shares = ShareGroups(ShareGroupsConfig())
    recreated = uuid.UUID(int=8)
    shares.ensure_partition("g", TOPIC, 0, 10)
    shares.ensure_partition("h", TOPIC, 1, 10)
    shares.ensure_partition("g", recreated, 0, 3)
    assert shares.partition("g", recreated, 0) is not shares.partition("g", TOPIC, 0)
    assert sorted(shares.forget_topic(TOPIC), key=str) == sorted(
        [ShareKey("g", TOPIC, 0), ShareKey("h", TOPIC, 1)], key=str
    )
    assert [(t, p) for t, p, _ in shares.partitions_of("g")] == [(recreated, 0)]
    assert shares.partitions_of("h") == []
