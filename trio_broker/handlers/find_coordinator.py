"""FindCoordinator: this node coordinates every group and every transactional id.

v0-3 ask for one key; v4+ batch several (``coordinator_keys``) and get one
entry each. Key type 0 is a group (the group coordinator's answer: the leader of the
group's ``__consumer_offsets`` partition), 1 a transactional id (the leader of the id's
``__transaction_state`` partition), anything else is an invalid request. A node alone is
a cluster of one: its internal topics have one partition, which it leads. An internal
topic that does not exist yet is made through ``services.admin`` on first use. The
address is the coordinator's on the client's listener, from ``services.leaders.view``.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import TRANSACTION_STATE

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
        # Alone: this broker. In a cluster: the leader of the group's __consumer_offsets
        # partition (made on first use; COORDINATOR_NOT_AVAILABLE until it and its
        # leader are there).
        error, leader = ctx.services.groups.find_coordinator(key)
        if error is not ErrorCode.NONE:
            return error, f"no coordinator for group {key!r} yet", -1, "", -1
        return _at(ctx, leader)
    if key_type == KEY_TYPE_TRANSACTION:
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    f"DESCRIBE on transactional id {key!r}", -1, "", -1)  # fmt: skip
        return _transaction_coordinator(ctx, key)
    return ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}", -1, "", -1


def _at(ctx: RequestContext, broker_id: int) -> tuple[ErrorCode, str | None, int, str, int]:
    """A coordinator's answer: ``broker_id`` at its address on the client's listener."""
    broker = ctx.services.leaders.view.brokers.get(broker_id)
    address = (
        None
        if broker is None
        else broker.endpoint(ctx.services.listener_name_for(ctx.client.connection_id))
    )
    if address is None:  # the coordinator has no endpoint on this client's listener
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is not on this listener",
                -1, "", -1)  # fmt: skip
    return ErrorCode.NONE, None, broker_id, *address


def _transaction_coordinator(
    ctx: RequestContext, key: str
) -> tuple[ErrorCode, str | None, int, str, int]:
    """The leader of the id's partition of ``__transaction_state``, as the coordinator's
    leadership has it (made on first use, through ``services.admin``; alone it is there
    from the start); COORDINATOR_NOT_AVAILABLE while the topic or that leader is not
    there yet."""
    config = ctx.services.config
    admin = ctx.services.admin
    transactions = ctx.services.transactions
    partition = transactions.partition_of(key)
    info = transactions.replication.partition(TRANSACTION_STATE, partition)
    if info is None and TRANSACTION_STATE not in admin.view.topics:
        admin.ensure_internal_topic_soon(
            TRANSACTION_STATE, config.transaction_state_log_num_partitions,
            config.transaction_state_log_replication_factor,
            {"cleanup.policy": "compact", "compression.type": "uncompressed",
             "min.insync.replicas": str(config.transaction_state_log_min_isr),
             "segment.bytes": str(config.transaction_state_log_segment_bytes)},
        )  # fmt: skip
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{TRANSACTION_STATE} is being made", -1, "", -1
    if info is None or info.leader not in admin.view.brokers:
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{TRANSACTION_STATE}-{partition} has no leader now", -1, "", -1)  # fmt: skip
    return _at(ctx, info.leader)


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
