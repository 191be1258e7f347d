"""Broker CPU per Produce request on W6 and W2 (issue 33): the figure to compare trees by.

Wall-clock rates on a shared machine are noisy; the broker's own CPU time (utime+stime
from /proc) divided by the Produce requests the client sent (librdkafka's statistics) is
much less so. Two figures per run: the whole process (every thread, the syncs' worker
threads included) and the event-loop thread alone (``/proc/PID/task/PID/stat``), where
the per-request Python runs. Each round runs every (tree, acks.all.fsync, workload) once,
interleaved, so trees compared with ``--trees`` meet the same load; the broker subprocess
imports trio_broker from the tree (``PYTHONPATH``).

    .venv/bin/python bench/produce_cpu.py --rounds 3                    # this tree
    .venv/bin/python bench/produce_cpu.py --trees /tmp/before . --rounds 5
    .venv/bin/python bench/produce_cpu.py --w6 4096 --w2 0 --fsync true --json out.json

``--launcher`` runs the broker under another command, e.g. a profiler that execs
``trio-broker serve ...`` in the same process (its pid is then the broker's).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads
from produce import BrokerProcess


def _stat_cpu_seconds(path: str) -> float:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MeasuredBroker(BrokerProcess):
    """A broker whose every CPU reading also reads its event-loop (main) thread's CPU.

    The workloads read ``cpu_seconds`` just before and just after the measured run, so
    the last two thread readings bracket the same interval.
    """

    def __init__(self, model: str, fsync: bool, launcher: list[str] | None) -> None:
        def config(data_dir: Path) -> Path:
            path = data_dir.parent / f"{data_dir.name}.properties"
            path.write_text(f"acks.all.fsync={'true' if fsync else 'false'}\n")
            return path

        super().__init__(model, launcher=launcher, config=config)
        self.loop_thread_readings: list[float] = []

    def cpu_seconds(self) -> float:
        pid = self.proc.pid
        self.loop_thread_readings.append(_stat_cpu_seconds(f"/proc/{pid}/task/{pid}/stat"))
        return _stat_cpu_seconds(f"/proc/{pid}/stat")

    def stop(self) -> None:
        super().stop()
        Path(f"{self.data_dir}.properties").unlink(missing_ok=True)

    def loop_thread_cpu_s(self) -> float:
        first, last = self.loop_thread_readings[0], self.loop_thread_readings[-1]
        return last - first


def run_one(
    workload: str, records: int, model: str, fsync: bool, launcher: list[str] | None
) -> dict[str, Any]:
    started: list[MeasuredBroker] = []

    def start() -> MeasuredBroker:
        started.append(MeasuredBroker(model, fsync, launcher))
        return started[-1]

    run: Callable[..., dict[str, Any]] = workloads.w6 if workload == "w6" else workloads.w2
    if workload == "w6":
        r = workloads.w6(model, records, start=start)
    else:
        r = run(records, model=model, start=start)
    requests = r["produce_requests"]
    loop_s = started[-1].loop_thread_cpu_s()
    r["loop_thread_cpu_s"] = loop_s
    r["loop_thread_cpu_us_per_request"] = loop_s / requests * 1e6 if requests else None
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w6", type=int, default=2048, help="W6 records (0: skip)")
    parser.add_argument("--w2", type=int, default=50_000, help="W2 records (0: skip)")
    parser.add_argument("--model", default="pipelined", choices=["serial", "pipelined"])
    parser.add_argument("--fsync", default="both", choices=["true", "false", "both"],
                        help="acks.all.fsync of the broker")  # fmt: skip
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")],
                        help="source trees to compare (each one's trio_broker via PYTHONPATH)")  # fmt: skip
    parser.add_argument("--launcher", default="", help="command to run the broker under")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    launcher = shlex.split(args.launcher) or None
    fsyncs = {"true": [True], "false": [False], "both": [True, False]}[args.fsync]
    workload_sizes = [(w, n) for w, n in (("w6", args.w6), ("w2", args.w2)) if n]
    trees = [tree.resolve() for tree in args.trees]
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for (workload, records), fsync, tree in itertools.product(workload_sizes, fsyncs, trees):
            os.environ["PYTHONPATH"] = str(tree)
            r = run_one(workload, records, args.model, fsync, launcher)
            key = f"{workload} fsync={str(fsync).lower()} {tree}"
            runs.setdefault(key, []).append(r)
            print(
                f"{key}: process {r['broker_cpu_us_per_request'] or float('nan'):7.1f} µs/request, "
                f"loop thread {r['loop_thread_cpu_us_per_request'] or float('nan'):7.1f} "
                f"({r['produce_requests']} requests, {r['broker_cpu_s']:.2f} core-s) "
                f"{r['mb_per_s']:7.1f} MB/s p99 {r['p99_ms']:.0f} ms, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    summary: dict[str, Any] = {"loadavg_after": os.getloadavg(), "runs": {}}
    for key, results in runs.items():
        process = [r["broker_cpu_us_per_request"] for r in results]
        loop = [r["loop_thread_cpu_us_per_request"] for r in results]
        if not all(process) or not all(loop):
            continue
        summary["runs"][key] = {"process_us_per_request": process,
                                "loop_thread_us_per_request": loop,
                                "mb_per_s": [r["mb_per_s"] for r in results]}  # fmt: skip
        print(
            f"{key}: median over {len(results)} runs: process {statistics.median(process):.1f} "
            f"µs/request ({min(process):.0f}-{max(process):.0f}), loop thread "
            f"{statistics.median(loop):.1f} ({min(loop):.0f}-{max(loop):.0f})"
        )
    if len(trees) > 1:  # each tree against the first, per workload and fsync setting
        for (workload, _), fsync in itertools.product(workload_sizes, fsyncs):
            first = summary["runs"].get(f"{workload} fsync={str(fsync).lower()} {trees[0]}")
            for tree in trees[1:]:
                other = summary["runs"].get(f"{workload} fsync={str(fsync).lower()} {tree}")
                if first is None or other is None:
                    continue
                ratios = [
                    statistics.median(other[k]) / statistics.median(first[k])
                    for k in ("process_us_per_request", "loop_thread_us_per_request")
                ]
                print(f"{workload} fsync={str(fsync).lower()} {tree} / {trees[0]}: process "
                      f"x{ratios[0]:.2f}, loop thread x{ratios[1]:.2f} (medians)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
