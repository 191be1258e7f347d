"""DescribeClientQuotas (48): the quotas in force, filtered by entity components.

Each filter component names an entity type and matches an exact name
(``match_type`` 0), the default entity (1) or any named, non-default one (2).
``strict`` asks for entities with exactly the filtered types; otherwise an
entity may have more. Needs DESCRIBE_CONFIGS on the cluster, as in Kafka.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.quota import ENTITY_TYPES, Entity

Resp = m.DescribeClientQuotasResponse
Component = m.DescribeClientQuotasRequest.ComponentData
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def _matches(entity: Entity, components: list[Component], strict: bool) -> bool:
    names = dict(entity)
    for c in components:
        if c.entity_type not in names:
            return False
        name = names[c.entity_type]
        if c.match_type == MATCH_EXACT and name != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and name is not None:
            return False
        if c.match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or len(names) == len(components)


def _check_filter(components: list[Component]) -> str | None:
    seen: set[str] = set()
    for c in components:
        if c.entity_type not in ENTITY_TYPES:
            return f"unknown entity type {c.entity_type!r}"
        if c.entity_type in seen:
            return f"entity type {c.entity_type!r} filtered twice"
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return f"unknown match type {c.match_type}"
        if c.match_type == MATCH_EXACT and c.match is None:
            return "an exact match needs a name"
        seen.add(c.entity_type)
    return None


@handles(m.ApiKey.DESCRIBE_CLIENT_QUOTAS)
async def handle_describe_client_quotas(
    ctx: RequestContext, request: m.DescribeClientQuotasRequest
) -> m.DescribeClientQuotasResponse:
    response = Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, entries=[])
    if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
        response.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        response.error_message = "DESCRIBE_CONFIGS on the cluster refused"
        response.entries = None
        return response
    problem = _check_filter(request.components)
    if problem is not None:
        response.error_code, response.error_message = ErrorCode.INVALID_REQUEST, problem
        response.entries = None
        return response
    table = ctx.services.quotas.table
    entries: list[Resp.EntryData] = []
    response.entries = entries
    for entity, values in sorted(table.effective().items(), key=lambda item: str(item[0])):
        if not _matches(entity, request.components, request.strict):
            continue
        entries.append(
            Resp.EntryData(
                entity=[
                    Resp.EntryData.EntityData(entity_type=kind, entity_name=name)
                    for kind, name in entity
                ],
                values=[
                    Resp.EntryData.ValueData(key=key, value=value)
                    for key, value in sorted(values.items())
                ],
            )
        )
    return response
