"""A compacted topic refuses records without a key, as Kafka does (librdkafka's test
0011_produce_batch expects it): the partition answers INVALID_RECORD, naming each keyless
record in Produce v8+'s record_errors, and nothing of the batch is appended. The cleaner
keeps the latest record of each key, so a keyless one could never be cleaned away.

Real clients (confluent-kafka, kafka-python) and our own codec against a broker process,
one for the module: each test makes a topic of its own.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka import KafkaProducer
from kafka.errors import InvalidRecordError

from tests.e2e.conftest import BrokerProcess
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

DEADLINE_S = 60.0


def create_topic(bootstrap: str, configs: dict[str, str]) -> str:
    name = f"compacted-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, 1, 1, config=configs)], operation_timeout=10)
    futures[name].result(timeout=DEADLINE_S)
    return name


def confluent_deliveries(bootstrap: str, topic: str, keys: list[bytes | None]) -> list[Any]:
    """The delivery report error (None: delivered) of each record, produced one by one."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0})
    errors: list[Any] = []
    for key in keys:
        producer.produce(
            topic, value=b"v", key=key, on_delivery=lambda err, _msg: errors.append(err)
        )
        assert producer.flush(DEADLINE_S) == 0
    return errors


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_confluent_kafka_sees_keyless_records_refused(
    shared_broker_process: BrokerProcess, policy: str
) -> None:
    topic = create_topic(shared_broker_process.bootstrap, {"cleanup.policy": policy})
    errors = confluent_deliveries(shared_broker_process.bootstrap, topic, [b"a", None, b"b"])
    assert errors[0] is None and errors[2] is None, errors
    assert errors[1] is not None and errors[1].code() == KafkaError.INVALID_RECORD, errors
    with shared_broker_process.connect() as conn:
        assert conn.end_offset(topic) == 2  # the keyless record took no offset


def test_kafka_python_sees_keyless_records_refused(shared_broker_process: BrokerProcess) -> None:
    topic = create_topic(shared_broker_process.bootstrap, {"cleanup.policy": "compact"})
    producer = KafkaProducer(
        bootstrap_servers=shared_broker_process.bootstrap, acks="all", retries=0
    )
    try:
        producer.send(topic, key=b"k", value=b"v").get(timeout=DEADLINE_S)
        with pytest.raises(InvalidRecordError):
            producer.send(topic, value=b"no key").get(timeout=DEADLINE_S)
    finally:
        producer.close(timeout=10)
    with shared_broker_process.connect() as conn:
        assert conn.end_offset(topic) == 1


def test_the_whole_batch_is_refused_and_each_keyless_record_named(
    shared_broker_process: BrokerProcess,
) -> None:
    topic = create_topic(shared_broker_process.bootstrap, {"cleanup.policy": "compact"})
    mixed = build_batch(
        [(b"k0", b"v"), (None, b"v"), (b"k2", b"v"), (None, b"v")], base_timestamp=1
    )
    with shared_broker_process.connect() as conn:
        assert conn.produce(topic, build_batch([(b"k", b"v")], base_timestamp=1)).error_code == 0
        part = conn.produce(topic, mixed, version=9)
        assert part.error_code == ErrorCode.INVALID_RECORD
        assert part.base_offset == -1 and part.log_start_offset == 0
        why = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
        assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
            (1, why),
            (3, why),
        ]
        assert part.error_message.startswith(
            "One or more records have been rejected due to 2 record errors in total"
        )
        assert conn.end_offset(topic) == 1  # nothing of the refused batch was appended


def test_a_topic_turned_compact_refuses_keyless_records(
    shared_broker_process: BrokerProcess,
) -> None:
    """The rule follows the topic's cleanup.policy as it changes (AlterConfigs)."""
    bootstrap = shared_broker_process.bootstrap
    topic = create_topic(bootstrap, {})
    assert confluent_deliveries(bootstrap, topic, [None]) == [None]  # delete: keys optional
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=DEADLINE_S)
    # AlterConfigs is answered once the logs have the new config.
    (err,) = confluent_deliveries(bootstrap, topic, [None])
    assert err is not None and err.code() == KafkaError.INVALID_RECORD
    with shared_broker_process.connect() as conn:
        assert conn.end_offset(topic) == 1
