"""ConsumerGroupHeartbeat (API 68, KIP-848): the consumer rebalance protocol.

A member of a ``group.protocol=consumer`` consumer joins (epoch 0), reports what it
owns and gets its assignment back, all through this one request; the rules live in
``trio_broker.state.consumer_group``. Topics travel as ids: the handler maps them to
names for the group and back. Partitions of a topic id this broker does not know are
left out of the member's report (the topic is gone). A heartbeat that changed the
group is answered once the group's new snapshot is stored in ``__consumer_offsets``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from trio_broker.groups.coordinator import GroupCoordinator
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.consumer_group import Assignment, Heartbeat, HeartbeatResult

Resp = m.ConsumerGroupHeartbeatResponse


def topic_table(ctx: RequestContext) -> dict[str, tuple[uuid.UUID, int]]:
    """name -> (topic id, partition count) of every topic, as Metadata lists them
    (``services.leaders.view``: the cluster's, or a node alone's own)."""
    topics = ctx.services.leaders.view.topics
    return {name: (info.topic_id, len(info.partitions)) for name, info in topics.items()}


def assigned_by_topic(
    partitions: Iterable[tuple[str, int]], table: dict[str, tuple[uuid.UUID, int]]
) -> list[tuple[uuid.UUID, str, list[int]]]:
    """(topic id, name, sorted partitions) per topic, by name; topics gone are left out.
    What the group Describe answers (consumer and share) list as a member's assignment."""
    per_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        per_topic.setdefault(topic, []).append(partition)
    return [
        (table[topic][0], topic, sorted(parts))
        for topic, parts in sorted(per_topic.items())
        if topic in table
    ]


def by_id(table: dict[str, tuple[uuid.UUID, int]]) -> dict[uuid.UUID, str]:
    return {topic_id: name for name, (topic_id, _) in table.items()}


def as_topic_partitions(
    assignment: Assignment, table: dict[str, tuple[uuid.UUID, int]], cls: type
) -> list[Any]:
    """Partitions grouped by topic id, sorted, as the response's TopicPartitions."""
    per_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        per_topic.setdefault(topic, []).append(partition)
    return [
        cls(topic_id=table[topic][0], partitions=sorted(parts))
        for topic, parts in sorted(per_topic.items())
        if topic in table
    ]


def owned_partitions(
    reported: Iterable[m.ConsumerGroupHeartbeatRequest.TopicPartitions] | None,
    names: dict[uuid.UUID, str],
) -> Assignment | None:
    if reported is None:
        return None
    return frozenset(
        (names[tp.topic_id], p) for tp in reported if tp.topic_id in names for p in tp.partitions
    )


def response(result: HeartbeatResult, table: dict[str, tuple[uuid.UUID, int]]) -> Resp:
    assignment = None
    if result.assignment is not None and result.error is ErrorCode.NONE:
        assignment = Resp.Assignment(
            topic_partitions=as_topic_partitions(
                result.assignment, table, Resp.Assignment.TopicPartitions
            )
        )
    return Resp(
        throttle_time_ms=0,
        error_code=result.error,
        error_message=result.message,
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval_ms=result.heartbeat_interval_ms,
        assignment=assignment,
    )


@handles(m.ApiKey.CONSUMER_GROUP_HEARTBEAT)
async def handle_consumer_group_heartbeat(
    ctx: RequestContext, request: m.ConsumerGroupHeartbeatRequest
) -> Resp | Deferred:
    group_id = request.group_id
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id):
        return response(HeartbeatResult(ErrorCode.GROUP_AUTHORIZATION_FAILED), {})
    groups: GroupCoordinator = ctx.services.groups
    if (not_here := groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        return response(HeartbeatResult(not_here), {})
    table = topic_table(ctx)
    subscribed = request.subscribed_topic_names
    heartbeat = Heartbeat(
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        subscribed=None if subscribed is None else tuple(subscribed),
        regex=request.subscribed_topic_regex if ctx.api_version >= 1 else None,
        server_assignor=request.server_assignor,
        owned=owned_partitions(request.topic_partitions, by_id(table)),
        client_id=ctx.header.client_id or "",
        client_host=f"/{ctx.client.host}",
    )
    metadata = {name: count for name, (_, count) in table.items()}
    describable = None
    if ctx.services.authorizer is not None:  # regex matches: only topics it may describe

        def describable(topic: str) -> bool:
            return authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic)

    result = groups.consumer_group_heartbeat(group_id, heartbeat, metadata, describable)
    if not groups.group_write_pending(group_id):
        return response(result, table)

    async def when_stored() -> Resp:
        # As Kafka: a member hears of a new epoch or assignment once it is stored, so it
        # never acts on a state a crash could take back.
        await groups.wait_group_stored(group_id)
        return response(result, table)

    return Deferred(when_stored)
