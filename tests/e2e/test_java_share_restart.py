"""The Java share consumer across a broker restart (``__share_group_state``).

Runs ``tests/jvm``'s ``ShareRestartTest`` in two Maven runs around a ``kill -9`` and
restart of a broker process with a data dir: before, a ``KafkaShareConsumer`` accepts half
of its first poll and its JVM exits holding the rest; after, a new member of the group gets
every other record once, those held before with delivery count 2 (locks are not durable,
delivery counts are), and never an accepted one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S, run_maven


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process: BrokerProcess
    with running_broker(tmp_path / "data") as process:
        yield process


@pytest.mark.timeout(2 * MAVEN_TIMEOUT_S + 60)
def test_the_java_share_consumer_across_a_kill_9(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = f"share-restart-{uuid.uuid4().hex[:8]}", f"sg-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
    # share.lock.ms: the broker's default lock (ShareConsumerTest's helpers read it).
    properties = {"share.topic": topic, "share.group": group, "share.lock.ms": 30_000,
                  "share.state.file": tmp_path / "seen.txt"}  # fmt: skip
    ok = {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}
    before = run_maven({"test": "ShareRestartTest#beforeTheRestart",
                        "bootstrap": broker.bootstrap, **properties})  # fmt: skip
    assert before == ok, (before, broker.log_tail())
    broker.kill9()
    broker.start()
    after = run_maven({"test": "ShareRestartTest#afterTheRestart",
                       "bootstrap": broker.bootstrap, **properties})  # fmt: skip
    assert after == ok, (after, broker.log_tail())
