"""A reassignment does not end while its leader is dead and no target replica can lead.

Found by the reassignment machine (statemachine/test_reassignment_machine.py, rule 7):
the leader, a target replica, died and the controller's move pass ran before its loss
pass. ``leave_replicas`` could elect no live in-sync target replica and left the state as
it was, and ``_finish_move`` took that for "nothing changes" because the dead leader is a
target replica: it wrote the assignment without the leaving replica while the ISR still
held it. The loss pass then left the partition with an ISR member that is no replica.
"""

from __future__ import annotations

import uuid

import trio

from trio_broker.cluster.controller import _finish_move
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.zk_layout import (
    CONTROLLER_EPOCH,
    PartitionState,
    TopicAssignment,
    encode_controller_epoch,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import LeaderAndIsr
from trio_broker.services.cluster_view import ClusterView, PartitionInfo


def test_a_move_whose_dead_leader_no_target_replica_can_replace_waits() -> None:
    async def main() -> tuple[TopicAssignment, PartitionState]:
        coord = MemoryCoordination(MemoryZooKeeper())
        await coord.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
        fence = (CONTROLLER_EPOCH, 0)
        # Replicas (2, 1, 3) moving to (2, 1): 3 leaves. Leader 2 is dead, 1 is out of
        # sync, 3 (leaving) is the only live ISR member.
        moving = TopicAssignment(uuid.uuid4(), {0: (2, 1, 3)}, {0: ()}, {0: (3,)})
        await coord.create(topic_path("t"), moving.encode())
        state = PartitionState.of(LeaderAndIsr(2, 2, (2, 3)), 1)
        await coord.create(partition_state_path("t", 0), state.encode())
        info = PartitionInfo((2, 1, 3), 2, 2, (2, 3), (), (3,))
        view = ClusterView(0, controller_id=0, controller_epoch=1)
        await _finish_move(coord, view, fence, frozenset({3, 4, 5}), "t", 0, info, 0)
        topic = await coord.get(topic_path("t"))
        stored = await coord.get(partition_state_path("t", 0))
        assert topic is not None and stored is not None
        return (
            TopicAssignment.decode(topic.data, topic_path("t")),
            PartitionState.decode(stored.data, "t-0"),
        )

    assignment, state = trio.run(main)
    assert assignment.partitions[0] == (2, 1, 3), "the move ended with no replica able to lead"
    assert assignment.removing[0] == (3,)
    assert state.leader_and_isr == LeaderAndIsr(2, 2, (2, 3))
