"""The Jepsen-style run (tests/cluster/jepsen.py), 2 minutes of faults, checked twice.

A seeded schedule of kill -9, SIGSTOP/SIGCONT and network partitions (through the fault
proxies) hits a 3-broker cluster while idempotent acks=all producers and a consumer
group work; then every acknowledged record must be read back exactly once in order,
and ``trio-broker verify`` over the captures of all three brokers must pass.
``bench/jepsen.py --minutes 30`` is the long version.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.jepsen import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_jepsen_style_run_loses_nothing_acknowledged(tmp_path: Path, zookeeper: str) -> None:
    # Seed 27's 2 minutes (the issue's CI length): leaders cut off from their followers
    # (3), followers cut off (2), a broker cut off from ZooKeeper past its session (it
    # fences itself), kill -9 (3), every replication connection reset.
    seed = int(os.environ.get("JEPSEN_SEED", "27"))
    figures = run(tmp_path, zookeeper, duration_s=120, seed=seed)
    assert figures["faults_injected"], "the schedule injected nothing"
    assert figures["records_acked"] > 1000, figures
    assert figures["lost"] == 0, figures["lost_examples"]
    assert figures["duplicates"] == 0 and figures["moved"] == 0, figures
    assert not figures["reordered_partitions"], figures
    assert figures["verify_exit_code"] == 0, figures["verify_summary"]
