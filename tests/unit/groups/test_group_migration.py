"""KIP-848's online migration in the coordinator (groups/coordinator.py): a classic group
with members becomes a consumer group when a consumer-protocol member joins (upgrade),
classic members join a consumer group, and the group goes back to a classic group when
its last consumer-protocol member leaves (downgrade); ``group.consumer.migration.policy``
decides, and every form of the group is stored so that a new coordinator loads it.
"""

from __future__ import annotations

from functools import partial

import attrs
import trio
import trio.testing

from tests.unit.groups.test_group_state import FakeBroker
from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import GroupCoordinator, Waiter
from trio_broker.groups.offsets_store import open_offsets_log
from trio_broker.groups.own_offsets import coordinator_alone
from trio_broker.protocol.consumer_protocol import (
    decode_assignment,
    encode_assignment,
    encode_subscription,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.consumer_group import LEAVE_EPOCH, Heartbeat
from trio_broker.state.group import GroupState, JoinRequest, JoinResult, SyncResult
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log

TOPICS = {"t": 4}
SESSION = 10_000


async def start(
    nursery: trio.Nursery, policy: str = "bidirectional", log: Log | None = None
) -> GroupCoordinator:
    config = BrokerConfig(
        storage="memory", group_initial_rebalance_delay_ms=0,
        group_consumer_migration_policy=policy,
    )  # fmt: skip
    broker = FakeBroker(config)
    await nursery.start(broker.flusher.run)
    opener = partial(open_offsets_log, None, LogConfig()) if log is None else (lambda: log)
    coordinator, own = coordinator_alone(broker, opener)
    await nursery.start(coordinator.run)
    await nursery.start(own.run)
    return coordinator


def join_request(member_id: str = "") -> JoinRequest:
    metadata = encode_subscription(["t"], 1)
    return JoinRequest(member_id, None, "client", "/127.0.0.1", SESSION, 30_000, "consumer",
                       (("range", metadata),), require_known_member_id=False)  # fmt: skip


async def settled(outcome: object) -> object:
    return await outcome.wait() if isinstance(outcome, Waiter) else outcome


async def stable_classic_group(coordinator: GroupCoordinator) -> tuple[str, int]:
    """One classic member holding all four partitions: (its id, the generation)."""
    joined = await settled(coordinator.join_group("g", join_request()))
    assert isinstance(joined, JoinResult) and joined.error is ErrorCode.NONE
    member, generation = joined.member_id, joined.generation_id
    everything = encode_assignment({("t", p) for p in range(4)}, 1)
    synced = await settled(coordinator.sync_group(
        "g", member, None, generation, None, None, {member: everything}))  # fmt: skip
    assert isinstance(synced, SyncResult) and synced.error is ErrorCode.NONE
    return member, generation


def consumer_join(coordinator: GroupCoordinator, member_id: str = "modern") -> int:
    result = coordinator.consumer_group_heartbeat(
        "g", Heartbeat(member_id, 0, rebalance_timeout_ms=30_000, subscribed=("t",),
                       owned=frozenset()), TOPICS,
    )  # fmt: skip
    assert result.error is ErrorCode.NONE, result
    return result.member_epoch


async def test_upgrade_then_downgrade_each_stored_for_a_new_coordinator(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as first_run:
            first = await start(first_run)
            classic_id, generation = await stable_classic_group(first)
            consumer_join(first)  # the upgrade
            assert "g" not in first.groups and "g" in first.consumer_groups
            group = first.consumer_groups["g"]
            assert group.members[classic_id].classic is not None
            await first.wait_group_stored("g")
            assert first.store.group_metadata("g") is None  # the classic record's tombstone
            # The classic member heartbeats with its generation and is told to rejoin.
            assert first.heartbeat("g", classic_id, None, generation) is (
                ErrorCode.REBALANCE_IN_PROGRESS
            )
            rejoined = first.join_group("g", join_request(classic_id), lambda: TOPICS)
            assert isinstance(rejoined, JoinResult) and rejoined.error is ErrorCode.NONE
            assert rejoined.generation_id == group.group_epoch
            await first.wait_group_stored("g")
            first_run.cancel_scope.cancel()
        log = first.store.log
        async with trio.open_nursery() as second_run:
            second = await start(second_run, log=log)  # a new coordinator on the same log
            group = second.consumer_groups["g"]
            assert group.members[classic_id].classic is not None
            synced = second.sync_group("g", classic_id, None, group.group_epoch, "consumer",
                                       "range", {})  # fmt: skip
            assert isinstance(synced, SyncResult) and synced.error is ErrorCode.NONE
            kept = decode_assignment(synced.assignment)
            # The consumer member leaves: the classic member is alone, the group classic.
            epoch = group.members["modern"].epoch
            left = second.consumer_group_heartbeat("g", Heartbeat("modern", LEAVE_EPOCH), TOPICS)
            assert left.error is ErrorCode.NONE
            assert "g" not in second.consumer_groups
            classic = second.groups["g"]
            assert classic.state is GroupState.PREPARING_REBALANCE
            await second.wait_group_stored("g")
            stored = second.store.group_metadata("g")
            assert stored is not None and [m.member_id for m in stored.members] == [classic_id]
            assert second.store.consumer_group_snapshot("g") is None
            assert epoch <= stored.generation_id
            assert decode_assignment(stored.members[0].assignment) == kept
            heartbeat = second.heartbeat("g", classic_id, None, stored.generation_id)
            assert heartbeat is ErrorCode.REBALANCE_IN_PROGRESS
            second_run.cancel_scope.cancel()
        outer.cancel_scope.cancel()


async def test_disabled_policy_keeps_a_live_classic_group_classic(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start(nursery, policy="disabled")
        await stable_classic_group(coordinator)
        result = coordinator.consumer_group_heartbeat(
            "g", Heartbeat("modern", 0, rebalance_timeout_ms=30_000, subscribed=("t",),
                           owned=frozenset()), TOPICS,
        )  # fmt: skip
        assert result.error is ErrorCode.GROUP_ID_NOT_FOUND
        assert "g" in coordinator.groups and "g" not in coordinator.consumer_groups
        nursery.cancel_scope.cancel()


async def test_upgrade_only_policy_keeps_the_classic_members_in_a_consumer_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start(nursery, policy="upgrade")
        classic_id, _ = await stable_classic_group(coordinator)
        consumer_join(coordinator)
        left = coordinator.consumer_group_heartbeat("g", Heartbeat("modern", LEAVE_EPOCH), TOPICS)
        assert left.error is ErrorCode.NONE
        group = coordinator.consumer_groups["g"]  # no downgrade
        assert list(group.members) == [classic_id]
        nursery.cancel_scope.cancel()


async def test_a_fenced_consumer_member_downgrades_the_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start(nursery)
        consumer_join(coordinator, "modern")
        joined = coordinator.join_group("g", join_request(), lambda: TOPICS)
        assert isinstance(joined, JoinResult) and joined.error is ErrorCode.NONE
        member = joined.member_id
        synced = coordinator.sync_group("g", member, None, joined.generation_id, None, None, {})
        assert isinstance(synced, SyncResult) and synced.error is ErrorCode.NONE
        # The classic member keeps its session with heartbeats; the consumer one is silent.
        for _ in range(7):
            await trio.sleep(SESSION / 1000 - 1)
            if "g" in coordinator.groups:
                break
            error = coordinator.heartbeat("g", member, None, joined.generation_id)
            assert error in (ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS)
        assert "g" in coordinator.groups and "g" not in coordinator.consumer_groups
        assert list(coordinator.groups["g"].members) == [member]
        nursery.cancel_scope.cancel()


async def test_a_classic_group_in_its_first_join_phase_upgrades_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No generation yet, so no protocol chosen: the member is subscribed as its first
    protocol says, its parked JoinGroup told to rejoin (a librdkafka member would take
    GROUP_ID_NOT_FOUND for the consumer-protocol one as fatal)."""
    async with trio.open_nursery() as nursery:
        coordinator = await start(nursery)
        coordinator.group_config = attrs.evolve(
            coordinator.group_config, initial_rebalance_delay_ms=3000
        )
        parked = coordinator.join_group("g", join_request())
        assert isinstance(parked, Waiter)  # the initial delay holds it
        consumer_join(coordinator)
        answered = await parked.wait()
        assert isinstance(answered, JoinResult)
        assert answered.error is ErrorCode.REBALANCE_IN_PROGRESS
        group = coordinator.consumer_groups["g"]
        rejoined = coordinator.join_group("g", join_request(answered.member_id), lambda: TOPICS)
        assert isinstance(rejoined, JoinResult) and rejoined.error is ErrorCode.NONE
        assert group.members[answered.member_id].subscribed == ("t",)
        nursery.cancel_scope.cancel()
