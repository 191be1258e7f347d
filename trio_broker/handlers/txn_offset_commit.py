"""TxnOffsetCommit (API 28): a transactional producer stages a group's offsets.

``sendOffsetsToTransaction`` ends here after AddOffsetsToTxn: the offsets are
appended to the offsets log as *pending for producer P* and the answer waits until
that append is durable. They become the group's committed offsets only when the
transaction coordinator commits the transaction
(:meth:`GroupCoordinator.complete_transaction`); an abort drops them. Meanwhile
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them.

Checks, in Kafka's order: WRITE on the transactional id, READ on the group (both
fail every partition), READ on each topic, the partition exists, the group id is
non-empty, the group's KIP-447 fencing (v3+ names the consumer's member id,
generation and group instance id), the producer's epoch against the epoch of its
earlier offsets here, the metadata size. Like Kafka before KIP-890 part 2, the
transaction coordinator is not asked whether the group was added.
"""

from __future__ import annotations

from trio_broker.groups.offsets_store import OffsetAndMetadata, OffsetKey
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.offsets import (
    MAX_METADATA_BYTES,
    NO_LEADER_EPOCH,
    answer_when_durable,
    coordinator,
    resolve_topic,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.TxnOffsetCommitResponse
TopicResp = Resp.TxnOffsetCommitResponseTopic
PartResp = TopicResp.TxnOffsetCommitResponsePartition
#: v2 adds the committed leader epoch; v3 the consumer's group metadata (KIP-447).
FIRST_LEADER_EPOCH_VERSION = 2
FIRST_GROUP_METADATA_VERSION = 3


@handles(m.ApiKey.TXN_OFFSET_COMMIT, 0, 5)
async def handle_txn_offset_commit(
    ctx: RequestContext, request: m.TxnOffsetCommitRequest
) -> m.TxnOffsetCommitResponse | Deferred:
    version = ctx.api_version
    groups = coordinator(ctx)
    group_id = request.group_id
    if not authorized(
        ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
    ):
        request_error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id):
        request_error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        request_error = ErrorCode.NONE
    now = ctx.services.now_ms()
    staged: list[tuple[OffsetKey, OffsetAndMetadata]] = []
    accepted: list[PartResp] = []  # partition responses whose fate is the group's and the write's
    topic_responses: list[TopicResp] = []
    for topic in request.topics:
        name, _, partitions, topic_error = resolve_topic(ctx, topic.name, None, by_id=False)
        topic_allowed = request_error is ErrorCode.NONE and authorized(
            ctx, Operation.READ, ResourceType.TOPIC, topic.name
        )
        partition_responses: list[PartResp] = []
        for p in topic.partitions:
            part = PartResp(partition_index=p.partition_index, error_code=ErrorCode.NONE)
            partition_responses.append(part)
            metadata = p.committed_metadata or ""
            if request_error is not ErrorCode.NONE:
                part.error_code = request_error
            elif not topic_allowed:
                part.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif topic_error is not ErrorCode.NONE or not 0 <= p.partition_index < partitions:
                part.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                part.error_code = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                assert name is not None
                epoch = (
                    p.committed_leader_epoch
                    if version >= FIRST_LEADER_EPOCH_VERSION
                    else NO_LEADER_EPOCH
                )
                value = OffsetAndMetadata(p.committed_offset, epoch, metadata, now)
                staged.append((OffsetKey(group_id, name, p.partition_index), value))
                accepted.append(part)
        topic_responses.append(TopicResp(name=topic.name, partitions=partition_responses))
    response = Resp(throttle_time_ms=0, topics=topic_responses)
    if not staged:
        return response

    def fail(error: ErrorCode) -> m.TxnOffsetCommitResponse:
        for part in accepted:
            part.error_code = error
        return response

    if not group_id:
        return fail(ErrorCode.INVALID_GROUP_ID)  # unlike OffsetCommit, no empty group id
    if (not_here := groups.coordinator_error(group_id)) is not ErrorCode.NONE:
        return fail(not_here)  # in a cluster: another broker leads the group's partition
    has_group_metadata = version >= FIRST_GROUP_METADATA_VERSION
    group_error = groups.validate_txn_offset_commit(
        group_id,
        request.producer_id,
        request.producer_epoch,
        request.member_id if has_group_metadata else "",
        request.group_instance_id if has_group_metadata else None,
        request.generation_id if has_group_metadata else -1,
    )
    if group_error is not ErrorCode.NONE:
        return fail(group_error)
    return answer_when_durable(
        groups,
        lambda: groups.stage_txn_offsets(request.producer_id, request.producer_epoch, staged),
        response,
        fail,
    )
