"""Several log dirs (``log.dirs``, JBOD) in a real broker process.

A partition moves to the other dir (AlterReplicaLogDirs from kafka-python's admin
client, and from Kafka's own kafka-reassign-partitions with ``log_dirs``) while an
idempotent confluent-kafka producer keeps writing; DescribeLogDirs then lists it in
the new dir, and after a restart every acknowledged record is there exactly once.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors

from tests.e2e.conftest import BROKER_EXE, BrokerProcess, running_broker

pytestmark = pytest.mark.timeout(300)
TOPIC = "moving"


class TwoDirBroker(BrokerProcess):
    """``serve --config`` with ``log.dirs=<a>,<b>`` (no --data-dir: that would mean one)."""

    def command_line(self) -> list[str]:
        root = self.data_dir.parent
        config = root / "server.properties"
        config.write_text(f"log.dirs={root / 'a'},{root / 'b'}\n")
        return [str(BROKER_EXE), "serve", "--config", str(config),
                "--listen", f"127.0.0.1:{self.port}"]  # fmt: skip


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "a", kind=TwoDirBroker) as process:
        yield process


class KeepProducing:
    """An idempotent producer writing numbered records until stopped."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5})  # fmt: skip
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: object, msg: object) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.append(msg.value())  # type: ignore[attr-defined]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.produce(TOPIC, value=b"%d" % self.sent, on_delivery=self._delivered)
            self.sent += 1
            self.producer.poll(0.005)  # a few hundred records a second

    def __enter__(self) -> KeepProducing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(30)
        assert self.producer.flush(60) == 0

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(self.acked) >= count:
                return
            self.thread.join(0.01)  # a bounded wait on the condition, not a fixed sleep
        raise AssertionError(f"only {len(self.acked)} of {count} records acknowledged")


def consume_all(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "jbod-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([TOPIC])
    got: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < count and time.monotonic() < deadline:
            got += [msg.value() for msg in consumer.consume(500, 0.2) if msg.error() is None]
        # Anything beyond ``count`` would be a duplicate: give it a moment to show.
        got += [msg.value() for msg in consumer.consume(500, 1.0) if msg.error() is None]
    finally:
        consumer.close()
    return got


def dirs_holding(bootstrap: str) -> dict[str, list[int]]:
    """log dir -> partitions of TOPIC in it, as DescribeLogDirs (kafka-python) says."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [answer] = admin.describe_log_dirs()
    finally:
        admin.close()
    return {
        d["log_dir"]: [p["partition_index"] for t in d["topics"] if t["name"] == TOPIC
                       for p in t["partitions"]]
        for d in answer["log_dirs"]
    }  # fmt: skip


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.create_topics([NewTopic(TOPIC, num_partitions=1)]).values()
    future.result(timeout=60)


def check_exactly_once_after_restart(broker: BrokerProcess, acked: list[bytes]) -> None:
    broker.stop()
    broker.start()
    got = consume_all(broker.bootstrap, len(acked))
    assert len(got) == len(set(got)), "a record came back twice"
    assert set(got) == set(acked)


def test_a_partition_moves_to_the_other_dir_while_producing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    create_topic(broker.bootstrap)
    assert dirs_holding(broker.bootstrap) == {a: [0], b: []}  # a tie: the first dir
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        with KeepProducing(broker.bootstrap) as producing:
            producing.wait_for(200)
            moved = admin.alter_replica_log_dirs({(TOPIC, 0, 0): b})
            assert list(moved.values()) == [kafka_errors.NoError]
            producing.wait_for(len(producing.acked) + 200)  # and it keeps taking appends
        refused = admin.alter_replica_log_dirs({(TOPIC, 0, 0): str(tmp_path / "c"),
                                                ("nowhere", 0, 0): a})  # fmt: skip
    finally:
        admin.close()
    assert refused[(TOPIC, 0, 0)] is kafka_errors.LogDirNotFoundError
    assert refused[("nowhere", 0, 0)] is kafka_errors.UnknownTopicOrPartitionError
    assert producing.failed == []
    assert dirs_holding(broker.bootstrap) == {a: [], b: [0]}
    assert not (tmp_path / "a" / f"{TOPIC}-0").exists()
    check_exactly_once_after_restart(broker, producing.acked)
    assert dirs_holding(broker.bootstrap) == {a: [], b: [0]}


def test_kafka_reassign_partitions_moves_a_partition_between_log_dirs(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("Kafka's reassignment tool needs Java 17 and Maven")
    from tests.kafka_tools import tool
    from tests.kafka_tools.classpath import kafka_tools_classpath

    classpath = kafka_tools_classpath(tmp_path / "kafka-tools")
    b = str(tmp_path / "b")
    create_topic(broker.bootstrap)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": 0, "replicas": [0], "log_dirs": [b]}]}))  # fmt: skip
    with KeepProducing(broker.bootstrap) as producing:
        producing.wait_for(100)
        for action in ("--execute", "--verify"):
            run = tool.run_tool(classpath, "reassign.ReassignPartitionsCommand",
                                "--bootstrap-server", broker.bootstrap,
                                "--reassignment-json-file", str(plan), action)  # fmt: skip
        producing.wait_for(len(producing.acked) + 100)
    assert "is completed" in run.stdout, run.stdout
    assert producing.failed == []
    assert dirs_holding(broker.bootstrap)[b] == [0]
    check_exactly_once_after_restart(broker, producing.acked)
