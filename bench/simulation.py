"""Deterministic simulation throughput: run seeds for N minutes, print schedules/minute.

    python bench/simulation.py --minutes 2 [--jobs 2] [--first-seed 1000] [--bug truncate-to-hw]

Each seed is one whole-cluster run of sim/ (three brokers, a fault schedule, the
invariants; docs/cluster.md "Deterministic simulation"). Seeds run in ``--jobs``
worker processes (``PYTHONHASHSEED=0``, as ``python -m sim`` replays them) until the
time is up or ``--max-seeds`` ran. Prints every failing seed with its first
violations and the replay command, then the rate. Exit status 1 if a seed failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_seed(seed: int, bug: str | None) -> tuple[int, list[str], int, float, float]:
    from sim.simulation import simulate

    cpu = time.process_time()
    result = simulate(seed, bug=bug)
    return seed, result.violations, result.acked, result.virtual_s, time.process_time() - cpu


def _worker_started() -> None:
    from sim import set_process_gc_policy
    from sim.simulation import simulate  # noqa: F401  (imported first: then frozen)

    set_process_gc_policy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--max-seeds", type=int, default=100_000)
    parser.add_argument("--bug", default=None, help="a planted bug of sim/bugs.py")
    args = parser.parse_args()
    os.environ["PYTHONHASHSEED"] = "0"  # the workers' hash seed (spawned after this)
    deadline = time.perf_counter() + args.minutes * 60
    started = time.perf_counter()
    seeds = iter(range(args.first_seed, args.first_seed + args.max_seeds))
    done = failed = acked = 0
    simulated_s = cpu_s = 0.0
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        args.jobs, mp_context=context, initializer=_worker_started
    ) as pool:
        running = {pool.submit(run_seed, next(seeds), args.bug) for _ in range(args.jobs)}
        while running:
            finished, running = concurrent.futures.wait(
                running, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in finished:
                seed, violations, seed_acked, seed_simulated, seed_cpu = future.result()
                done += 1
                cpu_s += seed_cpu
                acked += seed_acked
                simulated_s += seed_simulated
                if violations:
                    failed += 1
                    print(f"seed {seed} FAILED (replay: python -m sim --seed {seed}"
                          f"{' --bug ' + args.bug if args.bug else ''})")  # fmt: skip
                    for violation in violations[:3]:
                        print(f"  {violation}")
                if time.perf_counter() < deadline:
                    try:
                        running.add(pool.submit(run_seed, next(seeds), args.bug))
                    except StopIteration:
                        pass
    elapsed = time.perf_counter() - started
    print(
        f"{done} schedules in {elapsed:.1f} s with {args.jobs} job(s): "
        f"{done / elapsed * 60:.0f} schedules/minute, {failed} failed; "
        f"{simulated_s:.0f} s of cluster time simulated ({simulated_s / elapsed:.0f}x real "
        f"time), {acked} acknowledged values checked; {cpu_s / max(done, 1):.2f} CPU s per "
        f"schedule ({done / cpu_s * 60 if cpu_s else 0:.0f} schedules per CPU-minute)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
