"""Partition reassignment (KIP-455): the pure rules and the topic znode's moving lists."""

from __future__ import annotations

import json
import uuid

import pytest

from trio_broker.cluster.zk_layout import CoordinationDataError, TopicAssignment
from trio_broker.replication.controller_rules import (
    LeaderAndIsr,
    Reassignment,
    leave_replicas,
    reassign,
    reassignment_done,
)

LIVE = frozenset({1, 2, 3, 4})


def test_a_move_lists_target_replicas_first_then_the_leaving_ones() -> None:
    moving = reassign(Reassignment((1, 2)), [2, 3])
    assert moving == Reassignment((2, 3, 1), adding=(3,), removing=(1,))
    # The original replicas come back in the order the move lists them (so does Kafka's
    # ``replicas -- adding``): a cancelled move may change the preferred leader.
    assert (moving.original, moving.target) == ((2, 1), (2, 3))


def test_a_new_target_replaces_the_move_in_progress_from_the_original_replicas() -> None:
    first = reassign(Reassignment((1, 2)), [2, 3])
    second = reassign(first, [4, 1])
    assert second == Reassignment((4, 1, 2), adding=(4,), removing=(2,))


def test_cancelling_or_asking_for_the_same_replicas_means_no_move() -> None:
    moving = reassign(Reassignment((1, 2)), [2, 3])
    assert reassign(moving, None) == Reassignment((2, 1))
    assert reassign(Reassignment((1, 2)), [1, 2]) == Reassignment((1, 2))


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
