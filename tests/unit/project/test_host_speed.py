"""tests/host_speed.py: pytest-timeout's limits, the ini's and each mark's, multiplied by
the cores' slowdown; pytest-timeout enforces the scaled limit.

The runs are pytest subprocesses (pytester) with the plugin loaded by ``-p`` and the
scale given by hand (``TRIO_BROKER_TIMEOUT_SCALE``), so no probe runs in them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.host_speed import MAX_SCALE, REFERENCE_S, SCALE_ENV, scale_for

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]

LIMITS = """
import time

import pytest

def limit(request):
    marker = request.node.get_closest_marker("timeout")
    return None if marker is None else (marker.args[0], marker.kwargs)

def test_ini_limit(request):
    print("INI", limit(request))

@pytest.mark.timeout(600)
def test_marked_limit(request):
    print("MARKED", limit(request))

@pytest.mark.timeout(20, method="signal")
def test_marked_with_a_method(request):
    print("METHOD", limit(request))

@pytest.mark.timeout(0.5)
def test_one_second_under_a_half_second_limit():
    time.sleep(1.0)
"""


def _run(pytester: pytest.Pytester, scale: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\ntimeout = 300\n")  # not the project's: no other plugins
    path = os.environ.get("PYTHONPATH")
    pytester._monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{path}" if path else str(REPO))
    pytester._monkeypatch.setenv(SCALE_ENV, scale)
    pytester.makepyfile(test_limits=LIMITS)
    return pytester.runpytest_subprocess("-p", "tests.host_speed", "-s", "-p", "no:cacheprovider")


def test_every_limit_is_scaled_and_enforced_as_scaled(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "3")
    result.stdout.fnmatch_lines(["timeouts x3 (TRIO_BROKER_TIMEOUT_SCALE)"])
    result.stdout.fnmatch_lines(["*INI (900.0, {})*"])
    result.stdout.fnmatch_lines(["*MARKED (1800.0, {})*"])
    result.stdout.fnmatch_lines(["*METHOD (60.0, {'method': 'signal'})*"])
    result.assert_outcomes(passed=4)  # a 1 s test under 0.5 s x 3


def test_unscaled_limits_are_left_as_they_are(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "1")
    result.stdout.fnmatch_lines(["*INI None*", "*MARKED (600, {})*"])
    result.stdout.fnmatch_lines(["*Timeout*0.5*"])
    result.assert_outcomes(passed=3, failed=1)


def test_the_scale_is_the_slowdown_between_one_and_the_cap() -> None:
    assert scale_for(REFERENCE_S / 2) == 1.0  # a faster machine keeps the limits
    assert scale_for(REFERENCE_S * 2.5) == 2.5
    assert scale_for(REFERENCE_S * 50) == MAX_SCALE
