"""The one table of topic configs: what each key is, its bounds, default and meaning.

CreateTopics, AlterConfigs and IncrementalAlterConfigs validate with
:func:`check_topic_configs`, DescribeConfigs reports types, synonyms, defaults and
docs from :data:`TOPIC_CONFIGS`, and the partition logs get their settings from
:func:`log_config`. Bounds are Kafka's (its ConfigDef for topic configs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.log import LogConfig
from trio_broker.storage.throttled_replicas import (
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_REPLICAS,
    THROTTLED_REPLICA_CONFIGS,
    parse_throttled_replicas,
)

# Kafka's ConfigDef.Type codes, as DescribeConfigs v3+ sends them (broker keys use all).
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = 1, 2, 3, 4, 5, 6, 7, 8, 9

#: Kafka's default message.max.bytes: the largest batch a partition accepts.
DEFAULT_MAX_MESSAGE_BYTES = 1048588
COMPRESSION_TYPES = frozenset({"uncompressed", "gzip", "snappy", "lz4", "zstd", "producer"})


@attrs.frozen
class TopicConfig:
    type: int
    #: Smallest legal value of a numeric config.
    minimum: int | None = None
    #: The values a STRING may take, or each element of a LIST.
    choices: frozenset[str] | None = None
    #: The LogConfig field it sets, if the log applies it.
    log_field: str | None = None
    #: The broker-level key it inherits from (its synonym); None: shown only when set.
    broker_key: str | None = None
    #: The BrokerConfig field holding the broker default, or None for ``fixed_default``.
    default_field: str | None = None
    fixed_default: str | None = None
    doc: str | None = None


_WEEK_MS = "604800000"
_LONG_MAX = str(2**63 - 1)

TOPIC_CONFIGS: Mapping[str, TopicConfig] = {
    "cleanup.policy": TopicConfig(
        LIST, choices=frozenset({"delete", "compact"}), broker_key="log.cleanup.policy",
        default_field="log_cleanup_policy", fixed_default="delete",
        doc="delete: old segments go by retention; compact: the latest record per key is"
        " kept (docs/compaction.md); compact,delete: both.",
    ),
    "compression.type": TopicConfig(
        STRING, choices=COMPRESSION_TYPES, broker_key="compression.type",
        fixed_default="producer",
        doc="Codec for stored batches; producer keeps what the producer sent.",
    ),
    "max.message.bytes": TopicConfig(
        INT, minimum=0, broker_key="message.max.bytes", default_field="message_max_bytes",
        fixed_default=str(DEFAULT_MAX_MESSAGE_BYTES),
        doc="Largest record batch the partition accepts.",
    ),
    "message.timestamp.type": TopicConfig(
        STRING, choices=frozenset({"CreateTime", "LogAppendTime"}),
        broker_key="log.message.timestamp.type", default_field="log_message_timestamp_type",
        fixed_default="CreateTime",
        doc="CreateTime keeps the producer's timestamps; LogAppendTime stamps on append.",
    ),
    "min.insync.replicas": TopicConfig(
        INT, minimum=1, broker_key="min.insync.replicas", default_field="min_insync_replicas",
        fixed_default="1",
        doc="Replicas that must acknowledge an acks=all write (always met on one node).",
    ),
    "retention.bytes": TopicConfig(
        LONG, minimum=-1, log_field="retention_bytes", broker_key="log.retention.bytes",
        default_field="retention_bytes", fixed_default="-1",
        doc="Size above which the oldest segments are deleted; -1 means no limit.",
    ),
    "retention.ms": TopicConfig(
        LONG, minimum=-1, log_field="retention_ms", broker_key="log.retention.ms",
        default_field="retention_ms", fixed_default=_WEEK_MS,
        doc="Age after which a segment is deleted; -1 means keep forever.",
    ),
    "segment.bytes": TopicConfig(
        INT, minimum=14, log_field="segment_bytes", broker_key="log.segment.bytes",
        default_field="segment_bytes", fixed_default=str(1 << 30),
        doc="Segment file size at which the log rolls to a new segment.",
    ),
    "segment.ms": TopicConfig(
        LONG, minimum=1, log_field="segment_ms", broker_key="log.roll.ms",
        default_field="segment_ms", fixed_default=_WEEK_MS,
        doc="Age at which the active segment is rolled even if not full.",
    ),
    "index.interval.bytes": TopicConfig(INT, minimum=0, log_field="index_interval_bytes"),
    "file.delete.delay.ms": TopicConfig(LONG, minimum=0, log_field="file_delete_delay_ms"),
    "flush.messages": TopicConfig(
        LONG, minimum=1, broker_key="log.flush.interval.messages",
        default_field="flush_interval_messages", fixed_default=_LONG_MAX,
        doc="Records appended between two fsyncs of the log.",
    ),
    "flush.ms": TopicConfig(
        LONG, minimum=0, broker_key="log.flush.interval.ms", default_field="flush_interval_ms",
        fixed_default=_LONG_MAX, doc="Longest time a record stays in the log unsynced.",
    ),
    "segment.index.bytes": TopicConfig(INT, minimum=4),
    "delete.retention.ms": TopicConfig(
        LONG, minimum=0, log_field="delete_retention_ms",
        broker_key="log.cleaner.delete.retention.ms",
        default_field="log_cleaner_delete_retention_ms", fixed_default="86400000",
        doc="How long a compacted tombstone stays readable after its first cleaning.",
    ),
    "min.compaction.lag.ms": TopicConfig(
        LONG, minimum=0, log_field="min_compaction_lag_ms",
        broker_key="log.cleaner.min.compaction.lag.ms",
        default_field="log_cleaner_min_compaction_lag_ms", fixed_default="0",
        doc="A record stays uncompacted at least this long.",
    ),
    "max.compaction.lag.ms": TopicConfig(
        LONG, minimum=1, log_field="max_compaction_lag_ms",
        broker_key="log.cleaner.max.compaction.lag.ms",
        default_field="log_cleaner_max_compaction_lag_ms", fixed_default=_LONG_MAX,
        doc="A closed segment is compacted within this long whatever its dirty ratio.",
    ),
    "message.timestamp.difference.max.ms": TopicConfig(LONG),
    "min.cleanable.dirty.ratio": TopicConfig(
        DOUBLE, broker_key="log.cleaner.min.cleanable.ratio",
        default_field="log_cleaner_min_cleanable_ratio", fixed_default="0.5",
        doc="Share of uncleaned bytes in the closed segments that starts a cleaning pass.",
    ),
    "preallocate": TopicConfig(BOOLEAN),
    # KIP-73 (storage/throttled_replicas.py, docs/cluster.md "Throttled catch-up").
    LEADER_THROTTLED_REPLICAS: TopicConfig(
        LIST, fixed_default="",
        doc="Replicas whose leader throttles serving this topic to out-of-sync followers"
        " (leader.replication.throttled.rate): [partitionId]:[brokerId],... naming the"
        " leading broker, or * for all replicas.",
    ),
    FOLLOWER_THROTTLED_REPLICAS: TopicConfig(
        LIST, fixed_default="",
        doc="Replicas that throttle their own fetching of this topic while out of sync"
        " (follower.replication.throttled.rate): [partitionId]:[brokerId],... naming the"
        " fetching broker, or * for all replicas.",
    ),
    "unclean.leader.election.enable": TopicConfig(
        BOOLEAN, broker_key="unclean.leader.election.enable",
        default_field="unclean_leader_election_enable", fixed_default="false",
        doc="Whether a replica outside the ISR may be elected leader (the broker's value"
        " applies; a topic's own is stored and shown).",
    ),
}  # fmt: skip


def check_topic_configs(configs: Mapping[str, str]) -> None:
    """Raise InvalidConfigError (INVALID_CONFIG) unless a topic accepts ``configs`` whole."""
    for key, value in configs.items():
        spec = TOPIC_CONFIGS.get(key)
        if spec is None:
            raise InvalidConfigError(f"unknown topic config {key!r}")
        if value is None:
            raise InvalidConfigError(f"config {key!r} has a null value")
        _check_value(key, value, spec)
    try:
        log_config(configs)  # the log's own bounds (segment.bytes <= 2**31-1, ...)
    except ValueError as exc:
        raise InvalidConfigError(str(exc)) from None


def _check_value(key: str, value: str, spec: TopicConfig) -> None:
    if spec.type in (INT, LONG):
        try:
            number = int(value)
        except ValueError:
            raise InvalidConfigError(f"{key} must be an integer, got {value!r}") from None
        if spec.minimum is not None and number < spec.minimum:
            raise InvalidConfigError(f"{key} must be at least {spec.minimum}, got {number}")
    elif spec.type == DOUBLE:
        try:
            number_ = float(value)
        except ValueError:
            raise InvalidConfigError(f"{key} must be a number, got {value!r}") from None
        if key == "min.cleanable.dirty.ratio" and not 0 <= number_ <= 1:
            raise InvalidConfigError(f"{key} must be in [0, 1], got {value!r}")
    elif key in THROTTLED_REPLICA_CONFIGS:
        try:
            parse_throttled_replicas(key, value)
        except ValueError as exc:
            raise InvalidConfigError(str(exc)) from None
    elif spec.type == BOOLEAN and value.lower() not in ("true", "false"):
        raise InvalidConfigError(f"{key} must be true or false, got {value!r}")
    elif spec.choices is not None:
        values = [v.strip() for v in value.split(",")] if spec.type == LIST else [value]
        if not set(values) <= spec.choices:
            raise InvalidConfigError(f"{key} must be one of {sorted(spec.choices)}, got {value!r}")


def log_config(configs: Mapping[str, str], defaults: LogConfig | None = None) -> LogConfig:
    """The partition log settings of a topic: ``defaults`` overlaid with its configs.

    Raises ValueError for a value the log cannot use (check_topic_configs first).
    """
    changes: dict[str, Any] = {
        spec.log_field: int(configs[key])
        for key, spec in TOPIC_CONFIGS.items()
        if spec.log_field is not None and key in configs
    }
    if "cleanup.policy" in configs:
        policies = {p.strip() for p in configs["cleanup.policy"].split(",")}
        changes["compact"] = "compact" in policies
        changes["delete"] = "delete" in policies
    if "min.cleanable.dirty.ratio" in configs:
        changes["min_cleanable_dirty_ratio"] = float(configs["min.cleanable.dirty.ratio"])
    return attrs.evolve(defaults or LogConfig(), **changes)
