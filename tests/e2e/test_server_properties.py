"""``trio-broker serve --config server.properties``: Kafka's own config file drives the broker.

A Kafka 4 combined-mode ``server.properties`` (controller keys, thread counts,
replication factors of internal topics: accepted with a warning each) plus the
keys the broker applies: ``num.partitions`` for auto-created topics,
``group.min.session.timeout.ms`` refusing a confluent-kafka consumer whose
session timeout is below it, ``delete.topic.enable=false`` refusing DeleteTopics,
and DescribeConfigs through confluent-kafka's AdminClient listing the keys with
their sources.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from tests.e2e.conftest import BROKER_EXE, BrokerProcess
from tests.waits import wait_until
from trio_broker.protocol import messages as m
from trio_broker.storage.broker_configs import DYNAMIC_BROKER_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: Seconds any one client wait may take.
WAIT_S = 60.0

KAFKA_PROPERTIES = """\
# Kafka 4 combined broker+controller node (as config/server.properties ships), for both brokers
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=localhost:19093
listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:19093
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\\
                               SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={data_dir}
num.partitions=3
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=1
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
! applied by both brokers
group.min.session.timeout.ms=7000
group.initial.rebalance.delay.ms=0
ssl.keystore.password=not-shown
"""

INERT_KEYS = ("process.roles", "controller.quorum.bootstrap.servers", "num.network.threads",
              "socket.send.buffer.bytes", "ssl.keystore.password")  # fmt: skip


class PropertiesBroker(BrokerProcess):
    """``trio-broker serve --config FILE`` and nothing else on the command line."""

    def __init__(self, config_path: Path, data_dir: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.config_path = config_path

    def command_line(self) -> list[str]:
        return [str(BROKER_EXE), "serve", "--config", str(self.config_path)]


def _start(tmp_path: Path, extra: str) -> PropertiesBroker:
    data_dir = tmp_path / "data"
    path = tmp_path / "server.properties"
    path.write_text(KAFKA_PROPERTIES.format(data_dir=data_dir) + extra)
    broker = PropertiesBroker(path, data_dir)
    broker.start()
    return broker


def _stop(broker: PropertiesBroker) -> None:
    if broker.running:
        code = broker.stop()
        assert code == 0, f"broker exited with {code} on SIGTERM\n{broker.log_tail()}"


@pytest.fixture(scope="module")
def kafka_file_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PropertiesBroker]:
    broker = _start(tmp_path_factory.mktemp("props"), "delete.topic.enable=false\n")
    try:
        yield broker
    finally:
        _stop(broker)


def partitions_of(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10)
    return len(meta.topics[topic].partitions) if meta.topics[topic].error is None else 0


def test_inert_keys_are_logged_by_name_and_the_controller_listener_is_not_opened(
    kafka_file_broker: PropertiesBroker,
) -> None:
    log = kafka_file_broker.log_text()
    for key in INERT_KEYS:
        assert f"config key {key} is accepted" in log, key
    assert "config key num.partitions" not in log  # applied keys are not warned about
    # The share coordinator's state topic keys are applied (a cluster's share state).
    assert "config key share.coordinator.state.topic.min.isr" not in log
    with kafka_file_broker.connect() as conn:
        brokers = conn.metadata(topics=None).brokers
    assert [(b.node_id, b.port) for b in brokers] == [(1, kafka_file_broker.port)]


def test_auto_created_topics_get_num_partitions(kafka_file_broker: PropertiesBroker) -> None:
    producer = Producer({"bootstrap.servers": kafka_file_broker.bootstrap})
    producer.produce("props-auto", b"value")
    assert producer.flush(WAIT_S) == 0
    assert partitions_of(kafka_file_broker.bootstrap, "props-auto") == 3
    with kafka_file_broker.connect() as conn:  # Metadata with allow_auto_topic_creation
        (topic,) = conn.metadata(["props-meta"]).topics
    assert (topic.error_code, len(topic.partitions)) == (0, 3)


def _join(bootstrap: str, group: str, session_timeout_ms: int) -> tuple[bool, int | None]:
    """(assigned a partition, the error code the consumer reported), bounded in time."""
    errors: list[KafkaError] = []
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group,
        "session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": 1000,
        "auto.offset.reset": "earliest", "error_cb": errors.append,
    })  # fmt: skip
    try:
        consumer.subscribe(["props-auto"])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is not None:
                errors.append(message.error())
            if errors:
                return False, errors[0].code()
            if consumer.assignment():
                return True, None
        return False, None
    finally:
        consumer.close()


def test_a_session_timeout_below_the_minimum_is_refused(
    kafka_file_broker: PropertiesBroker,
) -> None:
    producer = Producer({"bootstrap.servers": kafka_file_broker.bootstrap})
    producer.produce("props-auto", b"x")
    assert producer.flush(WAIT_S) == 0
    bootstrap = kafka_file_broker.bootstrap
    assert _join(bootstrap, "props-short", 6000) == (False, KafkaError.INVALID_SESSION_TIMEOUT)
    assert _join(bootstrap, "props-ok", 7000) == (True, None)  # the minimum itself is fine


def test_delete_topics_is_refused_when_deletion_is_disabled(
    kafka_file_broker: PropertiesBroker,
) -> None:
    bootstrap = kafka_file_broker.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("props-kept", b"x")
    assert producer.flush(WAIT_S) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.delete_topics(["props-kept"], operation_timeout=10).values()
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=WAIT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_DELETION_DISABLED
    assert partitions_of(bootstrap, "props-kept") == 3
    # Versions before 3 have no TOPIC_DELETION_DISABLED: INVALID_REQUEST, as Kafka answers.
    with kafka_file_broker.connect() as conn:
        body = m.DeleteTopicsRequest(topic_names=["props-kept"], timeout_ms=1000)
        (result,) = conn.request(m.ApiKey.DELETE_TOPICS, 1, body).responses
    assert result.error_code == KafkaError.INVALID_REQUEST


def test_describe_configs_lists_the_broker_keys_with_their_sources(
    kafka_file_broker: PropertiesBroker,
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_file_broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "1")
    (future,) = admin.describe_configs([resource]).values()
    configs = future.result(timeout=WAIT_S)
    assert len(configs) > 300  # every key of Kafka's broker documentation

    def entry(name: str) -> tuple[str | None, ConfigSource]:
        return configs[name].value, ConfigSource(configs[name].source)

    static, default = ConfigSource.STATIC_BROKER_CONFIG, ConfigSource.DEFAULT_CONFIG
    assert entry("num.partitions") == ("3", static)
    assert entry("group.min.session.timeout.ms") == ("7000", static)
    assert entry("group.max.session.timeout.ms") == ("1800000", default)
    assert entry("delete.topic.enable") == ("false", static)
    assert entry("log.retention.ms") == ("3600000", static)
    assert entry("log.retention.hours") == ("1", static)
    assert entry("num.network.threads") == ("3", static)  # inert, but set by the file
    assert entry("background.threads") == ("10", default)  # Kafka's default
    assert entry("node.id") == ("1", static)
    assert entry("ssl.keystore.password") == (None, static)
    assert configs["ssl.keystore.password"].is_sensitive
    # Read-only but the dynamic broker configs (storage/broker_configs.py).
    writable = {name for name, c in configs.items() if not c.is_read_only}
    assert writable == set(DYNAMIC_BROKER_KEYS)
    synonyms = configs["log.retention.ms"].synonyms
    assert synonyms["log.retention.hours"].value == "1"
    assert ConfigSource(synonyms["log.retention.hours"].source) == static


def test_a_topic_shows_the_broker_values_in_force_with_their_sources(tmp_path: Path) -> None:
    """A topic that sets nothing inherits the file's values: DescribeConfigs names them
    STATIC_BROKER_CONFIG with the keys as written among the synonyms (Kafka's answer), and
    they are the values applied (compact: a record without a key is refused). A dynamic
    broker config then shows as DYNAMIC_BROKER_CONFIG."""
    broker = _start(
        tmp_path, "min.insync.replicas=2\nlog.cleanup.policy=compact\nmessage.max.bytes=500000\n"
    )
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([_new_topic("inherits")])["inherits"].result(timeout=WAIT_S)

        def described() -> dict[str, tuple[str | None, ConfigSource]]:
            """confluent-kafka's view: value and source (its synonyms are a dict by name,
            which keeps one of a key's levels: they are read over our codec below)."""
            resource = ConfigResource(ResourceType.TOPIC, "inherits")
            (future,) = admin.describe_configs([resource]).values()
            entries = future.result(timeout=WAIT_S)
            return {name: (e.value, ConfigSource(e.source)) for name, e in entries.items()}

        def synonyms(name: str) -> list[tuple[str, str | None, ConfigSource]]:
            Req = m.DescribeConfigsRequest
            resource = Req.DescribeConfigsResource(
                resource_type=2, resource_name="inherits", configuration_keys=[name]
            )
            request = Req(resources=[resource], include_synonyms=True)
            with broker.connect() as conn:
                (result,) = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request).results
            (entry,) = result.configs
            return [(s.name, s.value, ConfigSource(s.source)) for s in entry.synonyms]

        static, default = ConfigSource.STATIC_BROKER_CONFIG, ConfigSource.DEFAULT_CONFIG
        configs = described()
        assert configs["min.insync.replicas"] == ("2", static)
        assert synonyms("min.insync.replicas") == [
            ("min.insync.replicas", "2", static),
            ("min.insync.replicas", "1", default),
        ]
        assert configs["retention.ms"] == ("3600000", static)
        assert synonyms("retention.ms") == [
            ("log.retention.hours", "1", static),
            ("log.retention.hours", "168", default),
        ]
        assert configs["cleanup.policy"] == ("compact", static)
        assert configs["max.message.bytes"] == ("500000", static)
        assert configs["delete.retention.ms"] == ("86400000", default)

        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        errors: list[Any] = []
        for key in (b"k", None):  # one batch each: a keyless record refuses its batch
            producer.produce(
                "inherits", value=b"v", key=key, on_delivery=lambda e, _m: errors.append(e)
            )
            assert producer.flush(WAIT_S) == 0
        assert errors[0] is None and errors[1] is not None, errors
        assert errors[1].code() == KafkaError.INVALID_RECORD  # compact is in force

        change = ConfigEntry(
            "log.retention.ms", "60000", incremental_operation=AlterConfigOpType.SET
        )
        node = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[change])
        (future,) = admin.incremental_alter_configs([node]).values()
        future.result(timeout=WAIT_S)
        assert described()["retention.ms"] == ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG)
        assert synonyms("retention.ms") == [
            ("log.retention.ms", "60000", ConfigSource.DYNAMIC_BROKER_CONFIG),
            ("log.retention.hours", "1", static),
            ("log.retention.hours", "168", default),
        ]
    finally:
        _stop(broker)


def test_auto_create_off_and_deletion_on(tmp_path: Path) -> None:
    broker = _start(tmp_path, "auto.create.topics.enable=false\ndelete.topic.enable=true\n")
    try:
        with broker.connect() as conn:
            (topic,) = conn.metadata(["props-absent"]).topics
        assert topic.error_code == KafkaError.UNKNOWN_TOPIC_OR_PART
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([_new_topic("props-doomed")])["props-doomed"].result(timeout=WAIT_S)
        admin.delete_topics(["props-doomed"])["props-doomed"].result(timeout=WAIT_S)
        wait_until(lambda: partitions_of(broker.bootstrap, "props-doomed") == 0, "the deletion")
    finally:
        _stop(broker)


def _new_topic(name: str) -> Any:
    from confluent_kafka.admin import NewTopic

    return NewTopic(name, num_partitions=1, replication_factor=1)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("num.partition=2", "unknown config key 'num.partition' (did you mean 'num.partitions'?)"),
        ("num.partitions=two", "num.partitions: expected an integer, got 'two'"),
    ],
)
def test_a_bad_key_stops_serve_with_its_name(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "server.properties"
    path.write_text(f"log.dirs={tmp_path / 'data'}\n{line}\n")
    run = subprocess.run(
        [str(BROKER_EXE), "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert run.returncode == 2
    assert message in run.stderr
