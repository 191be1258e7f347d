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
"""

from __future__ import annotations

import uuid
from typing import Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.share_fetch import readable_end
from trio_broker.handlers.share_persist import persist
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

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


# ------------------------------------------------------------------------- describe


def describe_partition(ctx: RequestContext, group_id: str, topic: Any, partition: int) -> DescPart:
    out = DescPart(partition_index=partition, start_offset=UNINITIALIZED, leader_epoch=-1,
                   lag=-1, error_code=ErrorCode.NONE)  # fmt: skip
    share_partition = ctx.services.shares.partition(group_id, topic.topic_id, partition)
    if share_partition is None or not 0 <= partition < len(topic.logs):
        return out
    log = topic.logs[partition]
    share_partition.skip_to(log.log_start_offset)
    out.start_offset, out.leader_epoch = share_partition.start_offset, 0
    end = readable_end(ctx, topic.name, partition, log)
    finished = share_partition.finished_in_flight()
    out.lag = max(0, end - share_partition.start_offset - finished)
    return out


def describe_group(ctx: RequestContext, request: Any) -> DescGroup:
    group_id = request.group_id
    out = DescGroup(group_id=group_id, topics=[], error_code=ErrorCode.NONE)
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        out.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
        return out
    if (not_here := ctx.services.groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        out.error_code = not_here
        return out
    topics = ctx.services.topics
    if request.topics is None:  # every partition the group has share state for
        wanted: dict[str, list[int]] = {}
        for topic_id, partition, _ in ctx.services.shares.partitions_of(group_id):
            if (has := topics.by_id.get(topic_id)) is not None:
                wanted.setdefault(has.name, []).append(partition)
        wanted = {name: sorted(parts) for name, parts in sorted(wanted.items())}
        asked = [(name, parts) for name, parts in wanted.items()
                 if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)]  # fmt: skip
    else:
        asked = [(t.topic_name, list(t.partitions)) for t in request.topics]
    for name, partitions in asked:
        found = topics.get(name)
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
                describe_partition(ctx, group_id, found, p) for p in partitions]))  # fmt: skip
    return out


@handles(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS)
async def handle_describe_share_group_offsets(
    ctx: RequestContext, request: m.DescribeShareGroupOffsetsRequest
) -> DescResp:
    return DescResp(throttle_time_ms=0, groups=[describe_group(ctx, g) for g in request.groups])


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
    shares, topics = ctx.services.shares, ctx.services.topics
    answered: list[AlterTopic] = []
    for topic in request.topics:
        found = topics.get(topic.topic_name)
        error = ErrorCode.NONE
        if not authorized(ctx, Operation.READ, ResourceType.TOPIC, topic.topic_name):
            error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif found is None:
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        parts = []
        for p in topic.partitions:
            code = error
            if found is not None and not 0 <= p.partition_index < len(found.logs):
                code = code or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if code is ErrorCode.NONE and found is not None:
                shares.reset(group_id, found.topic_id, p.partition_index, p.start_offset)
            parts.append(AlterPart(partition_index=p.partition_index, error_code=code))
        topic_id = found.topic_id if found is not None and error is ErrorCode.NONE else NO_TOPIC
        answered.append(AlterTopic(topic_name=topic.topic_name, topic_id=topic_id,
                                   partitions=parts))  # fmt: skip
    if (stored := await persist(ctx, group_id)) is not ErrorCode.NONE:
        for answer in answered:
            for part in answer.partitions:
                if part.error_code == ErrorCode.NONE:
                    part.error_code = stored
    return AlterResp(throttle_time_ms=0, error_code=ErrorCode.NONE, responses=answered)


# ------------------------------------------------------------------------- delete


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
    shares, topics = ctx.services.shares, ctx.services.topics
    answered: list[DeleteTopic] = []
    deleted: list[tuple[uuid.UUID, int]] = []
    for topic in request.topics:
        name = topic.topic_name
        found = topics.get(name)
        answer = DeleteTopic(topic_name=name, topic_id=NO_TOPIC, error_code=ErrorCode.NONE)
        answered.append(answer)
        if not authorized(ctx, Operation.READ, ResourceType.TOPIC, name):
            answer.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif found is None:
            answer.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        elif not (gone := shares.forget_partitions(group_id, found.topic_id)):
            answer.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            answer.error_message = "There is no offset information to delete."
        else:
            answer.topic_id = found.topic_id
            deleted += [(found.topic_id, p) for p in gone]
    if (stored := await persist(ctx, group_id, deleted)) is not ErrorCode.NONE:
        for answer in answered:
            if answer.error_code == ErrorCode.NONE:
                answer.error_code = stored
    return DeleteResp(throttle_time_ms=0, error_code=ErrorCode.NONE, responses=answered)
