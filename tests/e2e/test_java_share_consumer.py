"""The Java share consumer (KIP-932, kafka-clients 4.x ``KafkaShareConsumer``).

Runs the JUnit class ``ShareConsumerTest`` of tests/jvm alone (``-Dtest``), against a
broker whose acquisition locks last a few seconds (the full Java run, test_java_client.py,
leaves it out): two members of a share group split a topic's records, each delivered once;
a record whose lock runs out goes to the other member with delivery count 2; released
records come back, rejected ones do not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_fetch_sessions import MetricsBroker, running_metrics_broker
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S, run_maven

LOCK_MS = 4000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MetricsBroker]:
    with running_metrics_broker(
        tmp_path,
        f'"group.share.record.lock.duration.ms" = {LOCK_MS}\n'
        '"group.share.heartbeat.interval.ms" = 1000\n',
    ) as process:
        yield process


@pytest.mark.timeout(MAVEN_TIMEOUT_S + 60)
def test_the_java_share_consumer(broker: MetricsBroker) -> None:
    totals = run_maven({
        "test": "ShareConsumerTest",
        "bootstrap": broker.bootstrap,
        "share.lock.ms": LOCK_MS,
    })  # fmt: skip
    assert totals == {"tests": 3, "failures": 0, "errors": 0, "skipped": 0}, (
        totals, broker.log_tail(),
    )  # fmt: skip
