"""The share-group admin APIs (KIP-932) Kafka's Admin and ``kafka-share-groups`` use:
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92).

As Kafka: describing needs DESCRIBE on the group (and shows only topics the principal
may DESCRIBE), altering READ on the group and on each topic, deleting DELETE on the
group and READ on each topic. Altering and deleting need an existing, empty share group
(GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP); they are answered once the new share state is
durable (handlers/share_persist.py). A start offset is the share partition's SPSO; a
partition without share state answers -1. The lag (version 1, KIP-1226) counts the
records below the high watermark not yet finished: those after the start offset minus
the ones already acknowledged or archived.

As Kafka's group coordinator, which looks topics up in its metadata image, these look
them up in the cluster's view: the group's coordinator may hold no replica of a topic.
The high watermark is this broker's when it leads the partition, else its leader's
(ListOffsets, as Kafka's coordinator asks the leader for the latest offset); one that
cannot be had is the partition's error, as in Kafka.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

from trio_broker.groups.share_records import StoredShareGroup
from trio_broker.groups.share_state import ShareKey
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.share_fetch import readable_end
from trio_broker.handlers.share_persist import (
    error_for_client,
    initialize_state,
    persist,
    read_state,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.services.cluster_view import TopicInfo
from trio_broker.state.share_partition import FINISHED

DescResp = m.DescribeShareGroupOffsetsResponse
DescGroup = DescResp.DescribeShareGroupOffsetsResponseGroup
DescTopic = DescGroup.DescribeShareGroupOffsetsResponseTopic
DescPart = DescTopic.DescribeShareGroupOffsetsResponsePartition
AlterResp = m.AlterShareGroupOffsetsResponse
AlterTopic = AlterResp.AlterShareGroupOffsetsResponseTopic
AlterPart = AlterTopic.AlterShareGroupOffsetsResponsePartition
DeleteResp = m.DeleteShareGroupOffsetsResponse
DeleteTopic = DeleteResp.DeleteShareGroupOffsetsResponseTopic
NO_TOPIC = uuid.UUID(int=0)
#: A partition without share state (Kafka's uninitialized start offset).
UNINITIALIZED = -1


def group_error(ctx: RequestContext, group_id: str | None) -> ErrorCode:
    """NONE, or why an alter/delete of the group's share state is refused."""
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID
    if (not_here := ctx.services.groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        return not_here
    empty = ctx.services.shares.is_empty(group_id, ctx.now_ms())
    if empty is None:
        return ErrorCode.GROUP_ID_NOT_FOUND
    return ErrorCode.NONE if empty else ErrorCode.NON_EMPTY_GROUP


def cluster_topic(ctx: RequestContext, name: str) -> TopicInfo | None:
    """The topic as the cluster's view knows it (a node alone's: its own topics)."""
    return ctx.services.leaders.view.topics.get(name)


def cluster_topic_by_id(ctx: RequestContext, topic_id: uuid.UUID) -> TopicInfo | None:
    found: TopicInfo | None = ctx.services.leaders.view.topic_by_id(topic_id)
    return found


async def partition_bounds(
    ctx: RequestContext, topic: str, partition: int
) -> tuple[ErrorCode, int, int]:
    """(NONE, log start offset, high watermark) of the data partition: this broker's
    when it leads it, else asked of its leader; or the error, with -1s."""
    log = ctx.services.topics.log(topic, partition)
    if log is not None and ctx.services.leaders.leader_term(topic, partition) is not None:
        return ErrorCode.NONE, log.log_start_offset, readable_end(ctx, topic, partition, log)
    info = cluster_topic(ctx, topic)
    held = None if info is None else info.partitions.get(partition)
    remote = ctx.services.share_coordinator.remote
    if held is None or held.leader < 0 or held.leader == ctx.services.config.node_id:
        return ErrorCode.LEADER_NOT_AVAILABLE, -1, -1  # none, or this one not yet leading
    if remote is None:
        return ErrorCode.LEADER_NOT_AVAILABLE, -1, -1
    return await remote.partition_offsets(held.leader, topic, partition)


# ------------------------------------------------------------------------- describe


async def describe_partition(
    ctx: RequestContext, group_id: str, topic: TopicInfo, partition: int
) -> DescPart:
    """The share partition's start offset and lag as its share coordinator holds them
    (a summary read, as Kafka's group coordinator makes one): what is durable, which
    is what moves them (acknowledgements, resets; acquisitions change neither)."""
    out = DescPart(partition_index=partition, start_offset=UNINITIALIZED, leader_epoch=-1,
                   lag=-1, error_code=ErrorCode.NONE)  # fmt: skip
    if partition not in topic.partitions:
        return out
    error, snapshot = await read_state(ctx, ShareKey(group_id, topic.topic_id, partition))
    if error is not ErrorCode.NONE:
        out.error_code = error
        return out
    if snapshot is None:
        return out
    error, log_start, end = await partition_bounds(ctx, topic.name, partition)
    if error is not ErrorCode.NONE:
        out.error_code = error
        return out
    # Records retention or DeleteRecords removed are no longer the group's to read.
    start = max(snapshot.start_offset, log_start)
    finished = sum(
        b.last_offset - max(b.first_offset, start) + 1
        for b in snapshot.batches
        if b.delivery_state in FINISHED and b.last_offset >= start
    )
    out.start_offset, out.leader_epoch = start, 0
    out.lag = max(0, end - start - finished)
    return out


async def describe_group(ctx: RequestContext, request: Any) -> DescGroup:
    group_id = request.group_id
    out = DescGroup(group_id=group_id, topics=[], error_code=ErrorCode.NONE)
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        out.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
        return out
    if (not_here := ctx.services.groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        out.error_code = not_here
        return out
    if request.topics is None:  # every partition the group has share state for
        wanted: dict[str, set[int]] = {}
        for topic_id, partition in known_partitions(ctx, group_id):
            if (has := cluster_topic_by_id(ctx, topic_id)) is not None:
                wanted.setdefault(has.name, set()).add(partition)
        asked = [(name, sorted(parts)) for name, parts in sorted(wanted.items())
                 if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)]  # fmt: skip
    else:
        asked = [(t.topic_name, list(t.partitions)) for t in request.topics]
    for name, partitions in asked:
        found = cluster_topic(ctx, name)
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
            out.topics.append(DescTopic(topic_name=name, topic_id=NO_TOPIC, partitions=[
                DescPart(partition_index=p, start_offset=UNINITIALIZED, leader_epoch=-1,
                         error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                for p in partitions]))  # fmt: skip
        elif found is None:  # no offsets to show, not an error (as OffsetFetch)
            out.topics.append(DescTopic(topic_name=name, topic_id=NO_TOPIC, partitions=[
                DescPart(partition_index=p, start_offset=UNINITIALIZED, leader_epoch=-1,
                         error_code=ErrorCode.NONE)
                for p in partitions]))  # fmt: skip
        else:
            out.topics.append(DescTopic(topic_name=name, topic_id=found.topic_id, partitions=[
                await describe_partition(ctx, group_id, found, p) for p in partitions
            ]))  # fmt: skip
    return out


def known_partitions(ctx: RequestContext, group_id: str) -> set[tuple[uuid.UUID, int]]:
    """The (topic id, partition)s the group has share state for, as its coordinator
    knows them: those its records in ``__consumer_offsets`` name (every share
    partition it was assigned, whichever broker coordinated it then), its share
    partitions in memory, and the keys in the share coordinator's tables led here (a
    node alone: all of them; state stored before the group's records were)."""
    known = {(t, p) for t, p, _ in ctx.services.shares.partitions_of(group_id)}
    if (recorded := ctx.services.groups.share_group(group_id)) is not None:
        known |= recorded.partitions()
    stored = ctx.services.share_coordinator.keys(group_id=group_id)
    return known | {(key.topic_id, key.partition) for key in stored}


async def record_partitions(
    ctx: RequestContext,
    group_id: str,
    *,
    added: Sequence[tuple[uuid.UUID, str, int]] = (),
    dropped: Collection[uuid.UUID] = (),
) -> ErrorCode:
    """Update the group's stored initialized share partitions (groups/share_records.py):
    ``added`` ones (reset), the ``dropped`` topics' gone (deleted); NONE once it counts."""
    groups = ctx.services.groups
    known = groups.share_group(group_id) or StoredShareGroup()
    try:
        write = groups.store_share_group(
            group_id, known.with_partitions(added).without_topics(dropped)
        )
        if write is not None:
            await groups.wait_offsets_durable(write)
    except KafkaError as exc:
        return error_for_client(exc.error_code)
    return ErrorCode.NONE


@handles(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS)
async def handle_describe_share_group_offsets(
    ctx: RequestContext, request: m.DescribeShareGroupOffsetsRequest
) -> DescResp:
    return DescResp(
        throttle_time_ms=0, groups=[await describe_group(ctx, g) for g in request.groups]
    )


# ------------------------------------------------------------------------- alter


@handles(m.ApiKey.ALTER_SHARE_GROUP_OFFSETS)
async def handle_alter_share_group_offsets(
    ctx: RequestContext, request: m.AlterShareGroupOffsetsRequest
) -> AlterResp:
    group_id = request.group_id

    def refused(code: ErrorCode) -> AlterResp:
        return AlterResp(throttle_time_ms=0, error_code=code, responses=[])

    if not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id or ""):
        return refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if (error := group_error(ctx, group_id)) is not ErrorCode.NONE:
        return refused(error)
    answered: list[AlterTopic] = []
    resets: dict[tuple[uuid.UUID, int], int] = {}
    names: dict[uuid.UUID, str] = {}
    for topic in request.topics:
        found = cluster_topic(ctx, topic.topic_name)
        error = ErrorCode.NONE
        if not authorized(ctx, Operation.READ, ResourceType.TOPIC, topic.topic_name):
            error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif found is None:
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        parts = []
        for p in topic.partitions:
            code = error
            if found is not None and p.partition_index not in found.partitions:
                code = code or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if code is ErrorCode.NONE and found is not None:
                resets[found.topic_id, p.partition_index] = p.start_offset
                names[found.topic_id] = found.name
            parts.append(AlterPart(partition_index=p.partition_index, error_code=code))
        topic_id = found.topic_id if found is not None and error is ErrorCode.NONE else NO_TOPIC
        answered.append(AlterTopic(topic_name=topic.topic_name, topic_id=topic_id,
                                   partitions=parts))  # fmt: skip
    # At each share partition's coordinator, as Kafka's group coordinator does it,
    # once the group's records name them (so a later coordinator finds them too).
    recorded = await record_partitions(ctx, group_id, added=[
        (t, names[t], p) for t, p in sorted(resets)
    ])  # fmt: skip
    if recorded is not ErrorCode.NONE:
        return refused(recorded)
    stored = await initialize_state(ctx.services, group_id, resets)
    for answer in answered:
        for part in answer.partitions:
            if part.error_code == ErrorCode.NONE and answer.topic_id != NO_TOPIC:
                part.error_code = stored.get(
                    (answer.topic_id, part.partition_index), ErrorCode.NONE
                )
    return AlterResp(throttle_time_ms=0, error_code=ErrorCode.NONE, responses=answered)


# ------------------------------------------------------------------------- delete


async def forget_partitions(ctx: RequestContext, group_id: str, topic: TopicInfo) -> list[int]:
    """The partitions of ``topic`` the group has share state for (at their share
    coordinators: a summary read of each; or in memory here), dropped from memory (their
    tombstones are the caller's to write)."""
    stored = []
    for partition in sorted(topic.partitions):
        error, snapshot = await read_state(ctx, ShareKey(group_id, topic.topic_id, partition))
        if error is not ErrorCode.NONE:
            raise KafkaError(error_for_client(error))
        if snapshot is not None:
            stored.append(partition)
    gone = set(ctx.services.shares.forget_partitions(group_id, topic.topic_id))
    return sorted(gone.union(stored))


@handles(m.ApiKey.DELETE_SHARE_GROUP_OFFSETS)
async def handle_delete_share_group_offsets(
    ctx: RequestContext, request: m.DeleteShareGroupOffsetsRequest
) -> DeleteResp:
    group_id = request.group_id

    def refused(code: ErrorCode) -> DeleteResp:
        return DeleteResp(throttle_time_ms=0, error_code=code, responses=[])

    if not authorized(ctx, Operation.DELETE, ResourceType.GROUP, group_id or ""):
        return refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if (error := group_error(ctx, group_id)) is not ErrorCode.NONE:
        return refused(error)
    answered: list[DeleteTopic] = []
    deleted: list[tuple[uuid.UUID, int]] = []
    for topic in request.topics:
        name = topic.topic_name
        found = cluster_topic(ctx, name)
        answer = DeleteTopic(topic_name=name, topic_id=NO_TOPIC, error_code=ErrorCode.NONE)
        answered.append(answer)
        if not authorized(ctx, Operation.READ, ResourceType.TOPIC, name):
            answer.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif found is None:
            answer.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            try:
                gone = await forget_partitions(ctx, group_id, found)
            except KafkaError as exc:  # a share coordinator cannot answer now
                answer.error_code = exc.error_code
                continue
            if not gone:
                answer.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                answer.error_message = "There is no offset information to delete."
            else:
                answer.topic_id = found.topic_id
                deleted += [(found.topic_id, p) for p in gone]
    stored = await persist(ctx, group_id, deleted)
    if stored is ErrorCode.NONE:  # the group's records no longer name the topics
        stored = await record_partitions(ctx, group_id, dropped={t for t, _ in deleted})
    if stored is not ErrorCode.NONE:
        for answer in answered:
            if answer.error_code == ErrorCode.NONE:
                answer.error_code = stored
    return DeleteResp(throttle_time_ms=0, error_code=ErrorCode.NONE, responses=answered)
