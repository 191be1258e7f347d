"""AlterConfigs: replace a topic's or the broker's config overrides (every key not listed
is reset).

Topic resources: values are checked before anything changes (unknown key, malformed
or out-of-range value -> INVALID_CONFIG); with ``validate_only`` the check is all that
happens. Accepted overrides are written to the topic catalogue and applied to the live
partition logs (retention, segment rolling, max.message.bytes), and DescribeConfigs
reports them with source DYNAMIC_TOPIC_CONFIG.

BROKER resources: the dynamic broker configs (storage/broker_configs.py), either the
cluster-wide default (name "") or this node's (its id). They become the log defaults
of every topic that does not set the key itself (docs/acls.md, "Dynamic broker configs").

In a cluster, an accepted topic change is also stored in ZooKeeper (the topic's config
znode), from where every replica's config watch applies it, min.insync.replicas included
(docs/cluster.md, "Topic configs in a cluster").

Shared with IncrementalAlterConfigs: resource checks, value checks, applying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from trio_broker.handlers.authorization import authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.security.acl import Operation, ResourceType
from trio_broker.services.topics import TopicError
from trio_broker.storage.broker_configs import CLUSTER_DEFAULT, THIS_BROKER, check_broker_configs
from trio_broker.storage.errors import InvalidConfigError, StorageError

Resp = m.AlterConfigsResponse


class ConfigResource(Protocol):
    """What the resources of AlterConfigs and IncrementalAlterConfigs have in common."""

    resource_type: int
    resource_name: str


AnyResource = TypeVar("AnyResource", bound=ConfigResource)
AnyAnswer = TypeVar("AnyAnswer", m.AlterConfigsResponse, m.IncrementalAlterConfigsResponse)

# Kafka's ConfigResource.Type codes.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8

#: cleanup.policy values AlterConfigs takes (compaction: docs/compaction.md).
CLEANUP_POLICIES = frozenset({"delete", "compact"})


class ConfigRefused(KafkaError):
    """A config change Kafka refuses: ``ConfigRefused(error_code, message)``."""


def check_values(ctx: RequestContext, configs: dict[str, str]) -> None:
    """Raise ConfigRefused(INVALID_CONFIG) unless the topic would accept ``configs`` whole."""
    try:
        ctx.services.topics.check_configs(configs)  # storage/topic_configs.py: the one table
    except TopicError as exc:
        raise ConfigRefused(exc.error_code, str(exc)) from None
    if "cleanup.policy" in configs:
        policies = {p.strip() for p in configs["cleanup.policy"].split(",")}
        if not policies <= CLEANUP_POLICIES:
            raise ConfigRefused(
                ErrorCode.INVALID_CONFIG,
                "cleanup.policy: only 'delete' and 'compact' are supported",
            )


def alter_resources(
    ctx: RequestContext,
    resources: list[AnyResource],
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> list[tuple[ErrorCode, str | None]]:
    """Check and (unless validate_only) apply each resource; one (error, message) each.

    ``new_configs(current overrides, resource)`` computes the topic's new overrides
    or raises ConfigRefused.
    """
    seen: dict[tuple[int, str], int] = {}
    for resource in resources:
        key = (resource.resource_type, resource.resource_name)
        seen[key] = seen.get(key, 0) + 1
    out: list[tuple[ErrorCode, str | None]] = []
    for resource in resources:
        try:
            if seen[(resource.resource_type, resource.resource_name)] > 1:
                raise ConfigRefused(ErrorCode.INVALID_REQUEST, "resource listed more than once")
            _alter_one(ctx, resource, validate_only, new_configs)
            out.append((ErrorCode.NONE, None))
        except ConfigRefused as exc:
            out.append((exc.error_code, str(exc)))
    return out


def _alter_one(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> None:
    name = resource.resource_name
    if resource.resource_type in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE):
        if not authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.CLUSTER):
            raise ConfigRefused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER_CONFIGS refused")
        if resource.resource_type == BROKER_LOGGER_RESOURCE:
            raise ConfigRefused(ErrorCode.INVALID_REQUEST, "broker loggers cannot be altered")
        _alter_broker(ctx, resource, validate_only, new_configs)
        return
    if resource.resource_type != TOPIC_RESOURCE:
        raise ConfigRefused(
            ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource.resource_type}"
        )
    if not authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.TOPIC, name):
        raise ConfigRefused(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "ALTER_CONFIGS refused")
    topic = ctx.services.topics.get(name)
    if topic is None:
        raise ConfigRefused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    configs = new_configs(dict(topic.info.configs), resource)
    check_values(ctx, configs)
    if validate_only:
        return
    try:
        ctx.services.topics.set_configs(name, configs)
    except TopicError as exc:
        raise ConfigRefused(exc.error_code, str(exc)) from None
    except OSError as exc:
        raise ConfigRefused(StorageError.error_code, f"cannot store configs: {exc}") from None


async def publish_topic_configs(
    ctx: RequestContext,
    resources: Sequence[ConfigResource],
    results: list[tuple[ErrorCode, str | None]],
    validate_only: bool,
) -> list[tuple[ErrorCode, str | None]]:
    """In a cluster, store each topic change that was applied here in ZooKeeper."""
    replication = ctx.services.replication
    if replication is None or validate_only:
        return results
    out = []
    for resource, (code, message) in zip(resources, results, strict=True):
        name = resource.resource_name
        topic = ctx.services.topics.get(name)
        if (
            code == ErrorCode.NONE
            and resource.resource_type == TOPIC_RESOURCE
            and topic is not None
            and name in replication.view.topics  # not a topic of this broker alone
        ):
            try:
                await replication.set_topic_configs(name, dict(topic.info.configs))
            except TopicError as exc:
                code, message = exc.error_code, str(exc)
        out.append((code, message))
    return out


def _alter_broker(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> None:
    """Dynamic broker configs: "" is the cluster-wide default, the node id this broker.

    Kafka answers INVALID_REQUEST for a key that is not dynamic, a bad value, or
    another broker's id; the whole resource is refused.
    """
    name, node = resource.resource_name, str(ctx.services.config.node_id)
    if name not in ("", node):
        raise ConfigRefused(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {node} or empty string, but received {name}",
        )
    level = CLUSTER_DEFAULT if name == "" else THIS_BROKER
    topics = ctx.services.topics
    configs = new_configs(topics.broker_configs.get(level), resource)
    try:
        check_broker_configs(configs)
        if not validate_only:
            topics.set_broker_configs(level, configs)
    except InvalidConfigError as exc:
        raise ConfigRefused(ErrorCode.INVALID_REQUEST, str(exc)) from None
    except TopicError as exc:
        raise ConfigRefused(exc.error_code, str(exc)) from None
    except OSError as exc:
        raise ConfigRefused(StorageError.error_code, f"cannot store configs: {exc}") from None


def _replace_all(
    current: dict[str, str], resource: m.AlterConfigsRequest.AlterConfigsResource
) -> dict[str, str]:
    # AlterConfigs is not incremental: the request is the topic's whole override set.
    return {c.name: c.value for c in resource.configs if c.value is not None}


def resources_response(
    response_class: type[AnyAnswer],
    resources: Sequence[ConfigResource],
    results: list[tuple[ErrorCode, str | None]],
) -> AnyAnswer:
    """One AlterConfigsResourceResponse per resource (both APIs share the layout)."""
    return response_class(
        throttle_time_ms=0,
        responses=[
            response_class.AlterConfigsResourceResponse(
                error_code=code, error_message=message,
                resource_type=r.resource_type, resource_name=r.resource_name,
            )
            for r, (code, message) in zip(resources, results, strict=True)
        ],
    )  # fmt: skip


@handles(m.ApiKey.ALTER_CONFIGS)
async def handle_alter_configs(
    ctx: RequestContext, request: m.AlterConfigsRequest
) -> m.AlterConfigsResponse:
    results = alter_resources(ctx, request.resources, request.validate_only, _replace_all)
    results = await publish_topic_configs(ctx, request.resources, results, request.validate_only)
    return resources_response(Resp, request.resources, results)
