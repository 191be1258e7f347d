"""DescribeTopicPartitions (KIP-966): the topics' partitions, a page at a time.

The Java Admin (3.7+) describes topics by name with this API when the broker offers it,
and kafka-topics.sh --describe through it. It answers from the same view Metadata does
(alone: this node's topics; in a cluster: the cluster view), with Kafka's paging rules
(``DescribeTopicPartitionsRequestHandler`` and ``KRaftMetadataCache``):

- topics in name order, each topic's partitions in index order, from the cursor on
  (the cursor's topic from its partition, the topics after it from partition 0);
- at most ``min(ResponsePartitionLimit, max.request.partition.size.limit)`` partitions
  (at least 1); when a topic does not fit, ``NextCursor`` names its first partition left
  out, and when the page is full at a topic's end, the next topic's partition 0;
- no topics asked for: every topic the principal may DESCRIBE, the rest left out unseen;
- a named topic it may not DESCRIBE gets TOPIC_AUTHORIZATION_FAILED (at the end, and
  without its id), a missing one UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for
  an illegal name); neither counts against the page;
- a cursor whose topic is not among the named topics, or whose partition is negative,
  fails the whole request with INVALID_REQUEST on every named topic.
"""

from __future__ import annotations

import uuid

from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
)
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.metadata import topic_metadata
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import RESERVED_TOPICS, TopicError, validate_topic_name

Resp = m.DescribeTopicPartitionsResponse
Topic = Resp.DescribeTopicPartitionsResponseTopic
Partition = Topic.DescribeTopicPartitionsResponsePartition
NO_ID = uuid.UUID(int=0)


@handles(m.ApiKey.DESCRIBE_TOPIC_PARTITIONS)
async def handle_describe_topic_partitions(
    ctx: RequestContext, request: m.DescribeTopicPartitionsRequest
) -> m.DescribeTopicPartitionsResponse:
    return describe(ctx, request)


def describe(
    ctx: RequestContext, request: m.DescribeTopicPartitionsRequest
) -> m.DescribeTopicPartitionsResponse:
    cursor = request.cursor
    after = cursor.topic_name if cursor is not None else ""
    every_topic = not request.topics
    listed = {*ctx.services.leaders.view.topics, *_own_listed(ctx)}
    if every_topic:
        names = {name for name in listed if name >= after}
    else:
        names = {t.name for t in request.topics if t.name >= after}
        if cursor is not None and cursor.topic_name not in names:
            return _refused(request)  # the cursor must point into the named topics
    if cursor is not None and cursor.partition_index < 0:
        return _refused(request)
    refused: list[Topic] = []
    allowed = []
    for name in sorted(names):
        if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
            allowed.append(name)
        elif not every_topic:  # named: say it is refused, but not whether it exists
            refused.append(Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name,
                                 topic_id=NO_ID, is_internal=False, partitions=[]))  # fmt: skip
    limit = max(min(ctx.services.config.max_request_partition_size_limit,
                    request.response_partition_limit), 1)  # fmt: skip
    response = Resp(throttle_time_ms=0, topics=[], next_cursor=None)
    remaining = limit
    for name in allowed:
        if remaining == 0:  # the page is full at a topic's end: go on at the next one
            response.next_cursor = Resp.Cursor(topic_name=name, partition_index=0)
            break
        if name not in listed:
            if not every_topic:
                response.topics.append(_missing(name))
            continue
        start = cursor.partition_index if cursor is not None and name == after else 0
        topic, next_index = _page(ctx, name, start, remaining)
        response.topics.append(topic)
        if next_index is not None:
            response.next_cursor = Resp.Cursor(topic_name=name, partition_index=next_index)
            break
        remaining -= len(topic.partitions)
    response.topics.extend(refused)
    return response


def _own_listed(ctx: RequestContext) -> list[str]:
    """A node alone's internal topics Metadata lists (handlers/metadata.py)."""
    return [name for name, own in ctx.services.own_internal_topics.items() if own.listed()]


def _page(ctx: RequestContext, name: str, start: int, count: int) -> tuple[Topic, int | None]:
    """Up to ``count`` partitions of an existing topic from ``start`` on, and the first
    partition left out (None: none left)."""
    meta = topic_metadata(ctx, name, None)
    ordered = sorted(meta.partitions, key=lambda p: p.partition_index)
    chosen = [p for p in ordered if p.partition_index >= start][:count]
    left = len(ordered) > start + count
    partitions = []
    for p in chosen:
        # No partition error for a partition without a leader (leader -1): Kafka's answer
        # leaves that to the leader id, where Metadata says LEADER_NOT_AVAILABLE.
        partition = Partition(
            error_code=ErrorCode.NONE, partition_index=p.partition_index,
            leader_id=p.leader_id, leader_epoch=p.leader_epoch,
            replica_nodes=list(p.replica_nodes), isr_nodes=list(p.isr_nodes),
            eligible_leader_replicas=[], last_known_elr=[],  # not null: the Java Admin reads both
            offline_replicas=list(p.offline_replicas),
        )  # fmt: skip
        partitions.append(partition)
    topic = Topic(
        error_code=ErrorCode.NONE, name=name, topic_id=meta.topic_id,
        is_internal=name in RESERVED_TOPICS, partitions=partitions,
        topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name),
    )  # fmt: skip
    return topic, start + count if left else None


def _missing(name: str) -> Topic:
    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if name not in RESERVED_TOPICS:  # an internal topic not made yet is just missing
        try:
            validate_topic_name(name)
        except TopicError as exc:
            error = exc.error_code
    return Topic(error_code=error, name=name, topic_id=NO_ID,
                 is_internal=name in RESERVED_TOPICS, partitions=[])  # fmt: skip


def _refused(request: m.DescribeTopicPartitionsRequest) -> m.DescribeTopicPartitionsResponse:
    """The whole request refused (Kafka's error response: each named topic, the error)."""
    return Resp(
        throttle_time_ms=0,
        topics=[Topic(error_code=ErrorCode.INVALID_REQUEST, name=t.name, topic_id=NO_ID,
                      is_internal=False, partitions=[]) for t in request.topics],
        next_cursor=None,
    )  # fmt: skip
