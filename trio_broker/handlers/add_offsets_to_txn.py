"""AddOffsetsToTxn: a consumer group's offsets join the producer's transaction.

The group's TxnOffsetCommit offsets stay staged until EndTxn, which tells the
group coordinator to commit or drop them. Needs WRITE on the transactional id
and READ on the group.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.transactions.state import fenced, fits_in_log

Resp = m.AddOffsetsToTxnResponse
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


@handles(m.ApiKey.ADD_OFFSETS_TO_TXN)
async def handle_add_offsets_to_txn(
    ctx: RequestContext, request: m.AddOffsetsToTxnRequest
) -> m.AddOffsetsToTxnResponse | Deferred:
    def answer(error: ErrorCode) -> m.AddOffsetsToTxnResponse:
        return Resp(throttle_time_ms=0, error_code=error)

    tid = request.transactional_id
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return answer(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if not request.group_id or not fits_in_log(request.group_id):
        return answer(ErrorCode.INVALID_GROUP_ID)
    running = ctx.services.transactions

    async def added() -> m.AddOffsetsToTxnResponse:
        return answer(
            await running.add_to_transaction(
                tid,
                request.producer_id,
                request.producer_epoch,
                (),
                (request.group_id,),
                fenced(ctx.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
            )
        )

    return Deferred(added)
