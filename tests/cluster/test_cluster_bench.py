"""bench/cluster_bench.py end to end in its smallest run, against both clusters.

``trio-broker cluster up --brokers 3`` (twice: fsync and replication-only) and a 3-node
Kafka 4.4 KRaft cluster (its default; the flush-every-message variant differs by one key,
which tests/e2e/test_bench_shared_config.py has Kafka check, and would add ~25 s) each
take W1 and W6 on an RF=3 topic with a few records. Checked: every mode ran both
workloads with every record acknowledged, CPU was read from three broker processes, and
the JSON and the table carry the ratio. No timing is asserted. Skips when Kafka's jars
cannot be had (no Java, or no Maven and nothing cached), as the other Kafka peer tests do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import kafka_peer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
MODES = ["trio_fsync", "trio_replication", "kafka"]


def _need_kafka() -> None:
    resolved = (kafka_peer.cache_dir() / "resolved").exists()
    if shutil.which("java") is None or (shutil.which("mvn") is None and not resolved):
        pytest.skip("Java and Maven are needed for Kafka's jars (scripts/install-system-deps.sh)")


def test_cluster_bench_smallest_run(tmp_path: Path) -> None:
    _need_kafka()
    out = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cluster_bench.py"), "--w1-records", "16",
         "--w6-records", "16", "--limits-seconds", "0", "--modes", ",".join(MODES),
         "--data-parent", str(tmp_path), "--time-limit", "240", "--json", str(out)],
        capture_output=True, text=True, timeout=280, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    figures = json.loads(out.read_text()) if out.exists() else {}
    if figures.get("kafka_unavailable"):
        pytest.skip(str(figures["kafka_unavailable"]))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert set(figures["modes"]) == set(MODES)
    for mode, workloads in figures["modes"].items():
        assert workloads["broker_processes"] == 3, (mode, workloads)
        for name in ("w1", "w6"):
            result = workloads[name]
            assert result["records"] == 16, (mode, name, result)
            assert result["errors"] == 0 and result["undelivered"] == 0, (mode, name, result)
            assert result["broker_cpu_s"] >= 0, (mode, name, result)
        if mode.startswith("kafka"):  # three JVMs always spend some
            assert workloads["w1"]["broker_cpu_s"] > 0, (mode, workloads)
    assert set(figures["ratios"]) == {"w1:trio_replication/kafka", "w6:trio_replication/kafka"}
    for mode in MODES:
        assert f"| W1 | {mode} |" in run.stdout and f"| W6 | {mode} |" in run.stdout
    # Every cluster's temporary data dir is gone.
    assert [p.name for p in tmp_path.iterdir()] == ["figures.json"]
