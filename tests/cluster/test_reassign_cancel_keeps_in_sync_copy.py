"""A move cancelled while the original replica is down and a joiner is the ISR alone, on
real ZooKeeper and on the in-memory twin: the joiner stays a replica (leaving) and keeps
leading until the original replica is back and in sync, then the move ends on it. The
leader's part (adding a caught-up replica to the ISR) is played by a conditional write,
as a leader makes it."""

from __future__ import annotations

import uuid

from harness import Clients, cluster

from tests.waits import eventually
from trio_broker.cluster.controller import ControllerActions
from trio_broker.cluster.zk_layout import (
    PartitionState,
    TopicAssignment,
    partition_state_path,
    topic_path,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import ClusterView

OK = (ErrorCode.NONE, None)


def shape(view: ClusterView) -> tuple[object, ...] | None:
    """(replicas, adding, removing, leader, ISR) of t-0 as the view holds it."""
    topic = view.topics.get("t")
    i = None if topic is None else topic.partitions.get(0)
    if i is None:
        return None
    return (i.replicas, i.adding_replicas, i.removing_replicas, i.leader, i.isr)


async def _write_isr(clients: Clients, view: ClusterView, isr: tuple[int, ...]) -> None:
    """The leader's ISR change, at the leader epoch the view holds."""
    async with clients.client() as admin:
        path = partition_state_path("t", 0)
        node = await admin.get(path)
        assert node is not None
        state = PartitionState.decode(node.data, path).leader_and_isr
        changed = PartitionState(state.leader, state.leader_epoch, isr, view.controller_epoch)
        await admin.set(path, changed.encode(), node.version)


async def test_a_cancel_back_to_a_down_replica_keeps_the_joiner_in_sync_alone(
    clients: Clients,
) -> None:
    async with cluster(clients, 1, 2, 3, 4) as members, clients.client() as admin:
        view = members[1].view
        await admin.create(topic_path("t"), TopicAssignment(uuid.uuid4(), {0: (3,)}).encode())
        await eventually(lambda: shape(view) == ((3,), (), (), 3, (3,)), "3 leads")
        await eventually(lambda: members[1].actions is not None, "the controller's actions")
        actions = members[1].actions
        assert isinstance(actions, ControllerActions)

        # t-0 moves from {3} to {2, 4}; 2 catches up (4 not yet), then 3 goes down:
        # 2 leads, the ISR alone.
        assert await actions.alter_reassignments({("t", 0): [2, 4]}) == {("t", 0): OK}
        await eventually(lambda: shape(view) == ((2, 4, 3), (2, 4), (3,), 3, (3,)), "moving")
        await _write_isr(clients, view, (2, 3))
        await eventually(lambda: shape(view) == ((2, 4, 3), (2, 4), (3,), 3, (2, 3)), "2 in")
        await members[3].stop()
        await eventually(lambda: shape(view) == ((2, 4, 3), (2, 4), (3,), 2, (2,)), "2 leads")

        # The cancel: back to {3}, but 2 and 4 stay (leaving) until 3 can lead.
        assert await actions.alter_reassignments({("t", 0): None}) == {("t", 0): OK}
        cancelled = ((3, 2, 4), (), (2, 4), 2, (2,))
        await eventually(lambda: shape(view) == cancelled, "cancelled, 2 still leads")

        # 3 returns (not in the ISR: not elected), catches up from 2 and joins the ISR:
        # the move ends on 3, which leads.
        await members[3].restart()
        await eventually(lambda: 3 in view.brokers, "3 is back")
        assert shape(view) == cancelled
        await _write_isr(clients, view, (2, 3))
        await eventually(lambda: shape(view) == ((3,), (), (), 3, (3,)), "back on 3")
