"""A partition created while every one of its replicas is down gets no state until one
of them is alive, and then its live replicas (Kafka's controller: a new partition with
no live replica stays new, and the first live replicas make its leader and ISR).

Why it matters: the controller wrote (no leader, epoch 0, every replica as the ISR), and
its next round's loss rule removed the dead members but the last, so the partition
waited for that one broker alone, though it had never held a record and another
replica came back first (found by statemachine/test_controller_machine.py).
"""

from __future__ import annotations

import uuid

import trio
import trio.testing

from trio_broker.cluster.controller import decide, run_controller
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
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
from trio_broker.replication.controller_rules import NO_LEADER, LeaderAndIsr
from trio_broker.services.cluster_view import ClusterView, PartitionInfo


def test_decide_writes_nothing_for_a_new_partition_with_no_live_replica() -> None:
    new = PartitionInfo((2, 3, 1), NO_LEADER, -1, ())
    assert decide(new, frozenset()) is None
    assert decide(new, frozenset({4})) is None  # a live broker that is not a replica
    assert decide(new, frozenset({1})) == LeaderAndIsr(1, 0, (1,))


async def test_the_first_replica_back_leads_a_partition_created_with_all_down() -> None:
    server = MemoryZooKeeper()
    admin, replica_2 = MemoryCoordination(server), MemoryCoordination(server)
    await admin.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
    await admin.create(topic_path("t"), TopicAssignment(uuid.uuid4(), {0: (1, 2)}).encode())
    view = ClusterView(0, controller_id=0, controller_epoch=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_controller, admin, view)
        await trio.testing.wait_all_tasks_blocked()  # its rounds, until it waits
        assert await admin.get(partition_state_path("t", 0)) is None
        # Broker 2 registers first (not the preferred replica, not the last listed).
        registration = BrokerRegistration(2, "127.0.0.1", 19002).encode()
        await replica_2.create(f"{BROKER_IDS}/2", registration, ephemeral=True)
        await trio.testing.wait_all_tasks_blocked()
        znode = await admin.get(partition_state_path("t", 0))
        assert znode is not None
        state = PartitionState.decode(znode.data, "t-0")
        assert (state.leader, state.leader_epoch, state.isr) == (2, 0, (2,))
        nursery.cancel_scope.cancel()
