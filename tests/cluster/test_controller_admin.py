"""The controller's admin actions (cluster/controller.py's ControllerActions) on real
ZooKeeper and on the in-memory twin: a partition move from start to finish, a cancelled
move, refused moves, a preferred election, a topic deletion the reconciler leaves alone.
The leader's part (adding a caught-up replica to the ISR) is played by a conditional
write, as a leader makes it."""

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
from trio_broker.replication.controller_rules import ElectionType
from trio_broker.services.cluster_view import ClusterView, PartitionInfo

OK = (ErrorCode.NONE, None)


def info(view: ClusterView, name: str, partition: int) -> PartitionInfo | None:
    topic = view.topics.get(name)
    return None if topic is None else topic.partitions.get(partition)


def shape(view: ClusterView, name: str, partition: int) -> tuple[object, ...] | None:
    """(replicas, adding, removing, leader, epoch, ISR) as the view holds them."""
    i = info(view, name, partition)
    if i is None:
        return None
    return (i.replicas, i.adding_replicas, i.removing_replicas, i.leader, i.leader_epoch, i.isr)


async def test_a_move_a_cancel_an_election_and_a_deletion(clients: Clients) -> None:
    async with cluster(clients, 1, 2, 3) as members, clients.client() as admin:
        view = members[2].view
        assignment = TopicAssignment(uuid.uuid4(), {0: (1, 2), 1: (1, 2)})
        await admin.create(topic_path("t"), assignment.encode())
        # The controller's actions take the partition's replicas from its own view, which
        # may learn of the topic after broker 2's does: wait for every view.
        for member in members.values():
            await eventually(lambda v=member.view: shape(v, "t", 0) == ((1, 2), (), (), 1, 0, (1, 2)),
                             f"led in broker {member.broker_id}'s view")  # fmt: skip
        await eventually(lambda: members[1].actions is not None, "the controller's actions")
        actions = members[1].actions
        assert isinstance(actions, ControllerActions)

        # Partition 0 moves from {1, 2} to {2, 3}: started, leader epoch bumped.
        assert await actions.alter_reassignments({("t", 0): [2, 3]}) == {("t", 0): OK}
        await eventually(
            lambda: shape(view, "t", 0) == ((2, 3, 1), (3,), (1,), 1, 1, (1, 2)), "moving"
        )
        # The leader adds broker 3 once it caught up; the controller finishes the move:
        # 1 leaves the ISR and the leadership (to 2, first of the target), then the replicas.
        path = partition_state_path("t", 0)
        node = await admin.get(path)
        assert node is not None
        caught_up = PartitionState(1, 1, (1, 2, 3), view.controller_epoch)
        await admin.set(path, caught_up.encode(), node.version)
        await eventually(lambda: shape(view, "t", 0) == ((2, 3), (), (), 2, 2, (2, 3)), "moved")

        # Partition 1 starts moving to {3} and is cancelled: back to {1, 2}.
        assert await actions.alter_reassignments({("t", 1): [3]}) == {("t", 1): OK}
        await eventually(lambda: shape(view, "t", 1) == ((3, 1, 2), (3,), (1, 2), 1, 1, (1, 2)),
                         "moving to 3")  # fmt: skip
        assert await actions.alter_reassignments({("t", 1): None}) == {("t", 1): OK}
        # The cancel leaves 3 as a leaving replica; the controller's next pass drops it.
        # The refusals below read the controller's own view, which may learn of that
        # last write after broker 2's does: wait for every view.
        for member in members.values():
            await eventually(lambda v=member.view: shape(v, "t", 1) == ((1, 2), (), (), 1, 2, (1, 2)),
                             f"back in broker {member.broker_id}'s view")  # fmt: skip

        refused = await actions.alter_reassignments(
            {("t", 1): None, ("t", 7): [1], ("t", 0): [9], ("u", 0): [1], ("t", 2): [2, 2]}
        )
        assert {k: v[0] for k, v in refused.items()} == {
            ("t", 1): ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
            ("t", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("t", 0): ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            ("u", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("t", 2): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        }
        elected = await actions.elect_leaders(ElectionType.PREFERRED, [("t", 0), ("t", 1)])
        assert {k: v[0] for k, v in elected.items()} == {
            ("t", 0): ErrorCode.ELECTION_NOT_NEEDED,
            ("t", 1): ErrorCode.ELECTION_NOT_NEEDED,
        }

        assert await actions.delete_topic("t") == OK
        await eventually(lambda: "t" not in view.topics, "the topic left every view")
        # Rounds that began after the deletion have run their course: the round that
        # leads a topic made after another one was led began after that round ended. One
        # that took "t" for new would have recreated its states by then.
        for name in ("later", "later-still"):
            await admin.create(
                topic_path(name), TopicAssignment(uuid.uuid4(), {0: (1, 2)}).encode()
            )
            await eventually(lambda name=name: shape(view, name, 0) == ((1, 2), (), (), 1, 0, (1, 2)),
                             f"a later round led {name}")  # fmt: skip
        assert await admin.get(topic_path("t")) is None
        assert await admin.get(partition_state_path("t", 0)) is None
        assert await actions.delete_topic("t") == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "topic 't' does not exist"
        )  # fmt: skip
