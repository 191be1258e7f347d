"""Partition reassignment (KIP-455): the pure rules and the topic znode's moving lists."""

from __future__ import annotations

import json
import uuid

import pytest

from trio_broker.cluster.zk_layout import CoordinationDataError, TopicAssignment
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    LeaderAndIsr,
    Reassignment,
    after_broker_loss,
    after_broker_return,
    leave_replicas,
    reassign,
    reassignment_done,
)
from trio_broker.replication.replica_rules import leaving_replica

LIVE = frozenset({1, 2, 3, 4})


def test_a_move_lists_target_replicas_first_then_the_leaving_ones() -> None:
    moving = reassign(Reassignment((1, 2)), [2, 3])
    assert moving == Reassignment((2, 3, 1), adding=(3,), removing=(1,))
    # The original replicas come back in the order the move lists them (so does Kafka's
    # ``replicas -- adding``): a cancelled move may change the preferred leader.
    assert (moving.original, moving.target) == ((2, 1), (2, 3))


def test_a_new_target_replaces_the_move_in_progress_keeping_every_current_replica() -> None:
    first = reassign(Reassignment((1, 2)), [2, 3])
    # 3, which the abandoned move added, leaves with the new move's end, not at once;
    # joining are the target's replicas outside the original ones.
    second = reassign(first, [4, 1])
    assert second == Reassignment((4, 1, 2, 3), adding=(4,), removing=(2, 3))
    # An abandoned joiner the new target keeps is still joining: the move waits for it.
    assert reassign(first, [3, 4]) == Reassignment((3, 4, 2, 1), adding=(3, 4), removing=(2, 1))


def test_a_cancel_is_a_move_back_to_the_original_replicas() -> None:
    moving = reassign(Reassignment((1, 2)), [2, 3])
    cancelled = reassign(moving, None)
    assert cancelled == Reassignment((2, 1, 3), removing=(3,))
    assert reassign(moving, [2, 1]) == cancelled
    # Nothing joins: it ends at the controller's next pass, on the original replicas.
    assert reassignment_done(LeaderAndIsr(1, 5, (1, 2)), cancelled)
    assert cancelled.target == (2, 1)
    # Cancelling a move that only removes, or asking for the replicas there are: no move.
    assert reassign(reassign(Reassignment((1, 2, 3)), [1, 2]), None) == Reassignment((1, 2, 3))
    assert reassign(Reassignment((1, 2)), [1, 2]) == Reassignment((1, 2))


def test_a_cancel_back_to_a_down_replica_keeps_the_only_in_sync_copy() -> None:
    # Broker 1 moves to 2; 2 caught up and joined the ISR, then 1 went down: 2 leads,
    # the ISR alone. The administrator cancels before the controller ended the move.
    moving = reassign(Reassignment((1,)), [2])
    assert moving == Reassignment((2, 1), adding=(2,), removing=(1,))
    state, live = LeaderAndIsr(2, 7, (2,)), frozenset({2, 3})
    cancelled = reassign(moving, None)
    # 2 stays a replica (leaving): the stored leader and ISR stay within the replicas.
    assert cancelled == Reassignment((1, 2), removing=(2,))
    assert leave_replicas(state, cancelled.replicas, live) is None  # the cancel's write
    assert state.leader in cancelled.replicas and set(state.isr) <= set(cancelled.replicas)
    # The controller's pass: the move is done, but no original replica can lead yet, so
    # the state stays as it is (2 keeps leading, keeps its copy) and the move waits.
    assert reassignment_done(state, cancelled)
    assert leave_replicas(state, cancelled.target, live) is None
    # 1 comes back: it is not leaving, so it may rejoin the ISR once it caught up...
    assert not leaving_replica(1, cancelled.removing, cancelled.adding, state.isr)
    assert leaving_replica(2, cancelled.removing, cancelled.adding, state.isr)
    # ...and then the pass ends the move on 1, which leads.
    caught_up = LeaderAndIsr(2, 7, (1, 2))
    assert leave_replicas(caught_up, cancelled.target, live | {1}) == LeaderAndIsr(1, 8, (1,))
    # Were 2 to go down meanwhile, it would stay the ISR and lead again on its return
    # (a clean election: 1 lacks what 2 acknowledged).
    offline = after_broker_loss(state, cancelled.replicas, 2, live)
    assert offline == LeaderAndIsr(NO_LEADER, 8, (2,))
    assert after_broker_return(offline, cancelled.replicas, 1, live | {1}) is None
    assert after_broker_return(offline, cancelled.replicas, 2, live) == LeaderAndIsr(2, 9, (2,))


def test_done_once_every_joining_replica_is_in_sync() -> None:
    moving = Reassignment((2, 3, 1), adding=(3,), removing=(1,))
    assert not reassignment_done(LeaderAndIsr(1, 5, (1, 2)), moving)
    assert reassignment_done(LeaderAndIsr(1, 5, (1, 2, 3)), moving)
    assert not reassignment_done(LeaderAndIsr(1, 5, (1, 2)), Reassignment((1, 2)))


def test_leaving_replicas_leave_the_isr_and_the_leadership() -> None:
    state = LeaderAndIsr(1, 5, (1, 2, 3))
    assert leave_replicas(state, (2, 3), LIVE) == LeaderAndIsr(2, 6, (2, 3))
    # A leader that stays keeps leading; only the ISR shrinks.
    assert leave_replicas(LeaderAndIsr(2, 5, (1, 2, 3)), (2, 3), LIVE) == LeaderAndIsr(2, 6, (2, 3))
    # Nothing to change, or nobody to lead yet: None.
    assert leave_replicas(LeaderAndIsr(2, 6, (2, 3)), (2, 3), LIVE) is None
    assert leave_replicas(LeaderAndIsr(1, 5, (1,)), (2, 3), LIVE) is None


def test_the_topic_znode_keeps_moves_as_kafka_writes_them() -> None:
    topic = TopicAssignment(uuid.uuid4(), {0: (2, 3, 1), 1: (1, 2)}, {0: (3,)}, {0: (1,)})
    doc = json.loads(topic.encode())
    assert (doc["adding_replicas"], doc["removing_replicas"]) == ({"0": [3]}, {"0": [1]})
    assert TopicAssignment.decode(topic.encode()) == topic
    assert (topic.target(0), topic.target(1)) == ((2, 3), (1, 2))


@pytest.mark.parametrize(
    "moving",
    [{"adding_replicas": {"0": [9]}}, {"removing_replicas": {"5": [1]}},
     {"adding_replicas": [1]}, {"removing_replicas": {"0": ["1"]}}],
)  # fmt: skip
def test_bad_moving_lists_are_a_clear_error(moving: dict[str, object]) -> None:
    doc = {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"0": [1, 2]}, **moving}
    with pytest.raises(CoordinationDataError):
        TopicAssignment.decode(json.dumps(doc).encode())


# Edges found by mutation testing (issue 31).


def test_a_move_that_only_adds_or_only_removes_replicas_completes() -> None:
    # Raising the replication factor: only joining replicas; done once they are in sync.
    growing = reassign(Reassignment((1, 2)), [1, 2, 3])
    assert growing.adding == (3,) and growing.removing == ()
    assert not reassignment_done(LeaderAndIsr(1, 5, (1, 2)), growing)
    assert reassignment_done(LeaderAndIsr(1, 5, (1, 2, 3)), growing)
    # Lowering it: nothing joins, the leaving replica may go at once.
    shrinking = reassign(Reassignment((1, 2, 3)), [1, 2])
    assert shrinking.adding == () and shrinking.removing == (3,)
    assert reassignment_done(LeaderAndIsr(1, 5, (1, 2)), shrinking)


def test_a_remaining_leader_keeps_leading_unless_it_is_down() -> None:
    # Leader 3 is not the first remaining replica: it stays leader, no needless election.
    state = LeaderAndIsr(3, 5, (1, 2, 3))
    assert leave_replicas(state, (2, 3), LIVE) == LeaderAndIsr(3, 6, (2, 3))
    # A remaining leader that is down hands over to the first live in-sync one.
    assert leave_replicas(state, (3, 2), LIVE - {3}) == LeaderAndIsr(2, 6, (2, 3))
