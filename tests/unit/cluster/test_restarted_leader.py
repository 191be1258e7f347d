"""A broker that restarts before the controller saw its registration go does not lead
on in the epoch its previous life led: the controller gives it a new epoch first
(Kafka's bounced broker; ``controller.restarted_leader``).

Why it matters: a power cut loses the log's unsynced tail, which followers may have
copied. In a new epoch, a follower holding that tail learns where the old epoch ended
on the leader and truncates to it; in the same epoch, what the new life appends at
those offsets cannot be told from the followers' copies, and the replicas disagree
below the HW for good. ci11 saw the race itself (``cluster up`` restarted a killed
leader within 0.5 s of ZooKeeper dropping its registration, before the controller read
the broker list): the restarted broker led on in its old epoch.
"""

from __future__ import annotations

import uuid

import trio

from trio_broker.cluster.controller import decide, restarted_leader, run_controller
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    encode_controller_epoch,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import LeaderAndIsr
from trio_broker.services.cluster_view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig


def test_decide_bumps_the_epoch_of_a_restarted_leader() -> None:
    info = PartitionInfo((2, 3), 2, 4, (2, 3), state_zxid=50)
    live = frozenset({2, 3})
    assert decide(info, live) is None
    # Same leader and ISR, a new epoch: the new life's term is not the old one's.
    assert decide(info, live, leader_restarted=True) == LeaderAndIsr(2, 5, (2, 3))
    assert restarted_leader(info, {2: 60, 3: 10})  # registered after the state's write
    assert not restarted_leader(info, {2: 40, 3: 60})  # a follower's restart: no
    assert not restarted_leader(info, {3: 60})  # the leader is not registered: loss rules
    assert not restarted_leader(PartitionInfo((2,), 2, 4, (2,)), {2: 60})  # unknown: no


async def _state(coord: MemoryCoordination) -> PartitionState:
    znode = await coord.get(partition_state_path("t", 0))
    assert znode is not None
    return PartitionState.decode(znode.data, "t-0")


async def test_the_controller_gives_a_restarted_leader_a_new_epoch() -> None:
    server = MemoryZooKeeper()
    admin, old_life, new_life = (MemoryCoordination(server) for _ in range(3))
    registration = BrokerRegistration(2, "127.0.0.1", 19002).encode()
    await admin.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
    await admin.create(f"{BROKER_IDS}/1", BrokerRegistration(1, "127.0.0.1", 19001).encode())
    await old_life.create(f"{BROKER_IDS}/2", registration, ephemeral=True)
    await admin.create(topic_path("t"), TopicAssignment(uuid.uuid4(), {0: (2, 1)}).encode())
    await admin.create(partition_state_path("t", 0), PartitionState(2, 7, (2, 1), 1).encode())
    view = ClusterView(1, controller_id=1, controller_epoch=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_controller, admin, view)
        await trio.testing.wait_all_tasks_blocked()
        assert (await _state(admin)).leader_epoch == 7  # nothing to change
        # Broker 2 dies and is back (a new session's registration) in one step, before
        # the controller reads the broker list: the list looks the same.
        server.expire(old_life.session)
        await new_life.create(f"{BROKER_IDS}/2", registration, ephemeral=True)
        await trio.testing.wait_all_tasks_blocked()  # the controller's round, and its next
        state = await _state(admin)
        # Once: the new write is newer than the registration.
        assert (state.leader, state.leader_epoch, state.isr) == (2, 8, (2, 1))
        nursery.cancel_scope.cancel()


async def test_a_restarted_broker_waits_for_the_new_epoch_to_lead() -> None:
    coord = MemoryCoordination(MemoryZooKeeper())
    topics = TopicManager(None, LogConfig(), lambda: 0)
    view = ClusterView(1)
    manager = ReplicaManager(
        view, coord, topics, min_insync_replicas=1, replica_lag_time_max_ms=1000,
        now_ms=lambda: 0, durability=None,
    )  # fmt: skip
    topic_id = topics.create("t", 1).topic_id or uuid.uuid4()
    view.brokers = {1: BrokerInfo(1, "127.0.0.1", 19001, registered_zxid=30)}

    def named(epoch: int, state_zxid: int) -> None:
        view.topics = {"t": TopicInfo("t", topic_id, {0: PartitionInfo(
            (1, 2), 1, epoch, (1, 2), state_zxid=state_zxid)})}  # fmt: skip

    named(7, state_zxid=20)  # written for the previous life
    await manager._apply()
    assert ("t", 0) not in manager.terms
    named(8, state_zxid=31)  # the controller's new epoch, after this life registered
    await manager._apply()
    assert manager.terms[("t", 0)].leader_epoch == 8
