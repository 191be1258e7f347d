"""CreatePartitions: grow topics to a larger partition count, as Kafka's controller does.

Each topic is judged on its own, in Kafka's (KRaft's) order: named more than
once in the request (INVALID_REQUEST), ALTER on the topic (refused before
existence is revealed), the deadline, existence, the new count (never a
shrink), then the explicit assignments. ``validate_only`` runs every check and
changes nothing.

The change goes to ``services.admin.create_partitions`` (services/topic_admin.py).
A node alone is a cluster of one: an explicit assignment is accepted only if every
new partition's replica list is exactly this broker, and the new logs are made at
once. In a cluster the new replica lists go to ZooKeeper: the topic's replication
factor, placed as for a new topic, or the assignment if it names distinct live
brokers, as many as the topic's replication factor. ``timeout_ms <= 0`` means the
deadline has passed before the work starts, and KRaft then answers
REQUEST_TIMED_OUT and changes nothing: so do we.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.repeated import REPEATED_MESSAGE, each_once
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import RESERVED_TOPICS, TopicError

Resp = m.CreatePartitionsResponse
Result = Resp.CreatePartitionsTopicResult


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


async def _result(
    ctx: RequestContext,
    topic: m.CreatePartitionsRequest.CreatePartitionsTopic,
    timeout_ms: int,
    validate_only: bool,
) -> m.CreatePartitionsResponse.CreatePartitionsTopicResult:
    try:
        _check_request(ctx, topic, timeout_ms)
        assignment = (
            None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
        )
        await ctx.services.admin.create_partitions(
            topic.name, topic.count, assignment, validate_only
        )
        return Result(name=topic.name, error_code=ErrorCode.NONE, error_message=None)
    except TopicError as exc:
        code, message = exc.error_code, str(exc)
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
