"""AlterClientQuotas (49): set or remove quotas at runtime, kept in the data dir.

Every entry is checked first (entity types, quota keys, positive values); an
entry with a problem gets INVALID_REQUEST and changes nothing, the others are
applied together and written to ``client-quotas.json``. ``validate_only``
checks without applying. Needs ALTER_CONFIGS on the cluster, as in Kafka.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.quota import (
    QUOTA_KEYS,
    Entity,
    QuotaConfigError,
    check_quota,
    make_entity,
)

Resp = m.AlterClientQuotasResponse

Change = tuple[Entity, str, float | None]


def _changes(entry: m.AlterClientQuotasRequest.EntryData) -> list[Change]:
    """The entry's operations, validated; QuotaConfigError names the first problem."""
    entity = make_entity((e.entity_type, e.entity_name) for e in entry.entity)
    changes: list[Change] = []
    for op in entry.ops:
        if op.remove:
            if op.key not in QUOTA_KEYS:
                raise QuotaConfigError(f"unknown quota key {op.key!r}")
            changes.append((entity, op.key, None))
        else:
            check_quota(op.key, op.value)
            changes.append((entity, op.key, float(op.value)))
    return changes


@handles(m.ApiKey.ALTER_CLIENT_QUOTAS)
async def handle_alter_client_quotas(
    ctx: RequestContext, request: m.AlterClientQuotasRequest
) -> m.AlterClientQuotasResponse:
    allowed = authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.CLUSTER)
    accepted: list[Change] = []
    entries: list[Resp.EntryData] = []
    for entry in request.entries:
        result = Resp.EntryData(
            error_code=ErrorCode.NONE,
            error_message=None,
            entity=[
                Resp.EntryData.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                for e in entry.entity
            ],
        )
        entries.append(result)
        if not allowed:
            result.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            result.error_message = "ALTER_CONFIGS on the cluster refused"
            continue
        try:
            accepted.extend(_changes(entry))
        except QuotaConfigError as exc:
            result.error_code, result.error_message = ErrorCode.INVALID_REQUEST, str(exc)
    if accepted and not request.validate_only:
        ctx.services.quotas.alter(accepted)
    return Resp(throttle_time_ms=0, entries=entries)
