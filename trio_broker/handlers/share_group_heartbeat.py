"""ShareGroupHeartbeat (API 76, KIP-932): membership of a share group.

A share consumer joins (epoch 0) with the topics it subscribes to, heartbeats with the
epoch it was given and leaves (epoch -1); the rules are in ``trio_broker.state.share_group``
and the groups in ``trio_broker.groups.share``. As Kafka: READ on the group, DESCRIBE on
each subscribed topic; a group id taken by a classic or consumer group is GROUP_ID_NOT_FOUND.
"""

from __future__ import annotations

from trio_broker.groups.coordinator import store_error
from trio_broker.groups.share_records import StoredShareGroup
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.consumer_group_heartbeat import as_topic_partitions, topic_table
from trio_broker.handlers.list_offsets import offset_for_reset
from trio_broker.handlers.share_persist import ensure_loaded, persist
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.state.share_group import ShareHeartbeat, ShareHeartbeatResult
from trio_broker.storage.group_configs import AutoOffsetReset

Resp = m.ShareGroupHeartbeatResponse


def response(result: ShareHeartbeatResult, ctx: RequestContext) -> Resp:
    assignment = None
    if result.assignment is not None and result.error is ErrorCode.NONE:
        assignment = Resp.Assignment(
            topic_partitions=as_topic_partitions(
                result.assignment, topic_table(ctx), Resp.Assignment.TopicPartitions
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


def error(code: ErrorCode, message: str | None = None) -> Resp:
    return Resp(throttle_time_ms=0, error_code=code, error_message=message, member_epoch=-1,
                heartbeat_interval_ms=0)  # fmt: skip


@handles(m.ApiKey.SHARE_GROUP_HEARTBEAT)
async def handle_share_group_heartbeat(
    ctx: RequestContext, request: m.ShareGroupHeartbeatRequest
) -> Resp:
    group_id = request.group_id
    if not group_id:
        return error(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id):
        return error(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    groups = ctx.services.groups
    if (not_here := groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        return error(not_here)
    if group_id in groups.groups or groups.consumer_group(group_id) is not None:
        return error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group.")
    subscribed = request.subscribed_topic_names
    for topic in subscribed or ():
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
            return error(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    heartbeat = ShareHeartbeat(
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        rack_id=request.rack_id,
        subscribed=None if subscribed is None else tuple(subscribed),
        client_id=ctx.header.client_id or "",
        client_host=f"/{ctx.client.host}",
    )
    metadata = topic_table(ctx)
    topics = ctx.services.topics

    def start_offset(topic: str, partition: int, reset: AutoOffsetReset) -> int:
        log = topics.log(topic, partition)
        return 0 if log is None else offset_for_reset(log, reset, ctx.now_ms())

    shares = ctx.services.shares
    before = {(t, p) for t, p, _ in shares.partitions_of(group_id)}
    result = shares.heartbeat(group_id, heartbeat, metadata, start_offset, ctx.now_ms())
    # A share partition made for the assignment (at the log end by default): stored before the
    # member can fetch from it, so a restart does not move its start past what came since.
    made = {(t, p) for t, p, _ in shares.partitions_of(group_id)} - before
    # Those led here are read from the share coordinator first: one with stored state
    # (a node restarted, a group that had it before) takes that state, the others are
    # written with their start (Kafka's group coordinator initializes them).
    await ensure_loaded(ctx, group_id, made)
    if (stored := await persist(ctx, group_id, only=made)) is not ErrorCode.NONE:
        return error(stored, "The share-partition state could not be written.")
    if (stored := await store_group(ctx, group_id)) is not ErrorCode.NONE:
        return error(stored, "The share group could not be written.")
    return response(result, ctx)


async def store_group(ctx: RequestContext, group_id: str) -> ErrorCode:
    """Write the group's records to ``__consumer_offsets`` that changed (its epoch,
    initialized share partitions, target and members: groups/share_records.py), and
    wait until they count, as Kafka's coordinator answers a heartbeat once its records
    are committed: a coordinator that restarts or takes the group over then knows every
    share partition the group has, and every member with the epoch it was answered.
    A member gone (left, or its session expired) has its records' tombstones written.
    A group gone from memory (no members, no share partitions) goes from there too,
    unless it has share partitions stored (a coordinator that took the group over holds
    none of them in memory): it stays, empty."""
    groups, shares = ctx.services.groups, ctx.services.shares
    known = groups.share_group(group_id)
    if group_id not in shares.groups and known is not None and known.initialized:
        shares.recall_groups([group_id], {group_id: known.epoch})
    group = shares.groups.get(group_id)
    if group is None:
        new = None
    else:
        # The cluster's topics (the coordinator may hold no replica of them).
        view = ctx.services.leaders.view
        named = [(t, p, view.topic_by_id(t)) for t, p, _ in shares.partitions_of(group_id)]
        new = (
            (known or StoredShareGroup())
            .with_partitions((t, info.name, p) for t, p, info in named if info is not None)
            .with_membership(group)
        )
    try:
        write = groups.store_share_group(group_id, new)
        if write is not None:
            await groups.wait_offsets_durable(write)
    except KafkaError as exc:
        # A storage error or a lost leadership: NOT_COORDINATOR (the client finds the
        # coordinator again); anything else it retries.
        code = store_error(exc.error_code)
        return code if code is ErrorCode.NOT_COORDINATOR else ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE
