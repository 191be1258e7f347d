"""A replica that a reassignment is removing is not admitted back to the ISR.

The controller ends a move with two writes: the partition state without the leaving
replicas (a new leader epoch), then the assignment without them. A leader that has read
the first but not yet the second still lists the leaving replica among its followers;
if that replica fetched on (it had not yet heard either), the leader used to propose it
back into the ISR, and the ISR then held a broker that is no replica of the partition
(seen in tests/cluster/test_cluster_admin.py's reassignment under load: ISR [1, 2, 3] of
replicas [2, 3]).

The follower's fetch goes through the one read entry (``partition/read.py``), which
records a replica's progress and hands the outcome to the replica manager.
"""

from __future__ import annotations

import uuid

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.partition.read import Isolation, ReplicaRead, read, read_by_replica
from trio_broker.protocol.records import build_batch
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

KEY = ("t", 0)


class Answer:
    error_code = 0
    high_watermark = last_stable_offset = log_start_offset = -1


def follower_fetch(manager: ReplicaManager, replica: int, offset: int) -> Answer:
    """``replica``'s Fetch of t-0 from ``offset`` (its log starting at 0), read as the
    fetch handler reads it: the guard's Partition, a first read that records progress."""
    topic = manager.topics.get("t")
    assert topic is not None
    partition = topic.leading(0)
    answer = Answer()
    read_by_replica(
        answer, partition, offset, 1 << 20, ReplicaRead(replica, 0, manager), 0, min_one=True
    )
    return answer


async def _leader_of(info: PartitionInfo) -> ReplicaManager:
    coord = MemoryCoordination(MemoryZooKeeper())
    topics = TopicManager(None, LogConfig(), lambda: 0)
    manager = ReplicaManager(
        ClusterView(1), coord, topics, min_insync_replicas=1, replica_lag_time_max_ms=1000,
        now_ms=lambda: 0, durability=None,
    )  # fmt: skip
    topic = topics.create("t", 1)
    manager.view.topics["t"] = TopicInfo("t", topic.topic_id or uuid.uuid4(), {0: info})
    log = topics.log(*KEY)
    assert log is not None
    for i in range(5):
        log.append(build_batch([(None, b"v%d" % i)], base_timestamp=0), now_ms=0)
    await manager._become_leader("t", 0, info)
    manager.terms[KEY].leader_synced(5)
    return manager


async def test_a_leaving_replica_that_catches_up_stays_out_of_the_isr() -> None:
    # Moving (1, 2, 3) to (1, 2): 3 is leaving and already out of the ISR.
    moving = PartitionInfo((1, 2, 3), 1, 7, (1, 2), removing_replicas=(3,))
    manager = await _leader_of(moving)
    assert follower_fetch(manager, 3, 5).error_code == 0  # caught up, in this epoch
    term = manager.terms[KEY]
    assert term.pending is None
    assert term.isr == frozenset({1, 2})


async def test_while_the_move_is_under_way_a_leaving_replica_may_rejoin() -> None:
    # Moving (1, 2, 3) to (1, 2, 4): 4 is not in sync yet, so the move goes on and 3 is
    # still a replica in full, as in Kafka.
    moving = PartitionInfo((1, 2, 4, 3), 1, 7, (1, 2), adding_replicas=(4,), removing_replicas=(3,))
    manager = await _leader_of(moving)
    follower_fetch(manager, 3, 5)
    term = manager.terms[KEY]
    assert term.pending is not None
    assert term.pending.isr == frozenset({1, 2, 3})


async def test_a_replica_that_stays_joins_the_isr_once_caught_up() -> None:
    # The same fetch by a replica that is not leaving: proposed into the ISR, as before.
    staying = PartitionInfo((1, 2, 3), 1, 7, (1, 2))
    manager = await _leader_of(staying)
    follower_fetch(manager, 3, 5)
    term = manager.terms[KEY]
    assert term.pending is not None
    assert term.pending.isr == frozenset({1, 2, 3})


async def test_a_consumers_read_records_no_progress() -> None:
    staying = PartitionInfo((1, 2, 3), 1, 7, (1, 2))
    manager = await _leader_of(staying)
    topic = manager.topics.get("t")
    assert topic is not None
    partition = topic.leading(0)
    read(Answer(), partition, 5, 1 << 20, Isolation.HIGH_WATERMARK, min_one=True)
    assert manager.terms[KEY].pending is None  # nobody proposed into the ISR
