"""Stored group membership: the record format, the restore rules, the coordinator's writes.

A completed generation is one record of the offsets log keyed by the group; a new
coordinator that replays the log restores the group Stable, with its members.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from tests.unit.groups.test_group_state import (
    FakeBroker,
    join,
    join_req,
    stable_group,
    start_coordinator,
)
from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import GroupCoordinator, Waiter, store_error
from trio_broker.groups.offsets_store import (
    GROUP_METADATA_RECORD_TYPE,
    GroupMetadata,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    decode_record,
    encode_record,
)
from trio_broker.groups.own_offsets import coordinator_alone
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.state.group import (
    Group,
    GroupConfig,
    GroupRecord,
    GroupState,
    MemberRecord,
    SyncResult,
)
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

S = GroupState

MEMBERS = (
    MemberRecord("m0", None, "client-a", "/127.0.0.1", 30_000, 10_000, b"sub0", b"as0"),
    MemberRecord("m1", "static-1", "client-b", "/10.0.0.2", 45_000, 6_000, b"", b"as1"),
)
RECORD = GroupRecord("consumer", 7, "range", "m1", MEMBERS)


# ------------------------------------------------------------------------- record format


@pytest.mark.parametrize(
    "record",
    [
        GroupMetadata("g", RECORD),
        GroupMetadata("ü-group", GroupRecord("consumer", 3, None, None, ())),
        GroupMetadata("g", GroupRecord(None, 0, None, None, ())),
        GroupMetadata("g", None),  # a tombstone
    ],
)
def test_group_metadata_round_trips(record: GroupMetadata) -> None:
    key, value = encode_record(record)
    assert int.from_bytes(key[:2], "big") == GROUP_METADATA_RECORD_TYPE  # Kafka's
    assert (value is None) == (record.value is None)
    assert decode_record(key, value) == record


def test_key_is_the_group_alone() -> None:
    """Compaction keeps the latest record per key: one per group, whatever its generation."""
    first, _ = encode_record(GroupMetadata("g", RECORD))
    later, _ = encode_record(GroupMetadata("g", GroupRecord("consumer", 8, None, None, ())))
    tombstone, _ = encode_record(GroupMetadata("g", None))
    assert first == later == tombstone
    assert first != encode_record(GroupMetadata("h", RECORD))[0]


@pytest.mark.parametrize("cut", [2, 5, 20, 60])
def test_truncated_value_is_refused(cut: int) -> None:
    key, value = encode_record(GroupMetadata("g", RECORD))
    assert value is not None
    with pytest.raises((ValueError, Exception)):
        decode_record(key, value[:cut])


def store_with(*batches: list[tuple[bytes, bytes | None]]) -> OffsetsStore:
    log = MemoryLog(LogConfig())
    for records in batches:
        log.append(build_batch(records, base_timestamp=0), now_ms=0)
    store = OffsetsStore(log)
    store.load()
    return store


def test_unknown_key_and_value_versions_are_skipped() -> None:
    """What an older broker does with a record it does not know: skips it and loads the rest
    (this is how a broker that predates group metadata reads a log holding it)."""
    commit = encode_record((OffsetKey("g", "t", 0), OffsetAndMetadata(5)))
    future_key = ((99).to_bytes(2, "big") + b"\x00\x01g", b"whatever")
    key, value = encode_record(GroupMetadata("g", RECORD))
    assert value is not None
    future_value = (key, (2).to_bytes(2, "big") + value[2:])
    store = store_with([future_key, commit, future_value])
    assert store.get("g", "t", 0) == OffsetAndMetadata(5)
    assert store.group_metadata("g") is None


def test_latest_record_wins_and_tombstone_removes() -> None:
    newer = GroupRecord("consumer", 8, "range", "m0", MEMBERS[:1])
    store = store_with([encode_record(GroupMetadata("g", RECORD))],
                       [encode_record(GroupMetadata("g", newer))])  # fmt: skip
    assert store.group_metadata("g") == newer
    assert store.group_ids() == ["g"]  # a stored group is loaded even without offsets
    gone = store_with([encode_record(GroupMetadata("g", RECORD))],
                      [encode_record(GroupMetadata("g", None))])  # fmt: skip
    assert gone.group_metadata("g") is None and gone.group_ids() == []


# ------------------------------------------------------------------------- restore rules


def test_stable_group_restores_stable_with_members() -> None:
    group, ids = stable_group(members=3)
    record = group.record()
    assert record.generation_id == 1 and record.leader_id == "m0"
    assert [m.assignment for m in record.members] == [m.encode() for m in ids]
    restored = Group.restore("g", record, GroupConfig(), now_ms=50_000)
    assert restored.state is S.STABLE
    assert (restored.generation_id, restored.leader_id, restored.protocol_name) == (
        1,
        "m0",
        "range",
    )
    assert restored.protocol_type == "consumer"
    assert [m.assignment for m in restored.members.values()] == [m.encode() for m in ids]
    assert restored.summary() == group.summary()
    # Sessions start at load time; heartbeats of the stored generation go on.
    assert restored.next_deadline() == 50_000 + 10_000
    assert restored.heartbeat("m1", None, 1, 55_000) is ErrorCode.NONE
    assert restored.heartbeat("m1", None, 0, 55_000) is ErrorCode.ILLEGAL_GENERATION
    sync = restored.sync("m2", None, 1, None, None, {}, 55_000, "w")
    assert sync.result == SyncResult(ErrorCode.NONE, "consumer", "range", b"m2")
    # A member that never comes back times out as usual and the rest rebalance.
    restored.advance_to(60_000)
    assert restored.state is S.PREPARING_REBALANCE and "m0" not in restored.members


def test_restore_keeps_static_members_and_leader_first() -> None:
    restored = Group.restore("g", RECORD, GroupConfig(), now_ms=0)
    assert list(restored.members) == ["m1", "m0"]  # the leader first
    assert restored.static_members == {"static-1": "m1"}
    assert restored.heartbeat("other", "static-1", 7, 1) is ErrorCode.FENCED_INSTANCE_ID
    assert restored.members["m1"].session_timeout_ms == 6_000
    assert restored.members["m1"].rebalance_timeout_ms == 45_000
    assert restored.members["m0"].client_host == "/127.0.0.1"
    assert restored.record() == GroupRecord("consumer", 7, "range", "m1", (MEMBERS[1], MEMBERS[0]))


def test_empty_record_restores_empty_with_its_generation() -> None:
    restored = Group.restore("g", GroupRecord("consumer", 4, None, None, ()), GroupConfig(), 9)
    assert restored.state is S.EMPTY and restored.generation_id == 4
    assert restored.protocol_type == "consumer" and restored.state_since_ms == 9
    assert restored.next_deadline() is None


@pytest.mark.parametrize(
    "record",
    [
        GroupRecord("consumer", 1, "range", "nobody", MEMBERS),  # leader not a member
        GroupRecord("consumer", 1, None, "m0", MEMBERS),  # members but no protocol
        GroupRecord(None, 1, "range", "m0", MEMBERS),
        GroupRecord("consumer", 1, "range", "m0", (MEMBERS[0], MEMBERS[0])),  # duplicate
        GroupRecord("consumer", -1, None, None, ()),
    ],
)
def test_contradictory_record_is_refused(record: GroupRecord) -> None:
    with pytest.raises(ValueError):
        Group.restore("g", record, GroupConfig(), 0)


def test_only_stable_or_empty_groups_are_stored() -> None:
    group = Group("g")
    group.join(join_req(v4=False), 0, "m0", "w")
    with pytest.raises(ValueError):
        group.record()


def completing_with_the_leader_synced() -> Group:
    """Generation 1 of m0 (leader) and m1, the leader's assignment written but not yet
    stored; m1 has not sent SyncGroup."""
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    for mid in ("m0", "m1"):
        group.join(join_req(v4=False), 0, mid, f"j-{mid}")
    group.advance_to(0)
    out = group.sync("m0", None, 1, None, None, {"m0": b"a0", "m1": b"a1"}, 5, "s0")
    assert out.result is None and not out.replies and out.store is not None
    assert [(m.member_id, m.assignment) for m in out.store.members] == [
        ("m0", b"a0"), ("m1", b"a1"),
    ]  # fmt: skip
    assert group.state is S.COMPLETING_REBALANCE and group.store_pending
    return group


def test_a_follower_waits_for_the_write_of_the_leaders_assignment() -> None:
    group = completing_with_the_leader_synced()
    # The follower comes after the leader, while the write is on its way: it waits too.
    assert group.sync("m1", None, 1, None, None, {}, 6, "s1").result is None
    assert group.summary().members[1].assignment == b""  # not Stable: nothing to show
    # A leader's retry neither answers nor writes again: its first assignment stands.
    retry = group.sync("m0", None, 1, None, None, {"m0": b"other"}, 7, "s0b")
    assert retry.result is None and retry.store is None and not retry.replies
    # The write counts: Stable, and everyone waiting is answered in that one step.
    replies = {r.waiter: r.result for r in group.store_completed(1, ErrorCode.NONE, 8)}
    ok = SyncResult(ErrorCode.NONE, "consumer", "range", b"a0")
    assert replies == {"s0": ok, "s0b": ok, "s1": attrs.evolve(ok, assignment=b"a1")}
    assert group.state is S.STABLE and group.state_since_ms == 8
    assert group.record().members[1].assignment == b"a1"
    # Sessions restart when the parked requests are answered.
    assert [m.session_deadline_ms for m in group.members.values()] == [10_008, 10_008]


def test_a_follower_syncing_after_the_write_is_answered_at_once() -> None:
    group = completing_with_the_leader_synced()
    assert [r.waiter for r in group.store_completed(1, ErrorCode.NONE, 8)] == ["s0"]
    assert group.sync("m1", None, 1, None, None, {}, 9, "s1").result == SyncResult(
        ErrorCode.NONE, "consumer", "range", b"a1"
    )


@pytest.mark.parametrize("error", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
def test_a_failed_write_answers_everyone_the_error_and_rebalances(error: ErrorCode) -> None:
    group = completing_with_the_leader_synced()
    group.sync("m1", None, 1, None, None, {}, 6, "s1")
    replies = {r.waiter: r.result for r in group.store_completed(1, error, 8)}
    assert replies == {"s0": SyncResult(error), "s1": SyncResult(error)}
    assert group.state is S.PREPARING_REBALANCE and not group.store_pending
    assert all(m.assignment == b"" for m in group.members.values())
    assert group.heartbeat("m0", None, 1, 9) is ErrorCode.REBALANCE_IN_PROGRESS


def test_a_write_of_an_abandoned_generation_changes_nothing() -> None:
    group = completing_with_the_leader_synced()
    group.sync("m1", None, 1, None, None, {}, 6, "s1")
    # m1 leaves while generation 1 is being written: the waiting leader must rejoin.
    error, replies = group.leave("m1", None, 7)
    assert error is ErrorCode.NONE
    assert {r.waiter: r.result for r in replies} == {
        "s0": SyncResult(ErrorCode.REBALANCE_IN_PROGRESS),
        "s1": SyncResult(ErrorCode.UNKNOWN_MEMBER_ID),
    }
    assert group.state is S.PREPARING_REBALANCE and not group.store_pending
    # Generation 1's write counts (or fails) later: too late, nothing happens.
    assert group.store_completed(1, ErrorCode.NONE, 8) == []
    assert group.store_completed(1, ErrorCode.NOT_COORDINATOR, 8) == []
    assert group.state is S.PREPARING_REBALANCE
    # Generation 2 goes on; an old write arriving now is still ignored.
    group.join(join_req("m0", v4=False), 9, "x", "j0")
    assert group.state is S.COMPLETING_REBALANCE and group.generation_id == 2
    assert group.sync("m0", None, 2, None, None, {"m0": b"b0"}, 9, "t0").store is not None
    assert group.store_completed(1, ErrorCode.NONE, 10) == []
    assert group.state is S.COMPLETING_REBALANCE and group.store_pending
    assert [r.waiter for r in group.store_completed(2, ErrorCode.NONE, 11)] == ["t0"]
    assert group.state is S.STABLE


# ------------------------------------------------------------------------- the coordinator


async def stable_in(coordinator: GroupCoordinator) -> str:
    result = await join(coordinator, join_req(v4=False))
    outcome = coordinator.sync_group("g", result.member_id, None, 1, None, None,
                                     {result.member_id: b"mine"})  # fmt: skip
    assert isinstance(outcome, Waiter)
    answered = await outcome.wait()
    assert answered == SyncResult(ErrorCode.NONE, "consumer", "range", b"mine")
    return result.member_id


async def test_coordinator_stores_and_a_new_one_restores(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as first_run:
            first = await start_coordinator(first_run, delay=0)
            member_id = await stable_in(first)
            # Answered only once stored: the record is already in the table.
            stored = first.store.group_metadata("g")
            assert stored is not None and stored.generation_id == 1
            assert [m.member_id for m in stored.members] == [member_id]
            await trio.sleep(8)  # most of the 10 s session is gone at the move
            # The first coordinator is gone at the move. Left running, its session timer
            # would empty the group in the log the second one replays, while that replay
            # runs in a worker thread and the mock clock jumps.
            first_run.cancel_scope.cancel()
        broker = FakeBroker(BrokerConfig(storage="memory", group_initial_rebalance_delay_ms=0))
        await nursery.start(broker.flusher.run)
        log = first.store.log
        second, own = coordinator_alone(broker, lambda: log)  # the same log, replayed
        await nursery.start(second.run)
        await nursery.start(own.run)
        group = second.groups["g"]
        assert group.state is S.STABLE and group.generation_id == 1
        await trio.sleep(9)  # the session restarted at load: still a member
        assert second.heartbeat("g", member_id, None, 1) is ErrorCode.NONE
        described = second.describe_group("g")
        assert described is not None and described.members[0].assignment == b"mine"
        nursery.cancel_scope.cancel()


async def test_emptied_group_is_stored_without_members_and_delete_tombstones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=0)
        member_id = await stable_in(coordinator)
        assert coordinator.leave_group("g", [(member_id, None)]) == [ErrorCode.NONE]
        assert coordinator.groups["g"].state is S.EMPTY
        assert coordinator.store.group_metadata("g") == GroupRecord("consumer", 2, None, None, ())
        results, writes = coordinator.delete_groups(["g"])
        assert results == {"g": ErrorCode.NONE}
        for write in writes:
            await coordinator.wait_offsets_durable(write)
        assert coordinator.store.group_metadata("g") is None
        assert coordinator.store.group_ids() == []
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("failure", "answer"),
    [
        (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.NOT_COORDINATOR, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REBALANCE_IN_PROGRESS),
        (ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.UNKNOWN_SERVER_ERROR),
        (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    ],
)
def test_a_failed_generation_write_is_answered_as_kafka_does(
    failure: ErrorCode, answer: ErrorCode
) -> None:
    assert store_error(failure) is answer


async def test_sync_answers_not_coordinator_when_the_store_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A storage error on the offsets log means this broker cannot coordinate the group
    (Kafka answers a failed group metadata append's KAFKA_STORAGE_ERROR this way)."""
    from trio_broker.storage.errors import StorageError

    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=0)
        result = await join(coordinator, join_req(v4=False))

        def failing_append(*_args: object, **_kwargs: object) -> None:
            raise StorageError("disk full")

        coordinator.store.log.append = failing_append
        outcome = coordinator.sync_group("g", result.member_id, None, 1, None, None, {})
        answered = await outcome.wait() if isinstance(outcome, Waiter) else outcome
        assert answered == SyncResult(ErrorCode.NOT_COORDINATOR)
        # The generation was not stored: its members are asked to rejoin.
        assert coordinator.groups["g"].state is S.PREPARING_REBALANCE
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------- compaction


def test_compaction_keeps_the_latest_generation_and_drops_removed_groups(tmp_path: Path) -> None:
    """The cleaner keeps one metadata record per group (the latest); a removed group's
    tombstone is all that is left of it, and replaying the cleaned log loads the same."""
    from tests.unit.storage.test_cleaner import T0, open_log, read_all, sealed
    from trio_broker.storage.cleaner import clean_log

    log = sealed(open_log(tmp_path / "offsets"))
    store = OffsetsStore(log)
    for generation in range(1, 30):
        record = GroupRecord("consumer", generation, "range", "m1", MEMBERS)
        store.apply(store.append([GroupMetadata("kept", record)], T0))
        store.apply(store.append([GroupMetadata("removed", record)], T0))
    store.apply(store.append([GroupMetadata("removed", None)], T0))
    store.apply(store.append([(OffsetKey("kept", "t", 0), OffsetAndMetadata(3))], T0))
    log.flush()
    assert log.cleanable_segments(), "the test needs sealed segments to clean"
    clean_log(log, T0 + 1000)
    keys = [key for _offset, key, _value, _ts in read_all(log)]
    kept_key = encode_record(GroupMetadata("kept", None))[0]
    removed_key = encode_record(GroupMetadata("removed", None))[0]
    assert keys.count(kept_key) == 1 and keys.count(removed_key) == 1
    replayed = OffsetsStore(log)
    replayed.load()
    assert replayed.group_metadata("kept") == GroupRecord("consumer", 29, "range", "m1", MEMBERS)
    assert replayed.group_metadata("removed") is None
    assert sorted(replayed.group_ids()) == ["kept"]
    log.close()
