"""Crash loop in CI: 8 kill -9s of the broker under acks=all load, then a full audit.

The harness is ``bench/crash_loop.py`` (run it directly for 20+ kills): a plain
and an idempotent confluent-kafka producer (acks=all) and a consumer group
committing offsets run while the broker is SIGKILLed and restarted at random
moments. Afterwards: zero acknowledged records lost or misplaced, zero
duplicates from the idempotent producer (the plain producer's are counted),
order kept per partition, committed offsets never below an acknowledged commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crash_loop import run_crash_loop

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_crash_loop(tmp_path: Path) -> None:
    result = run_crash_loop(tmp_path, kills=8, seed=9, uptime=(1.0, 3.0), rate=150.0)
    print(result.summary())
    assert result.kills == 8 and result.restarts == 8
    assert result.commit_checks >= 6, "committed offsets were rarely readable after restart"
    for name in ("plain", "idem"):
        assert result.acked[name] > 500, f"{name}: too little load was acknowledged"
        assert result.lost[name] == 0, result.summary()
        assert result.misplaced[name] == 0, result.summary()
        assert result.order_violations[name] == 0, result.summary()
    assert result.duplicated["idem"] == 0, result.summary()
    assert not result.fatal_errors, result.summary()
    assert not result.committed_backwards, result.summary()
    assert result.final_committed, "no committed offsets at the end"
