"""IncrementalAlterConfigs: SET, DELETE, APPEND or SUBTRACT single topic configs.

Same checks, persistence and live application as AlterConfigs (alter_configs.py),
on any broker of a cluster;
only the way the new override set is computed differs. APPEND and SUBTRACT
apply to list configs (cleanup.policy, the throttled-replica lists) only, as in Kafka.
"""

from __future__ import annotations

from trio_broker.handlers.alter_configs import (
    ConfigRefused,
    alter_configs,
    resources_response,
)
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.throttled_replicas import (
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_REPLICAS,
)

Resp = m.IncrementalAlterConfigsResponse

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
#: The value a list config (a comma-separated topic config) has when the topic does not
#: override it.
LIST_DEFAULTS = {
    "cleanup.policy": "delete",
    LEADER_THROTTLED_REPLICAS: "",
    FOLLOWER_THROTTLED_REPLICAS: "",
}
#: Topic configs whose value is a comma-separated list.
LIST_CONFIGS = frozenset(LIST_DEFAULTS)


def apply_operations(
    current: dict[str, str], resource: m.IncrementalAlterConfigsRequest.AlterConfigsResource
) -> dict[str, str]:
    configs = dict(current)
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        raise ConfigRefused(ErrorCode.INVALID_REQUEST, "a config is listed more than once")
    for change in resource.configs:
        name, op, value = change.name, change.config_operation, change.value
        if op == SET:
            if value is None:
                raise ConfigRefused(ErrorCode.INVALID_CONFIG, f"{name}: SET needs a value")
            configs[name] = value
        elif op == DELETE:
            configs.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if name not in LIST_CONFIGS:
                raise ConfigRefused(
                    ErrorCode.INVALID_CONFIG, f"{name} is not a list; APPEND/SUBTRACT need one"
                )
            items = [v for v in configs.get(name, LIST_DEFAULTS[name]).split(",") if v]
            given = [v.strip() for v in (value or "").split(",") if v.strip()]
            if op == APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            configs[name] = ",".join(items)
        else:
            raise ConfigRefused(ErrorCode.INVALID_REQUEST, f"unknown config operation {op}")
    return configs


@handles(m.ApiKey.INCREMENTAL_ALTER_CONFIGS)
async def handle_incremental_alter_configs(
    ctx: RequestContext, request: m.IncrementalAlterConfigsRequest
) -> m.IncrementalAlterConfigsResponse | Deferred:
    return await alter_configs(
        ctx, request.resources, request.validate_only, apply_operations,
        lambda results: resources_response(Resp, request.resources, results),
    )  # fmt: skip
