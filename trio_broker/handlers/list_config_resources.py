"""ListConfigResources (API 74; KIP-1142, v0 was KIP-714's ListClientMetricsResources).

Names the resources one may describe configs of, so that a tool can list them before it
describes them (kafka-configs --describe --entity-type groups / client-metrics with no
--entity-name). Kafka's rules (``KafkaApis.handleListConfigResources``):

- DESCRIBE_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED and no resources;
- v0 lists client-metrics resources only; v1 takes resource types (empty: every type it
  supports: TOPIC 2, BROKER 4, BROKER_LOGGER 8, CLIENT_METRICS 16, GROUP 32), and any
  other type fails the request with UNSUPPORTED_VERSION;
- topics: every topic (internal ones too); BROKER and BROKER_LOGGER: each live broker's
  id; GROUP: groups with a dynamic config; CLIENT_METRICS: client-metrics subscriptions.

trio-broker has no client-metrics subscriptions, so that type answers no names (what
Kafka answers when none is set); GROUP lists the groups with a config set
(storage/group_configs.py).
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import LoopBudget, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.ListConfigResourcesResponse

# Kafka's ConfigResource.Type ids.
TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8
CLIENT_METRICS = 16
GROUP = 32
SUPPORTED_V0 = frozenset({CLIENT_METRICS})
SUPPORTED_V1 = frozenset({TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP})


@handles(m.ApiKey.LIST_CONFIG_RESOURCES)
async def handle_list_config_resources(
    ctx: RequestContext, request: m.ListConfigResourcesRequest
) -> m.ListConfigResourcesResponse:
    response = Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, config_resources=[])
    if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
        response.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return response
    supported = SUPPORTED_V0 if ctx.api_version == 0 else SUPPORTED_V1
    wanted = set(request.resource_types) if ctx.api_version >= 1 else set()
    if not wanted:
        wanted = set(supported)
    if not wanted <= supported:
        response.error_code = ErrorCode.UNSUPPORTED_VERSION
        return response
    out = response.config_resources
    if wanted & {BROKER, BROKER_LOGGER}:
        ids = _broker_ids(ctx)
        for kind in (BROKER_LOGGER, BROKER):  # Kafka's order: loggers, then brokers
            if kind in wanted:
                out.extend(Resp.ConfigResource(resource_name=str(i), resource_type=kind)
                           for i in ids)  # fmt: skip
    if GROUP in wanted:
        out.extend(Resp.ConfigResource(resource_name=name, resource_type=GROUP)
                   for name in sorted(ctx.services.shares.group_configs.groups))  # fmt: skip
    if TOPIC in wanted:
        budget = LoopBudget(ctx.services)
        for name in sorted(ctx.services.leaders.view.topics):
            out.append(Resp.ConfigResource(resource_name=name, resource_type=TOPIC))
            await budget.tick()
    return response


def _broker_ids(ctx: RequestContext) -> list[int]:
    return sorted(ctx.services.leaders.view.brokers)
