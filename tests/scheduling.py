"""The xdist schedule of ``scripts/test.sh``: whole files, longest first, Spark on one worker.

xdist's ``--dist loadfile`` keeps a file's tests on one worker (module fixtures such as a
cluster start once), but it hands files out by test count, largest first. A file of
2,000 one-millisecond unit tests then goes first and the 140-second Jepsen run, one
test, goes last, so one worker runs it alone while the other has nothing left: the
run ends later than the work needs. This plugin keeps the file grouping and changes
two things:

* files are handed out longest first (the classic longest-processing-time rule), by
  the seconds recorded in ``tests/durations.json``; a file not recorded there (a new
  one) is estimated from its test count;
* every module that verifies on a Spark session (``SPARK_MODULES``) is one unit, so one
  worker starts the JVM once (tests/spark_session.py shares the session within a
  process) instead of each worker starting its own, and every job after the first
  runs on a warm JVM.

Refresh the recorded seconds after a full run (scripts/test.sh leaves its JUnit report
outside the repo)::

    .venv/bin/python tools/test_durations.py ~/.cache/trio-broker/junit-last.xml

Stale numbers cost only balance, never correctness: every collected test still runs
exactly once. Root conftest.py loads this plugin; without xdist it does nothing.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

DURATIONS_FILE = Path(__file__).with_name("durations.json")

#: Modules that start a local Spark session; scheduled together as one unit.
SPARK_MODULES = (
    "tests/verify/",
    "tests/spark/",
    "tests/reliability/test_crash_loop_verify.py",
    "tests/cluster/test_jepsen.py",
)
SPARK_UNIT = "<spark modules>"

#: The estimate for a test in a file with no recorded time (most new files are unit tests).
UNKNOWN_TEST_SECONDS = 0.5


def recorded_seconds() -> dict[str, float]:
    """File path -> seconds its tests took in the last recorded run (setup and teardown included)."""
    try:
        data = json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("files", {}).items()}


def scope_of(nodeid: str) -> str:
    """The unit a test is scheduled in: its file, or the one Spark unit."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(SPARK_MODULES):
        return SPARK_UNIT
    return path


def longest_first(units: dict[str, list[str]], seconds: dict[str, float]) -> list[str]:
    """The units in the order to hand them out: the longest expected first."""

    def expected(unit: str) -> float:
        files = {nodeid.split("::", 1)[0] for nodeid in units[unit]}
        total = 0.0
        for path in files:
            if path in seconds:
                total += seconds[path]
            else:
                total += UNKNOWN_TEST_SECONDS * sum(1 for n in units[unit] if n.startswith(path))
        return total

    return sorted(units, key=lambda unit: (-expected(unit), unit))


def make_scheduler_class() -> Any:
    from xdist.scheduler import LoadFileScheduling

    class LongestFirstFileScheduling(LoadFileScheduling):  # type: ignore[misc]
        """``loadfile`` with Spark modules grouped and units ordered longest first."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The queue is built and handed out inside one ``schedule`` call; order it
            # just before the first unit leaves. Only the queue is reordered: workers
            # address tests by their index in their own collection, which stays as is.
            if not getattr(self, "_ordered", False):
                self._ordered = True
                units = {unit: list(tests) for unit, tests in self.workqueue.items()}
                order = longest_first(units, recorded_seconds())
                self.workqueue = OrderedDict((unit, self.workqueue[unit]) for unit in order)
            super()._assign_work_unit(node)

    return LongestFirstFileScheduling


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadfile":
        return None
    return make_scheduler_class()(config, log)
