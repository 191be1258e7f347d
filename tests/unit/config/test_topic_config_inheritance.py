"""What DescribeConfigs says a topic inherits from its broker: the value in force and where
it comes from (Kafka's sources and synonyms), for every topic config with a broker key.

Kafka's table of topic configs and the broker keys they inherit from is its
ServerTopicConfigSynonyms; :data:`KAFKA_SYNONYMS` is the part of it for the topic configs
trio-broker has.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_broker.config import BrokerConfig, load_config
from trio_broker.config_keys import APPLIED, BROKER_KEYS
from trio_broker.handlers.describe_configs import (
    DEFAULT_CONFIG,
    DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG,
    ConfigValue,
    topic_config_values,
)
from trio_broker.storage.broker_configs import CLUSTER_DEFAULT, THIS_BROKER, BrokerConfigStore
from trio_broker.storage.topic_configs import TOPIC_CONFIGS

#: Topic config -> its broker keys, most important first (Kafka 4's ServerTopicConfigSynonyms).
KAFKA_SYNONYMS = {
    "segment.bytes": ("log.segment.bytes",),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
    "segment.index.bytes": ("log.index.size.max.bytes",),
    "flush.messages": ("log.flush.interval.messages",),
    "flush.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    "retention.bytes": ("log.retention.bytes",),
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "max.message.bytes": ("message.max.bytes",),
    "index.interval.bytes": ("log.index.interval.bytes",),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms",),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms",),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms",),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms",),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio",),
    "cleanup.policy": ("log.cleanup.policy",),
    "unclean.leader.election.enable": ("unclean.leader.election.enable",),
    "min.insync.replicas": ("min.insync.replicas",),
    "compression.type": ("compression.type",),
    "preallocate": ("log.preallocate",),
    "message.timestamp.type": ("log.message.timestamp.type",),
    "message.timestamp.difference.max.ms": ("log.message.timestamp.difference.max.ms",),
}
#: Kafka's synonyms whose broker key has no effect here (accepted and ignored): the topic
#: shows no inherited value for them, since none would be the one in force.
NOT_INHERITED = {
    "segment.index.bytes", "index.interval.bytes", "file.delete.delay.ms", "preallocate",
    "message.timestamp.difference.max.ms",
}  # fmt: skip


def describe(
    config: BrokerConfig,
    topic: dict[str, str] | None = None,
    store: BrokerConfigStore | None = None,
) -> dict[str, ConfigValue]:
    values = topic_config_values(config, topic or {}, store or BrokerConfigStore(None))
    return {v.name: v for v in values}


def from_file(tmp_path: Path, text: str) -> BrokerConfig:
    path = tmp_path / "server.properties"
    path.write_text(text)
    return load_config(path)


def test_every_inherited_topic_config_names_kafkas_broker_key() -> None:
    for name, spec in TOPIC_CONFIGS.items():
        kafka = KAFKA_SYNONYMS.get(name)
        if kafka is None or name in NOT_INHERITED:
            assert spec.broker_key is None, name
            continue
        assert spec.broker_key == kafka[0], name
        broker_key = BROKER_KEYS[spec.broker_key]
        # The value shown is the field the broker applies, when it applies the key.
        if broker_key.status == APPLIED:
            assert spec.default_field == broker_key.field, name
        else:
            assert spec.default_field is None, name


def test_the_config_files_values_are_shown_as_static_broker_configs(tmp_path: Path) -> None:
    config = from_file(
        tmp_path,
        "min.insync.replicas=2\nlog.retention.hours=1\nlog.cleanup.policy=compact\n"
        "log.cleaner.delete.retention.ms=5000\nlog.cleaner.min.compaction.lag.ms=7\n"
        "log.cleaner.max.compaction.lag.ms=900000\nlog.cleaner.min.cleanable.ratio=0.25\n"
        "unclean.leader.election.enable=true\nmessage.max.bytes=2000000\n"
        "log.message.timestamp.type=LogAppendTime\nlog.flush.interval.messages=10\n"
        "log.segment.bytes=1048576\nlog.roll.hours=2\nlog.retention.bytes=99\n",
    )
    shown = describe(config)
    expected = {
        "min.insync.replicas": ("2", [("min.insync.replicas", "2"), ("min.insync.replicas", "1")]),
        # The value in the topic config's unit; the synonyms as written.
        "retention.ms": ("3600000", [("log.retention.hours", "1"), ("log.retention.hours", "168")]),
        "segment.ms": ("7200000", [("log.roll.hours", "2"), ("log.roll.hours", "168")]),
        "cleanup.policy": ("compact", [("log.cleanup.policy", "compact"),
                                       ("log.cleanup.policy", "delete")]),
        "delete.retention.ms": ("5000", None),
        "min.compaction.lag.ms": ("7", None),
        "max.compaction.lag.ms": ("900000", None),
        "min.cleanable.dirty.ratio": ("0.25", None),
        "unclean.leader.election.enable": ("true", None),
        "max.message.bytes": ("2000000", [("message.max.bytes", "2000000"),
                                          ("message.max.bytes", "1048588")]),
        "message.timestamp.type": ("LogAppendTime", None),
        "flush.messages": ("10", None),
        "segment.bytes": ("1048576", None),
        "retention.bytes": ("99", None),
    }  # fmt: skip
    for name, (value, synonyms) in expected.items():
        assert (shown[name].value, shown[name].source) == (value, STATIC_BROKER_CONFIG), name
        if synonyms is not None:
            assert [(n, v) for n, v, _ in shown[name].synonyms] == synonyms, name
            assert [s for _, _, s in shown[name].synonyms] == [STATIC_BROKER_CONFIG, DEFAULT_CONFIG]
    # Inherited from nothing: Kafka's defaults.
    assert (shown["flush.ms"].value, shown["flush.ms"].source) == (str(2**63 - 1), DEFAULT_CONFIG)
    plain = describe(BrokerConfig())
    for name, value in plain.items():
        assert value.source == DEFAULT_CONFIG, name
    assert (plain["min.insync.replicas"].value, plain["retention.ms"].value) == ("1", "604800000")
    assert plain["retention.ms"].synonyms == [("log.retention.hours", "168", DEFAULT_CONFIG)]


def test_a_value_set_in_code_is_static_too() -> None:
    """A BrokerConfig built in code (tests, the in-process broker) has no file keys."""
    shown = describe(BrokerConfig(min_insync_replicas=3, log_cleanup_policy="compact,delete"))
    assert (shown["min.insync.replicas"].value, shown["min.insync.replicas"].source) == (
        "3", STATIC_BROKER_CONFIG
    )  # fmt: skip
    assert shown["cleanup.policy"].value == "compact,delete"


def test_a_key_the_broker_does_not_apply_is_not_inherited(tmp_path: Path) -> None:
    # compression.type in the config file is accepted with a warning and changes nothing.
    shown = describe(from_file(tmp_path, "compression.type=gzip\n"))
    assert (shown["compression.type"].value, shown["compression.type"].source) == (
        "producer", DEFAULT_CONFIG
    )  # fmt: skip


def test_dynamic_then_static_then_default_and_the_topics_own_first(tmp_path: Path) -> None:
    config = from_file(tmp_path, "log.retention.hours=1\nlog.segment.bytes=1048576\n")
    store = BrokerConfigStore(None)
    store.set(CLUSTER_DEFAULT, {"log.retention.ms": "7200000", "log.segment.bytes": "2097152"})
    store.set(THIS_BROKER, {"log.retention.ms": "1800000"})
    shown = describe(config, {"segment.bytes": "4096"}, store)
    retention = shown["retention.ms"]
    assert (retention.value, retention.source) == ("1800000", DYNAMIC_BROKER_CONFIG)
    assert retention.synonyms == [
        ("log.retention.ms", "1800000", DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "7200000", DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.hours", "1", STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", DEFAULT_CONFIG),
    ]
    segment = shown["segment.bytes"]
    assert (segment.value, segment.source) == ("4096", TOPIC_CONFIG)
    assert [s for _, _, s in segment.synonyms] == [
        TOPIC_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG,
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(KAFKA_SYNONYMS.keys() - NOT_INHERITED))
def test_every_inherited_config_is_listed_for_a_topic_that_does_not_set_it(name: str) -> None:
    assert name in describe(BrokerConfig())
