"""The broker key table (config_keys.py) and loading a Kafka server.properties with it."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import attrs
import pytest

from tests.kafka_tools.classpath import FAST_START_JVM, kafka_tools_classpath
from trio_broker.config import BrokerConfig, ConfigError, load_config
from trio_broker.config_keys import APPLIED, BROKER_KEYS, INERT, SECURITY, SYNONYMS, lookup
from trio_broker.groups.group_configs import broker_values
from trio_broker.handlers.describe_configs import (
    DEFAULT_CONFIG,
    STATIC_BROKER_CONFIG,
    broker_config_values,
)
from trio_broker.security.listeners import INTER_BROKER_KEYS, LISTENER_KEYS, resolve_listeners
from trio_broker.storage.broker_configs import BrokerConfigStore
from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.group_configs import check_group_configs

#: A Kafka 4 combined-mode server.properties as Kafka ships it (trimmed), and our additions.
KAFKA_FILE = """\
############################# Server Basics #############################
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=localhost:9093
listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:19092,CONTROLLER://localhost:19093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\\
    SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
log.dirs={data}
num.partitions=3
offsets.topic.replication.factor=1
log.retention.hours=1
log.segment.bytes : 1073741824
group.min.session.timeout.ms = 7000
delete.topic.enable=FALSE
"""

# (offsets.topic.replication.factor is applied: a cluster's __consumer_offsets has it.)
INERT_IN_FILE = [
    "process.roles", "controller.quorum.bootstrap.servers", "num.network.threads",
    "socket.send.buffer.bytes",
]  # fmt: skip


def write(tmp_path: Path, text: str, name: str = "server.properties") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_kafka_server_properties_is_applied(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, KAFKA_FILE.format(data=tmp_path / "data")))
    assert (config.host, config.port, config.node_id) == ("127.0.0.1", 19092, 1)
    (listener,) = resolve_listeners(config)  # the controller listener is not opened
    assert (listener.name, listener.advertised) == ("PLAINTEXT", ("localhost", 19092))
    assert config.data_dir == tmp_path / "data"
    assert config.num_partitions == 3 and config.num_handlers == 8
    assert config.retention_ms == 3_600_000  # log.retention.hours=1
    assert config.group_min_session_timeout_ms == 7000
    assert config.group_max_session_timeout_ms == 1_800_000
    assert config.delete_topic_enable is False
    assert config.inter_broker_listener_name == "PLAINTEXT"
    assert config.static_keys["log.segment.bytes"] == "1073741824"


def test_inert_keys_warn_once_each_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trio_broker.config"):
        load_config(write(tmp_path, KAFKA_FILE.format(data=tmp_path / "data")))
    warned = [r.getMessage().split()[2] for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warned) == sorted(INERT_IN_FILE)
    assert all("no effect" in r.getMessage() for r in caplog.records)


def test_applied_keys_do_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trio_broker.config"):
        load_config(write(tmp_path, "num.partitions=2\nlog.retention.ms=5\nnode.id=0\n"))
    assert caplog.records == []


def test_a_group_configs_bound_is_applied_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """group.share.min.record.lock.duration.ms bounds a share group's
    share.record.lock.duration.ms (librdkafka's share tests set it to 1000; 2000 here, above the least a group may ever set): applied, so
    not warned about as having no effect, and a group may then set 3000."""
    with caplog.at_level(logging.WARNING, logger="trio_broker.config"):
        config = load_config(
            write(tmp_path, "group.share.min.record.lock.duration.ms=2000\nnode.id=0\n")
        )
    assert caplog.records == []
    check_group_configs({"share.record.lock.duration.ms": "3000"}, broker_values(config))
    with pytest.raises(InvalidConfigError, match="must be in the range 2000 to 60000"):
        check_group_configs({"share.record.lock.duration.ms": "1500"}, broker_values(config))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num.partition=3", r"unknown config key 'num.partition' \(did you mean 'num.partitions'\?\)"),
        ("totally.made.up=1", r"unknown config key 'totally.made.up'$"),
        ("listener.name.plaintext.bogus=1", "unknown config key 'listener.name.plaintext.bogus'"),
        ("num.partitions=three", "num.partitions: expected an integer, got 'three'"),
        ("background.threads=lots", "background.threads: expected an integer"),  # inert, typed too
        ("auto.create.topics.enable=yes", "auto.create.topics.enable: expected true or false"),
        ("default.replication.factor=3", "default.replication.factor: .* only 1"),
        ("node.id=1\nbroker.id=2", "broker.id: 2 differs from node.id = 1"),
        ("listeners=CONTROLLER://:9093\ncontroller.listener.names=CONTROLLER", "no broker listener"),
        ("group.min.session.timeout.ms=10\ngroup.max.session.timeout.ms=5", "group.min.session"),
        ("queued.max.request.bytes=0", "queued.max.request.bytes"),
        ("log.message.timestamp.type=Now", "log.message.timestamp.type"),
        ("k = \\u00zz", r"line 1: malformed \\uxxxx"),
    ],
)  # fmt: skip
def test_bad_keys_and_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_the_most_specific_synonym_wins(tmp_path: Path) -> None:
    both = "log.retention.hours=5\nlog.retention.minutes=3\nlog.roll.hours=2\n"
    config = load_config(write(tmp_path, both))
    assert (config.retention_ms, config.segment_ms) == (180_000, 7_200_000)
    config = load_config(write(tmp_path, both + "log.retention.ms=42\nlog.roll.ms=7\n"))
    assert (config.retention_ms, config.segment_ms) == (42, 7)
    assert load_config(write(tmp_path, "log.retention.hours=-1")).retention_ms == -1  # forever
    config = load_config(write(tmp_path, f"log.dir={tmp_path}/a\nlog.dirs={tmp_path}/b,/c\n"))
    assert config.data_dir == tmp_path / "b"
    assert config.extra_log_dirs == (Path("/c"),)  # log.dirs: JBOD, the first is the data dir
    # --data-dir means one dir, whatever the file's log.dirs says.
    assert load_config(write(tmp_path, "log.dirs=/x,/y\n"), data_dir="/z").extra_log_dirs == ()
    assert load_config(write(tmp_path, "broker.id=4\nnode.id=4")).node_id == 4


def test_listener_prefixed_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "listeners=SASL_PLAINTEXT://127.0.0.1:9094\n"
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN\n"
        "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.example.Login required;\n"
    )
    with caplog.at_level(logging.WARNING, logger="trio_broker.config"):
        config = load_config(write(tmp_path, text))
    (listener,) = resolve_listeners(config)
    assert listener.mechanisms == ["PLAIN"]
    # Applied: the brokers' own login to each other in a cluster (security/inter_broker.py).
    assert caplog.records == []
    assert listener.settings["plain.sasl.jaas.config"] == "org.example.Login required;"
    (jaas,) = [
        v
        for v in broker_config_values(config, BrokerConfigStore(None))
        if v.name.startswith("listener.name.") and "jaas" in v.name
    ]
    assert (jaas.value, jaas.source, jaas.sensitive) == (None, STATIC_BROKER_CONFIG, True)


def test_toml_keeps_working_and_knows_every_kafka_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    toml = (
        'listeners = ["PLAINTEXT://127.0.0.1:9999"]\n'
        "auto.create.topics.enable = false\n"
        "num.network.threads = 3\n"
        '[log]\nretention.ms = 60000\ndirs = "d"\n'
        '[quotas."client-id=bench"]\nproducer_byte_rate = 1024\n'
    )
    with caplog.at_level(logging.WARNING, logger="trio_broker.config"):
        config = load_config(write(tmp_path, toml, "broker.toml"))
    assert (config.port, config.auto_create_topics, config.retention_ms) == (9999, False, 60000)
    assert config.data_dir == Path("d") and config.quotas == {"client-id=bench": {
        "producer_byte_rate": 1024}}  # fmt: skip
    assert [r.getMessage().split()[2] for r in caplog.records] == ["num.network.threads"]
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(write(tmp_path, "listeners = PLAINTEXT://x:1", "broken.toml"))


def test_the_format_is_detected_without_an_extension(tmp_path: Path) -> None:
    assert (
        load_config(write(tmp_path, "log.dirs=/tmp/x\nnum.partitions=2", "conf")).num_partitions
        == 2
    )
    assert (
        load_config(write(tmp_path, 'num.partitions = 4\nstorage = "memory"', "conf")).storage
        == "memory"
    )


def test_flags_override_the_file_and_count_as_static(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "num.partitions=2"), data_dir=tmp_path / "d", port=0)
    assert config.data_dir == tmp_path / "d"
    assert {"num.partitions", "log.dirs", "listeners"} <= set(config.static_keys)


def test_queued_max_request_bytes_minus_one_means_no_limit(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "queued.max.request.bytes=-1"))
    assert config.queued_request_bytes_limit >= 2**62
    assert BrokerConfig().queued_request_bytes_limit == 256 * 1024 * 1024


# --------------------------------------------------------------------------- the table


def test_every_applied_key_sets_a_real_field() -> None:
    fields = attrs.fields_dict(BrokerConfig)
    for spec in BROKER_KEYS.values():
        assert spec.status in (APPLIED, INERT), spec
        if spec.status == APPLIED and spec.field not in (None, SECURITY):
            assert spec.field in fields, spec
        if spec.status == INERT:
            assert spec.field is None and spec.origin == "kafka", spec
    security = {name for name, spec in BROKER_KEYS.items() if spec.field == SECURITY}
    # The TLS/SASL keys resolve_listeners applies, and the brokers' own login.
    assert security == set(LISTENER_KEYS) | set(INTER_BROKER_KEYS)
    for group in SYNONYMS:
        assert len({BROKER_KEYS[key].field for key in group}) == 1, group


def test_the_new_applied_keys_are_in_the_table() -> None:
    for key in ("group.min.session.timeout.ms", "group.max.session.timeout.ms",
                "auto.create.topics.enable", "delete.topic.enable", "message.max.bytes"):  # fmt: skip
        assert lookup(key).status == APPLIED


def test_broker_describe_values_and_sources(tmp_path: Path) -> None:
    text = KAFKA_FILE.format(data=tmp_path / "data") + "ssl.keystore.password=hunter2\n"
    values = {
        v.name: v
        for v in broker_config_values(load_config(write(tmp_path, text)), BrokerConfigStore(None))
    }
    assert set(BROKER_KEYS) <= set(values)
    assert (values["num.partitions"].value, values["num.partitions"].source) == (
        "3", STATIC_BROKER_CONFIG)  # fmt: skip
    assert (values["num.recovery.threads.per.data.dir"].value,
            values["num.recovery.threads.per.data.dir"].source) == ("2", DEFAULT_CONFIG)  # fmt: skip
    retention = values["log.retention.ms"]
    assert (retention.value, retention.source) == ("3600000", STATIC_BROKER_CONFIG)
    assert retention.synonyms == [
        ("log.retention.hours", "1", STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", DEFAULT_CONFIG),
    ]
    password = values["ssl.keystore.password"]
    assert (password.value, password.sensitive, password.source) == (
        None,
        True,
        STATIC_BROKER_CONFIG,
    )
    assert "no effect" in (values["num.network.threads"].doc or "").lower()
    assert values["listeners"].value == "PLAINTEXT://127.0.0.1:19092"


_DUMP_KEYS = r"""
import org.apache.kafka.common.config.ConfigDef;
public class DumpBrokerKeys {
    public static void main(String[] args) {
        ConfigDef def = org.apache.kafka.server.config.AbstractKafkaConfig.CONFIG_DEF;
        for (ConfigDef.ConfigKey key : def.configKeys().values())
            if (!key.internalConfig) System.out.println(key.name + " " + key.type);
    }
}
"""


def test_the_kafka_rows_are_kafka_4_4s_documented_broker_keys(tmp_path: Path) -> None:
    """Against Kafka's own ConfigDef (the source of its broker config documentation).

    Kafka 4.4.0's server jars come with its tools' classpath (Maven, cached in ~/.m2);
    the JDK and Maven are installed by scripts/install-system-deps.sh.
    """
    source = tmp_path / "DumpBrokerKeys.java"
    source.write_text(_DUMP_KEYS)
    run = subprocess.run(
        ["java", *FAST_START_JVM, "-cp", kafka_tools_classpath(tmp_path), str(source)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    kafka = dict(line.split() for line in run.stdout.splitlines())
    ours = {name: spec for name, spec in BROKER_KEYS.items() if spec.origin == "kafka"}
    assert set(ours) == set(kafka)
    from trio_broker.config_keys import TYPE_NAMES

    assert {name: TYPE_NAMES[spec.type].upper() for name, spec in ours.items()} == kafka


def test_producer_id_expiration_reaches_the_producer_state(tmp_path: Path) -> None:
    """producer.id.expiration.ms was accepted but inert: the registry kept Kafka's day."""
    from trio_broker.server.broker import Broker

    path = tmp_path / "server.properties"
    path.write_text(f"producer.id.expiration.ms=5000\nlog.dirs={tmp_path / 'data'}\n")
    assert Broker(load_config(path)).producers.expiration_ms == 5000
    assert Broker(load_config(data_dir=tmp_path / "d2")).producers.expiration_ms == 86_400_000
    path.write_text("producer.id.expiration.ms=0\n")
    with pytest.raises(ConfigError, match=r"producer\.id\.expiration\.ms: must be positive"):
        load_config(path)


def test_share_initialize_retry_interval_reaches_the_share_groups(tmp_path: Path) -> None:
    """group.share.initialize.retry.interval.ms (internal in Kafka 4.4, default 30 s) was
    a constant; as Kafka's GroupCoordinatorConfig, never below offsets.commit.timeout.ms."""
    from trio_broker.server.broker import Broker

    def retry_interval(text: str, data: str) -> int:
        path = tmp_path / "server.properties"
        path.write_text(f"{text}\nlog.dirs={tmp_path / data}\n")
        return Broker(load_config(path)).shares.config.initialize_retry_interval_ms

    assert retry_interval("group.share.initialize.retry.interval.ms=7000", "a") == 7000
    assert retry_interval("", "b") == 30_000
    assert retry_interval("group.share.initialize.retry.interval.ms=1000", "c") == 5000
    assert (
        retry_interval(
            "group.share.initialize.retry.interval.ms=1000\noffsets.commit.timeout.ms=800", "d"
        )
        == 1000
    )
    (tmp_path / "server.properties").write_text("group.share.initialize.retry.interval.ms=0\n")
    with pytest.raises(ConfigError, match=r"initialize\.retry\.interval\.ms: must be positive"):
        load_config(tmp_path / "server.properties")
