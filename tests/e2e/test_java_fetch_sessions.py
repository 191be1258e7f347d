"""The Java consumer (kafka-clients 4.x) reads through incremental fetch sessions.

Runs the JUnit class ``FetchSessionTest`` of tests/jvm alone (``-Dtest``), against a
broker with a metrics listener (the full Java run, test_java_client.py, leaves it out):
two consumers of one group read a topic through a rebalance, every record once, while
the broker's ``trio_broker_incremental_fetches_total`` grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import METRICS_LINE
from tests.e2e.test_fetch_sessions import MetricsBroker, running_metrics_broker
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S, run_maven
from tests.waits import wait_until


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MetricsBroker]:
    with running_metrics_broker(tmp_path, '"group.initial.rebalance.delay.ms" = 0\n') as process:
        yield process


@pytest.mark.timeout(MAVEN_TIMEOUT_S + 60)
def test_the_java_consumer_reads_through_fetch_sessions(broker: MetricsBroker) -> None:
    port = wait_until(lambda: METRICS_LINE.findall(broker.current_log()), "metrics port")[-1]
    totals = run_maven({
        "test": "FetchSessionTest",
        "bootstrap": broker.bootstrap,
        "metrics.url": f"http://127.0.0.1:{port}/metrics",
    })  # fmt: skip
    assert totals == {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}, totals
    assert broker.metric("trio_broker_incremental_fetches_total") > 0
