"""A/B: W1 (pipelined), W2 and W3 on two commits of the broker, alternating, in one run.

    .venv/bin/python bench/ab.py --a HEAD~1 --b HEAD [--rounds 2] [--quick] [--json FILE]

Each commit is checked out into a temporary git worktree, and the broker processes
of its rounds import that tree (``PYTHONPATH``); rounds alternate A, B, A, B, ... so
that a drifting disk or a busy machine hits both alike. Prints each round's figures
and the ratio B/A of the medians, beside the spread (max/min) of A's own rounds:
a ratio inside that spread is no difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads

ROOT = Path(__file__).resolve().parent.parent
QUICK = {"w1_records": 512, "w2_records": 50_000}
FULL = {"w1_records": 2048, "w2_records": 200_000}
#: (workload, figure, higher is better)
FIGURES = [
    ("w1_pipelined", "mb_per_s", True),
    ("w1_pipelined", "p99_ms", False),
    ("w2", "records_per_s", True),
    ("w3", "mb_per_s", True),
]


def one_round(tree: Path, sizes: dict[str, int]) -> dict[str, Any]:
    os.environ["PYTHONPATH"] = str(tree)
    out: dict[str, Any] = {}
    result, broker = workloads.w1("pipelined", sizes["w1_records"], keep=True)
    out["w1_pipelined"] = result
    try:
        out["w3"] = workloads.w3(broker, sizes["w1_records"])
    finally:
        if broker is not None:
            broker.stop()
    out["w2"] = workloads.w2(sizes["w2_records"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the baseline commit")
    parser.add_argument("--b", required=True, help="the commit to compare")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    base = Path(tempfile.mkdtemp(prefix="trio-broker-ab-"))
    trees = {}
    for label, rev in (("a", args.a), ("b", args.b)):
        trees[label] = base / label
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(trees[label]),
                        rev], check=True, capture_output=True)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    try:
        for round_no in range(args.rounds):
            for label in ("a", "b"):
                result = one_round(trees[label], sizes)
                runs[label].append(result)
                print(f"round {round_no + 1} {label}: " + ", ".join(
                    f"{w} {f}={result[w].get(f, float('nan')):.1f}" for w, f, _ in FIGURES
                ), flush=True)  # fmt: skip
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)  # fmt: skip
    summary = {}
    for workload, figure, higher in FIGURES:
        a = [r[workload][figure] for r in runs["a"]]
        b = [r[workload][figure] for r in runs["b"]]
        ratio = statistics.median(b) / statistics.median(a)
        spread = max(a) / min(a)
        summary[f"{workload}.{figure}"] = {"a": a, "b": b, "ratio_b_over_a": ratio,
                                            "a_spread": spread, "higher_is_better": higher}  # fmt: skip
        print(f"{workload:13} {figure:14} B/A {ratio:5.2f}   A's own spread {spread:5.2f}")
    if args.json:
        args.json.write_text(json.dumps({"a": args.a, "b": args.b, "sizes": sizes,
                                         "summary": summary, "runs": runs}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
