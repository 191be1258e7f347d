"""Crash loop with capture in CI: 3 kill -9s, then ``trio-broker verify`` on the capture.

Every broker incarnation runs with ``serve --capture`` into one directory (each
writes its own ``capture-b0-<start>-*.parquet`` run); the last one, which serves
the harness's final full read, is stopped with SIGTERM. ``trio-broker verify`` (in
this process, on the worker's shared Spark session: tests/spark_session.py) must then
pass, next to the harness's own audit. A Parquet file torn by a kill is left as
``*.parquet.tmp`` (the tap writes, then renames): one is planted here and must be
counted and ignored; so is a truncated ``*.parquet``, which verify must skip with a
warning rather than crash.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

from bench.crash_loop import run_crash_loop, verify_capture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]


def test_crash_loop_capture_verifies(tmp_path: Path, spark: Any) -> None:
    result = run_crash_loop(
        tmp_path, kills=3, seed=9, uptime=(1.0, 2.0), rate=100.0, capture=True, verify=False
    )
    print(result.summary())
    assert result.kills == 3 and result.restarts == 3
    assert not result.problems(), result.summary()
    for name in ("plain", "idem"):
        assert result.acked[name] > 100, f"{name}: too little load was acknowledged"
    capture = tmp_path / "capture"
    files = sorted(capture.glob("*.parquet"))
    assert files, "no capture files"
    # A kill that lands while the tap writes a file leaves a torn one of its own.
    torn_by_kills = len(list(capture.glob("*.parquet.tmp")))
    half = files[0].read_bytes()[: files[0].stat().st_size // 2]
    # What a kill during a flush leaves behind: half a Parquet file under the temporary name.
    (capture / (files[0].name.rsplit("-", 1)[0] + "-999999.parquet.tmp")).write_bytes(half)
    # What an OS crash could leave (renamed before the data reached the disk): verify must
    # skip it with a warning, not fail. A run of its own, so that no other data is missing.
    (capture / "capture-b0-1-000000.parquet").write_bytes(half)

    verdict = verify_capture(capture, tmp_path / "verify-report", spark=spark)
    result.verify = verdict
    print(verdict.summary())
    assert verdict.exit_code == 0 and verdict.ok, result.summary()
    # One run per start (4, plus the planted one); a start killed before its first
    # flush (1 s) leaves none.
    assert 3 <= verdict.incarnations <= 5, verdict.summary()
    assert verdict.closed_cleanly >= 1, "the last incarnation's capture was not closed"
    assert verdict.torn_files == torn_by_kills + 1, verdict.summary()
    assert verdict.unreadable_files == 1 and verdict.skipped_by_verify == 1, verdict.summary()
    assert verdict.acknowledged_batches > 0 and verdict.frames > 0, verdict.summary()
    assert verdict.acked_records_captured > 0, verdict.summary()
    assert all(n == 0 for n in verdict.violations.values()), verdict.summary()
