"""``python -m sim --seed N`` replays one seed (its schedule, trace and verdict);
``python -m sim --seeds A:B`` runs a range. Exit status 1 if any seed broke an invariant."""

from __future__ import annotations

import argparse
import os
import sys
import time

from sim.bugs import PLANTED_BUGS
from sim.simulation import simulate


def main() -> int:
    # Sets of strings iterate in hash order: fix the hash seed so a replay is exact.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "sim", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m sim")
    parser.add_argument("--seed", type=int, help="replay one seed, printing its trace")
    parser.add_argument("--seeds", default=None, help="a range A:B of seeds to run")
    parser.add_argument("--bug", choices=sorted(PLANTED_BUGS), help="plant a bug (sim/bugs.py)")
    args = parser.parse_args()
    if args.seed is not None:
        seeds, verbose = [args.seed], True
    else:
        first, _, last = (args.seeds or "0:20").partition(":")
        seeds, verbose = list(range(int(first), int(last))), False
    failed = 0
    started = time.perf_counter()
    for seed in seeds:
        result = simulate(seed, bug=args.bug)
        if verbose:
            print(f"seed {seed}: schedule")
            for fault in result.schedule:
                print(f"  {fault}")
            print("trace:")
            for line in result.trace:
                print(f"  {line}")
        status = "ok" if result.ok else "FAILED"
        print(
            f"seed {seed}: {status}: {result.acked} values acknowledged of {result.sent} "
            f"sends, {result.virtual_s:.1f} s simulated"
        )
        for violation in result.violations:
            print(f"  violation: {violation}")
        failed += not result.ok
    elapsed = time.perf_counter() - started
    print(
        f"{len(seeds)} seeds, {failed} failed, {elapsed:.1f} s "
        f"({len(seeds) / elapsed * 60:.0f} schedules/minute)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
