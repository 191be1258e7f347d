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
