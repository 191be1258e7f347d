"""Short soak in CI: 30 s of mixed load (bench/soak.py), no errors, no runaway memory.

The full soak is ``bench/soak.py`` (30 minutes by default; ``--minutes 2`` for
the short run recorded in docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import run_soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_short_soak(tmp_path: Path) -> None:
    summary = run_soak(tmp_path, minutes=0.5, interval=3.0, rate=300.0, idle=50)
    print({k: v for k, v in summary.items() if k != "table"})
    assert summary["samples"] >= 8
    assert summary["acked"] > 3000
    assert summary["failed"] == 0, summary["errors"]
    assert summary["churn_errors"] == 0, summary["errors"]
    assert summary["commit_errors"] == 0
    assert summary["connections_churned"] > 50
    assert summary["rss_mib_max"] < summary["rss_mib_first"] + 32
