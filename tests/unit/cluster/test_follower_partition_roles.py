"""A follower holds a ``Partition`` too, and one object carries the partition across
roles (issue 29, the follower's slice; Kafka's ``Partition`` on every replica, made a
follower by ``makeFollower`` and a leader by ``makeLeader`` on the same object).

The replica manager takes the partition as a follower when the view names another
leader (``_become_follower``: its leader and leader epoch, no term), puts its term in
the same object when it is elected, and drops only the term when another leads again.
A log put in another's place (a log-dir move) gets a new ``Partition`` in the role the
old one had, and the cluster moving the partition away drops it. Driven through the
manager's own ``_apply`` over a view set by hand, on an in-memory ZooKeeper.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.partition.append import NotLeader, Origin, append
from trio_broker.partition.partition import Follows
from trio_broker.protocol.records import build_batch
from trio_broker.services.cluster_view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import Topic, TopicManager
from trio_broker.storage.log import LogConfig

ME, OTHER = 1, 2
KEY = ("t", 0)


def _manager(data_dir: Path | None = None) -> tuple[ReplicaManager, Topic]:
    topics = TopicManager(data_dir, LogConfig(), lambda: 0)
    view = ClusterView(ME)
    view.brokers = {b: BrokerInfo(b, "127.0.0.1", 19000 + b) for b in (ME, OTHER)}
    manager = ReplicaManager(
        view, MemoryCoordination(MemoryZooKeeper()), topics, min_insync_replicas=1,
        replica_lag_time_max_ms=1000, now_ms=lambda: 0, durability=None,
    )  # fmt: skip
    return manager, topics.create("t", 1, topic_id=uuid.uuid4())


def _named(manager: ReplicaManager, topic: Topic, leader: int, epoch: int) -> None:
    manager.view.topics = {
        "t": TopicInfo(
            "t", topic.topic_id, {0: PartitionInfo((ME, OTHER), leader, epoch, (ME, OTHER))}
        )
    }


async def test_one_partition_object_follows_leads_and_follows_again() -> None:
    manager, topic = _manager()
    _named(manager, topic, OTHER, 1)
    await manager._apply()
    followed = topic.replica(0)
    assert followed is not None and followed.log is topic.logs[0]
    assert followed.follows == Follows(OTHER, 1) and followed.leader_term is None
    with pytest.raises(NotLeader):
        topic.leading(0)  # the guard finds it led nowhere here
    with pytest.raises(NotLeader):  # and the leader's append refuses a follower's Partition
        append(followed, build_batch([(None, b"v")]), origin=Origin.CLIENT, now_ms=0,
               durability=None)  # fmt: skip
    assert topic.logs[0].log_end_offset == 0

    _named(manager, topic, ME, 2)  # elected: makeLeader on the same object
    await manager._apply()
    assert topic.leading(0) is followed and topic.replica(0) is followed
    assert followed.term is manager.terms[KEY] and followed.follows is None

    _named(manager, topic, OTHER, 3)  # another leads again: the term goes, not the object
    await manager._apply()
    assert topic.replica(0) is followed
    assert followed.leader_term is None and followed.follows == Follows(OTHER, 3)
    assert KEY not in manager.terms
    with pytest.raises(NotLeader):
        topic.leading(0)

    _named(manager, topic, OTHER, 4)  # a new leader epoch of the same leader
    await manager._apply()
    assert topic.replica(0) is followed and followed.follows == Follows(OTHER, 4)


async def test_a_followed_log_put_in_anothers_place_gets_a_new_partition(tmp_path: Path) -> None:
    manager, topic = _manager(tmp_path / "data")
    _named(manager, topic, OTHER, 1)
    await manager._apply()
    before = topic.replica(0)
    assert before is not None
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    manager.topics.log_dirs.append(other_dir)
    manager.topics.dir_counts[other_dir] = 0
    moved = manager.topics.move_partition("t", 0, other_dir)  # AlterReplicaLogDirs
    after = topic.replica(0)
    assert after is not None and after is not before and after.log is moved
    assert after.follows == Follows(OTHER, 1) and after.leader_term is None
    manager.topics.close()


async def test_a_partition_moved_away_drops_its_partition() -> None:
    manager, topic = _manager()
    manager.topics.add_partitions("t", 2)
    manager.view.topics = {
        "t": TopicInfo(
            "t", topic.topic_id,
            {0: PartitionInfo((ME, OTHER), OTHER, 1, (ME, OTHER)),
             1: PartitionInfo((ME, OTHER), OTHER, 1, (ME, OTHER))},
        )
    }  # fmt: skip
    await manager._apply()
    assert topic.replica(0) is not None and topic.replica(1) is not None
    manager.view.topics["t"].partitions[0] = PartitionInfo((OTHER,), OTHER, 2, (OTHER,))
    await manager._apply()  # partition 0 reassigned away from this broker; 1 stays
    assert manager.topics.get("t") is topic
    assert KEY not in manager.following and topic.replica(0) is None
    assert topic.replica(1) is not None
