"""AddPartitionsToTxn: put partitions into a producer's open transaction (v0-5).

v0-3 (clients): one transaction. The partitions are added durably before the
answer; one unknown or unauthorized topic fails the request, and the other
partitions answer OPERATION_NOT_ATTEMPTED (as Kafka does). The coordinator's
error (fenced epoch, CONCURRENT_TRANSACTIONS while an end is in progress, ...)
is every partition's error.

v4+ (KIP-890, broker to broker; needs CLUSTER_ACTION): several transactions per
request, and ``verify_only`` asks whether the partitions are already in the
transaction without adding them: NONE, or INVALID_TXN_STATE when not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator
from trio_broker.transactions.state import fenced

Req = m.AddPartitionsToTxnRequest
Resp = m.AddPartitionsToTxnResponse
TopicResult = Resp.AddPartitionsToTxnTopicResult
FIRST_BATCHED_VERSION = 4
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def _results(errors: dict[tuple[str, int], ErrorCode], topic_cls: Any = TopicResult) -> list[Any]:
    """Per-topic results; v4+ nests the same shape under each transaction (``topic_cls``)."""
    partition_cls = topic_cls.AddPartitionsToTxnPartitionResult
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), error in errors.items():
        by_topic.setdefault(topic, []).append(
            partition_cls(partition_index=partition, partition_error_code=error)
        )
    return [topic_cls(name=name, results_by_partition=parts) for name, parts in by_topic.items()]


def _partitions(topics: Iterable[Any]) -> list[tuple[str, int]]:
    return [(topic.name, partition) for topic in topics for partition in topic.partitions]


def _refusals(
    ctx: RequestContext, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], ErrorCode]:
    """Per partition: unauthorized or unknown; empty when every partition may be added."""
    refused: dict[tuple[str, int], ErrorCode] = {}
    for topic, partition in partitions:
        if not authorized(ctx, Operation.WRITE, ResourceType.TOPIC, topic):
            refused[topic, partition] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif ctx.services.topics.log(topic, partition) is None:
            refused[topic, partition] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return refused


async def _add(
    ctx: RequestContext, coordinator: PartitionedTransactionCoordinator, transactional_id: str,
    producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]],
) -> dict[tuple[str, int], ErrorCode]:  # fmt: skip
    """One transaction's partitions, added (v0-3 and v4+ without verify_only)."""
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return dict.fromkeys(partitions, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    refused = _refusals(ctx, partitions)
    if refused:
        return {tp: refused.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in partitions}
    error = await coordinator.add_to_transaction(
        transactional_id, producer_id, producer_epoch, partitions, (),
        fenced(ctx.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
    )  # fmt: skip
    return dict.fromkeys(partitions, error)


@handles(m.ApiKey.ADD_PARTITIONS_TO_TXN)
async def handle_add_partitions_to_txn(
    ctx: RequestContext, request: m.AddPartitionsToTxnRequest
) -> m.AddPartitionsToTxnResponse | Deferred:
    running = ctx.services.transactions
    if ctx.api_version < FIRST_BATCHED_VERSION:
        partitions = _partitions(request.v3_and_below_topics)

        async def added() -> m.AddPartitionsToTxnResponse:
            errors = await _add(
                ctx, running, request.v3_and_below_transactional_id,
                request.v3_and_below_producer_id, request.v3_and_below_producer_epoch, partitions,
            )  # fmt: skip
            return Resp(throttle_time_ms=0, results_by_topic_v3_and_below=_results(errors))

        return Deferred(added)

    if not authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER):
        return Resp(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)

    async def batched() -> m.AddPartitionsToTxnResponse:
        results = []
        for txn in request.transactions:
            partitions = _partitions(txn.topics)
            if txn.verify_only:
                errors = {
                    tp: running.verify_partition(
                        txn.transactional_id, txn.producer_id, txn.producer_epoch, tp
                    )
                    for tp in partitions
                }
            else:
                errors = await _add(ctx, running, txn.transactional_id, txn.producer_id,
                                    txn.producer_epoch, partitions)  # fmt: skip
            results.append(
                Resp.AddPartitionsToTxnResult(
                    transactional_id=txn.transactional_id,
                    topic_results=_results(
                        errors, Resp.AddPartitionsToTxnResult.AddPartitionsToTxnTopicResult
                    ),
                )
            )
        return Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, results_by_transaction=results)

    return Deferred(batched)
