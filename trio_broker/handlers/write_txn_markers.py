"""WriteTxnMarkers: append commit/abort markers to partitions (inter-broker, v1-2).

Kafka's coordinator sends it to each partition leader. Ours writes its markers
locally, but the API is served too, so tools and a future cluster can drive
the partition side: each marker goes through the same append path as the
coordinator's (``append_txn_marker``), and the answer waits until they are all
durable. Needs CLUSTER_ACTION on the cluster.
"""

from __future__ import annotations

from typing import Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.transactions.coordinator import coordinator_of

Resp = m.WriteTxnMarkersResponse
MarkerResult = Resp.WritableTxnMarkerResult
TopicResult = MarkerResult.WritableTxnMarkerTopicResult
PartitionResult = TopicResult.WritableTxnMarkerPartitionResult


@handles(m.ApiKey.WRITE_TXN_MARKERS)
async def handle_write_txn_markers(
    ctx: RequestContext, request: m.WriteTxnMarkersRequest
) -> m.WriteTxnMarkersResponse | Deferred:
    coordinator = coordinator_of(ctx.services)
    allowed = authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    services = ctx.services
    results: list[MarkerResult] = []
    waits: list[tuple[Any, int]] = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                if not allowed:
                    error = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                elif coordinator is None:
                    error = ErrorCode.COORDINATOR_NOT_AVAILABLE
                elif services.topics.log(topic.name, index) is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    try:
                        waits.append(coordinator.write_marker(
                            services.topics, services.producers, services.durability,
                            services.appends, topic.name, index, marker.producer_id,
                            marker.producer_epoch, marker.transaction_result,
                            marker.coordinator_epoch, ctx.now_ms(),
                        ))  # fmt: skip
                        error = ErrorCode.NONE
                    except KafkaError as exc:
                        error = exc.error_code
                partitions.append(PartitionResult(partition_index=index, error_code=error))
            topics.append(TopicResult(name=topic.name, partitions=partitions))
        results.append(MarkerResult(producer_id=marker.producer_id, topics=topics))
    response = Resp(markers=results)
    if not waits:
        return response

    async def durable() -> m.WriteTxnMarkersResponse:
        for marker_log, offset in waits:
            await services.durability.wait_durable(marker_log, offset)
        return response

    return Deferred(durable)
