"""InitProducerId: hand an idempotent producer its id and epoch (every version, 0-6).

* No id in the request (v0-2, or -1/-1): a fresh id from the persisted id blocks,
  epoch 0. Ids never repeat, across restarts too.
* The client's current id and epoch (v3+, KIP-360): the same id with the next epoch,
  so it can restart its sequences at 0; a fresh id once the epoch would pass 32767.
* A transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED. We have no transaction
  coordinator, and every client treats that error as fatal with a message naming the
  transactional id, where COORDINATOR_NOT_AVAILABLE would make it retry until its
  timeout and then report a vague timeout (docs/idempotence.md).
"""

from __future__ import annotations

import logging

from trio_broker.handlers.authorization import Operation, ResourceType, authorized, authorized_any
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.state.producer import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    SnapshotError,
    decide_init_producer_id,
)

log = logging.getLogger("trio_broker.producer")
Resp = m.InitProducerIdResponse


@handles(m.ApiKey.INIT_PRODUCER_ID)
async def handle_init_producer_id(
    ctx: RequestContext, request: m.InitProducerIdRequest
) -> m.InitProducerIdResponse:
    def answer(error: ErrorCode, producer_id: int, epoch: int) -> m.InitProducerIdResponse:
        return Resp(
            throttle_time_ms=0, error_code=error, producer_id=producer_id, producer_epoch=epoch
        )

    if request.transactional_id is not None:
        return answer(
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        )
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
