"""DescribeProducers (KIP-664): the active producers of partitions, for operators.

Per partition: each producer the partition's producer state knows (idempotent or
transactional) with its epoch, last sequence and timestamp, the coordinator epoch of
its last transaction marker (-1 if none), and the first offset of its open
transaction (-1 if none): the offset a hanging transaction holds the LSO at
(``kafka-transactions.sh find-hanging`` reads exactly this).

As in Kafka: READ on the topic is needed (else TOPIC_AUTHORIZATION_FAILED for each
partition), an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION, and a broker
that does not lead the partition answers NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.leadership import check_leader
from trio_broker.handlers.producer_state import prepare_producer_states
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.DescribeProducersResponse
TopicResp = Resp.TopicResponse
PartResp = TopicResp.PartitionResponse
ProducerState = PartResp.ProducerState


@handles(m.ApiKey.DESCRIBE_PRODUCERS, 0, 0)
async def handle_describe_producers(
    ctx: RequestContext, request: m.DescribeProducersRequest
) -> m.DescribeProducersResponse:
    services = ctx.services
    await prepare_producer_states(
        ctx, ((t.name, None, t.partition_indexes) for t in request.topics)
    )
    topics: list[TopicResp] = []
    for wanted in request.topics:
        allowed = authorized(ctx, Operation.READ, ResourceType.TOPIC, wanted.name)
        partitions: list[PartResp] = []
        for index in wanted.partition_indexes:
            part = PartResp(partition_index=index, error_code=0, active_producers=[])
            partitions.append(part)
            if not allowed:
                part.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            log = services.topics.log(wanted.name, index)
            if log is None:
                part.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if isinstance(check_leader(ctx, wanted.name, index), ErrorCode):
                part.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            manager = services.producers.manager(wanted.name, index, log)
            txns = manager.txns
            for pid in sorted(set(manager.producers) | set(txns.markers)):
                entry = manager.producers.get(pid)
                marker = txns.markers.get(pid)
                epoch = -1 if entry is None else entry.epoch
                if marker is not None:
                    epoch = max(epoch, marker.producer_epoch)
                part.active_producers.append(
                    ProducerState(
                        producer_id=pid,
                        producer_epoch=epoch,
                        last_sequence=-1 if entry is None else entry.last_seq,
                        last_timestamp=_or_unknown(manager.last_timestamp(pid)),
                        coordinator_epoch=-1 if marker is None else marker.coordinator_epoch,
                        current_txn_start_offset=txns.ongoing.get(pid, -1),
                    )
                )
        topics.append(TopicResp(name=wanted.name, partitions=partitions))
    return Resp(throttle_time_ms=0, topics=topics)


def _or_unknown(timestamp: int | None) -> int:
    """Kafka's -1 for a producer with no timestamp (none in its batches or marker)."""
    return -1 if timestamp is None else timestamp
