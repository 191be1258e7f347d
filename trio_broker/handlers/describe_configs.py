"""DescribeConfigs: a topic's effective configs, every key of this broker's config, and a
group's configs.

Topic configs are the ones set at creation (source TOPIC) plus defaults taken
from the broker config. Like Kafka, an inherited value reports
DYNAMIC_BROKER_CONFIG or DYNAMIC_DEFAULT_BROKER_CONFIG when a dynamic broker config
sets it (storage/broker_configs.py), else STATIC_BROKER_CONFIG when the broker's
config file overrides the built-in default and DEFAULT_CONFIG otherwise.
CreateTopics v5+ returns the same list.

A GROUP resource lists every group config (storage/group_configs.py), any group name,
set or not, as Kafka does: GROUP_CONFIG for the group's own values, else the broker's.

Internal topics (``__consumer_offsets``, ``__transaction_state``) are described like
any other, as Kafka does. In a cluster, a topic this broker holds no copy of is
described from its config znode in ZooKeeper (a Deferred reads it), so any broker
answers for any topic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from trio_broker.config import BrokerConfig
from trio_broker.config_keys import (
    APPLIED,
    BROKER_KEYS,
    INERT,
    SECURITY,
    SYNONYMS,
    BrokerKey,
    inert_reason,
    listener_key,
)
from trio_broker.groups.group_configs import broker_value
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, LoopBudget, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.listeners import LISTENER_KEYS
from trio_broker.services.topics import RESERVED_TOPICS, TopicError, validate_topic_name
from trio_broker.storage.broker_configs import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_KEYS,
    THIS_BROKER,
    BrokerConfigStore,
)
from trio_broker.storage.group_configs import GROUP_CONFIGS
from trio_broker.storage.topic_configs import (
    LONG,
    STRING,
    TOPIC_CONFIGS,
    TopicConfig,
)

Resp = m.DescribeConfigsResponse
Result = Resp.DescribeConfigsResult
Entry = Result.DescribeConfigsResourceResult
Synonym = Entry.DescribeConfigsSynonym

# Resource types (Kafka's ConfigResource.Type).
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
GROUP_RESOURCE = 32

# Config sources (Kafka's DescribeConfigsResponse.ConfigSource).
TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
GROUP_CONFIG = 8  # the Java admin's DYNAMIC_GROUP_CONFIG

_BUILTIN = BrokerConfig()


class ConfigValue(NamedTuple):
    name: str
    value: str | None
    source: int
    type: int
    doc: str | None
    #: (name, value, source), most specific first, as Kafka lists synonyms.
    synonyms: list[tuple[str, str | None, int]]
    #: Passwords are sensitive (broker configs only).
    sensitive: bool | None = None
    #: Broker configs are read-only but the dynamic ones; topic configs are not.
    read_only: bool = False


def _is_static(config: BrokerConfig, keys: tuple[str, ...], field: str | None) -> bool:
    """Set at start: by a key of the file or a flag, or (a config built in code) by its field."""
    if any(key in config.static_keys for key in keys):
        return True
    return field is not None and getattr(config, field) != getattr(_BUILTIN, field)


def _inherited(
    config: BrokerConfig, spec: TopicConfig, dynamic: BrokerConfigStore
) -> tuple[str | None, int, list[tuple[str, str | None, int]]]:
    """A topic config's broker default in force: (value, source, synonyms).

    As Kafka: the value the logs apply (this broker's dynamic value, else the cluster-wide
    dynamic default, else the config file's, else the built-in one, in the topic config's
    unit: log.retention.hours=1 is retention.ms 3600000). The synonyms are every key of
    the broker group (log.retention.ms, .minutes, .hours) that is set at each level, most
    specific first, then the group's defaults.
    """
    assert spec.broker_key is not None
    group = _synonym_group(spec.broker_key)
    synonyms: list[tuple[str, str | None, int]] = []
    for level, source in ((THIS_BROKER, DYNAMIC_BROKER_CONFIG),
                          (CLUSTER_DEFAULT, DYNAMIC_DEFAULT_BROKER_CONFIG)):  # fmt: skip
        synonyms += [(key, dynamic.levels[level][key], source)
                     for key in group if key in dynamic.levels[level]]  # fmt: skip
    # A key the broker accepts without applying it (compression.type) changes nothing: the
    # value shown is the one in force.
    written = [(key, config.static_keys[key], STATIC_BROKER_CONFIG) for key in group
               if key in config.static_keys and _applied(key)]  # fmt: skip
    applied = None if spec.default_field is None else getattr(config, spec.default_field)
    if written:
        synonyms += written
    elif spec.default_field is not None and _is_static(config, group, spec.default_field):
        # Set in code (tests) or by a flag that has no key.
        synonyms.append((spec.broker_key, _text(applied), STATIC_BROKER_CONFIG))
    # Kafka's own defaults (log.retention.hours=168; log.retention.ms has none), which
    # the built-in values of these keys equal.
    synonyms += [(key, BROKER_KEYS[key].kafka_default, DEFAULT_CONFIG) for key in group
                 if key in BROKER_KEYS and BROKER_KEYS[key].kafka_default is not None]  # fmt: skip
    if synonyms and synonyms[0][2] in (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG):
        value: str | None = synonyms[0][1]
    elif applied is not None:  # what the broker applies
        value = _text(applied)
    else:  # None: unset, Kafka's default (flush.ms); or a key the broker does not apply
        value = spec.fixed_default
    source = synonyms[0][2] if synonyms else DEFAULT_CONFIG
    return value, source, synonyms


def _applied(key: str) -> bool:
    spec = BROKER_KEYS.get(key)
    return spec is not None and spec.status == APPLIED


def topic_config_values(
    config: BrokerConfig, topic_configs: dict[str, str], dynamic: BrokerConfigStore
) -> list[ConfigValue]:
    """Every config of a topic: its own settings first in precedence, then inherited ones
    (``dynamic``: the dynamic broker configs, above the config file's values).

    From the one table (storage/topic_configs.py): configs with a broker synonym are
    always listed, with the broker's value in force when the topic does not set them;
    the others only when the topic sets them.
    """
    out = []
    inherited = {key for key, spec in TOPIC_CONFIGS.items() if spec.broker_key is not None}
    for name in sorted(inherited | set(topic_configs)):
        spec = TOPIC_CONFIGS.get(name)
        synonyms: list[tuple[str, str | None, int]] = []
        value: str | None = None
        source = DEFAULT_CONFIG
        if spec is not None and spec.broker_key is not None:
            value, source, synonyms = _inherited(config, spec, dynamic)
        if name in topic_configs:
            value, source = topic_configs[name], TOPIC_CONFIG
            synonyms.insert(0, (name, value, TOPIC_CONFIG))
        out.append(
            ConfigValue(
                name, value, source, spec.type if spec else STRING,
                spec.doc if spec else None, synonyms,
            )
        )  # fmt: skip
    return out


def dynamic_config_values(dynamic: BrokerConfigStore, level: str) -> list[ConfigValue]:
    """The dynamic broker configs set at one level (the cluster default: Kafka's BROKER
    resource "" lists only these)."""
    source = DYNAMIC_BROKER_CONFIG if level == THIS_BROKER else DYNAMIC_DEFAULT_BROKER_CONFIG
    out = []
    for key, value in sorted(dynamic.levels[level].items()):
        topic_key = DYNAMIC_BROKER_KEYS.get(key)  # None: a replication throttle rate
        kind = LONG if topic_key is None else TOPIC_CONFIGS[topic_key].type
        out.append(ConfigValue(key, value, source, kind, None, [(key, value, source)]))
    return out


def _synonym_group(key: str) -> tuple[str, ...]:
    return next((group for group in SYNONYMS if key in group), (key,))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def _default_value(spec: BrokerKey) -> str | None:
    """What the broker uses when no key of the group is set: ours where we apply it."""
    if spec.field == SECURITY:
        return _text(LISTENER_KEYS.get(spec.name))
    if spec.status == APPLIED and spec.field is not None and spec.scale == 1:
        return _text(getattr(_BUILTIN, spec.field))
    if spec.name == "listeners":
        return f"PLAINTEXT://{_BUILTIN.host}:{_BUILTIN.port}"
    return spec.kafka_default


def _current_value(config: BrokerConfig, spec: BrokerKey) -> str | None:
    """The value in effect: the field an applied key sets, else the key as written."""
    if spec.field == SECURITY:
        return _text(config.security.get(spec.name, LISTENER_KEYS.get(spec.name)))
    if spec.status == APPLIED and spec.field is not None and spec.scale == 1:
        return _text(getattr(config, spec.field))
    if spec.name == "listeners":
        return config.listeners or f"PLAINTEXT://{config.host}:{config.port}"
    if spec.name == "advertised.listeners" and config.advertised_listeners is not None:
        return config.advertised_listeners
    return config.static_keys.get(spec.name, spec.kafka_default)


def _broker_value(config: BrokerConfig, spec: BrokerKey, dynamic: BrokerConfigStore) -> ConfigValue:
    group = _synonym_group(spec.name)
    primary = group[0] == spec.name
    field = spec.field if spec.field not in (None, SECURITY) and spec.scale == 1 else None
    static = _is_static(config, group if primary else (spec.name,), field)
    if primary:
        value = _current_value(config, spec)
    else:  # log.retention.hours and the like: the key itself, as written or Kafka's default
        value = config.static_keys.get(spec.name, spec.kafka_default)
    synonyms: list[tuple[str, str | None, int]] = [
        (key, config.static_keys[key], STATIC_BROKER_CONFIG)
        for key in (group if primary else (spec.name,))
        if key in config.static_keys
    ]
    if static and not synonyms:  # set in code (tests) or by a flag without a key
        synonyms.append((spec.name, value, STATIC_BROKER_CONFIG))
    default = _default_value(spec)
    if default is not None:
        synonyms.append((spec.name, default, DEFAULT_CONFIG))
    source = STATIC_BROKER_CONFIG if static else DEFAULT_CONFIG
    is_dynamic = spec.name in DYNAMIC_BROKER_KEYS
    if is_dynamic:  # a value set at runtime comes first, this broker's before the cluster's
        for level, dynamic_source in ((CLUSTER_DEFAULT, DYNAMIC_DEFAULT_BROKER_CONFIG),
                                      (THIS_BROKER, DYNAMIC_BROKER_CONFIG)):  # fmt: skip
            if spec.name in dynamic.levels[level]:
                value, source = dynamic.levels[level][spec.name], dynamic_source
                synonyms.insert(0, (spec.name, value, source))
    if spec.sensitive:
        value, synonyms = None, [(name, None, source) for name, _, source in synonyms]
    doc = None
    if spec.status == INERT:
        doc = f"No effect in trio-broker ({inert_reason(spec.name)}); accepted as in Kafka."
    return ConfigValue(spec.name, value, source, spec.type, doc, synonyms, spec.sensitive,
                       read_only=not is_dynamic)  # fmt: skip


def broker_config_values(config: BrokerConfig, dynamic: BrokerConfigStore) -> list[ConfigValue]:
    """Every key of the broker table (config_keys.py), and the file's listener.name.* keys.

    Like Kafka for static configs: STATIC_BROKER_CONFIG for keys set at start,
    DEFAULT_CONFIG otherwise; passwords are sensitive and have no value. All are
    read-only but the dynamic broker configs (``dynamic``, storage/broker_configs.py),
    whose value in force and synonyms come first when set at runtime.
    """
    out = [_broker_value(config, spec, dynamic) for spec in BROKER_KEYS.values()]
    for key, written in config.static_keys.items():
        if key.startswith("listener.name."):
            spec = listener_key(key)
            value = None if spec.sensitive else written
            out.append(
                ConfigValue(key, value, STATIC_BROKER_CONFIG, spec.type, None,
                            [(key, value, STATIC_BROKER_CONFIG)], spec.sensitive, read_only=True)
            )  # fmt: skip
    return sorted(out, key=lambda c: c.name)


def group_config_values(config: BrokerConfig, overrides: dict[str, str]) -> list[ConfigValue]:
    """Every group config (storage/group_configs.py), as Kafka describes a GROUP resource:
    the group's own value (GROUP_CONFIG) or the default, and below it the broker key it
    defaults to (group.share.record.lock.duration.ms), static or default."""
    out = []
    for name, spec in sorted(GROUP_CONFIGS.items()):
        synonyms: list[tuple[str, str | None, int]] = []
        default: str | None = spec.default
        if spec.broker_key is not None:
            default = broker_value(config, spec.broker_key)
            static = spec.broker_key in config.static_keys or _is_static(
                config, (), BROKER_KEYS[spec.broker_key].field
            )
            source = STATIC_BROKER_CONFIG if static else DEFAULT_CONFIG
            synonyms.append((spec.broker_key, default, source))
        value: str | None
        if name in overrides:
            value, source = overrides[name], GROUP_CONFIG
        else:
            value, source = default, DEFAULT_CONFIG
        synonyms.insert(0, (name, value, source))
        out.append(ConfigValue(name, value, source, spec.type, None, synonyms))
    return out


def _entry(value: ConfigValue, synonyms: bool, documentation: bool) -> Entry:
    return Entry(
        name=value.name, value=value.value, read_only=value.read_only,
        config_source=value.source, is_default=value.source == DEFAULT_CONFIG,
        is_sensitive=bool(value.sensitive),
        synonyms=[Synonym(name=n, value=v, source=s) for n, v, s in value.synonyms]
        if synonyms else [],
        config_type=value.type, documentation=value.doc if documentation else None,
    )  # fmt: skip


#: Config overrides read from ZooKeeper for topics held elsewhere, or why they were not.
ClusterConfigs = dict[str, dict[str, str] | TopicError]


def _describe(
    ctx: RequestContext,
    resource: m.DescribeConfigsRequest.DescribeConfigsResource,
    from_cluster: ClusterConfigs,
) -> tuple[list[ConfigValue], ErrorCode, str]:
    services = ctx.services
    name = resource.resource_name
    if resource.resource_type == TOPIC_RESOURCE:
        if name not in RESERVED_TOPICS:  # internal topics have configs too
            try:
                validate_topic_name(name)
            except TopicError as exc:
                return [], exc.error_code, str(exc)
        if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name):
            return [], ErrorCode.TOPIC_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS refused"
        topic = services.topics.get(name)
        own = services.own_internal_topics.get(name)
        if topic is None and own is not None and own.listed():  # a node alone's (Metadata)
            topic = own.as_topic()
        configs = topic.info.configs if topic is not None else from_cluster.get(name)
        if isinstance(configs, TopicError):
            return [], configs.error_code, str(configs)
        if configs is None:
            return [], ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        values = topic_config_values(services.config, configs, services.topics.broker_configs)
        return values, ErrorCode.NONE, ""
    if resource.resource_type == BROKER_RESOURCE:
        if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
            return [], ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS refused"
        if name == "":  # the cluster-wide dynamic defaults
            return (
                dynamic_config_values(services.topics.broker_configs, CLUSTER_DEFAULT),
                ErrorCode.NONE,
                "",
            )
        if name != str(services.config.node_id):
            return (
                [],
                ErrorCode.INVALID_REQUEST,
                (f"broker id {name!r} is not this broker ({services.config.node_id})"),
            )
        return (
            broker_config_values(services.config, services.topics.broker_configs),
            ErrorCode.NONE,
            "",
        )
    if resource.resource_type == GROUP_RESOURCE:
        if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.GROUP, name):
            return [], ErrorCode.GROUP_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS refused"
        if name == "":
            return [], ErrorCode.INVALID_REQUEST, "Group name must not be empty"
        overrides = services.shares.group_configs.get(name)
        return group_config_values(services.config, overrides), ErrorCode.NONE, ""
    return [], ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource.resource_type}"


def _held_elsewhere(
    ctx: RequestContext, resource: m.DescribeConfigsRequest.DescribeConfigsResource
) -> bool:
    """A topic of the controller's view this broker has no copy of (in a cluster its
    configs are in ZooKeeper; a node alone has a copy of every topic it knows)."""
    name = resource.resource_name
    return (
        resource.resource_type == TOPIC_RESOURCE
        and ctx.services.topics.get(name) is None
        and name in ctx.services.admin.view.topics
        and authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name)
    )


@handles(m.ApiKey.DESCRIBE_CONFIGS)
async def handle_describe_configs(
    ctx: RequestContext, request: m.DescribeConfigsRequest
) -> m.DescribeConfigsResponse | Deferred:
    admin = ctx.services.admin
    elsewhere = sorted({r.resource_name for r in request.resources if _held_elsewhere(ctx, r)})
    if not elsewhere:
        return await _answer(ctx, request, {})

    async def read_then_answer() -> m.DescribeConfigsResponse:
        from_cluster: ClusterConfigs = {}
        for name in elsewhere:
            try:
                from_cluster[name] = await admin.read_topic_configs(name)
            except TopicError as exc:
                from_cluster[name] = exc
        return await _answer(ctx, request, from_cluster)

    return Deferred(read_then_answer)


async def _answer(
    ctx: RequestContext, request: m.DescribeConfigsRequest, from_cluster: ClusterConfigs
) -> m.DescribeConfigsResponse:
    synonyms = ctx.api_version >= 1 and request.include_synonyms
    documentation = ctx.api_version >= 3 and request.include_documentation
    results: list[Result] = []
    budget = LoopBudget(ctx.services)  # every topic and the broker: tens of ms per thousand
    for resource in request.resources:
        await budget.tick()
        values, error, message = _describe(ctx, resource, from_cluster)
        if resource.configuration_keys is not None:
            wanted = set(resource.configuration_keys)
            values = [v for v in values if v.name in wanted]
        results.append(
            Result(
                error_code=error, error_message=message or None,
                resource_type=resource.resource_type, resource_name=resource.resource_name,
                configs=[_entry(v, synonyms, documentation) for v in values],
            )
        )  # fmt: skip
    return Resp(throttle_time_ms=0, results=results)
