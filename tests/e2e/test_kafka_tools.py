"""Kafka's own test tools against trio-broker ([jvm] §4).

What Kafka's system tests drive — VerifiableProducer, VerifiableConsumer,
ProducerPerformance, ConsumerPerformance from org.apache.kafka:kafka-tools 4.4.0 — run
unchanged against a `trio-broker serve` process. The verifiable pair is the check: an
idempotent acks=all producer keeps sending while the broker is killed with -9 and
restarted, and afterwards every record the producer reported acknowledged is consumed,
none twice.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from tests.kafka_tools import tool as kafka_tool
from tests.kafka_tools.tool import tool_argv as tool

pytestmark = pytest.mark.timeout(300)


tools_classpath = kafka_tool.tools_classpath


class JsonLines:
    """Reads a tool's JSON lines from its stdout in a thread."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self.events = proc, []  # type: list[dict[str, Any]]
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(b"{"):
                self.events.append(json.loads(line))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("name") == name]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data") as process:
        yield process


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    [future] = admin.create_topics([NewTopic(name, num_partitions=partitions)]).values()
    future.result(timeout=60)


def test_every_acknowledged_record_is_consumed_once_across_a_kill_9(
    broker: BrokerProcess, tools_classpath: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, "verifiable", 3)
    config = tmp_path / "producer.properties"
    config.write_text(
        # The tool sets retries=0 unless told otherwise; idempotence needs retries.
        "enable.idempotence=true\nacks=all\nretries=2147483647\ndelivery.timeout.ms=120000\n"
        "request.timeout.ms=5000\nretry.backoff.ms=100\nreconnect.backoff.max.ms=500\n"
    )
    total = 4000
    producer = subprocess.Popen(
        tool(tools_classpath, "VerifiableProducer", "--topic", "verifiable",
             "--max-messages", str(total), "--throughput", "800",
             "--command-config", str(config), "--bootstrap-server", broker.bootstrap),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out = JsonLines(producer)
        deadline = time.monotonic() + 60
        while len(out.named("producer_send_success")) < total // 3:
            assert producer.poll() is None, f"the producer exited with {producer.returncode}"
            assert time.monotonic() < deadline, "the producer did not get going"
            time.sleep(0.05)
        broker.kill9()  # mid-stream: acked records must survive, unacked ones are retried
        time.sleep(1.0)  # the outage (a fault's shape, not a wait for a condition)
        broker.start()
        assert producer.wait(timeout=150) == 0
        out.thread.join(timeout=10)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    acked = {e["value"] for e in out.named("producer_send_success")}
    errors = out.named("producer_send_error")
    [summary] = out.named("tool_data")
    assert not errors, errors[:3]
    assert summary["sent"] == summary["acked"] == total == len(acked)

    consumer = subprocess.Popen(
        tool(tools_classpath, "VerifiableConsumer", "--topic", "verifiable",
             "--group-id", "verifier", "--max-messages", str(total), "--verbose",
             "--reset-policy", "earliest", "--bootstrap-server", broker.bootstrap),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        seen = JsonLines(consumer)
        assert consumer.wait(timeout=120) == 0
        seen.thread.join(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    values = [e["value"] for e in seen.named("record_data")]
    assert len(values) == len(set(values)), "a record was consumed twice"
    assert set(values) == acked, f"{len(acked - set(values))} acknowledged records missing"
    committed = seen.named("offsets_committed")
    assert committed and all(c["success"] for c in committed)


def test_producer_and_consumer_performance_tools(
    broker: BrokerProcess, tools_classpath: str
) -> None:
    create_topic(broker.bootstrap, "perf", 2)
    produced = subprocess.run(
        tool(tools_classpath, "ProducerPerformance", "--topic", "perf", "--num-records",
             "20000", "--record-size", "100", "--throughput", "-1", "--producer-props",
             f"bootstrap.servers={broker.bootstrap}", "acks=all"),
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-2000:]
    final = produced.stdout.decode().strip().splitlines()[-1]
    assert final.startswith("20000 records sent"), final
    consumed = subprocess.run(
        tool(tools_classpath, "ConsumerPerformance", "--topic", "perf", "--num-records",
             "20000", "--timeout", "60000", "--bootstrap-server", broker.bootstrap),
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    header, row = consumed.stdout.decode().strip().splitlines()[-2:]
    columns = dict(zip([c.strip() for c in header.split(",")], row.split(","), strict=False))
    assert int(columns["data.consumed.in.nMsg"]) == 20000, columns


class ConfiguredBroker(BrokerProcess):
    """A broker process with a ``--config`` file."""

    def __init__(self, data_dir: Path, config: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.config = config

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.config)]


def test_kafka_configs_describes_what_a_topic_inherits(
    tmp_path: Path, tools_classpath: str
) -> None:
    """kafka-configs (ConfigCommand) --describe --all prints a topic's inherited values
    with Kafka's sources and synonyms: the config file's min.insync.replicas=2 and
    log.retention.hours=1, as a Kafka broker with the same file would."""
    config = tmp_path / "server.properties"
    config.write_text("min.insync.replicas=2\nlog.retention.hours=1\n")
    process = ConfiguredBroker(tmp_path / "data", config)
    process.start()
    try:
        create_topic(process.bootstrap, "described", 1)
        described = subprocess.run(
            tool(tools_classpath, "ConfigCommand", "--bootstrap-server", process.bootstrap,
                 "--describe", "--entity-type", "topics", "--entity-name", "described", "--all"),
            capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        process.stop()
    assert described.returncode == 0, described.stderr[-2000:]
    lines = {
        line.strip().split("=", 1)[0]: line.strip()
        for line in described.stdout.decode().splitlines()
    }
    assert lines["min.insync.replicas"] == (
        "min.insync.replicas=2 sensitive=false synonyms={STATIC_BROKER_CONFIG:"
        "min.insync.replicas=2, DEFAULT_CONFIG:min.insync.replicas=1}"
    )
    assert lines["retention.ms"] == (
        "retention.ms=3600000 sensitive=false synonyms={STATIC_BROKER_CONFIG:"
        "log.retention.hours=1, DEFAULT_CONFIG:log.retention.hours=168}"
    )
    assert lines["cleanup.policy"] == (
        "cleanup.policy=delete sensitive=false synonyms={DEFAULT_CONFIG:log.cleanup.policy=delete}"
    )
