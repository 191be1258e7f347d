"""Find the topic a Produce or Fetch entry names (by id in the versions that use ids), and
whether this broker may answer for one of its partitions (:func:`leading_partition`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.leadership import check_leader
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.schema import uses_topic_ids

if TYPE_CHECKING:
    from trio_broker.partition.append import Term
    from trio_broker.services.topics import Topic


def find_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> tuple[Topic | None, str, ErrorCode]:
    """(the topic or None, its name for the answer and the ACL check, the error if missing).

    An unknown topic id has no name: the name is then "" (and stays UNKNOWN_TOPIC_ID).
    A known topic (by id or name) without the partition asked for is
    UNKNOWN_TOPIC_OR_PARTITION, as in Kafka: the id was found, the partition was not.
    In a cluster, a topic this broker holds no replica of is still the cluster's: its
    partitions answer NOT_LEADER_OR_FOLLOWER (so clients refresh their metadata and go
    to the leader), under the topic's name.
    """
    topics = ctx.services.topics
    by_id = uses_topic_ids(ctx.header.api_key, ctx.api_version)
    if by_id:
        topic = topics.by_id.get(topic_id) if topic_id is not None else None
        missing = (
            ErrorCode.UNKNOWN_TOPIC_ID if topic is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
    else:
        topic = topics.get(name or "")
        missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if topic is not None:
        return topic, topic.name, missing
    view = ctx.services.leaders.view
    if by_id:
        held = view.topic_by_id(topic_id) if topic_id is not None else None
    else:
        held = view.topics.get(name or "")
    if held is not None:  # a node alone holds every topic it has: only in a cluster
        return None, held.name, ErrorCode.NOT_LEADER_OR_FOLLOWER
    return None, name or "", missing


def missing_partition_error(
    ctx: RequestContext, name: str, partition: int, missing: ErrorCode
) -> ErrorCode:
    """The error for ``partition`` of a topic this broker has no log of: ``missing``
    (from :func:`find_topic`), unless the cluster has that partition and this broker
    has not created its copy yet (partitions just added): NOT_LEADER_OR_FOLLOWER, as
    Kafka answers for a partition its metadata knows and its replica manager does not,
    so clients refresh their metadata instead of taking the partition for gone."""
    if missing is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return missing
    held = ctx.services.leaders.view.topics.get(name)
    if held is not None and partition in held.partitions:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return missing


def leading_partition(
    ctx: RequestContext, topic: Topic | None, name: str, partition: int, missing: ErrorCode,
    current_leader_epoch: int = -1, *, fence_alone: bool = True,
) -> Term | ErrorCode:  # fmt: skip
    """The guard Produce and Fetch share for one partition of a topic :func:`find_topic`
    gave (``topic``, ``name``, ``missing``): this broker's term when it holds the
    partition and leads it (in ``current_leader_epoch``: :func:`check_leader`), else
    the error to answer, in Kafka's order: the partition unknown here, then not the
    leader (or fenced). The log is then ``topic.logs[partition]``; a term rather than a
    (log, term) pair keeps the hot path free of a tuple per partition."""
    if topic is None or not 0 <= partition < len(topic.logs):
        return missing_partition_error(ctx, name, partition, missing)
    return check_leader(
        ctx, topic.name, partition, current_leader_epoch, fence_alone=fence_alone
    )  # fmt: skip
