"""``trio-broker serve --log-format json``: every broker log line is one JSON object.

A real ``serve`` subprocess (tests/e2e/conftest.py's BrokerProcess) with
``request.log.slow.ms = 1`` in its config file; confluent-kafka produces and then
reads with a long poll, which is always slower than 1 ms, so slow-request lines
appear. The broker is stopped (SIGTERM, exit 0) before its log is read whole.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.e2e.conftest import BrokerProcess

TOPIC = "json-logs"
RECORDS = 20
REQUEST_FIELDS = {
    "api", "api_key", "version", "correlation_id", "client_id", "client", "principal",
    "total_ms", "queue_ms", "handler_ms", "wait_ms", "throttle_ms",
}  # fmt: skip


class JsonLogBroker(BrokerProcess):
    def __init__(self, data_dir: Path, log_format: str | None) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.log_format = log_format
        self.config_path = data_dir.parent / "broker.toml"
        self.config_path.write_text('"request.log.slow.ms" = 1\n"num.partitions" = 1\n')

    def command_line(self) -> list[str]:
        flag = [] if self.log_format is None else ["--log-format", self.log_format]
        return [*super().command_line(), "--config", str(self.config_path), *flag]


def produce_and_read(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "client.id": "json-test"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"x%d" % i)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got = 0
        # A deadline, not a count of polls: on a loaded machine the consumer's start
        # (metadata, offsets, the first fetch) can outlast 100 polls of 0.1 s.
        deadline = time.monotonic() + 60
        while got < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got += 1
        assert got == RECORDS
        assert consumer.poll(1.0) is None  # at least one full long poll (500 ms)
    finally:
        consumer.close()


def run_broker(tmp_path: Path, log_format: str | None) -> str:
    broker = JsonLogBroker(tmp_path / "data", log_format)
    broker.start()
    try:
        produce_and_read(broker.bootstrap)
    finally:
        assert broker.stop() == 0
    # The harness adds its own "===== e2e: ..." marker lines to the same file.
    return "".join(
        line for line in broker.log_text().splitlines(keepends=True) if not line.startswith("=")
    )


def test_json_log_lines_and_slow_requests(tmp_path: Path) -> None:
    lines = run_broker(tmp_path, "json").splitlines()
    entries = [json.loads(line) for line in lines]  # every line parses
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert entry["time"].endswith("Z")
    assert any(e["message"].startswith("listening on 127.0.0.1:") for e in entries)
    slow = [e for e in entries if e["logger"] == "trio_broker.requests"]
    assert slow, "no slow-request line"
    for entry in slow:
        assert entry.keys() >= REQUEST_FIELDS, entry
        assert entry["level"] == "INFO"
        assert entry["principal"] == "User:ANONYMOUS"
        assert entry["client"].startswith("127.0.0.1:")
        assert entry["total_ms"] >= 1
        assert entry["message"].startswith(f"slow request api={entry['api']} ")
    fetches = [e for e in slow if e["api"] == "fetch" and e["client_id"] == "rdkafka"]
    assert fetches, sorted({(e["api"], e["client_id"]) for e in slow})
    assert max(e["wait_ms"] for e in fetches) >= 100  # a long poll that found nothing


def test_text_log_is_the_default_format(tmp_path: Path) -> None:
    text = run_broker(tmp_path, None)  # no --log-format flag
    slow = [line for line in text.splitlines() if " trio_broker.requests: slow request " in line]
    assert slow
    assert all(" principal=User:ANONYMOUS " in line for line in slow)
    assert not any(line.startswith("{") for line in text.splitlines())
