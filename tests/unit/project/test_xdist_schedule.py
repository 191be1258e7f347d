"""The xdist schedule (tests/scheduling.py): longest files first, Spark modules as one unit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.scheduling import SPARK_UNIT, UNKNOWN_TEST_SECONDS, longest_first, scope_of

ROOT = Path(__file__).resolve().parents[3]


def test_spark_modules_share_one_unit_and_other_files_keep_their_own() -> None:
    assert scope_of("tests/verify/test_verify_txn.py::test_a") == SPARK_UNIT
    assert scope_of("tests/spark/test_spark_kafka.py::test_b[x]") == SPARK_UNIT
    assert scope_of("tests/reliability/test_crash_loop_verify.py::test_c") == SPARK_UNIT
    assert scope_of("tests/cluster/test_jepsen.py::test_f") == SPARK_UNIT
    assert (
        scope_of("tests/cluster/test_cluster_e2e.py::test_g") == "tests/cluster/test_cluster_e2e.py"
    )
    assert (
        scope_of("tests/reliability/test_crash_loop.py::test_d")
        == "tests/reliability/test_crash_loop.py"
    )
    assert scope_of("tests/unit/x/test_y.py::TestZ::test_e") == "tests/unit/x/test_y.py"


def test_units_go_longest_first_and_unrecorded_files_are_estimated_by_test_count() -> None:
    units = {
        "a.py": ["a.py::t1", "a.py::t2"],  # recorded: 10 s
        "b.py": ["b.py::t1"],  # recorded: 100 s
        "new.py": [f"new.py::t{i}" for i in range(50)],  # unrecorded: 50 tests
        SPARK_UNIT: ["tests/verify/v.py::t", "tests/spark/s.py::t"],  # 30 + 40 s
    }
    seconds = {"a.py": 10.0, "b.py": 100.0, "tests/verify/v.py": 30.0, "tests/spark/s.py": 40.0}
    assert 50 * UNKNOWN_TEST_SECONDS == 25.0
    assert longest_first(units, seconds) == ["b.py", SPARK_UNIT, "new.py", "a.py"]


def test_a_run_on_two_workers_runs_every_test_once(tmp_path: Path) -> None:
    # A throwaway project whose conftest loads the plugin, run on two xdist workers.
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.scheduling"]\n')
    for name, count in (("test_many.py", 30), ("test_one.py", 1), ("test_few.py", 3)):
        body = "".join(f"def test_{i}():\n    pass\n" for i in range(count))
        (tmp_path / name).write_text(body)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,  # a bound on a hang: two xdist workers start slowly on a loaded machine
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "34 passed" in result.stdout, result.stdout
