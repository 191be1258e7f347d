"""DescribeConfigs: a topic's effective configs, and a few of this broker's settings.

Topic configs are the ones set at creation (source TOPIC) plus defaults taken
from the broker config. Like Kafka, an inherited value reports
STATIC_BROKER_CONFIG when the broker's config file overrides the built-in
default and DEFAULT_CONFIG otherwise. CreateTopics v5+ returns the same list.
"""

from __future__ import annotations

from typing import NamedTuple

from trio_broker.config import BrokerConfig
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import TopicError, validate_topic_name
from trio_broker.storage.topic_configs import (
    BOOLEAN,
    DEFAULT_MAX_MESSAGE_BYTES,
    INT,
    LIST,
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

# Config sources (Kafka's DescribeConfigsResponse.ConfigSource).
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

_BUILTIN = BrokerConfig()


class ConfigValue(NamedTuple):
    name: str
    value: str | None
    source: int
    type: int
    doc: str | None
    #: (name, value, source), most specific first, as Kafka lists synonyms.
    synonyms: list[tuple[str, str | None, int]]


def _broker_default(config: BrokerConfig, spec: TopicConfig) -> tuple[str, int]:
    if spec.default_field is None:
        return str(spec.fixed_default), DEFAULT_CONFIG
    value = getattr(config, spec.default_field)
    field_default = getattr(_BUILTIN, spec.default_field)
    source = DEFAULT_CONFIG if value == field_default else STATIC_BROKER_CONFIG
    return str(value), source


def topic_config_values(config: BrokerConfig, topic_configs: dict[str, str]) -> list[ConfigValue]:
    """Every config of a topic: its own settings first in precedence, then inherited ones.

    From the one table (storage/topic_configs.py): configs with a broker synonym are
    always listed; the others only when the topic sets them.
    """
    out = []
    inherited = {key for key, spec in TOPIC_CONFIGS.items() if spec.broker_key is not None}
    for name in sorted(inherited | set(topic_configs)):
        spec = TOPIC_CONFIGS.get(name)
        synonyms: list[tuple[str, str | None, int]] = []
        if name in topic_configs:
            synonyms.append((name, topic_configs[name], TOPIC_CONFIG))
        if spec is not None and spec.broker_key is not None:
            default, default_source = _broker_default(config, spec)
            synonyms.append((spec.broker_key, default, default_source))
        value, source = synonyms[0][1], synonyms[0][2]
        out.append(
            ConfigValue(
                name, value, source, spec.type if spec else STRING,
                spec.doc if spec else None, synonyms,
            )
        )  # fmt: skip
    return out


def broker_config_values(config: BrokerConfig) -> list[ConfigValue]:
    """A handful of broker settings; enough for tools that show a broker's config."""
    fields = {
        "node.id": ("node_id", INT),
        "num.partitions": ("num_partitions", INT),
        "auto.create.topics.enable": ("auto_create_topics", BOOLEAN),
        "log.retention.ms": ("retention_ms", LONG),
        "log.retention.bytes": ("retention_bytes", LONG),
        "log.segment.bytes": ("segment_bytes", INT),
        "log.roll.ms": ("segment_ms", LONG),
    }
    out = []
    for key, (field, type_) in fields.items():
        raw = getattr(config, field)
        value = str(raw).lower() if isinstance(raw, bool) else str(raw)
        source = DEFAULT_CONFIG if raw == getattr(_BUILTIN, field) else STATIC_BROKER_CONFIG
        out.append(ConfigValue(key, value, source, type_, None, [(key, value, source)]))
    fixed = {
        "default.replication.factor": ("1", INT),
        "message.max.bytes": (str(DEFAULT_MAX_MESSAGE_BYTES), INT),
        "min.insync.replicas": ("1", INT),
        "log.cleanup.policy": ("delete", LIST),
        "compression.type": ("producer", STRING),
    }
    for key, (value, type_) in fixed.items():
        out.append(
            ConfigValue(key, value, DEFAULT_CONFIG, type_, None, [(key, value, DEFAULT_CONFIG)])
        )
    return sorted(out, key=lambda c: c.name)


def _entry(value: ConfigValue, synonyms: bool, documentation: bool) -> Entry:
    return Entry(
        name=value.name, value=value.value, read_only=False, config_source=value.source,
        is_default=value.source == DEFAULT_CONFIG, is_sensitive=False,
        synonyms=[Synonym(name=n, value=v, source=s) for n, v, s in value.synonyms]
        if synonyms else [],
        config_type=value.type, documentation=value.doc if documentation else None,
    )  # fmt: skip


def _describe(
    ctx: RequestContext, resource: m.DescribeConfigsRequest.DescribeConfigsResource
) -> tuple[list[ConfigValue], ErrorCode, str]:
    services = ctx.services
    name = resource.resource_name
    if resource.resource_type == TOPIC_RESOURCE:
        try:
            validate_topic_name(name)
        except TopicError as exc:
            return [], exc.error_code, str(exc)
        if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name):
            return [], ErrorCode.TOPIC_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS refused"
        topic = services.topics.get(name)
        if topic is None:
            return [], ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        return topic_config_values(services.config, topic.info.configs), ErrorCode.NONE, ""
    if resource.resource_type == BROKER_RESOURCE:
        if not authorized(ctx, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
            return [], ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS refused"
        if name == "":
            # The cluster-wide dynamic defaults: we have none.
            return [], ErrorCode.NONE, ""
        if name != str(services.config.node_id):
            return (
                [],
                ErrorCode.INVALID_REQUEST,
                (f"broker id {name!r} is not this broker ({services.config.node_id})"),
            )
        return broker_config_values(services.config), ErrorCode.NONE, ""
    return [], ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource.resource_type}"


@handles(m.ApiKey.DESCRIBE_CONFIGS)
async def handle_describe_configs(
    ctx: RequestContext, request: m.DescribeConfigsRequest
) -> m.DescribeConfigsResponse:
    synonyms = ctx.api_version >= 1 and request.include_synonyms
    documentation = ctx.api_version >= 3 and request.include_documentation
    results: list[Result] = []
    for resource in request.resources:
        values, error, message = _describe(ctx, resource)
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
