"""AlterConfigs: replace a topic's or the broker's config overrides (every key not listed
is reset).

Topic resources: values are checked before anything changes (unknown key, malformed
or out-of-range value -> INVALID_CONFIG); with ``validate_only`` the check is all that
happens. Accepted overrides are written to the topic catalogue and applied to the live
partition logs (retention, segment rolling, max.message.bytes), and DescribeConfigs
reports them with source DYNAMIC_TOPIC_CONFIG.

GROUP resources: a group's configs (storage/group_configs.py, Kafka's GroupConfig keys),
checked and stored (:func:`_alter_group`): a node alone's here, a cluster's in ZooKeeper
through ``services.admin``, where every broker's group config watch applies them.

BROKER resources: the dynamic broker configs (storage/broker_configs.py), either the
cluster-wide default (name "") or this node's (its id). They become the log defaults
and the min.insync.replicas of every topic that does not set the key itself (docs/acls.md,
"Dynamic broker configs"). This node's are changed here; the cluster-wide default goes
to ``services.admin`` as a topic's change does: in a cluster it is stored in ZooKeeper
(Kafka's ``/config/brokers/<default>``), where every broker's config watch applies it.

A topic's change goes to ``services.admin`` (services/topic_admin.py), which reads the
topic's current overrides, computes and checks the new ones, and stores them. A node
alone is a cluster of one: its catalogue is changed at once. In a cluster, whichever
broker takes the request changes ZooKeeper: it reads the topic's config znode and
writes the new overrides back conditionally on the znode's version (a Deferred), from
where every replica's config watch applies them, min.insync.replicas included
(docs/cluster.md, "Topic configs in a cluster"); a broker holding a copy applies the
stored value to it at once too. Never from its local copy: that may lag ZooKeeper (its
watch has not applied the last change yet), and writing it back would undo another
broker's change.

Shared with IncrementalAlterConfigs: resource checks, value checks, applying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from trio_broker.groups.group_configs import broker_values
from trio_broker.handlers.authorization import authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles, when_applied
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.security.acl import Operation, ResourceType
from trio_broker.services.topics import TopicError
from trio_broker.storage.broker_configs import THIS_BROKER, check_broker_configs
from trio_broker.storage.errors import InvalidConfigError, StorageError
from trio_broker.storage.group_configs import check_group_configs

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
GROUP_RESOURCE = 32

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
    topics: list[int],
) -> list[tuple[ErrorCode, str | None]]:
    """Check each resource and apply the broker ones; one (error, message) each.

    ``new_configs(current overrides, resource)`` computes the new overrides or raises
    ConfigRefused. The indexes of the topics allowed go to ``topics`` (their answer is
    left NONE): their change is the admin's (:func:`alter_configs`).
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
            if _check_or_alter(ctx, resource, validate_only, new_configs):
                topics.append(len(out))
            out.append((ErrorCode.NONE, None))
        except ConfigRefused as exc:
            out.append((exc.error_code, str(exc)))
    return out


def _check_or_alter(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> bool:
    """A broker's own resource is altered here (False); True: a topic ALTER_CONFIGS
    allows, the cluster-wide default, or a cluster's group, changed through
    ``services.admin``."""
    name = resource.resource_name
    if resource.resource_type in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE):
        if not authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.CLUSTER):
            raise ConfigRefused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER_CONFIGS refused")
        if resource.resource_type == BROKER_LOGGER_RESOURCE:
            raise ConfigRefused(ErrorCode.INVALID_REQUEST, "broker loggers cannot be altered")
        if name == "":
            return True  # the cluster-wide default: services.admin stores it (ZooKeeper)
        _alter_broker(ctx, resource, validate_only, new_configs)
        return False
    if resource.resource_type == GROUP_RESOURCE:
        # True: a cluster's, stored through services.admin (ZooKeeper).
        return _alter_group(ctx, resource, validate_only, new_configs)
    if resource.resource_type != TOPIC_RESOURCE:
        raise ConfigRefused(
            ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource.resource_type}"
        )
    if not authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.TOPIC, name):
        raise ConfigRefused(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "ALTER_CONFIGS refused")
    return True


async def alter_configs(
    ctx: RequestContext,
    resources: list[AnyResource],
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
    answer: Callable[[list[tuple[ErrorCode, str | None]]], AnyAnswer],
) -> AnyAnswer | Deferred:
    """AlterConfigs and IncrementalAlterConfigs: the resources checked (and the broker
    ones applied) here (:func:`alter_resources`), then the topics' changes stored by
    ``services.admin``; ``answer(results)`` builds the response."""
    topics: list[int] = []
    results = alter_resources(ctx, resources, validate_only, new_configs, topics)
    admin = ctx.services.admin

    async def store_then_answer() -> AnyAnswer:
        for index in topics:
            resource = resources[index]
            if resource.resource_type == BROKER_RESOURCE:
                try:
                    await admin.update_cluster_default_configs(
                        _default_change_of(resource, validate_only, new_configs)
                    )
                except (ConfigRefused, TopicError) as exc:
                    results[index] = (exc.error_code, str(exc))
                continue
            if resource.resource_type == GROUP_RESOURCE:
                group_stored: list[dict[str, str]] = []
                try:
                    await admin.update_group_configs(resource.resource_name, _group_change_of(
                        ctx, resource, validate_only, new_configs, group_stored
                    ))  # fmt: skip
                    if group_stored:  # this broker applies them at once, the others' watch
                        ctx.services.shares.set_group_configs(
                            resource.resource_name, group_stored[0]
                        )
                except (ConfigRefused, TopicError) as exc:
                    results[index] = (exc.error_code, str(exc))
                except OSError as exc:
                    results[index] = (StorageError.error_code, f"cannot store configs: {exc}")
                continue
            stored: list[dict[str, str]] = []
            change = _change_of(ctx, resource, validate_only, new_configs, stored)
            try:
                await admin.update_topic_configs(resource.resource_name, change)
            except (ConfigRefused, TopicError) as exc:
                results[index] = (exc.error_code, str(exc))
                continue
            if stored:  # what the controller holds now: this broker's copy shows it at once
                admin.topic_configs_stored(resource.resource_name, stored[0])
        return answer(results)

    return await when_applied(ctx.services, store_then_answer)


def _change_of(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
    stored: list[dict[str, str]],
) -> Callable[[dict[str, str]], dict[str, str] | None]:
    """The change of one topic's stored overrides: the new overrides, checked; nothing
    to store when only validating. ``stored`` keeps the last overrides it returned (the
    ones written, once the conditional write succeeds)."""

    def change(current: dict[str, str]) -> dict[str, str] | None:
        configs = new_configs(dict(current), resource)
        check_values(ctx, configs)
        if validate_only:
            return None
        stored[:] = [configs]
        return configs

    return change


def _default_change_of(
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> Callable[[dict[str, str]], dict[str, str] | None]:
    """The change of the cluster-wide default (the BROKER resource ""): checked as
    Kafka does (INVALID_REQUEST for a key that is not dynamic or a bad value)."""

    def change(current: dict[str, str]) -> dict[str, str] | None:
        configs = new_configs(dict(current), resource)
        try:
            check_broker_configs(configs)
        except InvalidConfigError as exc:
            raise ConfigRefused(ErrorCode.INVALID_REQUEST, str(exc)) from None
        return None if validate_only else configs

    return change


def _alter_broker(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> None:
    """Dynamic broker configs of this broker (its node id; "" is not changed here).

    Kafka answers INVALID_REQUEST for a key that is not dynamic, a bad value, or
    another broker's id; the whole resource is refused.
    """
    name, node = resource.resource_name, str(ctx.services.config.node_id)
    if name not in ("", node):
        raise ConfigRefused(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {node} or empty string, but received {name}",
        )
    level = THIS_BROKER  # the cluster-wide default ("") goes through services.admin
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


def _alter_group(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
) -> bool:
    """A group's configs (storage/group_configs.py): checked as Kafka's controller does
    (every refusal INVALID_CONFIG, an empty name INVALID_REQUEST), then stored and
    applied to the group's share partitions at once. A node alone keeps them in its data
    dir, here (False). In a cluster the group's coordinator and its partitions' leaders
    may be other brokers: True, the change goes to ``services.admin`` (ZooKeeper's
    ``/config/groups``, which every broker watches: cluster/group_config_watch.py),
    checked against the stored configs, not this broker's copy."""
    name = resource.resource_name
    if not authorized(ctx, Operation.ALTER_CONFIGS, ResourceType.GROUP, name):
        raise ConfigRefused(ErrorCode.GROUP_AUTHORIZATION_FAILED, "ALTER_CONFIGS refused")
    if name == "":
        raise ConfigRefused(ErrorCode.INVALID_REQUEST, "Default group resources are not allowed.")
    if not ctx.services.admin.keeps_group_configs:
        return True
    shares = ctx.services.shares
    changed = _group_change_of(ctx, resource, validate_only, new_configs, [])(
        shares.group_configs.get(name)
    )
    try:
        if changed is not None:
            shares.set_group_configs(name, changed)
    except OSError as exc:
        raise ConfigRefused(StorageError.error_code, f"cannot store configs: {exc}") from None
    return False


def _group_change_of(
    ctx: RequestContext,
    resource: AnyResource,
    validate_only: bool,
    new_configs: Callable[[dict[str, str], AnyResource], dict[str, str]],
    stored: list[dict[str, str]],
) -> Callable[[dict[str, str]], dict[str, str] | None]:
    """The change of one group's configs: the new ones, checked; nothing to store when
    only validating. ``stored`` keeps the last configs it returned."""

    def change(current: dict[str, str]) -> dict[str, str] | None:
        configs = new_configs(dict(current), resource)
        try:
            check_group_configs(configs, broker_values(ctx.services.config))
        except InvalidConfigError as exc:
            raise ConfigRefused(ErrorCode.INVALID_CONFIG, str(exc)) from None
        if validate_only:
            return None
        stored[:] = [configs]
        return configs

    return change


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
) -> m.AlterConfigsResponse | Deferred:
    return await alter_configs(
        ctx, request.resources, request.validate_only, _replace_all,
        lambda results: resources_response(Resp, request.resources, results),
    )  # fmt: skip
