"""InitProducerId: hand an idempotent producer its id and epoch (every version, 0-6).

* No id in the request (v0-2, or -1/-1): a fresh id from the persisted id blocks,
  epoch 0. Ids never repeat, across restarts too.
* The client's current id and epoch (v3+, KIP-360): the same id with the next epoch,
  so it can restart its sequences at 0; a fresh id once the epoch would pass 32767.
* A transactional id: the transaction coordinator's answer (trio_broker/transactions):
  a fresh id on first use, the next epoch after, fencing the previous producer
  (its open transaction is aborted first: CONCURRENT_TRANSACTIONS meanwhile, the
  client retries). Needs WRITE on the transactional id (docs/transactions.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from trio_broker.handlers.authorization import Operation, ResourceType, authorized, authorized_any
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.state.producer import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    SnapshotError,
    decide_init_producer_id,
)
from trio_broker.transactions.state import fenced

log = logging.getLogger("trio_broker.producer")
Resp = m.InitProducerIdResponse
#: KIP-588: PRODUCER_FENCED from v4 on; older clients get INVALID_PRODUCER_EPOCH.
FIRST_VERSION_WITH_PRODUCER_FENCED = 4


@handles(m.ApiKey.INIT_PRODUCER_ID)
async def handle_init_producer_id(
    ctx: RequestContext, request: m.InitProducerIdRequest
) -> m.InitProducerIdResponse | Deferred:
    def answer(error: ErrorCode, producer_id: int, epoch: int) -> m.InitProducerIdResponse:
        return Resp(
            throttle_time_ms=0, error_code=error, producer_id=producer_id, producer_epoch=epoch
        )

    if request.transactional_id is not None:
        return _transactional(ctx, request, answer)
    # An idempotent producer needs IDEMPOTENT_WRITE on the cluster or, as Kafka 3.x
    # accepts, WRITE on some topic.
    if not authorized(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER) and not (
        authorized_any(ctx, Operation.WRITE, ResourceType.TOPIC)
    ):
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    allocator = ProducerStateRegistry.attached_to(ctx.services).allocator
    try:
        # Versions before 3 have no such fields: the codec leaves their defaults, -1.
        decision = decide_init_producer_id(
            request.producer_id, request.producer_epoch, allocator.issued_below
        )
        if decision.error_code != ErrorCode.NONE:
            return answer(decision.error_code, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        if decision.producer_id is None:
            return answer(ErrorCode.NONE, allocator.allocate(), decision.epoch)
        return answer(ErrorCode.NONE, decision.producer_id, decision.epoch)
    except (OSError, SnapshotError):
        # The id block could not be read or made durable: an id handed out now could
        # repeat after a restart. Retriable for the client; the log says why.
        log.exception("cannot allocate a producer id")
        return answer(ErrorCode.COORDINATOR_NOT_AVAILABLE, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)


def _transactional(
    ctx: RequestContext,
    request: m.InitProducerIdRequest,
    answer: Callable[[ErrorCode, int, int], m.InitProducerIdResponse],
) -> m.InitProducerIdResponse | Deferred:
    transactional_id = request.transactional_id
    assert transactional_id is not None
    if not authorized(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return answer(
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        )
    coordinator = ctx.services.transactions

    async def decided() -> m.InitProducerIdResponse:
        try:
            result = await coordinator.init_producer_id(
                transactional_id, request.producer_id, request.producer_epoch,
                request.transaction_timeout_ms,
                fenced(ctx.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
            )  # fmt: skip
        except (OSError, SnapshotError):
            log.exception("cannot allocate a producer id")
            return answer(ErrorCode.COORDINATOR_NOT_AVAILABLE, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        return answer(result.error, result.producer_id, result.producer_epoch)

    return Deferred(decided)
