"""Produce and Fetch for a partition this broker has no log of: the error depends on
whether the cluster has the partition (Kafka's replica manager vs its metadata cache).

A partition the cluster has but this broker has not created yet (CreatePartitions just
wrote it; the broker grows its local topic when its view changes) answers
NOT_LEADER_OR_FOLLOWER, so clients refresh their metadata and retry; a partition the
cluster does not have stays UNKNOWN_TOPIC_OR_PARTITION, and a single broker answers as
before.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from trio_broker.handlers.topic_lookup import missing_partition_error
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.local_replication import LocalReplication, LocalView
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def context(leaders: Any) -> Any:
    return SimpleNamespace(services=SimpleNamespace(leaders=leaders))


def alone_with(topic: str, partitions: int) -> Any:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    topics.create(topic, partitions)
    endpoints = [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
    return LocalReplication(LocalView(1, None, topics, lambda: endpoints))


def cluster_with(topic: str, partitions: int) -> Any:
    view = ClusterView(1)
    info = PartitionInfo(replicas=(1, 2), leader=2, leader_epoch=0, isr=(1, 2))
    view.topics[topic] = TopicInfo(topic, uuid.uuid4(), {p: info for p in range(partitions)})
    return SimpleNamespace(view=view)


def test_a_partition_the_cluster_has_answers_not_leader() -> None:
    ctx = context(cluster_with("grown", 4))
    assert missing_partition_error(ctx, "grown", 3, UNKNOWN) == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_partition_the_cluster_lacks_stays_unknown() -> None:
    ctx = context(cluster_with("grown", 4))
    assert missing_partition_error(ctx, "grown", 4, UNKNOWN) == UNKNOWN
    assert missing_partition_error(ctx, "other", 0, UNKNOWN) == UNKNOWN


def test_other_errors_and_a_single_broker_are_unchanged() -> None:
    assert missing_partition_error(context(alone_with("grown", 3)), "grown", 3, UNKNOWN) == UNKNOWN
    unknown_id = ErrorCode.UNKNOWN_TOPIC_ID
    ctx = context(cluster_with("grown", 4))
    assert missing_partition_error(ctx, "", 0, unknown_id) == unknown_id
