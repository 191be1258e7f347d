"""``trio-broker serve`` sets its process's garbage-collector policy
(trio_broker/server/gc_policy.py) and reports the collector in /metrics: a raised young
threshold and the start-up objects frozen by default, another threshold or Python's own
settings from ``TRIO_BROKER_GC_GEN0_THRESHOLD``, a clear refusal of a bad value."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.broker_fork import start_broker
from tests.e2e.conftest import BROKER_EXE, STOP_TIMEOUT_S, BrokerProcess
from trio_broker.server.gc_policy import DEFAULT_GEN0_THRESHOLD, GEN0_THRESHOLD_ENV

TOPIC = "gc-policy"
#: Starts a broker with this TRIO_BROKER_GC_GEN0_THRESHOLD (None: unset).
StartBroker = Callable[[str | None], "MetricsBroker"]


class MetricsBroker(BrokerProcess):
    """A broker that also serves /metrics on a free port."""

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--metrics-listen", "127.0.0.1:0"]


@pytest.fixture
def broker_with_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StartBroker]:
    started: list[MetricsBroker] = []

    def start(threshold: str | None) -> MetricsBroker:
        if threshold is None:
            monkeypatch.delenv(GEN0_THRESHOLD_ENV, raising=False)
        else:
            monkeypatch.setenv(GEN0_THRESHOLD_ENV, threshold)
        broker = MetricsBroker(tmp_path / f"data-{len(started)}", "pipelined", "file")
        started.append(broker)
        broker.start()
        return broker

    yield start
    for broker in started:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


def _pythons_own_threshold() -> int:
    """The young threshold a fresh interpreter of this Python starts with."""
    out = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return int(out.stdout)


def test_serve_raises_the_young_threshold_and_freezes_what_start_up_made(
    broker_with_env: StartBroker,
) -> None:
    broker = broker_with_env(None)
    assert broker.metric("trio_broker_gc_gen0_threshold") == DEFAULT_GEN0_THRESHOLD
    # The imports alone are tens of thousands of containers.
    assert broker.metric("trio_broker_gc_frozen_objects") > 10_000

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(500):
        producer.produce(TOPIC, value=b"x" * 100, key=str(i).encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    # Each collection since the policy was set is timed, and counted by the collector too.
    for generation in ("0", "1", "2"):
        labels = f'generation="{generation}"'
        timed = broker.metric("trio_broker_gc_pause_seconds_count", labels)
        counted = broker.metric("trio_broker_gc_collections_total", labels)
        assert 0 <= timed <= counted, (generation, timed, counted)
        inf_bucket = broker.metric("trio_broker_gc_pause_seconds_bucket", labels + ',le="+Inf"')
        assert inf_bucket == timed


def test_the_environment_sets_another_threshold_or_pythons_own(
    broker_with_env: StartBroker,
) -> None:
    chosen = broker_with_env("2500")
    assert chosen.metric("trio_broker_gc_gen0_threshold") == 2500
    assert chosen.metric("trio_broker_gc_frozen_objects") > 10_000

    pythons = broker_with_env("python")
    assert pythons.metric("trio_broker_gc_gen0_threshold") == _pythons_own_threshold()
    assert pythons.metric("trio_broker_gc_frozen_objects") == 0


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1e4"])
def test_a_bad_threshold_is_refused_before_the_broker_starts(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GEN0_THRESHOLD_ENV, value)
    data_dir = tmp_path / "data"
    proc = start_broker(
        [str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert proc.wait(STOP_TIMEOUT_S) == 2, err
    assert f"{GEN0_THRESHOLD_ENV}={value!r}: expected a whole number >= 1" in err
    assert "listening on" not in err
    assert not data_dir.exists()  # nothing was started, nothing written
