"""CreatePartitions: grow topics to a larger partition count, as Kafka's controller does.

Each topic is judged on its own, in Kafka's (KRaft's) order: named more than
once in the request (INVALID_REQUEST), ALTER on the topic (refused before
existence is revealed), the deadline, existence, the new count (never a
shrink), then the explicit assignments. ``validate_only`` runs every check and
changes nothing.

A broker alone is the whole cluster, so an explicit assignment is accepted only
if every new partition's replica list is exactly this broker. In a cluster the
new replica lists go to ZooKeeper (``ReplicaManager.create_partitions``): the
topic's replication factor, placed as for a new topic, or the assignment if it
names distinct live brokers, as many as the topic's replication factor. The work is short and synchronous (a few
directories and one catalogue write), so a positive ``timeout_ms`` is always
met; ``timeout_ms <= 0`` means the deadline has passed before the work starts,
and KRaft then answers REQUEST_TIMED_OUT and changes nothing: so do we.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.repeated import REPEATED_MESSAGE, each_once
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import RESERVED_TOPICS, TopicError
from trio_broker.storage.errors import LogError, StorageError

Resp = m.CreatePartitionsResponse
Result = Resp.CreatePartitionsTopicResult


def _check_assignments(
    ctx: RequestContext, topic: m.CreatePartitionsRequest.CreatePartitionsTopic, current: int
) -> None:
    """Kafka's checks of a manual assignment, on a cluster of one broker."""
    assignments = topic.assignments
    if assignments is None:
        return
    added = topic.count - current
    if len(assignments) != added:
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"adding {added} partition(s) needs {added} assignment(s), got {len(assignments)}",
        )
    node = ctx.services.config.node_id
    for offset, assignment in enumerate(assignments):
        replicas = list(assignment.broker_ids)
        if replicas == [node]:
            continue
        unknown = sorted(set(replicas) - {node})
        if not replicas:
            reason = "no replicas"
        elif unknown:
            reason = f"unknown broker(s) {unknown}"
        else:
            reason = f"broker {node} listed {len(replicas)} times"
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {current + offset}: {reason}; the replicas must be [{node}], "
            "the only broker",
        )


def _check_request(
    ctx: RequestContext, topic: m.CreatePartitionsRequest.CreatePartitionsTopic, timeout_ms: int
) -> None:
    name = topic.name
    if not authorized(ctx, Operation.ALTER, ResourceType.TOPIC, name):
        raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"ALTER on topic {name!r} refused")
    if timeout_ms <= 0:
        raise TopicError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"timeout_ms {timeout_ms}: the deadline passed before the work could start",
        )
    if name in RESERVED_TOPICS:
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"{name} is an internal topic; the broker owns its partition count",
        )


def _grow(
    ctx: RequestContext,
    topic: m.CreatePartitionsRequest.CreatePartitionsTopic,
    timeout_ms: int,
    validate_only: bool,
) -> None:
    _check_request(ctx, topic, timeout_ms)
    name = topic.name
    topics = ctx.services.topics
    current = len(topics.check_new_partitions(name, topic.count).logs)
    _check_assignments(ctx, topic, current)
    if not validate_only:
        topics.add_partitions(name, topic.count)


async def _result(
    ctx: RequestContext,
    topic: m.CreatePartitionsRequest.CreatePartitionsTopic,
    timeout_ms: int,
    validate_only: bool,
) -> m.CreatePartitionsResponse.CreatePartitionsTopicResult:
    try:
        replication = ctx.services.replication
        if replication is None:
            _grow(ctx, topic, timeout_ms, validate_only)
        else:  # the cluster's topic grows in ZooKeeper; every replica follows
            _check_request(ctx, topic, timeout_ms)
            assignment = (
                None
                if topic.assignments is None
                else [list(a.broker_ids) for a in topic.assignments]
            )
            await replication.create_partitions(topic.name, topic.count, assignment, validate_only)
        return Result(name=topic.name, error_code=ErrorCode.NONE, error_message=None)
    except (TopicError, LogError) as exc:
        code, message = exc.error_code, str(exc)
    except OSError as exc:  # a disk error is a storage error
        code, message = StorageError.error_code, f"cannot add partitions: {exc}"
    return Result(name=topic.name, error_code=code, error_message=message)


@handles(m.ApiKey.CREATE_PARTITIONS)
async def handle_create_partitions(
    ctx: RequestContext, request: m.CreatePartitionsRequest
) -> m.CreatePartitionsResponse:
    results: list[m.CreatePartitionsResponse.CreatePartitionsTopicResult] = []
    for topic, repeated in each_once(request.topics, lambda t: t.name):
        if repeated:  # answered once, with INVALID_REQUEST, and not acted on
            results.append(
                Result(name=topic.name, error_code=ErrorCode.INVALID_REQUEST,
                       error_message=REPEATED_MESSAGE)
            )  # fmt: skip
            continue
        results.append(await _result(ctx, topic, request.timeout_ms, request.validate_only))
    return Resp(throttle_time_ms=0, results=results)
