"""One local[2] Spark session per test process, shared by every module that verifies in-process.

A session starts in 7-10 s (more on a busy machine), and a fresh JVM runs its first
job several times slower than a warm one (its code not compiled yet). Each verify
module used to start its own, and tests/cluster/test_jepsen.py and
tests/reliability/test_crash_loop_verify.py ran ``trio-broker verify`` as a subprocess
(a JVM each); CI runs the suite with ``--dist loadfile`` and tests/scheduling.py keeps
every Spark-backed module on one worker, so the session starts once, on first use of
the ``spark`` fixture, and stops when the worker ends. Root conftest.py loads this
plugin.

A test stopped by pytest-timeout inside a Spark call is not stopped at all: pyspark's
clean-up makes another call, which waits behind the running job; and once the job
ends, py4j's connection is one answer behind, so every later call on that session
reads the answer meant for the one before it (``'int' object has no attribute ...``).
One slow test turned every later Spark test of its worker red (ci14). So a watchdog
kills the session's JVM 15 s before pytest-timeout would fire: the test fails at once
with py4j's connection error and the watchdog's message, and the fixture, which hands
out a proxy rather than the session, gives the next test a fresh session. A timeout
stays one failure.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest


class SparkHolder:
    """The worker's Spark session, replaced after a test timed out in it."""

    def __init__(self) -> None:
        self.session: Any = None
        self.broken = False

    def current(self) -> Any:
        if self.broken:
            self.discard()
        if self.session is None:
            from trio_broker.verify.job import spark_session

            self.session = spark_session("local[2]")
        return self.session

    def discard(self) -> None:
        """Kill the session's JVM without talking to it (its connection is out of step)."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.kill()
            proc.wait()
        if gateway is not None:
            gateway.close()
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
        self.session, self.broken = None, False

    def stop(self) -> None:
        if self.session is not None and not self.broken:
            self.session.stop()
        elif self.broken:
            self.discard()


class SparkProxy:
    """Stands for the worker's current session: module fixtures keep it across a restart.

    Only a ``SparkSession`` attribute starts (or restarts) a session: tests/cluster's
    report hook asks every fixture value for ``brokers``, and after the watchdog had
    killed the JVM that question started a new one inside pytest's report, outside any
    test, where its slowness ran into pytest-timeout's alarm and ended the whole run
    with an INTERNALERROR (stop 48's CI; reproduced with the Jepsen test's limit at
    115 s)."""

    def __init__(self, holder: SparkHolder) -> None:
        self._holder = holder

    def __getattr__(self, name: str) -> Any:
        from pyspark.sql import SparkSession

        if not hasattr(SparkSession, name):
            raise AttributeError(f"a Spark session has no attribute {name!r}")
        return getattr(self._holder.current(), name)


HOLDER = SparkHolder()


def spark_missing() -> str | None:
    """Why no local Spark session can start here (None: it can)."""
    if importlib.util.find_spec("pyspark") is None:
        return "the verify extra (pyspark) is not installed"
    if shutil.which("java") is None:
        return "Spark needs a Java runtime (java not on PATH)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    missing = spark_missing()
    if missing is not None:
        pytest.skip(missing)
    HOLDER.current()
    yield SparkProxy(HOLDER)
    HOLDER.stop()


@pytest.fixture
def spark_if_possible(request: pytest.FixtureRequest) -> Any:
    """The shared session, or None where none can start: a test whose ``trio-broker
    verify`` then runs as a subprocess fails there as it did, rather than skipping its
    other checks."""
    return None if spark_missing() is not None else request.getfixturevalue("spark")


#: Seconds before pytest-timeout's limit at which the watchdog kills the JVM.
WATCHDOG_MARGIN_S = 15.0


def _timeout_of(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:  # the ini option exists only with pytest-timeout loaded
        configured = item.config.getini("timeout")
        return float(configured) if configured else None
    except (TypeError, ValueError):
        return None


def _kill_jvm(item_id: str, limit: float) -> None:
    if HOLDER.session is None:
        return
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    HOLDER.broken = True
    sys.stderr.write(
        f"\nverify watchdog: {item_id} still in Spark after {limit:.0f} s; killing the "
        "Spark JVM so the test fails now and the next test gets a fresh session\n"
    )
    if proc is not None:
        proc.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    timeout = _timeout_of(item)
    uses_spark = bool({"spark", "spark_if_possible"} & set(getattr(item, "fixturenames", ())))
    watchdog = None
    if uses_spark and timeout and timeout > WATCHDOG_MARGIN_S:
        limit = timeout - WATCHDOG_MARGIN_S
        watchdog = threading.Timer(limit, _kill_jvm, args=(item.nodeid, limit))
        watchdog.daemon = True
        watchdog.start()
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.cancel()
