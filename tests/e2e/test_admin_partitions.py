"""CreatePartitions and DescribeLogDirs with real clients against a ``trio-broker serve`` process.

confluent-kafka's AdminClient (librdkafka) and kafka-python's KafkaAdminClient
grow topics; records are then produced to and consumed from the new partitions
with each library, and a subscribed confluent-kafka consumer group picks the new
partitions up by itself. kafka-python's ``describe_log_dirs`` reports the sizes
the broker holds. (confluent-kafka 2.16 has no describe_log_dirs binding.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic
from kafka.errors import (
    InvalidPartitionsError,
    InvalidReplicationAssignmentError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from tests.e2e.conftest import BrokerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: Seconds any one client step may take.
STEP_TIMEOUT_S = 60.0


def confluent_admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def wait_all(futures: dict[str, Any]) -> dict[str, Any]:
    return {name: future.result(STEP_TIMEOUT_S) for name, future in futures.items()}


def confluent_error(future: Any) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(STEP_TIMEOUT_S)
    error: KafkaError = raised.value.args[0]
    return int(error.code())


def confluent_produce(
    broker: BrokerProcess, topic: str, partition: int, values: list[bytes]
) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    failures: list[Any] = []
    for value in values:
        producer.produce(
            topic, value=value, partition=partition,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )  # fmt: skip
    assert producer.flush(STEP_TIMEOUT_S) == 0
    assert failures == []


def confluent_read(broker: BrokerProcess, topic: str, partition: int, count: int) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"reader-{topic}-{partition}",
        "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.assign([CTopicPartition(topic, partition, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            assert message.partition() == partition
            got.append(message.value())
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "broker_process", [("pipelined", "file"), ("serial", "memory")], indirect=True
)
def test_confluent_admin_grows_a_topic_then_produce_and_consume(
    broker_process: BrokerProcess,
) -> None:
    admin = confluent_admin(broker_process)
    wait_all(admin.create_topics([NewTopic("orders", num_partitions=1)]))
    # validate_only: accepted, nothing changes.
    wait_all(admin.create_partitions([NewPartitions("orders", 3)], validate_only=True))
    assert len(admin.list_topics("orders", timeout=10).topics["orders"].partitions) == 1
    wait_all(admin.create_partitions([NewPartitions("orders", 3)]))
    assert len(admin.list_topics("orders", timeout=10).topics["orders"].partitions) == 3
    # Kafka's refusals, as librdkafka reports them.
    same = admin.create_partitions([NewPartitions("orders", 3)])["orders"]
    assert confluent_error(same) == KafkaError.INVALID_PARTITIONS
    unknown = admin.create_partitions([NewPartitions("nope", 2)])["nope"]
    assert confluent_error(unknown) == KafkaError.UNKNOWN_TOPIC_OR_PART
    elsewhere = admin.create_partitions([NewPartitions("orders", 4, replica_assignment=[[7]])])
    assert confluent_error(elsewhere["orders"]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    wait_all(admin.create_partitions([NewPartitions("orders", 4, replica_assignment=[[0]])]))

    values = [b"new-%d" % i for i in range(50)]
    for partition in (2, 3):
        confluent_produce(broker_process, "orders", partition, values)
        assert confluent_read(broker_process, "orders", partition, len(values)) == values
    consumer = Consumer({"bootstrap.servers": broker_process.bootstrap, "group.id": "marks"})
    try:  # nothing leaked into the old partition
        marks = consumer.get_watermark_offsets(CTopicPartition("orders", 0), STEP_TIMEOUT_S)
        assert marks == (0, 0)
    finally:
        consumer.close()


def test_a_subscribed_group_picks_up_new_partitions(broker_process: BrokerProcess) -> None:
    admin = confluent_admin(broker_process)
    wait_all(admin.create_topics([NewTopic("grow", num_partitions=1)]))
    consumer = Consumer({
        "bootstrap.servers": broker_process.bootstrap, "group.id": "growers",
        "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500,
    })  # fmt: skip
    try:
        consumer.subscribe(["grow"])
        confluent_produce(broker_process, "grow", 0, [b"before"])
        seen: dict[int, list[bytes]] = {}
        deadline = time.monotonic() + STEP_TIMEOUT_S

        def poll_until(done: Any) -> None:
            while not done() and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and not message.error():
                    seen.setdefault(message.partition(), []).append(message.value())

        poll_until(lambda: seen.get(0) == [b"before"])
        wait_all(admin.create_partitions([NewPartitions("grow", 2)]))
        confluent_produce(broker_process, "grow", 1, [b"after"])
        # The group notices the new partition at a metadata refresh and rebalances.
        poll_until(lambda: seen.get(1) == [b"after"])
        assert seen == {0: [b"before"], 1: [b"after"]}
    finally:
        consumer.close()


def test_kafka_python_grows_a_topic_and_describes_log_dirs(
    broker_process: BrokerProcess,
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker_process.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([KNewTopic("events", num_partitions=2, replication_factor=1)])
        admin.create_partitions({"events": 4})
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"events": 3})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.create_partitions({"missing": 2})
        with pytest.raises(InvalidReplicationAssignmentError):
            admin.create_partitions({"events": {"count": 5, "assignments": [[0, 1]]}})
        admin.create_partitions({"events": {"count": 5, "assignments": [[0]]}})
        admin.create_partitions({"events": 9}, validate_only=True)

        producer = KafkaProducer(bootstrap_servers=broker_process.bootstrap, acks="all")
        try:
            for i in range(20):
                producer.send("events", value=b"v%d" % i, partition=4).get(STEP_TIMEOUT_S)
        finally:
            producer.close()
        consumer = KafkaConsumer(
            bootstrap_servers=broker_process.bootstrap, enable_auto_commit=False
        )
        try:
            consumer.assign([TopicPartition("events", 4)])
            consumer.seek_to_beginning()
            got: list[bytes] = []
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while len(got) < 20 and time.monotonic() < deadline:
                for records in consumer.poll(500).values():
                    got.extend(r.value for r in records)
            assert got == [b"v%d" % i for i in range(20)]
        finally:
            consumer.close()

        (broker,) = admin.describe_log_dirs()
        (log_dir,) = broker["log_dirs"]
        assert log_dir["error_code"] == 0
        assert log_dir["log_dir"] == str(broker_process.data_dir.absolute())
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
        sizes = {
            (t["name"], p["partition_index"]): p["partition_size"]
            for t in log_dir["topics"]
            for p in t["partitions"]
        }
        assert {key for key in sizes if key[0] == "events"} == {("events", i) for i in range(5)}
        on_disk = sum(
            f.stat().st_size for f in (broker_process.data_dir / "events-4").glob("*.log")
        )
        assert sizes[("events", 4)] == on_disk > 0
        assert sizes[("events", 0)] == 0

        # Only what is asked for: a list of topics (all their partitions).
        (broker,) = admin.describe_log_dirs(topic_partitions={"events": [4, 1]})
        (topic,) = broker["log_dirs"][0]["topics"]
        assert sorted(p["partition_index"] for p in topic["partitions"]) == [1, 4]
    finally:
        admin.close()
    # The count survives a restart.
    broker_process.restart()
    with broker_process.connect() as conn:
        (meta,) = conn.metadata(["events"]).topics
    assert len(meta.partitions) == 5
