"""Capture switched on and off while the broker runs: only the frames in between are captured.

A real ``trio-broker serve --capture DIR --capture-paused`` subprocess; one
confluent-kafka producer keeps its connection across the three phases. Capture
goes on through ``trio-broker capture on`` (POST /capture/on on the metrics
listener) and off through SIGUSR1.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="the verify extra (pyarrow) is not installed")

from tests.verify.helpers import CapturingBroker, read_capture
from trio_broker.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOPIC = "toggle"
PER_PHASE = 3
SWITCH_TIMEOUT_S = 10.0


def _status(address: str, capsys: pytest.CaptureFixture[str], action: str = "status") -> str:
    assert main(["capture", action, "--metrics", address]) == 0
    state: str = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["capture"]
    return state


def _produce(producer: Any, phase: str) -> None:
    for i in range(PER_PHASE):
        producer.produce(TOPIC, f"phase-{phase}-{i}".encode())
        assert producer.flush(10) == 0


def test_capture_toggled_at_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Producer

    capture_dir = tmp_path / "capture"
    broker = CapturingBroker(
        tmp_path / "data", capture_dir,
        ["--capture-paused", "--capture-records", "full", "--metrics-listen", "127.0.0.1:0"],
    )  # fmt: skip
    try:
        metrics = f"127.0.0.1:{broker.metrics_port}"
        assert broker.metrics_port, broker.log()
        assert _status(metrics, capsys) == "off"
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        _produce(producer, "A")
        assert _status(metrics, capsys, "on") == "on"
        _produce(producer, "B")
        broker.proc.send_signal(signal.SIGUSR1)  # toggles: off
        deadline = time.monotonic() + SWITCH_TIMEOUT_S
        while _status(metrics, capsys) != "off" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _status(metrics, capsys) == "off", broker.log()
        _produce(producer, "C")
        del producer
    finally:
        assert broker.stop() == 0, broker.log()

    table = read_capture(capture_dir)
    produce_requests = [
        row["frame"]
        for row in table.to_pylist()
        if row["api_key"] == 0 and row["direction"] == "request"
    ]
    seen = {
        (phase, i)
        for frame in produce_requests
        for phase in "ABC"
        for i in range(PER_PHASE)
        if f"phase-{phase}-{i}".encode() in frame
    }
    assert seen == {("B", i) for i in range(PER_PHASE)}
    # Every captured Produce request got its response captured too (same correlation ids).
    responses = {
        row["correlation_id"]
        for row in table.to_pylist()
        if row["api_key"] == 0 and row["direction"] == "response"
    }
    requests = {
        row["correlation_id"]
        for row in table.to_pylist()
        if row["api_key"] == 0 and row["direction"] == "request"
    }
    assert requests == responses and len(requests) == PER_PHASE
    stats = [json.loads(p.read_text()) for p in capture_dir.glob("*.stats.json")]
    assert [s["switched"] for s in stats] == [2]
    assert main(["capture", "status", "--metrics", metrics]) == 1  # the broker is gone
