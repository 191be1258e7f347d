"""The group coordinator in a cluster, in process (no ZooKeeper): the replica manager's
leadership calls are fed directly.

One table per led ``__consumer_offsets`` partition, replayed from that partition's log
in the background (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and dropped on resignation
(parked joins answer NOT_COORDINATOR); groups of partitions led elsewhere answer
NOT_COORDINATOR through every group API; writes carry the leader epoch and count only
below the high watermark, within offsets.commit.timeout.ms.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from tests.clustered_broker import ME, ClusteredBroker, Term
from trio_broker.config import BrokerConfig
from trio_broker.groups import GroupCoordinator, OffsetAndMetadata, OffsetKey, OffsetsStore
from trio_broker.groups.coordinator import Waiter
from trio_broker.handlers.base import ClientInfo, RequestContext
from trio_broker.handlers.find_coordinator import handle_find_coordinator
from trio_broker.handlers.groups import (
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_list_groups,
)
from trio_broker.handlers.offsets import handle_offset_commit, handle_offset_fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.messages import RequestHeader
from trio_broker.replication.leader import AckState
from trio_broker.server.flusher import Flusher
from trio_broker.services.cluster_view import BrokerInfo, PartitionInfo, TopicInfo
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, NotCommitted, partition_for
from trio_broker.state.group import GroupState, JoinRequest, JoinResult, SyncResult
from trio_broker.storage.memory import MemoryLog

PARTITIONS = 4
CONFIG = BrokerConfig(
    storage="memory", zookeeper_connect="127.0.0.1:1/unused",
    offsets_topic_num_partitions=PARTITIONS, group_initial_rebalance_delay_ms=0,
)  # fmt: skip


def group_in(partition: int, prefix: str = "g") -> str:
    """A group id whose offsets live in ``partition``."""
    return next(
        g
        for g in (f"{prefix}{i}" for i in range(1000))
        if partition_for(g, PARTITIONS) == partition
    )


def make_broker(config: BrokerConfig = CONFIG) -> ClusteredBroker:
    """What the coordinator and the group handlers use of a Broker in a cluster; this
    broker holds no replica of any topic (the cluster's view knows them), and its flusher
    syncs on the event loop (as in test_group_state.py): several tests run on an
    autojumping mock clock, which jumps while a sync runs in a worker thread, so a
    session could end "during" a write that took a few real milliseconds."""
    return ClusteredBroker(config, flusher=Flusher(inline=True))


def in_cluster(broker: ClusteredBroker) -> GroupCoordinator:
    """As the broker's wiring in a cluster: the replica manager leads the partitions
    and tells the coordinator (a leadership listener)."""
    coordinator = GroupCoordinator(
        broker, offsets_partitions=broker.config.offsets_topic_num_partitions,
        leaders=lambda: broker.replication,
    )  # fmt: skip
    broker.leadership_listeners[CONSUMER_OFFSETS] = coordinator
    return coordinator


async def start(nursery: trio.Nursery) -> tuple[ClusteredBroker, GroupCoordinator]:
    broker = make_broker()
    await nursery.start(broker.flusher.run)
    coordinator = broker.groups = in_cluster(broker)
    await nursery.start(coordinator.run)
    return broker, coordinator


def lead(broker: ClusteredBroker, coordinator: GroupCoordinator, partition: int, epoch: int,
         log: MemoryLog) -> None:  # fmt: skip
    broker.replication.terms[CONSUMER_OFFSETS, partition] = Term(epoch)
    coordinator.elected(partition, epoch, log)


def offsets_log(partition: int, records: dict[OffsetKey, int]) -> MemoryLog:
    """A ``__consumer_offsets`` replica holding ``records`` (as a previous leader wrote)."""
    store = OffsetsStore(MemoryLog(), partition)
    write = store.append([(key, OffsetAndMetadata(offset)) for key, offset in records.items()], 0)
    store.apply(write)
    return store.log


def join_req(member_id: str = "") -> JoinRequest:
    return JoinRequest(
        member_id=member_id, group_instance_id=None, client_id="c", client_host="/h",
        session_timeout_ms=10_000, rebalance_timeout_ms=10_000, protocol_type="consumer",
        protocols=(("range", b""),), require_known_member_id=False,
    )  # fmt: skip


async def test_a_led_partition_loads_in_the_background_then_serves_its_groups() -> None:
    mine, other = group_in(2), group_in(3)
    log = offsets_log(2, {OffsetKey(mine, "t", 0): 41, OffsetKey(mine, "t", 1): 7})
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        assert broker.leadership_listeners == {CONSUMER_OFFSETS: coordinator}
        assert coordinator.coordinator_error(mine) is ErrorCode.NOT_COORDINATOR
        lead(broker, coordinator, 2, 5, log)
        assert coordinator.coordinator_error(mine) is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert coordinator.loading()
        await coordinator.led[2].loaded.wait()
        assert coordinator.coordinator_error(mine) is ErrorCode.NONE
        assert coordinator.coordinator_error(other) is ErrorCode.NOT_COORDINATOR
        assert coordinator.committed(mine, "t", 0) == OffsetAndMetadata(41)
        assert [g for g, *_ in coordinator.list_groups()] == [mine]  # Empty, with offsets
        # A new epoch of the same leadership keeps the table (no reload).
        table = coordinator.led[2].store
        lead(broker, coordinator, 2, 6, log)
        assert coordinator.led[2].store is table and coordinator.led[2].leader_epoch == 6
        nursery.cancel_scope.cancel()


async def test_resigning_forgets_the_groups_and_answers_parked_joins() -> None:
    mine = group_in(1)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 1, 0, MemoryLog())
        await coordinator.led[1].loaded.wait()
        # The join parks until the join phase ends (the timer task ends it).
        parked = coordinator.join_group(mine, join_req())
        assert isinstance(parked, Waiter)
        coordinator.resigned(1)
        result = await parked.wait()
        assert isinstance(result, JoinResult) and result.error is ErrorCode.NOT_COORDINATOR
        assert coordinator.list_groups() == []
        assert coordinator.coordinator_error(mine) is ErrorCode.NOT_COORDINATOR
        with pytest.raises(KafkaError) as info:
            coordinator.committed(mine, "t", 0)
        assert info.value.error_code == ErrorCode.NOT_COORDINATOR
        nursery.cancel_scope.cancel()


async def test_resigning_while_loading_drops_the_table() -> None:
    mine = group_in(0)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 0, 0, offsets_log(0, {OffsetKey(mine, "t", 0): 3}))
        coordinator.resigned(0)
        await trio.testing.wait_all_tasks_blocked()
        assert coordinator.led == {} and coordinator.list_groups() == []
        nursery.cancel_scope.cancel()


async def test_a_commit_carries_the_leader_epoch_and_counts_below_the_hw() -> None:
    mine = group_in(2)
    log = MemoryLog()
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 2, 9, log)
        await coordinator.led[2].loaded.wait()
        write = coordinator.append_offsets([(OffsetKey(mine, "t", 0), OffsetAndMetadata(12))])
        assert log.epoch_cache.latest_epoch == 9
        await coordinator.wait_offsets_durable(write)
        assert coordinator.committed(mine, "t", 0) == OffsetAndMetadata(12)
        # Leadership moved before the commit counted: NOT_COORDINATOR, nothing visible.
        broker.replication.ack = AckState.LEADERSHIP_LOST
        write = coordinator.append_offsets([(OffsetKey(mine, "t", 0), OffsetAndMetadata(13))])
        with pytest.raises(NotCommitted) as info:
            await coordinator.wait_offsets_durable(write)
        assert info.value.error_code == ErrorCode.NOT_COORDINATOR
        assert coordinator.committed(mine, "t", 0) == OffsetAndMetadata(12)
        # The replica manager no longer holds a term: the append itself is refused.
        del broker.replication.terms[CONSUMER_OFFSETS, 2]
        with pytest.raises(NotCommitted) as info:
            coordinator.append_offsets([(OffsetKey(mine, "t", 0), OffsetAndMetadata(14))])
        assert info.value.error_code == ErrorCode.NOT_COORDINATOR
        nursery.cancel_scope.cancel()


async def test_a_commit_not_replicated_in_time_is_coordinator_not_available(
    autojump_clock: trio.testing.MockClock,
) -> None:
    mine = group_in(3)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 3, 0, MemoryLog())
        await coordinator.led[3].loaded.wait()
        broker.replication.ack = None  # followers never catch up
        started = trio.current_time()
        write = coordinator.append_offsets([(OffsetKey(mine, "t", 0), OffsetAndMetadata(5))])
        with pytest.raises(NotCommitted) as info:
            await coordinator.wait_offsets_durable(write)
        assert info.value.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        # offsets.commit.timeout.ms (5 s) runs from the write's fsync: never less.
        assert trio.current_time() - started >= 5.0
        assert coordinator.committed(mine, "t", 0) is None
        nursery.cancel_scope.cancel()


async def test_a_transaction_marker_ends_the_staged_offsets_of_its_partition() -> None:
    in_two, also_in_two, in_three = group_in(2, "a"), group_in(2, "b"), group_in(3)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 2, 0, MemoryLog())
        lead(broker, coordinator, 3, 0, MemoryLog())
        await coordinator.led[2].loaded.wait()
        await coordinator.led[3].loaded.wait()
        for group_id, offset in ((in_two, 10), (also_in_two, 20), (in_three, 30)):
            assert coordinator.validate_txn_offset_commit(group_id, 77, 0, "", None, -1) is (
                ErrorCode.NONE
            )
            staged = coordinator.stage_txn_offsets(
                77, 0, [(OffsetKey(group_id, "t", 0), OffsetAndMetadata(offset))]
            )
            await coordinator.wait_offsets_durable(staged)
        await coordinator.complete_transaction_in_partition(2, 77, 0, committed=True)
        assert coordinator.committed(in_two, "t", 0) == OffsetAndMetadata(10)
        assert coordinator.committed(also_in_two, "t", 0) is not None
        # Partition 3's marker has not come: its group's offset is still pending.
        assert coordinator.committed(in_three, "t", 0) is None
        assert coordinator.has_pending_offset(in_three, "t", 0)
        await coordinator.complete_transaction_in_partition(3, 77, 0, committed=False)
        assert coordinator.committed(in_three, "t", 0) is None
        assert not coordinator.has_pending_offset(in_three, "t", 0)
        with pytest.raises(KafkaError) as info:
            await coordinator.complete_transaction_in_partition(1, 77, 0, committed=True)
        assert info.value.error_code == ErrorCode.NOT_COORDINATOR
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------- the handlers


def context(broker: ClusteredBroker, api_key: m.ApiKey, version: int) -> RequestContext:
    header = RequestHeader(api_key, version, 1, "routing")
    return RequestContext(header=header, services=broker, client=ClientInfo(1, "127.0.0.1", 1))  # type: ignore[arg-type]


async def test_group_apis_answer_not_coordinator_for_groups_led_elsewhere() -> None:
    mine, elsewhere = group_in(0), group_in(1)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 0, 0, MemoryLog())
        await coordinator.led[0].loaded.wait()
        join = m.JoinGroupRequest(
            group_id=elsewhere, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            member_id="", protocol_type="consumer",
            protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        )  # fmt: skip
        joined = await handle_join_group(context(broker, m.ApiKey.JOIN_GROUP, 5), join)
        assert isinstance(joined, m.JoinGroupResponse)
        assert joined.error_code == ErrorCode.NOT_COORDINATOR
        beat = await handle_heartbeat(
            context(broker, m.ApiKey.HEARTBEAT, 3),
            m.HeartbeatRequest(group_id=elsewhere, generation_id=1, member_id="x"),
        )
        assert beat.error_code == ErrorCode.NOT_COORDINATOR
        commit = m.OffsetCommitRequest(
            group_id=elsewhere, generation_id_or_member_epoch=-1, member_id="",
            topics=[m.OffsetCommitRequest.OffsetCommitRequestTopic(name="t", partitions=[
                m.OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=5)])],
        )  # fmt: skip
        broker.replication.view.topics["t"] = TopicInfo(
            "t", uuid.uuid4(), {0: PartitionInfo((1, 2, 3), 2, 0, (1, 2, 3))}
        )
        committed = await handle_offset_commit(context(broker, m.ApiKey.OFFSET_COMMIT, 8), commit)
        assert isinstance(committed, m.OffsetCommitResponse)
        [[part]] = [t.partitions for t in committed.topics]
        assert part.error_code == ErrorCode.NOT_COORDINATOR
        fetch = m.OffsetFetchRequest(groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=g, topics=None)
            for g in (mine, elsewhere)
        ])  # fmt: skip
        fetched = await handle_offset_fetch(context(broker, m.ApiKey.OFFSET_FETCH, 8), fetch)
        assert [(g.group_id, g.error_code) for g in fetched.groups] == [
            (mine, ErrorCode.NONE), (elsewhere, ErrorCode.NOT_COORDINATOR)
        ]  # fmt: skip
        described = await handle_describe_groups(
            context(broker, m.ApiKey.DESCRIBE_GROUPS, 5),
            m.DescribeGroupsRequest(groups=[elsewhere]),
        )
        assert [g.error_code for g in described.groups] == [ErrorCode.NOT_COORDINATOR]
        # The commit went to the right coordinator: this broker, for ``mine``. The
        # cluster's topic counts though this broker holds no replica of it.
        commit.group_id = mine
        deferred = await handle_offset_commit(context(broker, m.ApiKey.OFFSET_COMMIT, 8), commit)
        assert not isinstance(deferred, m.OffsetCommitResponse)
        done = await deferred.finish()
        assert [p.error_code for t in done.topics for p in t.partitions] == [ErrorCode.NONE]
        assert coordinator.committed(mine, "t", 0) is not None
        listed = await handle_list_groups(
            context(broker, m.ApiKey.LIST_GROUPS, 4), m.ListGroupsRequest()
        )
        assert [g.group_id for g in listed.groups] == [mine]
        nursery.cancel_scope.cancel()


async def test_elected_in_the_view_but_not_yet_leading_is_load_in_progress() -> None:
    """FindCoordinator answers from the view, which can name this broker before its
    replica manager has begun the term: the group's APIs answer
    COORDINATOR_LOAD_IN_PROGRESS then (clients retry here), not NOT_COORDINATOR (which
    sends them back to FindCoordinator, to be named this broker again)."""
    group = group_in(3)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        offsets = {p: PartitionInfo((1, 2, 3), 2, 0, (1, 2, 3)) for p in range(PARTITIONS)}
        broker.replication.view.topics[CONSUMER_OFFSETS] = TopicInfo(
            CONSUMER_OFFSETS, uuid.uuid4(), offsets
        )
        assert coordinator.coordinator_error(group) == ErrorCode.NOT_COORDINATOR  # 2 leads
        offsets[3] = PartitionInfo((1, 2, 3), ME, 1, (1, 2, 3))  # the view moved first
        assert coordinator.coordinator_error(group) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        fetch = m.OffsetFetchRequest(groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, topics=None)
        ])  # fmt: skip
        fetched = await handle_offset_fetch(context(broker, m.ApiKey.OFFSET_FETCH, 8), fetch)
        assert [g.error_code for g in fetched.groups] == [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS]
        lead(broker, coordinator, 3, 1, MemoryLog())
        await coordinator.led[3].loaded.wait()
        assert coordinator.coordinator_error(group) == ErrorCode.NONE
        nursery.cancel_scope.cancel()


async def test_find_coordinator_names_the_leader_of_the_groups_partition() -> None:
    group = group_in(2)
    async with trio.open_nursery() as nursery:
        broker, _ = await start(nursery)
        view = broker.replication.view
        view.brokers = {b: BrokerInfo(b, "127.0.0.1", 9090 + b) for b in (1, 2, 3)}
        ctx = context(broker, m.ApiKey.FIND_COORDINATOR, 3)
        request = m.FindCoordinatorRequest(key=group, key_type=0)
        # No __consumer_offsets yet: it is made (in the background), the client retries.
        answer = await handle_find_coordinator(ctx, request)
        assert answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        await trio.testing.wait_all_tasks_blocked()
        [(name, partitions, rf, configs)] = broker.replication.created
        assert (name, partitions, rf) == (CONSUMER_OFFSETS, PARTITIONS, 3)
        assert configs["cleanup.policy"] == "compact"
        leaders = {p: PartitionInfo((1, 2, 3), 1 + p % 3, 0, (1, 2, 3)) for p in range(4)}
        leaders[1] = PartitionInfo((1, 2, 3), -1, 0, ())  # offline
        view.topics[CONSUMER_OFFSETS] = TopicInfo(CONSUMER_OFFSETS, uuid.uuid4(), leaders)
        answer = await handle_find_coordinator(ctx, request)
        assert (answer.error_code, answer.node_id, answer.port) == (ErrorCode.NONE, 3, 9093)
        request.key = group_in(1)
        answer = await handle_find_coordinator(ctx, request)
        assert answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        nursery.cancel_scope.cancel()


async def test_delete_groups_writes_once_per_offsets_partition() -> None:
    in_zero, in_two, elsewhere = group_in(0), group_in(2), group_in(1)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        for partition in (0, 2):
            lead(broker, coordinator, partition, 0, MemoryLog())
            await coordinator.led[partition].loaded.wait()
        for group_id in (in_zero, in_two):
            assert coordinator.validate_offset_commit(group_id, "", None, -1) is ErrorCode.NONE
            write = coordinator.append_offsets(
                [(OffsetKey(group_id, "t", 0), OffsetAndMetadata(1))]
            )
            await coordinator.wait_offsets_durable(write)
        results, writes = coordinator.delete_groups([in_zero, in_two, elsewhere])
        assert results == {
            in_zero: ErrorCode.NONE, in_two: ErrorCode.NONE, elsewhere: ErrorCode.NOT_COORDINATOR
        }  # fmt: skip
        assert sorted(w.store.partition for w in writes if w.store is not None) == [0, 2]
        for write in writes:
            await coordinator.wait_offsets_durable(write)
        assert coordinator.committed(in_zero, "t", 0) is None
        assert coordinator.committed(in_two, "t", 0) is None
        nursery.cancel_scope.cancel()


async def test_in_a_cluster_the_single_node_offsets_log_is_not_opened(tmp_path: Path) -> None:
    # <data_dir>/__consumer_offsets-0 is partition 0's replica in a cluster: the topic
    # manager owns it, the coordinator only reads it once it leads the partition.
    broker = make_broker(attrs.evolve(CONFIG, storage="file", data_dir=tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.flusher.run)
        coordinator = in_cluster(broker)
        await nursery.start(coordinator.run)
        assert coordinator.offsets is None and coordinator.led == {}
        assert await trio.to_thread.run_sync(lambda: list(tmp_path.iterdir())) == []
        nursery.cancel_scope.cancel()


async def stable_group_in(coordinator: GroupCoordinator, group: str) -> tuple[str, Any]:
    """Join one member and send the leader's SyncGroup: (member id, its outcome)."""
    joined = coordinator.join_group(group, join_req())
    result = await joined.wait() if isinstance(joined, Waiter) else joined
    assert isinstance(result, JoinResult) and result.error is ErrorCode.NONE
    outcome = coordinator.sync_group(group, result.member_id, None, result.generation_id,
                                     None, None, {result.member_id: b"p0"})  # fmt: skip
    return result.member_id, outcome


async def moved_stable_group(
    nursery: trio.Nursery, mine: str
) -> tuple[str, SyncResult, GroupCoordinator]:
    """A group made Stable by partition 2's leader, which then resigns, and the next
    leader of the same replica, loaded: (the member id, the leader's SyncGroup answer,
    the successor)."""
    log = MemoryLog()
    broker, coordinator = await start(nursery)
    lead(broker, coordinator, 2, 1, log)
    await coordinator.led[2].loaded.wait()
    member_id, outcome = await stable_group_in(coordinator, mine)
    assert isinstance(outcome, Waiter)
    synced = await outcome.wait()
    assert isinstance(synced, SyncResult)
    coordinator.resigned(2)

    other_broker, successor = await start(nursery)
    lead(other_broker, successor, 2, 2, log)  # the same replica, a new leader
    await successor.led[2].loaded.wait()
    return member_id, synced, successor


async def test_an_elected_partition_restores_its_stable_groups() -> None:
    """The leader's SyncGroup is answered once the generation counts (below the HW);
    the partition's next leader loads the group Stable, with its member."""
    mine = group_in(2)
    async with trio.open_nursery() as nursery:
        member_id, synced, successor = await moved_stable_group(nursery, mine)
        assert synced == SyncResult(ErrorCode.NONE, "consumer", "range", b"p0")
        group = successor.groups[mine]
        assert group.state is GroupState.STABLE and group.generation_id == 1
        assert successor.heartbeat(mine, member_id, None, 1) is ErrorCode.NONE
        nursery.cancel_scope.cancel()


async def test_a_generation_not_replicated_answers_not_coordinator_and_rebalances() -> None:
    mine = group_in(1)
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 1, 0, MemoryLog())
        await coordinator.led[1].loaded.wait()
        broker.replication.ack = AckState.LEADERSHIP_LOST
        _member_id, outcome = await stable_group_in(coordinator, mine)
        assert isinstance(outcome, Waiter)
        assert await outcome.wait() == SyncResult(ErrorCode.NOT_COORDINATOR)
        assert coordinator.groups[mine].state is GroupState.PREPARING_REBALANCE
        assert coordinator.led[1].store is not None
        assert coordinator.led[1].store.group_metadata(mine) is None  # never applied
        nursery.cancel_scope.cancel()


async def test_an_election_that_ends_after_the_coordinator_stopped_is_dropped() -> None:
    """Shutdown cancels the coordinator and the replica manager together; the manager can
    finish an election (its log flush runs in an uncancellable worker thread) after the
    coordinator's nursery has closed. Before: RuntimeError "Nursery is closed to new
    arrivals", logged as an ERROR applying the cluster view. Now: nothing to do."""
    log = offsets_log(2, {OffsetKey(group_in(2), "t", 0): 1})
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        nursery.cancel_scope.cancel()  # as the broker's shutdown cancels its services
    lead(broker, coordinator, 2, 5, log)
    assert 2 not in coordinator.led
    assert coordinator.coordinator_error(group_in(2)) is ErrorCode.NOT_COORDINATOR


async def test_a_restored_member_that_never_comes_back_leaves_after_its_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A new coordinator times the restored members' sessions from its load (Kafka
    schedules their expiry as it loads): one that never heartbeats leaves once its
    session is over, though no request comes in meanwhile."""
    # The successor's load reads the log in a worker thread; the clock must not jump
    # while it runs (the session would be timed from a later load).
    autojump_clock.autojump_threshold = 0.05
    mine = group_in(2)
    async with trio.open_nursery() as nursery:
        _, _, successor = await moved_stable_group(nursery, mine)
        assert successor.groups[mine].members
        await trio.sleep(11)  # past the member's 10 s session, no request in between
        assert not successor.groups[mine].members
        nursery.cancel_scope.cancel()
