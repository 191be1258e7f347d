"""Fingerprints of simulator runs: whether a change left the schedules the same.

    python bench/sim_fingerprint.py --seeds 0:30 [--bug B] > after.txt   (each tree)
    diff before.txt after.txt

Prints one line per seed: the seed, whether it kept every invariant, its task steps,
and a hash of every task step's task name and virtual time (a ``trio`` instrument).
Two trees whose lines agree ran the same schedules step for step: a change that only
makes the simulation cheaper explores what it did, and the planted bugs (``--bug``)
are caught by the same seeds. Run under ``PYTHONHASHSEED=0``, as ``python -m sim``
(sets of strings iterate in hash order); the script re-executes itself with it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Fingerprint(trio.abc.Instrument):
    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        self.hash.update(f"{task.name}@{trio.current_time():.9f};".encode())


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    import sim.simulation as simulation
    from sim.bugs import PLANTED_BUGS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:30", help="a range A:B of seeds")
    parser.add_argument("--bug", choices=sorted(PLANTED_BUGS), help="plant a bug (sim/bugs.py)")
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split(":"))
    original = simulation._main
    current: list[Fingerprint] = []

    async def fingerprinted(*main_args: Any) -> None:
        trio.lowlevel.add_instrument(current[-1])
        try:
            await original(*main_args)
        finally:
            trio.lowlevel.remove_instrument(current[-1])

    simulation._main = fingerprinted  # type: ignore[assignment]
    for seed in range(first, last):
        current.append(Fingerprint())
        result = simulation.simulate(seed, bug=args.bug)
        fingerprint = current[-1]
        print(seed, "ok" if result.ok else "caught", fingerprint.steps,
              fingerprint.hash.hexdigest()[:16], flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
