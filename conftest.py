"""Hypothesis profiles for the whole suite (tests/, statemachine/, spec/, fuzz/).

* ``ci`` (the default, and whenever ``CI`` is set): derandomized, so a run is
  repeatable and a red CI run is red again on a laptop; no deadline, because two
  shared cores make timings meaningless; modest example counts; failures print a
  reproduction blob.
* ``thorough``: many examples, random seeds, for a long run by hand::

      HYPOTHESIS_PROFILE=thorough .venv/bin/pytest statemachine fuzz

A test that sets its own ``@settings`` keeps them: a profile only supplies the
defaults that a test does not override. The example database (``.hypothesis/``)
is gitignored.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=50,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=2_000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


#: Test modules that build one Maven module (``tests/jvm/target``): one worker runs them
#: all, in turn, so that two ``mvn test`` never write the same target directory.
SHARED_MAVEN_BUILD = ("tests/e2e/test_java_client.py", "tests/e2e/test_java_fetch_sessions.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """For ``pytest -n N --dist loadgroup`` (scripts/test.sh): a module's tests stay on
    one worker, so module-scoped fixtures (a broker, a Spark session) start once; the
    modules of one Maven build share a worker. Runs before xdist reads the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        group = "maven-tests-jvm" if module in SHARED_MAVEN_BUILD else module
        item.add_marker(pytest.mark.xdist_group(group))
