"""OffsetCommit, OffsetFetch, OffsetDelete.

A commit is checked against the group (generation, member id, state) and
appended to the internal offsets log in request order; the response waits until
the flusher has made that append durable, and only then does the offset become
visible to OffsetFetch. OffsetFetch answers -1 for partitions without a commit.
v10 of both APIs name topics by id instead of name.

In a cluster a group this broker does not coordinate gets NOT_COORDINATOR (or
COORDINATOR_LOAD_IN_PROGRESS while its table loads), and a commit counts once it is
replicated below the high watermark of its ``__consumer_offsets`` partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

from trio_broker.groups.coordinator import GroupCoordinator
from trio_broker.groups.offsets_store import Entry, OffsetAndMetadata, OffsetKey, PendingWrite
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.schema import Message, uses_topic_ids
from trio_broker.services.cluster_view import TopicInfo

R = TypeVar("R", bound=Message)

CommitResp = m.OffsetCommitResponse
CommitPartResp = CommitResp.OffsetCommitResponseTopic.OffsetCommitResponsePartition
FetchResp = m.OffsetFetchResponse
DeleteResp = m.OffsetDeleteResponse
DeletePartResp = DeleteResp.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition
#: The topics an OffsetFetch asks about: v0-7 for its one group, v8+ per group.
FetchTopic = m.OffsetFetchRequest.OffsetFetchRequestTopic
FetchGroupTopics = m.OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics

#: offset.metadata.max.bytes: longer commit metadata is refused per partition.
MAX_METADATA_BYTES = 4096
#: OffsetFetch v8 batches several groups (KIP-709).
FIRST_MULTI_GROUP_VERSION = 8
NO_OFFSET = -1
NO_LEADER_EPOCH = -1
ZERO_UUID = uuid.UUID(int=0)


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    groups: GroupCoordinator = ctx.services.groups
    return groups


def resolve_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None, by_id: bool
) -> tuple[str | None, uuid.UUID, int, ErrorCode]:
    """(name, id, partition count, error) of a topic named in a request."""
    topics = ctx.services.topics
    if by_id:
        topic = topics.by_id.get(topic_id) if topic_id is not None else None
    else:
        topic = topics.get(name or "")
    if topic is None:
        # In a cluster the group's coordinator need not hold a replica of the topic.
        known = cluster_topic(ctx, name, topic_id, by_id)
        if known is not None:
            return known.name, known.topic_id, len(known.partitions), ErrorCode.NONE
        missing = ErrorCode.UNKNOWN_TOPIC_ID if by_id else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return name, topic_id or ZERO_UUID, 0, missing
    return topic.name, topic.topic_id, len(topic.logs), ErrorCode.NONE


def cluster_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None, by_id: bool
) -> TopicInfo | None:
    """A topic (by name or id) as ``services.leaders.view`` has it, or None: in a
    cluster, one the group's coordinator holds no replica of; alone, the view is this
    broker's own topics."""
    view = ctx.services.leaders.view
    if not by_id:
        return view.topics.get(name or "")
    return None if topic_id is None else view.topic_by_id(topic_id)


# ------------------------------------------------------------------------- OffsetCommit


#: OffsetFetch v9 carries the member id and epoch of a consumer-protocol member.
FIRST_MEMBER_EPOCH_FETCH_VERSION = 9


@handles(m.ApiKey.OFFSET_COMMIT)
async def handle_offset_commit(
    ctx: RequestContext, request: m.OffsetCommitRequest
) -> m.OffsetCommitResponse | Deferred:
    version = ctx.api_version
    by_id = uses_topic_ids(ctx.header.api_key, version)
    groups = coordinator(ctx)
    group_id = request.group_id
    group_error = groups.coordinator_error(group_id)
    if group_error is ErrorCode.NONE:
        group_error = groups.validate_offset_commit(
            group_id,
            request.member_id,
            request.group_instance_id if version >= 7 else None,
            request.generation_id_or_member_epoch,
            version,
        )
    group_allowed = authorized(ctx, Operation.READ, ResourceType.GROUP, group_id)
    now = ctx.services.now_ms()
    entries: list[Entry] = []
    waiting: list[CommitPartResp] = []  # partition responses whose fate is the write's
    topic_responses: list[CommitResp.OffsetCommitResponseTopic] = []
    for topic in request.topics:
        name, topic_id, partitions, topic_error = resolve_topic(
            ctx, topic.name, topic.topic_id if by_id else None, by_id
        )
        partition_responses: list[CommitPartResp] = []
        # An unknown topic id has no name to authorize: it stays UNKNOWN_TOPIC_ID.
        topic_allowed = name is None or authorized(ctx, Operation.READ, ResourceType.TOPIC, name)
        for p in topic.partitions:
            part = CommitPartResp(partition_index=p.partition_index, error_code=ErrorCode.NONE)
            partition_responses.append(part)
            metadata = p.committed_metadata or ""
            if not group_allowed:
                part.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            elif not topic_allowed:
                part.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif topic_error is not ErrorCode.NONE or not 0 <= p.partition_index < partitions:
                part.error_code = topic_error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif group_error is not ErrorCode.NONE:
                part.error_code = group_error
            elif (
                stale := groups.commit_partition_error(
                    group_id,
                    request.member_id,
                    request.generation_id_or_member_epoch,
                    name or "",
                    p.partition_index,
                )
            ) is not ErrorCode.NONE:
                part.error_code = stale
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                part.error_code = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                assert name is not None
                epoch = p.committed_leader_epoch if version >= 6 else NO_LEADER_EPOCH
                value = OffsetAndMetadata(p.committed_offset, epoch, metadata, now)
                entries.append((OffsetKey(group_id, name, p.partition_index), value))
                waiting.append(part)
        topic_responses.append(
            CommitResp.OffsetCommitResponseTopic(
                name=name or "", topic_id=topic_id, partitions=partition_responses
            )
        )
    response = CommitResp(throttle_time_ms=0, topics=topic_responses)
    if not entries:
        return response

    def fail(error: ErrorCode) -> m.OffsetCommitResponse:
        for part in waiting:
            part.error_code = error
        return response

    # Appended now, so commits on one connection land in the log in request order.
    return answer_when_durable(groups, lambda: groups.append_offsets(entries), response, fail)


def answer_when_durable(
    groups: GroupCoordinator,
    append: Callable[[], PendingWrite],
    response: R,
    fail: Callable[[ErrorCode], R],
) -> R | Deferred:
    """Append offset records now and answer once they count (OffsetCommit and
    TxnOffsetCommit); a write that did not count fails the accepted partitions with the
    coordinator's error, which clients retry: NOT_COORDINATOR once leadership moved or
    when the disk failed (Kafka's answer to a storage error), COORDINATOR_NOT_AVAILABLE
    when not synced and replicated within offsets.commit.timeout.ms."""
    try:
        write = append()
    except KafkaError as exc:
        return fail(exc.error_code)

    async def when_durable() -> R:
        try:
            await groups.wait_offsets_durable(write)
        except KafkaError as exc:
            return fail(exc.error_code)
        return response

    return Deferred(when_durable)


# ------------------------------------------------------------------------- OffsetFetch


def fetch_group_offsets(
    ctx: RequestContext,
    group_id: str,
    topics: list[FetchTopic] | list[FetchGroupTopics] | None,
    by_id: bool,
    require_stable: bool = False,
) -> list[tuple[str, uuid.UUID, list[tuple[int, int, int, str, ErrorCode]]]]:
    """[(topic name, topic id, [(partition, offset, leader epoch, metadata, error)])].

    With ``require_stable`` (v7+, read_committed consumers) a partition that an open
    transaction holds an offset for answers UNSTABLE_OFFSET_COMMIT and no offset:
    the client retries until the transaction ends (KIP-447).
    """
    groups = coordinator(ctx)

    def unstable(topic: str, partition: int) -> bool:
        return require_stable and groups.has_pending_offset(group_id, topic, partition)

    out = []
    if topics is None:  # every partition the group has committed
        by_topic: dict[str, list[tuple[int, int, int, str, ErrorCode]]] = {}
        for (name, partition), stored in sorted(groups.committed_for_group(group_id).items()):
            by_topic.setdefault(name, []).append(
                (partition, NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
                if unstable(name, partition)
                else (
                    partition,
                    stored.offset,
                    stored.leader_epoch,
                    stored.metadata,
                    ErrorCode.NONE,
                )
            )
        for name, partitions in by_topic.items():
            if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
                continue  # as Kafka: offsets of undescribable topics are left out
            topic = ctx.services.topics.get(name)
            if by_id and topic is None:
                continue  # the topic is gone: there is no id to name it by
            out.append((name, topic.topic_id if topic else ZERO_UUID, partitions))
        return out
    for wanted in topics:
        # Only v10+ (a group's topics) names topics by id.
        topic_id = wanted.topic_id if by_id and isinstance(wanted, FetchGroupTopics) else None
        found, resolved_id, _, error = resolve_topic(ctx, wanted.name, topic_id, by_id)
        allowed = found is None or authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, found)
        partitions = []
        for index in wanted.partition_indexes:
            value = None if found is None else groups.committed(group_id, found, index)
            if not allowed:
                partitions.append(
                    (index, NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                )
            elif by_id and error is not ErrorCode.NONE:
                partitions.append((index, NO_OFFSET, NO_LEADER_EPOCH, "", error))
            elif found is not None and unstable(found, index):
                partitions.append(
                    (index, NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
                )
            elif value is None:
                partitions.append((index, NO_OFFSET, NO_LEADER_EPOCH, "", ErrorCode.NONE))
            else:
                partitions.append(
                    (index, value.offset, value.leader_epoch, value.metadata, ErrorCode.NONE)
                )
        out.append((found or "", resolved_id, partitions))
    return out


def not_coordinator_fetch(
    topics: list[FetchTopic] | None, error: ErrorCode
) -> m.OffsetFetchResponse:
    """OffsetFetch v0-7 for a group coordinated elsewhere: the error at the top (v2+)
    and on each asked partition (v0-1 have only those)."""
    Part = FetchResp.OffsetFetchResponseTopic.OffsetFetchResponsePartition
    return FetchResp(
        throttle_time_ms=0,
        error_code=error,
        topics=[
            FetchResp.OffsetFetchResponseTopic(
                name=topic.name,
                partitions=[
                    Part(partition_index=index, committed_offset=NO_OFFSET,
                         committed_leader_epoch=NO_LEADER_EPOCH, metadata="", error_code=error)
                    for index in topic.partition_indexes
                ],
            )
            for topic in topics or []
        ],
    )  # fmt: skip


@handles(m.ApiKey.OFFSET_FETCH)
async def handle_offset_fetch(
    ctx: RequestContext, request: m.OffsetFetchRequest
) -> m.OffsetFetchResponse:
    version = ctx.api_version
    by_id = uses_topic_ids(ctx.header.api_key, version)
    # require_stable (v7+) asks for UNSTABLE_OFFSET_COMMIT while a transactional commit
    # is pending (TxnOffsetCommit staged it, the transaction has not ended).
    require_stable = version >= 7 and request.require_stable
    groups = coordinator(ctx)
    if version < FIRST_MULTI_GROUP_VERSION:
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, request.group_id):
            return FetchResp(
                throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[]
            )
        not_here = groups.coordinator_error(request.group_id)
        if not_here is not ErrorCode.NONE:
            return not_coordinator_fetch(request.topics, not_here)
        found = fetch_group_offsets(
            ctx, request.group_id, request.topics, by_id=False, require_stable=require_stable
        )
        return FetchResp(
            throttle_time_ms=0,
            error_code=ErrorCode.NONE,
            topics=[
                FetchResp.OffsetFetchResponseTopic(
                    name=name,
                    partitions=[
                        FetchResp.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                            partition_index=index,
                            committed_offset=offset,
                            committed_leader_epoch=epoch,
                            metadata=metadata,
                            error_code=error,
                        )
                        for index, offset, epoch, metadata, error in partitions
                    ],
                )
                for name, _, partitions in found
            ],
        )
    group_responses: list[FetchResp.OffsetFetchResponseGroup] = []
    for group in request.groups:
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group.group_id):
            group_responses.append(
                FetchResp.OffsetFetchResponseGroup(
                    group_id=group.group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED
                )
            )
            continue
        not_here = groups.coordinator_error(group.group_id)
        if not_here is ErrorCode.NONE and version >= FIRST_MEMBER_EPOCH_FETCH_VERSION:
            # A member of a KIP-848 group reads its offsets with its current epoch.
            not_here = groups.validate_offset_fetch(
                group.group_id, group.member_id, group.member_epoch
            )
        if not_here is not ErrorCode.NONE:
            group_responses.append(
                FetchResp.OffsetFetchResponseGroup(group_id=group.group_id, error_code=not_here)
            )
            continue
        found = fetch_group_offsets(ctx, group.group_id, group.topics, by_id, require_stable)
        Topics = FetchResp.OffsetFetchResponseGroup.OffsetFetchResponseTopics
        group_responses.append(
            FetchResp.OffsetFetchResponseGroup(
                group_id=group.group_id,
                error_code=ErrorCode.NONE,
                topics=[
                    Topics(
                        name=name,
                        topic_id=topic_id,
                        partitions=[
                            Topics.OffsetFetchResponsePartitions(
                                partition_index=index,
                                committed_offset=offset,
                                committed_leader_epoch=epoch,
                                metadata=metadata,
                                error_code=error,
                            )
                            for index, offset, epoch, metadata, error in partitions
                        ],
                    )
                    for name, topic_id, partitions in found
                ],
            )
        )
    return FetchResp(throttle_time_ms=0, groups=group_responses)


# ------------------------------------------------------------------------- OffsetDelete


@handles(m.ApiKey.OFFSET_DELETE)
async def handle_offset_delete(
    ctx: RequestContext, request: m.OffsetDeleteRequest
) -> m.OffsetDeleteResponse | Deferred:
    groups = coordinator(ctx)
    group_id = request.group_id
    if not group_id:
        return DeleteResp(throttle_time_ms=0, error_code=ErrorCode.INVALID_GROUP_ID, topics=[])
    if not authorized(ctx, Operation.DELETE, ResourceType.GROUP, group_id):
        return DeleteResp(
            throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[]
        )
    if (not_here := groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        return DeleteResp(throttle_time_ms=0, error_code=not_here, topics=[])
    group_error, subscribed = groups.delete_offsets_check(group_id)
    if group_error is not ErrorCode.NONE:
        return DeleteResp(throttle_time_ms=0, error_code=group_error, topics=[])
    tombstones: list[Entry] = []
    deleted: list[DeletePartResp] = []
    topic_responses: list[DeleteResp.OffsetDeleteResponseTopic] = []
    for topic in request.topics:
        _, _, partitions, topic_error = resolve_topic(ctx, topic.name, None, by_id=False)
        partition_responses: list[DeletePartResp] = []
        for p in topic.partitions:
            index = p.partition_index
            part = DeletePartResp(partition_index=index, error_code=ErrorCode.NONE)
            partition_responses.append(part)
            if topic_error is not ErrorCode.NONE or not 0 <= index < partitions:
                part.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif subscribed and topic.name in subscribed:
                # Members still consume it: they would just commit it again.
                part.error_code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            elif groups.committed(group_id, topic.name, index) is not None:
                tombstones.append((OffsetKey(group_id, topic.name, index), None))
                deleted.append(part)
        topic_responses.append(
            DeleteResp.OffsetDeleteResponseTopic(name=topic.name, partitions=partition_responses)
        )
    response = DeleteResp(throttle_time_ms=0, error_code=ErrorCode.NONE, topics=topic_responses)
    if not tombstones:
        return response
    try:
        write = groups.append_offsets(tombstones)
    except KafkaError as exc:
        return DeleteResp(throttle_time_ms=0, error_code=exc.error_code, topics=[])

    async def when_durable() -> m.OffsetDeleteResponse:
        try:
            await groups.wait_offsets_durable(write)
        except KafkaError as exc:
            for part in deleted:
                part.error_code = exc.error_code
        return response

    return Deferred(when_durable)
