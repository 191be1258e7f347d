"""The one per-partition guard (``topic_lookup.leading_partition``, rules in
``leadership.py``) against Kafka's answers (ReplicaManager.getPartitionOrError, then
Partition.getLocalLog), case by case:

- a partition this broker holds no log of: NOT_LEADER_OR_FOLLOWER if the cluster's
  metadata has that partition (partitions just added, or another broker's replicas),
  else UNKNOWN_TOPIC_OR_PARTITION, per partition: a topic held elsewhere whose
  partition the cluster lacks is unknown, not "not the leader";
- a partition held here as a follower: the client's leader epoch is compared with the
  one the follower knows first (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH), then it is
  NOT_LEADER_OR_FOLLOWER, also while the partition has no leader (Kafka's hosted
  partition is simply not the leader; LEADER_NOT_AVAILABLE is Metadata's answer);
- the debugging replica's ListOffsets may read the follower's copy (``replica_partition``);
- a node alone answers as before.

The leaders below are a cluster's view with this broker (1) holding logs and leading
nothing; the wire-level cases are in tests/integration/test_partition_guard_answers.py.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from trio_broker.handlers.leadership import missing_partition_error
from trio_broker.handlers.topic_lookup import (
    FollowerCopy,
    find_topic,
    leading_partition,
    replica_partition,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.local_replication import LocalReplication, LocalTerm, LocalView
from trio_broker.services.producers import PartitionProducerState, ProducerStateRegistry
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

E = ErrorCode
UNKNOWN = E.UNKNOWN_TOPIC_OR_PARTITION
EPOCH = 5


class FollowingEverything:
    """A cluster's leadership as the replica manager gives it, for a broker that leads
    nothing: the view, no term."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.view.topics.get(topic)
        return None if info is None else info.partitions.get(partition)

    def leader_term(self, topic: str, partition: int) -> None:
        return None


def context(
    leaders: Any, topics: TopicManager, api_key: int = m.ApiKey.LIST_OFFSETS,
    producers: ProducerStateRegistry | None = None,
) -> Any:  # fmt: skip
    # The producers' registry: the replication took its partitions with its entries.
    registry = producers if producers is not None else ProducerStateRegistry(None, lambda: 0)
    return SimpleNamespace(
        services=SimpleNamespace(
            leaders=leaders, topics=topics, producers=registry, own_internal_topics={}
        ),
        header=RequestHeader(api_key, 7, 1, "guard"),
        api_version=7,
    )


def alone_with(topic: str, partitions: int) -> Any:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    topics.create(topic, partitions)
    endpoints = [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
    producers = ProducerStateRegistry(None, lambda: 0)
    leaders = LocalReplication(LocalView(1, None, topics, lambda: endpoints), producers=producers)
    return context(leaders, topics, producers=producers)


def cluster(held: dict[str, int], cluster_has: dict[str, int], leader: int = 2) -> Any:
    """Broker 1 holds ``held`` topics' logs (that many partitions each); the cluster's
    view has ``cluster_has``, every partition led by ``leader`` in epoch 5."""
    topics = TopicManager(None, LogConfig(), lambda: 0)
    for name, count in held.items():
        topics.create(name, count)
    view = ClusterView(1)
    info = PartitionInfo(replicas=(1, 2), leader=leader, leader_epoch=EPOCH, isr=(1, 2))
    for name, count in cluster_has.items():
        view.topics[name] = TopicInfo(name, uuid.uuid4(), {p: info for p in range(count)})
    return context(FollowingEverything(view), topics)


def guard(ctx: Any, name: str, partition: int, current_leader_epoch: int = -1) -> Any:
    topic, found_name, missing = find_topic(ctx, name, None)
    return leading_partition(ctx, topic, found_name, partition, missing, current_leader_epoch)


def test_a_partition_the_cluster_has_answers_not_leader() -> None:
    ctx = cluster(held={"grown": 3}, cluster_has={"grown": 4, "elsewhere": 2})
    assert missing_partition_error(ctx, "grown", 3) == E.NOT_LEADER_OR_FOLLOWER
    assert guard(ctx, "grown", 3) == E.NOT_LEADER_OR_FOLLOWER  # not created here yet
    assert guard(ctx, "elsewhere", 1) == E.NOT_LEADER_OR_FOLLOWER  # no replica here


def test_a_partition_the_cluster_lacks_stays_unknown() -> None:
    ctx = cluster(held={"grown": 3}, cluster_has={"grown": 4, "elsewhere": 2})
    assert guard(ctx, "grown", 4) == UNKNOWN
    assert guard(ctx, "other", 0) == UNKNOWN
    # A topic held on other brokers: its partition 2 is not the cluster's (was
    # NOT_LEADER_OR_FOLLOWER for every partition of such a topic).
    assert guard(ctx, "elsewhere", 2) == UNKNOWN


def test_a_follower_checks_the_epoch_before_it_says_not_leader() -> None:
    ctx = cluster(held={"t": 1}, cluster_has={"t": 1})
    assert guard(ctx, "t", 0) == E.NOT_LEADER_OR_FOLLOWER
    assert guard(ctx, "t", 0, EPOCH) == E.NOT_LEADER_OR_FOLLOWER
    assert guard(ctx, "t", 0, EPOCH - 1) == E.FENCED_LEADER_EPOCH
    assert guard(ctx, "t", 0, EPOCH + 1) == E.UNKNOWN_LEADER_EPOCH


def test_a_partition_held_here_without_a_leader_is_not_led_here() -> None:
    ctx = cluster(held={"t": 1}, cluster_has={"t": 1}, leader=-1)
    assert guard(ctx, "t", 0) == E.NOT_LEADER_OR_FOLLOWER  # was LEADER_NOT_AVAILABLE
    # Held here, not in the view (yet or any more): not the leader either.
    ctx = cluster(held={"t": 1}, cluster_has={})
    assert guard(ctx, "t", 0) == E.NOT_LEADER_OR_FOLLOWER


def test_the_debugging_replica_may_read_a_followers_copy() -> None:
    ctx = cluster(held={"t": 1}, cluster_has={"t": 2, "elsewhere": 1})

    def replica(name: str, partition: int, current: int = -1) -> Any:
        topic, found_name, missing = find_topic(ctx, name, None)
        return replica_partition(ctx, topic, found_name, partition, missing, current)

    assert replica("t", 0) == FollowerCopy(leader_epoch=EPOCH)
    assert replica("t", 0, EPOCH) == FollowerCopy(leader_epoch=EPOCH)
    assert replica("t", 0, EPOCH - 1) == E.FENCED_LEADER_EPOCH
    assert replica("t", 1) == E.NOT_LEADER_OR_FOLLOWER  # no copy here to read
    assert replica("elsewhere", 0) == E.NOT_LEADER_OR_FOLLOWER
    assert replica("t", 2) == UNKNOWN


def test_other_errors_and_a_single_broker_are_unchanged() -> None:
    ctx = alone_with("solo", 3)
    assert guard(ctx, "solo", 3) == UNKNOWN
    assert guard(ctx, "other", 0) == UNKNOWN
    led = guard(ctx, "solo", 0)
    # The one lookup gives the partition whole: its log, its term, its producer state.
    assert not isinstance(led, ErrorCode) and (led.topic, led.index) == ("solo", 0)
    assert led.log is ctx.services.topics.log("solo", 0) and led.term.leader_epoch == 0
    assert isinstance(led.producers, PartitionProducerState)
    assert led.producers.registry is ctx.services.producers
    assert (led.producers.topic, led.producers.index) == ("solo", 0)
    assert guard(ctx, "solo", 0, 1) == E.UNKNOWN_LEADER_EPOCH
    unknown_id = ErrorCode.UNKNOWN_TOPIC_ID
    ctx = cluster(held={}, cluster_has={"grown": 4})
    assert missing_partition_error(ctx, "", 0, unknown_id) == unknown_id


def test_one_partition_per_log_its_term_replaced() -> None:
    """The topic keeps one Partition per partition, taken by the replication: the
    guard finds the same object for the same log (a Fetch of many partitions allocates
    none per partition) and never takes one; a new term taken on the same log keeps
    the object; a log put in another's place (the topic made again) gives a new one,
    never the old log's."""
    ctx = alone_with("solo", 2)
    first = guard(ctx, "solo", 0)
    assert not isinstance(first, ErrorCode)
    assert guard(ctx, "solo", 0) is first
    assert first.term is ctx.services.leaders.leader_term("solo", 0)  # one term per log
    other = guard(ctx, "solo", 1)
    assert not isinstance(other, ErrorCode) and other is not first and other.index == 1
    # A new term taken on the same log (a cluster's next leader epoch): the same
    # Partition, holding the new term, which the guard finds.
    topic, _, _ = find_topic(ctx, "solo", None)
    assert topic is not None and topic.partitions[0] is first
    taken = LocalTerm(1, first.log)
    assert topic.make_leader(0, taken, first.producers) is first and first.term is taken
    assert guard(ctx, "solo", 0) is first
    # Its term ended (the Partition dropped): not led here, and the guard takes none.
    topic.drop_partition(0)
    assert guard(ctx, "solo", 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert 0 not in topic.partitions
    old_log = first.log
    topics = ctx.services.topics
    topics.delete("solo")
    topics.create("solo", 2)
    again = guard(ctx, "solo", 0)
    assert not isinstance(again, ErrorCode) and again is not first
    assert again.log is topics.log("solo", 0) and again.log is not old_log
    assert again.term.high_watermark == 0 and again.term is not first.term
