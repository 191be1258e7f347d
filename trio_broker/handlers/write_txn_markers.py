"""WriteTxnMarkers: append commit/abort markers to partitions (inter-broker, v1-2).

Kafka's coordinator sends it to each partition leader, and so does ours in a cluster
(``cluster/txn_marker_channel.py``): each marker is appended in this leader's epoch
through the same path as the coordinator's local ones (``services/txn_markers.py``:
the producer state checks the producer and coordinator epochs), and the answer waits
until every marker is committed (synced, below the high watermark). A partition this
broker does not lead answers NOT_LEADER_OR_FOLLOWER (the coordinator retries at the
new leader); a ``__consumer_offsets`` partition is handed to the group coordinator,
which commits or drops the producer's staged offsets.

A node alone takes the same path: it leads every partition it holds (a cluster of one,
``services.leaders``), so its markers are appended as the partition's leader and
answered once synced; the coordinator alone writes its own markers directly, the API
serves tools that drive the partition side. A partition this broker holds no replica of
answers UNKNOWN_TOPIC_OR_PARTITION (Kafka's, for a partition not online here). Needs
CLUSTER_ACTION on the cluster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.producer_state import prepare_producer_states
from trio_broker.partition.append import Appended
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.txn_markers import (
    append_marker_as_leader,
    complete_offsets_marker,
    marker_committed,
)

Resp = m.WriteTxnMarkersResponse
MarkerResult = Resp.WritableTxnMarkerResult
TopicResult = MarkerResult.WritableTxnMarkerTopicResult
PartitionResult = TopicResult.WritableTxnMarkerPartitionResult


@handles(m.ApiKey.WRITE_TXN_MARKERS)
async def handle_write_txn_markers(
    ctx: RequestContext, request: m.WriteTxnMarkersRequest
) -> m.WriteTxnMarkersResponse | Deferred:
    allowed = authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    services = ctx.services
    if allowed:  # the marker's epoch checks need the partitions' producer state
        await prepare_producer_states(ctx, (
            (t.name, None, t.partition_indexes)
            for mk in request.markers for t in mk.topics if t.name != CONSUMER_OFFSETS
        ))  # fmt: skip
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
                elif services.topics.log(topic.name, index) is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif topic.name == CONSUMER_OFFSETS:
                    waits.append((result, _offsets_marker(services, index, marker)))
                else:
                    written = append_marker_as_leader(
                        services, topic.name, index, marker.producer_id, marker.producer_epoch,
                        marker.transaction_result, marker.coordinator_epoch, ctx.now_ms(),
                    )  # fmt: skip
                    if isinstance(written, ErrorCode):
                        result.error_code = written
                    else:
                        waits.append((result, _committed(services, written)))
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
