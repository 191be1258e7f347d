"""``python -m sim --seed N`` replays one seed (its schedule, trace and verdict);
``python -m sim --seeds A:B`` runs a range. Exit status 1 if any seed broke an invariant."""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator

from sim import set_process_gc_policy
from sim.bugs import PLANTED_BUGS
from sim.simulation import SimResult, simulate
from trio_broker.server.gc_policy import GcPolicyError


def main() -> int:
    # Sets of strings iterate in hash order: fix the hash seed so a replay is exact.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "sim", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m sim")
    parser.add_argument("--seed", type=int, help="replay one seed, printing its trace")
    parser.add_argument("--seeds", default=None, help="a range A:B of seeds to run")
    parser.add_argument("--bug", choices=sorted(PLANTED_BUGS), help="plant a bug (sim/bugs.py)")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="processes running seeds side by side (each seed is still one replayable run)",
    )  # fmt: skip
    args = parser.parse_args()
    try:
        set_process_gc_policy()  # before the pool forks: its workers inherit it
    except GcPolicyError as exc:
        parser.error(str(exc))
    if args.seed is not None:
        seeds, verbose = [args.seed], True
    else:
        first, _, last = (args.seeds or "0:20").partition(":")
        seeds, verbose = list(range(int(first), int(last))), False
    failed = 0
    started = time.perf_counter()
    for seed, result in _results(seeds, args.bug, max(1, args.jobs)):
        if verbose:
            print(f"seed {seed}: schedule (faults within {result.span_s:.2f} s)")
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


def _results(seeds: list[int], bug: str | None, jobs: int) -> Iterator[tuple[int, SimResult]]:
    """Each seed's result, in seed order; with ``jobs`` > 1 from a pool of processes
    (forked after PYTHONHASHSEED is fixed, so each run is the one ``--seed`` replays)."""
    if jobs == 1 or len(seeds) == 1:
        for seed in seeds:
            yield seed, simulate(seed, bug=bug)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from zip(seeds, pool.imap(functools.partial(_simulate, bug=bug), seeds),
                       strict=True)  # fmt: skip


def _simulate(seed: int, bug: str | None) -> SimResult:
    return simulate(seed, bug=bug)


if __name__ == "__main__":
    sys.exit(main())
