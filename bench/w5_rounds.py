"""W5 rounds, interleaved between broker trees, with where each produce's time went.

    .venv/bin/python bench/w5_rounds.py --rounds 3 --trees base=0652f29 new=HEAD \\
        [--consumers 20] [--client-processes 4] [--client-stats] [--quick] [--json out.json] \\
        [--storage memory]

A tree is a commit (``git archive``d into a temporary directory and run by this venv's
interpreter, its editable install's finder dropped so that the tree's own ``trio_broker``
is imported) or a path to a ``trio-broker`` executable.

Each round runs W5 (bench/workloads.py) once per tree, in the order given, so a change
in the machine's load falls on both. Per run it prints the produce latency the clients
saw, the broker's CPU per request, the load average, the client processes' CPU, and, for
a broker with the request stage histograms, Produce's stages (bucket bounds: "at most").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads
from run_all import FULL, QUICK

ROOT = Path(__file__).resolve().parent.parent

#: Runs a ``git archive``d tree's broker with this venv: the editable install's import
#: finder would otherwise bring in the worktree's ``trio_broker``.
WRAPPER = """#!/bin/sh
exec {python} -c '
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, "{tree}")
from trio_broker.cli import main
sys.argv[0] = "trio-broker"
sys.exit(main())' "$@"
"""


def tree_executable(spec: str, scratch: Path) -> Path:
    """``spec``: an existing trio-broker executable, or a commit to archive into ``scratch``."""
    if Path(spec).exists():
        return Path(spec).resolve()
    tree = scratch / spec.replace("/", "_")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", spec], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    exe = tree / "trio-broker"
    exe.write_text(WRAPPER.format(python=sys.executable, tree=tree))
    exe.chmod(0o755)
    return exe


def line(tree: str, r: dict[str, Any], load: tuple[float, float, float]) -> str:
    text = (
        f"{tree:>6}: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} max {r['max_ms']:.0f} ms"
        f" | e2e p99 {r['e2e_p99_ms']:.0f} | broker {r['broker_cpu_s']:.2f} s"
        f" ({r['broker_cpu_us_per_request']:.0f} us/req) | client {r['client_cpu_s']:.1f} s"
        f" | load {load[0]:.1f} | sent {r['sent']} err {r['errors']}"
    )
    for name, row in r["broker_stages"].items():
        text += f"\n        {name:>16}: p50<={row['p50_le_ms']:g} p99<={row['p99_le_ms']:g}"
        text += f" max<={row['max_le_ms']:g} ms (n={row['count']:.0f})"
    for name, row in r["client_latencies"].items():
        text += f"\n        client {name:>14}: mean {row['mean_ms']:.1f}"
        text += f" window-p99 median {row['window_p99_median_ms']:.1f}"
        text += f" p99 {row['window_p99_p99_ms']:.1f} max {row['window_p99_max_ms']:.1f} ms"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", required=True,
                        help="NAME=COMMIT or NAME=path/to/trio-broker")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=0)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--client-stats", action="store_true")
    parser.add_argument("--quick", action="store_true", help="W5's quick sizes")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--storage", choices=["file", "memory"], default="file",
        help="memory: no fsync, so the disk's latency does not hide the broker's own",
    )  # fmt: skip
    args = parser.parse_args()
    sizes = (QUICK if args.quick else FULL)["w5"]
    scratch = Path(tempfile.mkdtemp(prefix="w5-trees-"))
    try:
        trees = [(name, tree_executable(spec, scratch))
                 for name, spec in (t.split("=", 1) for t in args.trees)]  # fmt: skip
        run_rounds(args, sizes, trees)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def start_with(storage: str) -> workloads.StartBroker:
    """The pipelined broker with a /metrics listener (W5's default), on ``storage``."""
    extra = ["--metrics-listen", "127.0.0.1:0"]
    return lambda: workloads.BrokerProcess("pipelined", storage=storage, extra=extra)


def run_rounds(args: argparse.Namespace, sizes: Any, trees: list[tuple[str, Path]]) -> None:
    runs: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for name, exe in trees:
            os.environ["BENCH_TRIO_BROKER"] = str(exe)
            load = os.getloadavg()
            r = workloads.w5(*sizes, consumers=args.consumers,
                             client_processes=args.client_processes,
                             client_stats=args.client_stats,
                             start=start_with(args.storage))  # fmt: skip
            r.pop("cdf_ms", None)
            runs.append({"round": round_no, "tree": name, "loadavg": load, **r})
            print(f"round {round_no} " + line(name, r, load), flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
