"""EndTxn: commit or abort the producer's open transaction.

The answer comes after PrepareCommit/PrepareAbort is durable, every
partition's marker is appended and durable, the groups of AddOffsetsToTxn have
committed or dropped their staged offsets, and CompleteCommit/CompleteAbort is
durable (trio_broker/transactions/coordinator.py). A retried EndTxn of a
finished transaction answers NONE; the opposite outcome INVALID_TXN_STATE.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.transactions.state import fenced

Resp = m.EndTxnResponse
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


@handles(m.ApiKey.END_TXN)
async def handle_end_txn(
    ctx: RequestContext, request: m.EndTxnRequest
) -> m.EndTxnResponse | Deferred:
    def answer(error: ErrorCode) -> m.EndTxnResponse:
        # v5 echoes the producer id and epoch (KIP-890's epoch bump is not used: the
        # transaction.version feature is not advertised, so clients keep their epoch).
        return Resp(throttle_time_ms=0, error_code=error, producer_id=request.producer_id,
                    producer_epoch=request.producer_epoch)  # fmt: skip

    tid = request.transactional_id
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    running = ctx.services.transactions

    async def ended() -> m.EndTxnResponse:
        return answer(
            await running.end_transaction(
                tid,
                request.producer_id,
                request.producer_epoch,
                request.committed,
                fenced(ctx.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
            )
        )

    return Deferred(ended)
