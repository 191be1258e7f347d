"""What the models alone reach: line and branch coverage of the rule modules under the
state machines (statemachine/) and the simulator seeds CI runs (tests/sim).

Issue 31 scores planted slips against the models and the simulator alone, and every round
found the same thing: a slip is caught when a machine calls the module through the
broker's own path, and missed in modules no machine drives. This tool draws that map. It
runs the model tests under coverage.py (branch coverage, one dynamic context per test, so
the table can say which machines reach a module) with the CI Hypothesis profile and a
fixed seed, then prints per rule module its statements, lines and branches covered and
the test files that reached it:

    python tools/model_coverage.py                       # run (bounded) and print
    python tools/model_coverage.py --report              # print from the last run's data
    python tools/model_coverage.py --tests statemachine/test_group_machine.py --all
    python tools/model_coverage.py --add --tests statemachine/test_new_machine.py

It needs coverage.py in the venv (``.venv/bin/pip install coverage``; not a test
dependency: CI does not run it). The data is kept in ``--data`` (default
``~/.cache/trio-broker/model-coverage``), one file per test run, combined for the report.
Results: docs/verification.md, "Twelfth round".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import coverage
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The model tests CI runs: every state machine, and the simulator's CI seeds (its first
#: 60 and the rotating ones the run's seed draws). Each group runs as one pytest process.
DEFAULT_TESTS = ("statemachine", "tests/sim")

#: The rule modules issue 31 plants slips in, by folder under trio_broker/; the server's
#: files are named one by one (the connection, its mute and budget wiring), the rest of
#: server/ is the Trio shell.
RULE_FOLDERS = ("replication", "storage", "transactions", "cluster", "groups", "state", "partition")
RULE_FILES = (
    "server/connection.py",
    "server/memory_budget.py",
    "server/quotas.py",
    "server/fetch_waits.py",
    "server/flusher.py",
    "server/transaction_timers.py",
    "server/log_cleaner.py",
    "server/share_coordinator_loader.py",
)

#: A bound on each pytest process (the whole run takes some minutes on a quiet machine).
RUN_TIMEOUT_S = 3600

RC_TEMPLATE = """\
[run]
branch = True
parallel = True
source = trio_broker
data_file = {data_file}
"""


def run(tests: list[str], data_dir: Path, seed: str, jobs: int, add: bool) -> int:
    """Run each test group under coverage into ``data_dir``, ``jobs`` at a time (beside
    the data already there if ``add``); the worst exit status."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if not add:
        for old in data_dir.glob(".coverage*"):
            old.unlink()
    rcfile = data_dir / "coveragerc"
    rcfile.write_text(RC_TEMPLATE.format(data_file=data_dir / ".coverage"))
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", HYPOTHESIS_SEED=seed)
    worst = 0
    waiting = list(tests)
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    while waiting or running:
        while waiting and len(running) < jobs:
            group = waiting.pop(0)
            command = [
                sys.executable,
                "-m",
                "coverage",
                "run",
                f"--rcfile={rcfile}",
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:xdist",
                "-p",
                "tools.model_coverage",  # the context hook below
                group,
            ]
            print("$", " ".join(command), flush=True)
            running.append((group, subprocess.Popen(command, cwd=ROOT, env=env)))
        group, process = running.pop(0)
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"{group}: stopped after {RUN_TIMEOUT_S} s", flush=True)
            process.kill()
            process.wait()
            status = 124
        print(f"{group}: exit {status}", flush=True)
        worst = max(worst, status)
    return worst


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Record each test's lines under its file's name, so the table can say which
    machines reach a module (coverage's own test_function context names Hypothesis's
    generated TestCase class for every machine)."""
    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(item.nodeid.split("::", 1)[0])
    try:
        return (yield)
    finally:
        if current is not None:
            current.switch_context("")


def is_rule_module(relative: str) -> bool:
    folder = relative.split("/", 1)[0]
    return folder in RULE_FOLDERS or relative in RULE_FILES


def report(data_dir: Path, show_all: bool, below: float) -> None:
    rcfile = data_dir / "coveragerc"
    if list(data_dir.glob(".coverage.*")):  # one per test group; a report combines them once
        subprocess.run(
            [sys.executable, "-m", "coverage", "combine", "--append", "-q", f"--rcfile={rcfile}"],
            cwd=ROOT,
            check=True,
        )
    with tempfile.TemporaryDirectory() as scratch:
        json_path = Path(scratch) / "coverage.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "coverage",
                "json",
                "-q",
                "--show-contexts",
                f"--rcfile={rcfile}",
                "-o",
                str(json_path),
            ],
            cwd=ROOT,
            check=True,
        )
        data = json.loads(json_path.read_text())
    package = ROOT / "trio_broker"
    rows: list[tuple[str, int, int, int, int, list[str]]] = []
    for name, entry in data["files"].items():
        relative = Path(name).resolve().relative_to(package).as_posix()
        if relative.endswith("__init__.py") or not (show_all or is_rule_module(relative)):
            continue
        summary = entry["summary"]
        machines = sorted(
            {
                context.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
                for contexts in entry.get("contexts", {}).values()
                for context in contexts
                if context
            }
        )
        rows.append(
            (
                relative,
                summary["num_statements"],
                summary["covered_lines"],
                summary["num_branches"],
                summary["covered_branches"],
                machines,
            )
        )
    # A module no test of the run imported is not in the data at all: list it at 0%.
    seen = {row[0] for row in rows}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in seen or relative.endswith("__init__.py"):
            continue
        if show_all or is_rule_module(relative):
            rows.append((relative, -1, 0, -1, 0, []))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    print(f"{'module':46} {'stmts':>6} {'lines':>6} {'branches':>9}  reached by")
    for relative, statements, lines, branches, covered_branches, machines in sorted(rows):
        line_pct = 100.0 * lines / statements if statements > 0 else 0.0
        if line_pct > below:
            continue
        branch_text = f"{100.0 * covered_branches / branches:.0f}%" if branches > 0 else "-"
        statements_text = str(statements) if statements >= 0 else "?"
        short = ", ".join(m.removeprefix("test_").removesuffix("_machine") for m in machines)
        print(
            f"{relative:46} {statements_text:>6} {line_pct:5.0f}% {branch_text:>9}  "
            f"{short or 'nothing (never imported)' if statements < 0 else short or 'nothing'}"
        )
        group = relative.split("/", 1)[0]
        if statements > 0:
            total = totals[group]
            total[0] += statements
            total[1] += lines
            total[2] += branches
            total[3] += covered_branches
    print()
    print(f"{'package (imported modules)':46} {'stmts':>6} {'lines':>6} {'branches':>9}")
    for group, (statements, lines, branches, covered_branches) in sorted(totals.items()):
        branch_pct = 100.0 * covered_branches / branches if branches else 0.0
        print(
            f"{group + '/':46} {statements:>6} {100.0 * lines / statements:5.0f}% "
            f"{branch_pct:8.0f}%"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS))
    parser.add_argument(
        "--data",
        type=Path,
        default=Path.home() / ".cache" / "trio-broker" / "model-coverage",
        help="where the coverage data goes (replaced by a run)",
    )
    parser.add_argument("--seed", default=os.environ.get("HYPOTHESIS_SEED", "1"))
    parser.add_argument("--jobs", type=int, default=2, help="test groups run side by side")
    parser.add_argument(
        "--add", action="store_true", help="add to the last run's data (a changed machine)"
    )
    parser.add_argument("--report", action="store_true", help="only print the last run's table")
    parser.add_argument("--all", action="store_true", help="every module, not only the rules")
    parser.add_argument(
        "--below", type=float, default=100.0, help="only modules at or below this line %%"
    )
    args = parser.parse_args()
    status = 0
    if not args.report:
        status = run(args.tests, args.data, args.seed, args.jobs, args.add)
    report(args.data, args.all, args.below)
    return status


if __name__ == "__main__":
    sys.exit(main())
