"""Hypothesis profiles and the run's seed for the whole suite (tests/, statemachine/, spec/, fuzz/).

* ``ci`` (the default, and whenever ``CI`` is set): random seeds, so every run
  explores new sequences; no deadline, because two shared cores make timings
  meaningless; modest example counts; failures print a reproduction blob.
* ``thorough``: many examples, random seeds, for a long run by hand::

      HYPOTHESIS_PROFILE=thorough .venv/bin/pytest statemachine fuzz

One seed per run: unless ``--hypothesis-seed=N`` or ``HYPOTHESIS_SEED=N`` gives it,
the controller picks one, prints it in the report header (and again in the summary
of a run with failures), and passes it to the xdist workers in ``HYPOTHESIS_SEED``,
so every worker uses it. Rerunning with the same seed replays the same sequences::

      .venv/bin/pytest statemachine/test_txn_coordinator_machine.py --hypothesis-seed=N

With a seed, Hypothesis does not consult the example database. A test that sets
``derandomize=True`` (tests/differential/test_against_kafka.py) keeps its fixed
sequences whatever the seed. A test that sets its own ``@settings`` keeps them: a
profile only supplies the defaults that a test does not override. The example
database (``.hypothesis/``) is gitignored.

It also loads tests/leak_check.py: a session whose tests leave a process running (a
broker, ZooKeeper) fails at its end, naming the process and the test that started it.
"""

from __future__ import annotations

import collections
import os
import random

import pytest
from hypothesis import HealthCheck, settings

SEED_ENV = "HYPOTHESIS_SEED"

pytest_plugins = ["tests.leak_check"]

settings.register_profile(
    "ci",
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


#: The slowest test files (their seconds in a CI run on 2 cores, 2026-11-29), longest
#: first. With ``-n 2 --dist loadfile`` a file is one work unit and a worker takes the next
#: unit in queue order; xdist's default queue order (most tests first) put these files,
#: of one to three tests each, at the end, so one worker ran jepsen's 5 minutes while
#: the other had nothing left. Queued first, their long runs overlap the many short files.
SLOW_FILES = (
    "tests/verify/test_verify_txn.py",  # 200
    "tests/cluster/test_jepsen.py",  # 290 before it was shortened; about 170 now
    "tests/verify/test_verify_multi.py",  # 170
    "tests/unit/test_crosshair_all.py",  # 90
    "tests/reliability/test_crash_loop_verify.py",  # 80
    "tests/verify/test_verify_e2e.py",  # 80
    "tests/e2e/test_java_client.py",  # 65
    "tests/cluster/test_clean_shutdown.py",  # 60
    "tests/reliability/test_txn_crash_loop.py",  # 50
    "tests/verify/test_verify_cluster.py",  # 45
    "tests/reliability/test_power_cut.py",  # 40
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, queue the files of :data:`SLOW_FILES` first, longest first, then the
    others by number of tests (xdist's own order). A file's tests stay together and in
    order (a stable sort of whole files), so module fixtures still start once."""
    if not hasattr(config, "workerinput"):
        return
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    files = [item.nodeid.split("::", 1)[0] for item in items]
    per_file = collections.Counter(files)
    order = {
        id(item): (rank.get(f, len(SLOW_FILES)), -per_file[f]) for item, f in zip(items, files)
    }
    items.sort(key=lambda item: order[id(item)])


def _seed(config: pytest.Config) -> str:
    return str(config.getoption("hypothesis_seed", default=None))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Fix the run's seed before Hypothesis's plugin reads ``--hypothesis-seed``.

    The controller decides; xdist workers start after this hook and inherit the
    environment, so they read the same ``HYPOTHESIS_SEED``.
    """
    if config.getoption("hypothesis_seed", default=None) is None:
        # Hypothesis's plugin turns a seed of digits into an int (as on the command line).
        config.option.hypothesis_seed = os.environ.get(SEED_ENV) or str(
            random.SystemRandom().randrange(1 << 32)
        )
    os.environ[SEED_ENV] = _seed(config)
    # Keep the queue order pytest_collection_modifyitems gives the workers (xdist would
    # sort the files by number of tests again).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_report_header(config: pytest.Config) -> str:
    seed = _seed(config)
    return f"hypothesis seed: {seed} (reproduce with --hypothesis-seed={seed} or {SEED_ENV}={seed})"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        seed = _seed(config)
        terminalreporter.write_line(
            f"hypothesis seed of this run: {seed}; to replay its sequences rerun the failed "
            f"tests with --hypothesis-seed={seed} (or {SEED_ENV}={seed}), or use the "
            "@reproduce_failure blob printed with a failure"
        )
