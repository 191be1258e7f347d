"""ShareGroupHeartbeat (API 76, KIP-932): membership of a share group.

A share consumer joins (epoch 0) with the topics it subscribes to, heartbeats with the
epoch it was given and leaves (epoch -1); the rules are in ``trio_broker.state.share_group``
and the groups in ``trio_broker.groups.share``. As Kafka: READ on the group, DESCRIBE on
each subscribed topic; a group id taken by a classic or consumer group is GROUP_ID_NOT_FOUND.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from trio_broker.groups.coordinator import store_error
from trio_broker.groups.share_records import StoredShareGroup
from trio_broker.groups.share_state import ShareKey
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.consumer_group_heartbeat import as_topic_partitions, topic_table
from trio_broker.handlers.list_offsets import offset_for_reset
from trio_broker.handlers.share_admin import partition_bounds
from trio_broker.handlers.share_persist import (
    ensure_loaded,
    initialize_state,
    leader_epoch_here,
    persist,
    read_state,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.state.share_group import LEAVE_EPOCH, ShareHeartbeat, ShareHeartbeatResult
from trio_broker.storage.group_configs import AutoOffsetReset

Resp = m.ShareGroupHeartbeatResponse

#: topic name -> (topic id, partition count), of the topics that exist.
TopicTable = Mapping[str, tuple[uuid.UUID, int]]
#: Where a share partition starts: (topic, partition, the group's reset) -> offset.
StartOffset = Callable[[str, int, AutoOffsetReset], int]
#: A share partition as the group's records name it: (topic id, topic name, partition).
Named = tuple[uuid.UUID, str, int]


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
    # Only partitions whose share state is durably initialized are assigned (Kafka's
    # assignable partitions): a member is never handed one it might fetch from at a
    # start that a restart would move.
    assignable = assignable_partitions(groups.share_group(group_id), metadata)
    result = shares.heartbeat(group_id, heartbeat, metadata, start_offset, ctx.now_ms(), assignable)
    # A share partition made for the assignment (initialized, not read here since: after a
    # restart, or a coordinator that took the group over) is read from its share
    # coordinator, which holds its state.
    made = {(t, p) for t, p, _ in shares.partitions_of(group_id)} - before
    await ensure_loaded(ctx, group_id, made)
    if (stored := await persist(ctx, group_id, only=made)) is not ErrorCode.NONE:
        return error(stored, "The share-partition state could not be written.")
    if result.error is ErrorCode.NONE and heartbeat.member_epoch != LEAVE_EPOCH:
        initialized = await initialize_subscribed(ctx, group_id, metadata, start_offset)
        if isinstance(initialized, ErrorCode):
            return error(initialized, "The share group could not be written.")
        if initialized:
            assignable = assignable_partitions(groups.share_group(group_id), metadata)
            caught_up = shares.catch_up(
                group_id, request.member_id, metadata, start_offset, assignable
            )
            result = result if caught_up is None else caught_up
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
    if group_id not in shares.groups and known is not None and known.recorded_topics():
        shares.recall_groups([group_id], {group_id: known.epoch})
    group = shares.groups.get(group_id)
    if group is None:
        new = None
    else:
        # The cluster's topics (the coordinator may hold no replica of them).
        view = ctx.services.leaders.view
        base = known or StoredShareGroup()
        # Those being initialized are recorded initialized by their initialization alone.
        under_way = {(t, p) for t, topic in base.initializing.items() for p in topic.partitions}
        named = [
            (t, p, view.topic_by_id(t))
            for t, p, _ in shares.partitions_of(group_id)
            if (t, p) not in under_way
        ]
        new = base.with_partitions(
            (t, info.name, p) for t, p, info in named if info is not None
        ).with_membership(
            group, {name: topic_id for name, (topic_id, _) in topic_table(ctx).items()}
        )
    # A storage error or a lost leadership: NOT_COORDINATOR (the client finds the
    # coordinator again); anything else it retries.
    return await _store(ctx, group_id, new)


def assignable_partitions(
    stored: StoredShareGroup | None, metadata: TopicTable
) -> dict[str, frozenset[int]]:
    """topic name -> the partitions of it whose share state the group's records call
    initialized, for the topic that has the recorded id now (a topic created again under
    its name is another topic: none of its partitions are, until initialized)."""
    if stored is None:
        return {}
    names = {topic_id: (name, count) for name, (topic_id, count) in metadata.items()}
    out = {}
    for topic_id, topic in stored.initialized.items():
        if topic_id in names:
            name, count = names[topic_id]
            out[name] = frozenset(p for p in topic.partitions if p < count)
    return out


async def initialize_subscribed(
    ctx: RequestContext, group_id: str, metadata: TopicTable, start_offset: StartOffset
) -> bool | ErrorCode:
    """Initialize the share state of every partition of the group's subscribed topics
    that is neither initialized nor being initialized (or was, too long ago: a
    coordinator that restarted meanwhile), as Kafka's group coordinator does after a
    heartbeat (InitializeShareGroupState): recorded as initializing first, then made
    durable at its share coordinator, then recorded as initialized, when it becomes
    assignable. One that fails is recorded as no longer initializing, so a later
    heartbeat tries again; until then it is not assigned. Whether any became
    initialized; an error: the records could not be written."""
    groups, shares = ctx.services.groups, ctx.services.shares
    group = shares.groups.get(group_id)
    if group is None:
        return False
    known = groups.share_group(group_id) or StoredShareGroup()
    done = {(t, p) for t, topic in known.initialized.items() for p in topic.partitions}
    now_ms = ctx.now_ms()
    wanted: list[Named] = []
    for name in sorted(group.subscribed_topics()):
        if name not in metadata:
            continue
        topic_id, count = metadata[name]
        under_way = known.initializing.get(topic_id)
        for partition in range(count):
            if (topic_id, partition) in done:
                continue
            key = ShareKey(group_id, topic_id, partition)
            if (
                under_way is not None
                and partition in under_way.partitions
                and shares.initializing_fresh(key, now_ms)
            ):
                continue  # being initialized by another heartbeat, or lately
            shares.initializing_since[key] = now_ms
            wanted.append((topic_id, name, partition))
    if not wanted:
        return False
    if (code := await _store(ctx, group_id, known.with_initializing(wanted))) is not ErrorCode.NONE:
        return code
    succeeded, failed = await _make_durable(ctx, group_id, wanted, start_offset)
    now = groups.share_group(group_id) or StoredShareGroup()
    code = await _store(ctx, group_id, now.with_partitions(succeeded).without_initializing(failed))
    for topic_id, _, partition in wanted:
        shares.initializing_since.pop(ShareKey(group_id, topic_id, partition), None)
    return code if code is not ErrorCode.NONE else bool(succeeded)


async def _make_durable(
    ctx: RequestContext, group_id: str, wanted: list[Named], start_offset: StartOffset
) -> tuple[list[Named], list[Named]]:
    """(initialized, failed) of ``wanted``. A partition led here is made at its start (by
    the group's share.auto.offset.reset), read from its share coordinator (stored state
    wins: the group had it before) and written there, as a leader writes it. One led
    elsewhere is initialized at its share coordinator (:func:`_initialize_elsewhere`)."""
    shares = ctx.services.shares
    led = [(t, n, p) for t, n, p in wanted if leader_epoch_here(ctx, t, p) is not None]
    made = []
    for topic_id, name, partition in led:
        if shares.partition(group_id, topic_id, partition) is None:
            start = start_offset(name, partition, shares.auto_offset_reset(group_id))
            shares.ensure_partition(group_id, topic_id, partition, start)
            made.append((topic_id, partition))
    read = {(t, p) for t, _, p in led}
    unread = await ensure_loaded(ctx, group_id, read)
    written = ErrorCode.NONE
    if read - unread.keys():
        written = await persist(ctx, group_id, only=read - unread.keys())
    failed = [(t, n, p) for t, n, p in led if (t, p) in unread or written is not ErrorCode.NONE]
    for topic_id, _, partition in failed:
        if (topic_id, partition) in made:  # made for this attempt: the next starts afresh
            shares.forget(ShareKey(group_id, topic_id, partition))
    elsewhere = [w for w in wanted if w not in led]
    if elsewhere:
        failed += await _initialize_elsewhere(ctx, group_id, elsewhere)
    return [w for w in wanted if w not in failed], failed


async def _initialize_elsewhere(
    ctx: RequestContext, group_id: str, wanted: list[Named]
) -> list[Named]:
    """Initialize share partitions led by other brokers at their share coordinators, as
    Kafka's group coordinator does (InitializeShareGroupState): one with stored state
    keeps it (a summary read finds it); the others are written at their start, the
    partition's log start (``earliest``) or high watermark (``latest``), asked of its
    leader (ListOffsets), in state epoch 1. Their leaders read that at their first
    ShareFetch. A group starting ``by_duration`` has its leader find the start at its
    first ShareFetch instead (no lookup by time across brokers here): nothing is
    written for it. The partitions that failed."""
    reset = ctx.services.shares.auto_offset_reset(group_id)
    failed: list[Named] = []
    starts: dict[tuple[uuid.UUID, int], int] = {}
    for topic_id, name, partition in wanted:
        error, stored = await read_state(ctx, ShareKey(group_id, topic_id, partition))
        if error is not ErrorCode.NONE:
            failed.append((topic_id, name, partition))
        elif stored is None and reset.kind != "by_duration":
            error, log_start, high_watermark = await partition_bounds(ctx, name, partition)
            if error is not ErrorCode.NONE:
                failed.append((topic_id, name, partition))
            else:
                starts[topic_id, partition] = (
                    log_start if reset.kind == "earliest" else high_watermark
                )
    if starts:
        answers = await initialize_state(ctx.services, group_id, starts)
        failed += [
            (t, n, p)
            for t, n, p in wanted
            if answers.get((t, p), ErrorCode.NONE) is not ErrorCode.NONE
        ]
    return failed


async def _store(ctx: RequestContext, group_id: str, new: StoredShareGroup | None) -> ErrorCode:
    """Write the group's records that ``new`` changes (None: their tombstones) and wait
    until they count."""
    groups = ctx.services.groups
    try:
        write = groups.store_share_group(group_id, new)
        if write is not None:
            await groups.wait_offsets_durable(write)
    except KafkaError as exc:
        code = store_error(exc.error_code)
        return code if code is ErrorCode.NOT_COORDINATOR else ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE
