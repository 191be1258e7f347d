"""Where the suite's CPU goes: per test, per file, per folder, and per kind of process.

On two cores the whole suite is bound by CPU, not by its waits (docs/testing-time.md), so
the figure to cut is CPU seconds, which wall seconds under four workers do not show.

As a pytest plugin it records, for every test (setup, call and teardown), the CPU of the
worker itself and of the child processes it reaped in that time (brokers, JVMs, CLI calls;
a child is counted when it is waited for, so a module fixture's broker counts in the test
that tears the fixture down; a broker forked by tests/broker_fork.py's fork server counts
when it exits, kill -9 included)::

    TEST_CPU_DIR=/tmp/cpu PYTHONPATH=tools CI=true bash scripts/test.sh -p test_cpu

Then::

    .venv/bin/python tools/test_cpu.py report /tmp/cpu            # files, most CPU first
    .venv/bin/python tools/test_cpu.py report /tmp/cpu --by folder

Processes nobody waits for (a kill -9'd broker, a session's ZooKeeper or Spark JVM) are
missing there; BSD process accounting sees every process. As root, with the ``acct``
package (``apt-get install acct``)::

    accton /tmp/pacct   # ... run the suite ...   accton off
    .venv/bin/python tools/test_cpu.py pacct /tmp/pacct           # CPU by command name
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DIR_ENV = "TEST_CPU_DIR"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Brokers forked by the fork server (tests/broker_fork.py) are its children, not ours:
    # it reports each one's CPU when it exits.
    fork = sys.modules.get("tests.broker_fork")
    forked = fork.forked_cpu() if fork is not None else 0.0
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + forked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get(DIR_ENV)
    own_before, reaped_before = _cpu()
    wall_before = time.monotonic()
    yield
    if not out:
        return
    own_after, reaped_after = _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    row = {
        "id": item.nodeid,
        "self": own_after - own_before,
        "children": reaped_after - reaped_before,
        "wall": time.monotonic() - wall_before,
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{worker}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def _group(test_id: str, by: str) -> str:
    path = test_id.split("::")[0]
    if by == "file":
        return path
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]


def report(directory: Path, by: str, top: int) -> None:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            entry = totals[_group(row["id"], by)]
            entry[0] += row["self"]
            entry[1] += row["children"]
            entry[2] += row["wall"]
            entry[3] += 1
    own = sum(e[0] for e in totals.values())
    reaped = sum(e[1] for e in totals.values())
    print(
        f"{len(totals)} {by}s: {own + reaped:.0f} CPU s ({own:.0f} in the workers, {reaped:.0f} reaped)"
    )
    print(f"{'CPU s':>8} {'worker':>8} {'reaped':>8} {'wall s':>8} {'tests':>6}  {by}")
    ranked = sorted(totals.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for name, (o, r, w, n) in ranked[:top]:
        print(f"{o + r:8.1f} {o:8.1f} {r:8.1f} {w:8.1f} {int(n):6d}  {name}")


def pacct(path: Path, top: int) -> None:
    """CPU by command name from a process accounting file (``dump-acct``'s columns)."""
    dumped = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True, check=True)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    ticks = os.sysconf("SC_CLK_TCK")
    for line in dumped.stdout.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 4:
            continue
        command, user, system = fields[0], float(fields[2]), float(fields[3])
        entry = totals[command]
        entry[0] += (user + system) / ticks
        entry[1] += 1
    total = sum(e[0] for e in totals.values())
    print(f"{sum(int(e[1]) for e in totals.values())} processes, {total:.0f} CPU s")
    for command, (cpu, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {int(count):6d}  {command}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="CPU per file or folder from the plugin's records")
    rep.add_argument("directory", type=Path)
    rep.add_argument("--by", choices=("file", "folder"), default="file")
    rep.add_argument("--top", type=int, default=40)
    acc = sub.add_parser("pacct", help="CPU per command name from a process accounting file")
    acc.add_argument("file", type=Path)
    acc.add_argument("--top", type=int, default=25)
    args: Any = parser.parse_args(argv)
    if args.command == "report":
        report(args.directory, args.by, args.top)
    else:
        pacct(args.file, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
