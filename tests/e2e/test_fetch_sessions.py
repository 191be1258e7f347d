"""kafka-python consumes through incremental fetch sessions (KIP-227), over real sockets.

kafka-python (3.x) opens a fetch session per broker and then sends incremental
fetches; librdkafka and aiokafka fetch without sessions. The broker's side is read
from its /metrics (``--metrics-listen``): incremental fetches taken, sessions cached,
refusals per error. A consumer group of two kafka-python members reads a
four-partition topic through a rebalance (the second member joins) and a broker
restart (SIGTERM, same port and data dir); every record is read exactly once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_clients import create_topic
from tests.kafka_python_groups import knows_its_topics
from tests.waits import wait_until

TOPIC, PARTITIONS, GROUP = "sessions", 4, "session-readers"
PER_ROUND = 120
WAIT_S = 60.0


class MetricsBroker(BrokerProcess):
    """A broker that also serves /metrics on a free port (found again after a restart)."""

    def __init__(self, data_dir: Path, config: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.config = config

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.config),
                "--metrics-listen", "127.0.0.1:0"]  # fmt: skip


@contextlib.contextmanager
def running_metrics_broker(directory: Path, toml: str) -> Iterator[MetricsBroker]:
    """A :class:`MetricsBroker` with ``toml`` as its broker.toml, in ``directory``;
    stopped at the end, and it must stop cleanly."""
    config = directory / "broker.toml"
    config.write_text(toml)
    process = MetricsBroker(directory / "data", config)
    process.start()
    try:
        yield process
    finally:
        if process.running:
            assert process.stop() == 0, process.log_tail()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MetricsBroker]:
    with running_metrics_broker(tmp_path, '"group.initial.rebalance.delay.ms" = 0\n') as process:
        yield process


class Member:
    """A kafka-python group member in its own thread: poll, keep, commit, repeat."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.name = name
        self.consumer = knows_its_topics(KafkaConsumer(
            TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, client_id=name,
            enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=200,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000,
            reconnect_backoff_max_ms=500, request_timeout_ms=15_000,
        ))  # fmt: skip
        #: Values read and committed, in order.
        self.read: list[str] = []
        #: How many of ``read`` the thread has finished with (read and committed).
        self.committed = 0
        self.assigned: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                batches = self.consumer.poll(timeout_ms=200)
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
                if batches:
                    # Kept only once committed: a failed commit (the group forgot this
                    # member in the restart) means the records come again after rejoining.
                    self.consumer.commit()
                    for records in batches.values():
                        self.read.extend(r.value.decode() for r in records)
                self.committed = len(self.read)
            except Exception as exc:  # the broker restarting: try again, bounded by the test
                if self.stop.is_set():
                    break
                print(f"{self.name}: {type(exc).__name__}: {exc}")
                time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)
        self.consumer.close(autocommit=False)


def produce(bootstrap: str, first: int, count: int) -> list[str]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    values = [f"record-{i}" for i in range(first, first + count)]
    for i, value in enumerate(values):
        producer.produce(TOPIC, value=value.encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    return values


def test_kafka_python_reads_through_sessions_across_a_rebalance_and_a_restart(
    broker: MetricsBroker,
) -> None:
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    produced = produce(broker.bootstrap, 0, PER_ROUND)
    first = Member(broker.bootstrap, "member-1")
    members = [first]
    try:
        wait_until(lambda: first.committed == PER_ROUND, "member-1 to read round 1")
        # The broker took incremental fetches: one session, continued.
        assert broker.metric("trio_broker_fetch_sessions") >= 1
        incremental = broker.metric("trio_broker_incremental_fetches_total")
        assert incremental > 0

        # Rebalance: a second member joins; each then holds part of the topic.
        second = Member(broker.bootstrap, "member-2")
        members.append(second)
        wait_until(lambda: first.assigned and second.assigned
            and first.assigned | second.assigned == set(range(PARTITIONS))
            and not first.assigned & second.assigned, "the two members to share the partitions")  # fmt: skip
        produced += produce(broker.bootstrap, PER_ROUND, PER_ROUND)
        wait_until(lambda: first.committed + second.committed == 2 * PER_ROUND, "round 2")
        assert broker.metric("trio_broker_incremental_fetches_total") > incremental
        assert broker.metric("trio_broker_fetch_sessions") >= 2

        # Restart: the new process knows no sessions; the members open new ones.
        broker.restart()
        produced += produce(broker.bootstrap, 2 * PER_ROUND, PER_ROUND)
        wait_until(lambda: first.committed + second.committed == 3 * PER_ROUND, "round 3")
        wait_until(lambda: broker.metric("trio_broker_incremental_fetches_total") > 0, "incremental fetches after the restart")  # fmt: skip
        not_found = broker.metric(
            "trio_broker_fetch_session_errors_total", 'error="FETCH_SESSION_ID_NOT_FOUND"'
        )
        print(f"after the restart: FETCH_SESSION_ID_NOT_FOUND answered {not_found:.0f} times")
    finally:
        for member in members:
            member.close()
    read = first.read + members[-1].read if len(members) > 1 else first.read
    # Exactly once: nothing lost, nothing twice.
    assert sorted(read) == sorted(produced)
    assert len(set(read)) == len(read) == 3 * PER_ROUND
