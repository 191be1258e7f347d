"""Broker CPU per Produce request on W6 and W2 (issue 33): the figure to compare trees by.

Wall-clock rates on a shared machine are noisy; the broker's own CPU time (utime+stime
from /proc, every thread) divided by the Produce requests the client sent (librdkafka's
statistics) is much less so. Rounds alternate the workloads; run the same command
against each tree (``PYTHONPATH=<tree>``: the broker subprocess inherits it).

    PYTHONPATH=. .venv/bin/python bench/produce_cpu.py --rounds 3
    PYTHONPATH=. .venv/bin/python bench/produce_cpu.py --w6 4096 --w2 0 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w6", type=int, default=2048, help="W6 records (0: skip)")
    parser.add_argument("--w2", type=int, default=50_000, help="W2 records (0: skip)")
    parser.add_argument("--model", default="pipelined", choices=["serial", "pipelined"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"w6": [], "w2": []}
    for _ in range(args.rounds):
        if args.w6:
            runs["w6"].append(workloads.w6(args.model, args.w6))
        if args.w2:
            runs["w2"].append(workloads.w2(args.w2, model=args.model))
        for name, results in runs.items():
            if results:
                r = results[-1]
                print(
                    f"{name}: {r['broker_cpu_us_per_request'] or float('nan'):7.1f} µs/request "
                    f"({r['produce_requests']} requests, {r['broker_cpu_s']:.2f} core-s) "
                    f"{r['mb_per_s']:7.1f} MB/s p99 {r['p99_ms']:.0f} ms, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    summary: dict[str, Any] = {"loadavg_after": os.getloadavg()}
    for name, results in runs.items():
        per = [r["broker_cpu_us_per_request"] for r in results if r["broker_cpu_us_per_request"]]
        if per:
            summary[name] = {"cpu_us_per_request": per, "median": statistics.median(per),
                             "mb_per_s": [r["mb_per_s"] for r in results]}  # fmt: skip
            print(f"{name} median {summary[name]['median']:.1f} µs/request over {len(per)} runs")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
