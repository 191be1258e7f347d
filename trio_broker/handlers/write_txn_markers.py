"""WriteTxnMarkers: append commit/abort markers to partitions (inter-broker, v1-2).

Kafka's coordinator sends it to each partition leader, and so does ours in a cluster
(``cluster/txn_marker_channel.py``): each marker is appended in this leader's epoch
through the same path as the coordinator's local ones (``services/txn_markers.py``:
the producer state checks the producer and coordinator epochs), and the answer waits
until every marker is committed (synced, below the high watermark). A partition this
broker does not lead answers NOT_LEADER_OR_FOLLOWER (the coordinator retries at the
new leader); a ``__consumer_offsets`` partition is handed to the group coordinator,
which commits or drops the producer's staged offsets.

On a single broker the coordinator writes its markers itself; the API is served too, so
tools can drive the partition side, and answers once the markers are durable. Needs
CLUSTER_ACTION on the cluster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.partition.append import Appended
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.txn_markers import (
    append_marker_as_leader,
    complete_offsets_marker,
    marker_committed,
)
from trio_broker.storage.log_protocol import Log
from trio_broker.transactions.coordinator import TransactionCoordinator
from trio_broker.transactions.lookup import coordinator_of

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
    clustered = services.replication is not None
    results: list[MarkerResult] = []
    #: Partition results still to be decided once their marker is committed.
    waits: list[tuple[PartitionResult, Callable[[], Awaitable[ErrorCode]]]] = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                result = PartitionResult(partition_index=index, error_code=ErrorCode.NONE)
                partitions.append(result)
                if not allowed:
                    result.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                elif clustered and topic.name == CONSUMER_OFFSETS:
                    waits.append((result, _offsets_marker(services, index, marker)))
                elif clustered:
                    written = append_marker_as_leader(
                        services, topic.name, index, marker.producer_id, marker.producer_epoch,
                        marker.transaction_result, marker.coordinator_epoch, ctx.now_ms(),
                    )  # fmt: skip
                    if isinstance(written, ErrorCode):
                        result.error_code = written
                    else:
                        waits.append((result, _committed(services, written)))
                else:
                    result.error_code = _append_alone(ctx, coordinator, topic.name, index,
                                                      marker, waits, result)  # fmt: skip
            topics.append(TopicResult(name=topic.name, partitions=partitions))
        results.append(MarkerResult(producer_id=marker.producer_id, topics=topics))
    response = Resp(markers=results)
    if not waits:
        return response

    async def committed() -> m.WriteTxnMarkersResponse:
        for result, wait in waits:  # every marker is appended already: they commit together
            result.error_code = await wait()
        return response

    return Deferred(committed)


def _committed(services: Any, written: Appended) -> Callable[[], Awaitable[ErrorCode]]:
    return lambda: marker_committed(services, written)


def _offsets_marker(
    services: Any, partition: int, marker: Any
) -> Callable[[], Awaitable[ErrorCode]]:
    return lambda: complete_offsets_marker(services, partition, marker.producer_id,
                                           marker.producer_epoch, marker.transaction_result)  # fmt: skip


def _append_alone(
    ctx: RequestContext, coordinator: Any, topic: str, index: int, marker: Any,
    waits: list[tuple[PartitionResult, Callable[[], Awaitable[ErrorCode]]]],
    result: PartitionResult,
) -> ErrorCode:  # fmt: skip
    """A single broker: the coordinator's own marker writer, answered once durable."""
    services = ctx.services
    if not isinstance(coordinator, TransactionCoordinator):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if services.topics.log(topic, index) is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        written = coordinator.write_marker(
            services.topics, services.producers, services.durability, services.appends, topic,
            index, marker.producer_id, marker.producer_epoch, marker.transaction_result,
            marker.coordinator_epoch, ctx.now_ms(),
        )  # fmt: skip
    except KafkaError as exc:
        return ErrorCode(exc.error_code)
    waits.append((result, _durable(services, written)))
    return ErrorCode.NONE


def _durable(services: Any, written: tuple[Log, int]) -> Callable[[], Awaitable[ErrorCode]]:
    async def wait() -> ErrorCode:
        await services.durability.wait_durable(*written)
        return ErrorCode.NONE

    return wait
