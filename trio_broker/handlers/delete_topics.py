"""DeleteTopics: by name (all versions) or by topic id (v6+).

The topic is looked up in ``services.admin.view`` and deleted by the controller
(``services.admin.controller``, services/topic_admin.py). A node alone is its own
controller: it closes the topic's logs and removes their directories at once. In a
cluster only the controller deletes (others: NOT_CONTROLLER): the topic's tree goes
from ZooKeeper, and every broker holding a copy deletes it when its view loses the
topic. With ``delete.topic.enable=false`` every topic of the request is refused before
any other check, as Kafka's controller does: TOPIC_DELETION_DISABLED, or
INVALID_REQUEST for versions 0-2, which predate that error.
"""

from __future__ import annotations

import uuid

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.repeated import REPEATED_MESSAGE, each_once
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import TopicInfo

Resp = m.DeleteTopicsResponse
Result = Resp.DeletableTopicResult
ZERO_UUID = uuid.UUID(int=0)


def _lookup(ctx: RequestContext, name: str | None, topic_id: uuid.UUID) -> TopicInfo | None:
    """The topic by name or id, as the controller's view has it."""
    view = ctx.services.admin.view
    return view.topics.get(name) if name is not None else view.topic_by_id(topic_id)


async def _delete(ctx: RequestContext, name: str | None, topic_id: uuid.UUID) -> Result:
    result = Result(name=name, topic_id=topic_id, error_code=ErrorCode.NONE, error_message=None)
    if name is not None and topic_id != ZERO_UUID:
        result.error_code = ErrorCode.INVALID_REQUEST
        result.error_message = "give a topic name or a topic id, not both"
        return result
    if name is None:
        if topic_id == ZERO_UUID:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = "neither a topic name nor a topic id was given"
            return result
        topic = _lookup(ctx, None, topic_id)
        if topic is None:
            result.error_code = ErrorCode.UNKNOWN_TOPIC_ID
            result.error_message = f"no topic with id {topic_id}"
            return result
    else:
        topic = _lookup(ctx, name, topic_id)
        if not authorized(ctx, Operation.DELETE, ResourceType.TOPIC, name):
            # Refused before existence is revealed, as Kafka does.
            result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            result.error_message = f"DELETE on topic {name!r} refused"
            return result
        if topic is None:
            result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            result.error_message = f"topic {name!r} does not exist"
            return result
    result.name, result.topic_id = topic.name, topic.topic_id
    if name is None and not authorized(ctx, Operation.DELETE, ResourceType.TOPIC, topic.name):
        result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        result.error_message = f"DELETE on topic {topic.name!r} refused"
        return result
    controller = ctx.services.admin.controller
    if controller is None:
        result.error_code = ErrorCode.NOT_CONTROLLER
        result.error_message = "this broker is not the controller"
        return result
    result.error_code, result.error_message = await controller.delete_topic(topic.name)
    return result


@handles(m.ApiKey.DELETE_TOPICS)
async def handle_delete_topics(
    ctx: RequestContext, request: m.DeleteTopicsRequest
) -> m.DeleteTopicsResponse:
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, ZERO_UUID) for name in request.topic_names]
    if not ctx.services.config.delete_topic_enable:
        error = (
            ErrorCode.TOPIC_DELETION_DISABLED if ctx.api_version >= 3 else ErrorCode.INVALID_REQUEST
        )
        refused = [
            Result(name=name, topic_id=topic_id, error_code=error,
                   error_message="topic deletion is disabled (delete.topic.enable=false)")
            for name, topic_id in wanted
        ]  # fmt: skip
        return Resp(throttle_time_ms=0, responses=refused)
    # A topic named (or identified) twice is answered once, with INVALID_REQUEST, as Kafka does.
    responses: list[Result] = []
    for (name, topic_id), repeated in each_once(
        wanted, lambda w: w[0] if w[0] is not None else w[1]
    ):
        if repeated:
            responses.append(
                Result(name=name, topic_id=topic_id, error_code=ErrorCode.INVALID_REQUEST,
                       error_message=REPEATED_MESSAGE)
            )  # fmt: skip
            continue
        responses.append(await _delete(ctx, name, topic_id))
    return Resp(throttle_time_ms=0, responses=responses)
