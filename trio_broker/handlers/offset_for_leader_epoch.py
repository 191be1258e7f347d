"""OffsetForLeaderEpoch: the end offset of a leader epoch, for truncation detection.

Every partition has had one leader epoch, 0, since it was created, so:

- the current epoch (0) ends at the log end offset, which on one node is the
  high watermark;
- an epoch below 0 is UNDEFINED: Kafka answers leader epoch -1, end offset -1
  (no error) and a consumer then resets its position;
- an epoch above 0 was never seen: Kafka's epoch cache has no entry at or after
  it and answers the same -1/-1 (no error); an error here would make a consumer
  retry forever instead of resetting.

The request's current_leader_epoch (-1 = no check) is compared with ours
first (``leading_partition``, the guard every per-partition API shares: a node
alone's term has epoch 0; a follower compares it with the epoch it knows before it
answers NOT_LEADER_OR_FOLLOWER): older is FENCED_LEADER_EPOCH, newer is
UNKNOWN_LEADER_EPOCH.

In a cluster the leader answers from the partition's leader-epoch cache (KIP-101,
KIP-279): where the asked epoch ends in its log. Followers use it to truncate.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.topic_lookup import find_topic, leading_partition
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.OffsetForLeaderEpochResponse
TopicResult = Resp.OffsetForLeaderTopicResult
EpochEndOffset = TopicResult.EpochEndOffset
NO_EPOCH = -1


@handles(m.ApiKey.OFFSET_FOR_LEADER_EPOCH)
async def handle_offset_for_leader_epoch(
    ctx: RequestContext, request: m.OffsetForLeaderEpochRequest
) -> m.OffsetForLeaderEpochResponse:
    results: list[TopicResult] = []
    # Brokers (CLUSTER_ACTION) may ask for any topic; a consumer (KIP-320) needs DESCRIBE.
    replica = authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    for wanted in request.topics:
        topic, name, missing = find_topic(ctx, wanted.topic, None)
        partitions: list[EpochEndOffset] = []
        allowed = replica or authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, wanted.topic)
        for p in wanted.partitions:
            out = EpochEndOffset(
                error_code=ErrorCode.NONE, partition=p.partition, leader_epoch=NO_EPOCH,
                end_offset=-1,
            )  # fmt: skip
            partitions.append(out)
            if not allowed:
                out.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            # Kafka asks the leader only (fetchOnlyFromLeader), a follower's request too.
            led = leading_partition(
                ctx, topic, name, p.partition, missing, p.current_leader_epoch
            )  # fmt: skip
            if isinstance(led, ErrorCode):
                out.error_code = led
                continue
            term, log = led.term, led.log
            if term.replicated:
                out.leader_epoch, out.end_offset = log.epoch_cache.end_offset_for(
                    p.leader_epoch, log.log_end_offset
                )
            elif p.leader_epoch == term.leader_epoch:
                # Alone: one epoch since creation, kept in no epoch cache.
                out.leader_epoch, out.end_offset = term.leader_epoch, log.log_end_offset
        results.append(TopicResult(topic=wanted.topic, partitions=partitions))
    return Resp(throttle_time_ms=0, topics=results)
