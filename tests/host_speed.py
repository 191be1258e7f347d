"""pytest-timeout's limits scaled to how fast this machine's cores run today.

The limits (pyproject's 300 s, a test's own ``timeout`` mark) bound a test that would
otherwise hang, and they were set on the suite's own machine at its usual speed. This
VM's cores have run the same pure-Python loop anywhere from 1x to 10x slower within one
day (docs/testing-time.md, session 55), with no other process running: stop 48's CI
died when the Jepsen test, 120 s on a quiet machine, passed its 600 s limit, and
took the run's report with it. A limit that a correct test passes only because the
cores are slow tells nothing, so a whole-suite run (xdist, or ``CI`` set) measures the
speed once, before any test, and multiplies every limit by the slowdown it found
(between 1 and :data:`MAX_SCALE`). The report header prints both; the controller passes
the scale to its workers in ``TRIO_BROKER_TIMEOUT_SCALE``, which also sets it by hand
(``=1`` turns it off). Root conftest.py loads this plugin.

The deadlines inside tests (tests/waits.py) are not scaled: they are a minute or more
already, and a condition that takes longer fails the test as it should.
"""

from __future__ import annotations

import os
import time

import pytest

SCALE_ENV = "TRIO_BROKER_TIMEOUT_SCALE"
#: CPU seconds the probe takes on this machine's cores on a quiet day. Derived, not
#: measured quiet: a 20M-addition loop at module level took 1.3 s on the morning of
#: 2026-12-01 (0.065 s per million); that evening, cores about 8x slower, the probe
#: took 0.45 of what a million module-level additions took (locals are quicker).
REFERENCE_S = 0.03
#: At about 5x the suite's ~1,050 CPU s take most of CI's 90 minutes on two cores;
#: beyond that no scale saves the run, and a hung test would only hold it longer.
MAX_SCALE = 5.0


def probe_seconds(tries: int = 5) -> float:
    """The fastest of ``tries`` runs of a fixed pure-Python loop (CPU time, so another
    process on the machine does not count; the fastest, so one descheduling does not)."""
    best = float("inf")
    for _ in range(tries):
        started = time.process_time()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.process_time() - started)
    return best


def scale_for(seconds: float) -> float:
    return round(min(MAX_SCALE, max(1.0, seconds / REFERENCE_S)), 2)


def current_scale() -> float:
    try:
        return min(MAX_SCALE, max(1.0, float(os.environ.get(SCALE_ENV, "1"))))
    except ValueError:
        return 1.0


def base_timeout(item: pytest.Item) -> float | None:
    """The limit pytest-timeout would apply to ``item``: its closest mark, else the ini."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    try:  # the ini option exists only with pytest-timeout loaded
        configured = item.config.getini("timeout")
    except ValueError:
        return None
    try:
        return float(configured) if configured else None
    except (TypeError, ValueError):
        return None


_probe: tuple[float, float] | None = None  # (seconds, scale) when this process measured


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _probe
    if hasattr(config, "workerinput") or SCALE_ENV in os.environ:
        return  # a worker (the controller measured), or set by hand
    whole_suite = bool(config.getoption("numprocesses", None)) or bool(os.environ.get("CI"))
    if not whole_suite:
        return
    seconds = probe_seconds()
    _probe = (seconds, scale_for(seconds))
    os.environ[SCALE_ENV] = str(_probe[1])  # the xdist workers start after this


def pytest_report_header(config: pytest.Config) -> str | None:
    if _probe is not None:
        seconds, scale = _probe
        return (
            f"host speed: the probe loop took {seconds:.3f} CPU s ({REFERENCE_S} s on a "
            f"quiet day): timeouts x{scale:g}"
        )
    scale = current_scale()
    return None if scale == 1.0 else f"timeouts x{scale:g} ({SCALE_ENV})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scale = current_scale()
    if scale == 1.0:
        return
    for item in items:
        limit = base_timeout(item)
        if limit is not None and limit > 0:
            marker = item.get_closest_marker("timeout")
            kwargs = {} if marker is None else {k: v for k, v in marker.kwargs.items()
                                                if k != "timeout"}  # fmt: skip
            item.add_marker(pytest.mark.timeout(limit * scale, **kwargs), append=False)
