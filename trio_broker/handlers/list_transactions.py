"""ListTransactions: the transactional ids this coordinator knows (KIP-664, v0-2).

Filters: states (by Kafka's names; unknown names come back in
``unknown_state_filters``), producer ids, v1's minimum running time
(``duration_filter`` ms, Ongoing only counts), v2's transactional id regex.
Only ids the principal may DESCRIBE are listed.

The regex is a client's: it is compiled with RE2 (protocol/patterns.py: linear-time
matching, at most 1 KiB) and tried only on ids the principal may DESCRIBE and that
pass the cheap filters. A pattern RE2 refuses, or too long, is
INVALID_REGULAR_EXPRESSION, as Kafka answers a pattern Java cannot compile.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import LoopBudget, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.patterns import InvalidPattern, Pattern, compile_pattern
from trio_broker.transactions.state import TxnState

Resp = m.ListTransactionsResponse


@handles(m.ApiKey.LIST_TRANSACTIONS)
async def handle_list_transactions(
    ctx: RequestContext, request: m.ListTransactionsRequest
) -> m.ListTransactionsResponse:
    coordinator = ctx.services.transactions
    wanted_states = set()
    unknown = []
    for name in request.state_filters:
        state = TxnState.from_kafka_name(name)
        if state is None:
            unknown.append(name)
        else:
            wanted_states.add(state)
    pattern: Pattern | None = None
    if ctx.api_version >= 2 and request.transactional_id_pattern:
        try:
            pattern = compile_pattern(request.transactional_id_pattern)
        except InvalidPattern:
            return Resp(throttle_time_ms=0, error_code=ErrorCode.INVALID_REGULAR_EXPRESSION,
                        unknown_state_filters=[], transaction_states=[])  # fmt: skip
    min_duration = request.duration_filter if ctx.api_version >= 1 else -1
    now = ctx.now_ms()
    listed = []
    budget = LoopBudget(ctx.services)
    for meta in sorted(coordinator.all(), key=lambda meta: meta.transactional_id):
        await budget.tick()
        if request.state_filters and meta.state not in wanted_states:
            continue
        if request.producer_id_filters and meta.producer_id not in request.producer_id_filters:
            continue
        if min_duration >= 0 and (
            meta.state != TxnState.ONGOING or now - meta.start_ms < min_duration
        ):
            continue
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                          meta.transactional_id):  # fmt: skip
            continue
        if pattern is not None and not pattern.fullmatch(meta.transactional_id):
            continue
        listed.append(Resp.TransactionState(transactional_id=meta.transactional_id,
                                            producer_id=meta.producer_id,
                                            transaction_state=meta.state.kafka_name))  # fmt: skip
    return Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, unknown_state_filters=unknown,
                transaction_states=listed)  # fmt: skip
