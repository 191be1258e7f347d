"""DescribeCluster: the live brokers and the controller (alone: this node is both)."""

from __future__ import annotations

from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
)
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.DescribeClusterResponse

# DescribeCluster endpoint types (KIP-919).
BROKER_ENDPOINT = 1
CONTROLLER_ENDPOINT = 2
#: Kafka's "authorized operations not requested" marker.
OPERATIONS_OMITTED = -(2**31)
#: Without an authorizer every cluster operation is allowed: bits of Kafka's AclOperation codes
#: CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
#: IDEMPOTENT_WRITE 12.
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


@handles(m.ApiKey.DESCRIBE_CLUSTER)
async def handle_describe_cluster(
    ctx: RequestContext, request: m.DescribeClusterRequest
) -> m.DescribeClusterResponse:
    services = ctx.services
    endpoint_type = request.endpoint_type if ctx.api_version >= 1 else BROKER_ENDPOINT
    response = Resp(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
        endpoint_type=endpoint_type, cluster_id=services.cluster_id,
        controller_id=services.config.node_id, brokers=[],
        cluster_authorized_operations=CLUSTER_OPERATIONS
        if request.include_cluster_authorized_operations else OPERATIONS_OMITTED,
    )  # fmt: skip
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER):
        response.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        response.error_message = "DESCRIBE on the cluster refused"
        return response
    if services.authorizer is not None and request.include_cluster_authorized_operations:
        response.cluster_authorized_operations = authorized_operations(ctx, ResourceType.CLUSTER)
    if endpoint_type == CONTROLLER_ENDPOINT:
        # Our one listener is a broker listener; a client that wants the controller
        # quorum must be told it asked the wrong kind of endpoint.
        response.error_code = ErrorCode.MISMATCHED_ENDPOINT_TYPE
        response.error_message = "this is a broker endpoint, not a controller endpoint"
        return response
    if endpoint_type != BROKER_ENDPOINT:
        response.error_code = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        response.error_message = f"unknown endpoint type {endpoint_type}"
        return response
    view = services.leaders.view  # a cluster's live brokers, or this node alone
    response.controller_id = view.controller_id
    listener = services.listener_name_for(ctx.client.connection_id)
    response.brokers = [
        Resp.DescribeClusterBroker(
            broker_id=b.broker_id, host=h, port=p, rack=b.rack, is_fenced=False
        )
        for b, h, p in view.brokers_on(listener)
    ]
    return response
