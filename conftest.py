"""Hypothesis profiles and the run's seed for the whole suite (tests/, statemachine/, spec/, fuzz/).

* ``ci`` (the default, and whenever ``CI`` is set): random seeds, so every run
  explores new sequences; no deadline, because two shared cores make timings
  meaningless; modest example counts; failures print a reproduction blob.
* ``thorough``: many examples, random seeds, for a long run by hand::

      HYPOTHESIS_PROFILE=thorough .venv/bin/pytest statemachine fuzz

Neither runs Hypothesis's explain phase (``PHASES``). It runs only after a failure was
found and shrunk, so a green run never pays for it; but on Python 3.11 it reruns the
failing example under ``sys.settrace``, which made a producer id machine's catch (found
and shrunk in 1.6 CPU s) still be explaining at 473 s, past pytest's 300 s guard, and
added a third to the CPU of a connection machine's catch (9.3 -> 12.6 s), where it
traces only the test's thread, not the broker's, and names nothing but the failing
assertion. A failure still prints its steps and notes. A test's own ``phases`` keep
theirs.

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
broker, ZooKeeper) fails at its end, naming the process and the test that started it;
tests/scheduling.py (the xdist schedule); tests/spark_session.py (the ``spark``
fixture: one Spark session per test process); and tests/host_speed.py (pytest-timeout's
limits scaled to the cores' speed, measured once per whole-suite run).
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, Phase, settings

SEED_ENV = "HYPOTHESIS_SEED"

pytest_plugins = ["tests.leak_check", "tests.scheduling", "tests.spark_session", "tests.host_speed"]

#: Every phase but explain (see above).
PHASES = tuple(phase for phase in Phase if phase is not Phase.explain)

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=50,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=PHASES,
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=2_000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=PHASES,
)
#: tools/mutation.sh: a mutant is killed by the first failure, so it is not shrunk (a
#: planted slip's shrinking took minutes on the loaded machine, for steps nobody reads).
settings.register_profile(
    "mutation",
    parent=settings.get_profile("ci"),
    phases=tuple(phase for phase in PHASES if phase is not Phase.shrink),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
    # Apache Kafka, which the differential and bench tests start to compare behaviour, not
    # speed, gets a JIT and collector for short runs (bench/kafka_peer.py's
    # JVM_OPTIONS_ENV; benchmarks leave it unset): a start, 200 records and a stop took
    # 11.3-13.3 CPU s with Kafka's own options, 7.0-7.4 s with these.
    os.environ.setdefault(
        "TRIO_BROKER_KAFKA_PEER_JVM",
        "-Xmx1G -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true",
    )


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
