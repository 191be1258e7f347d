"""ShareAcknowledge (API 79, KIP-932): a share-group member acknowledges records without
fetching more (commitSync, close). It runs in the member's share session: epoch 0 cannot
open one here (INVALID_SHARE_SESSION_EPOCH), -1 closes it after the acknowledgements.
As Kafka: READ on the group and on each topic."""

from __future__ import annotations

import uuid

from trio_broker.groups.share import CLOSE_SESSION, OPEN_SESSION, next_epoch
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.share_fetch import Pending, acknowledge, request_error, settle
from trio_broker.handlers.share_persist import ensure_loaded, persist_each
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.ShareAcknowledgeResponse
TopicResp = Resp.ShareAcknowledgeTopicResponse
PartResp = TopicResp.PartitionData


def top_level(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Resp:
    return Resp(
        throttle_time_ms=0, error_code=code, error_message=message,
        acquisition_lock_timeout_ms=0, responses=[], node_endpoints=[],
    )  # fmt: skip


# Version 2 brings Renew acknowledgements (KIP-1222), which this slice lacks.
@handles(m.ApiKey.SHARE_ACKNOWLEDGE, max_version=1)
async def handle_share_acknowledge(ctx: RequestContext, request: m.ShareAcknowledgeRequest) -> Resp:
    group_id, member_id = request.group_id, request.member_id
    if (why := request_error(group_id, member_id)) is not None:
        return top_level(ctx, ErrorCode.INVALID_REQUEST, why)
    assert group_id is not None and member_id is not None
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id):
        return top_level(ctx, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    shares = ctx.services.shares
    epoch = request.share_session_epoch
    if epoch == OPEN_SESSION:
        return top_level(ctx, ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                         "A share session cannot be opened by ShareAcknowledge.")  # fmt: skip
    if (error := shares.session_error(group_id, member_id, epoch)) is not ErrorCode.NONE:
        return top_level(ctx, error)
    session = shares.session(group_id, member_id)
    assert session is not None
    if epoch != CLOSE_SESSION:
        session.epoch = next_epoch(session.epoch)
    per_topic: dict[uuid.UUID, list[PartResp]] = {}
    touched: set[tuple[uuid.UUID, int]] = set()
    pending: Pending = {}
    # In a cluster, share state not read in this leader epoch yet is read first.
    unread = await ensure_loaded(ctx, group_id, {
        (t.topic_id, p.partition_index) for t in request.topics for p in t.partitions
    })  # fmt: skip
    for topic in request.topics:
        for p in topic.partitions:
            code = unread.get((topic.topic_id, p.partition_index)) or acknowledge(
                ctx, group_id, member_id, topic.topic_id, p.partition_index,
                p.acknowledgement_batches, touched, pending,
            )  # fmt: skip
            per_topic.setdefault(topic.topic_id, []).append(PartResp(
                partition_index=p.partition_index, error_code=code,
                current_leader=PartResp.LeaderIdAndEpoch(
                    leader_id=ctx.services.config.node_id, leader_epoch=0
                ),
            ))  # fmt: skip
    if epoch == CLOSE_SESSION:
        shares.close_session(group_id, member_id)
    # Answered once the acknowledgements are durable: a restart does not deliver them
    # again. A partition whose write failed answers why, its acknowledgements undone
    # (still acquired by the member: its retry finds them), as Kafka's.
    stored = await persist_each(ctx, group_id, touched)
    settle(ctx, group_id, member_id, pending, stored)
    for topic_id, parts in per_topic.items():
        for part in parts:
            code = stored.get((topic_id, part.partition_index), ErrorCode.NONE)
            if part.error_code == ErrorCode.NONE and code is not ErrorCode.NONE:
                part.error_code = code
    return Resp(
        throttle_time_ms=0, error_code=ErrorCode.NONE,
        # (Version 2's field, KIP-1222; not offered: version 1 carries none.)
        acquisition_lock_timeout_ms=shares.lock_duration_ms(group_id),
        responses=[TopicResp(topic_id=t, partitions=ps) for t, ps in per_topic.items()],
        node_endpoints=[],
    )  # fmt: skip
