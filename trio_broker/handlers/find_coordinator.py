"""FindCoordinator: this node coordinates every group and every transactional id.

v0-3 ask for one key; v4+ batch several (``coordinator_keys``) and get one
entry each. Key type 0 is a group, 1 a transactional id (this broker, when it
runs a transaction coordinator), anything else is an invalid request.
"""

from __future__ import annotations

import zlib

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.FindCoordinatorResponse
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
#: v4 is the first version that batches keys (KIP-699).
FIRST_BATCHED_VERSION = 4


def _locate(
    ctx: RequestContext, key_type: int, key: str
) -> tuple[ErrorCode, str | None, int, str, int]:
    """(error, message, node id, host, port) for one key."""
    if key_type == KEY_TYPE_GROUP:
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, key):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED, f"DESCRIBE on group {key!r}", -1, "", -1
        replication = ctx.services.replication
        if replication is not None and replication.view.brokers:
            # A cluster: one live broker per group, the same answer from every broker.
            # Group state is not replicated yet ([cluster]): it moves with the broker set.
            live = sorted(replication.view.brokers)
            chosen = replication.view.brokers[live[zlib.crc32(key.encode()) % len(live)]]
            address = chosen.endpoint(ctx.services.listener_name_for(ctx.client.connection_id))
            if address is None:  # the coordinator has no endpoint on this client's listener
                return (ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is not on this "
                        "listener", -1, "", -1)  # fmt: skip
            return ErrorCode.NONE, None, chosen.broker_id, *address
        host, port = ctx.services.advertised_for(ctx.client.connection_id)
        return ErrorCode.NONE, None, ctx.services.config.node_id, host, port
    if key_type == KEY_TYPE_TRANSACTION:
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    f"DESCRIBE on transactional id {key!r}", -1, "", -1)  # fmt: skip
        if ctx.services.transactions is None:  # cluster mode: not built yet (docs/cluster.md)
            return (ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "no transaction coordinator: transactions need a single broker for now",
                    -1, "", -1)  # fmt: skip
        host, port = ctx.services.advertised_for(ctx.client.connection_id)
        return ErrorCode.NONE, None, ctx.services.config.node_id, host, port
    return ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}", -1, "", -1


@handles(m.ApiKey.FIND_COORDINATOR)
async def handle_find_coordinator(
    ctx: RequestContext, request: m.FindCoordinatorRequest
) -> m.FindCoordinatorResponse:
    key_type = request.key_type if ctx.api_version >= 1 else KEY_TYPE_GROUP
    if ctx.api_version >= FIRST_BATCHED_VERSION:
        coordinators = []
        for key in request.coordinator_keys:
            error, message, node, host, port = _locate(ctx, key_type, key)
            coordinators.append(
                Resp.Coordinator(key=key, node_id=node, host=host, port=port,
                                 error_code=error, error_message=message)
            )  # fmt: skip
        return Resp(throttle_time_ms=0, coordinators=coordinators)
    error, message, node, host, port = _locate(ctx, key_type, request.key)
    return Resp(
        throttle_time_ms=0, error_code=error, error_message=message,
        node_id=node, host=host, port=port,
    )  # fmt: skip
