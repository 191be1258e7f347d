"""DescribeTransactions: the coordinator's view of transactional ids (KIP-664).

Per id: its state name ("Ongoing", ...), timeout, start time, producer id and
epoch and the partitions of the open transaction. Unknown ids answer
TRANSACTIONAL_ID_NOT_FOUND; DESCRIBE on the transactional id is required.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import LoopBudget, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.DescribeTransactionsResponse
State = Resp.TransactionState


@handles(m.ApiKey.DESCRIBE_TRANSACTIONS)
async def handle_describe_transactions(
    ctx: RequestContext, request: m.DescribeTransactionsRequest
) -> m.DescribeTransactionsResponse:
    coordinator = ctx.services.transactions
    states = []
    budget = LoopBudget(ctx.services)  # a request may name 100,000 ids
    for tid in request.transactional_ids:
        await budget.tick()
        described = State(transactional_id=tid, transaction_state="", transaction_timeout_ms=0,
                          transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1,
                          topics=[])  # fmt: skip
        table = coordinator.table_for(tid)
        meta = None if isinstance(table, ErrorCode) else table.get(tid)
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            described.error_code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif isinstance(table, ErrorCode):
            # NOT_COORDINATOR (or loading) for an id another broker coordinates.
            described.error_code = table
        elif meta is None:
            described.error_code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions):
                by_topic.setdefault(topic, []).append(partition)
            described.error_code = ErrorCode.NONE
            described.transaction_state = meta.state.kafka_name
            described.transaction_timeout_ms = meta.timeout_ms
            described.transaction_start_time_ms = meta.start_ms
            described.producer_id = meta.producer_id
            described.producer_epoch = meta.producer_epoch
            described.topics = [State.TopicData(topic=topic, partitions=parts)
                                for topic, parts in by_topic.items()]  # fmt: skip
        states.append(described)
    return Resp(throttle_time_ms=0, transaction_states=states)
