"""The simulator alone against the planted bugs that list it, for one or more sim/ trees.

    python tools/sim_score.py --seeds 0:30 --jobs 2 before=/tmp/sim-before now=.
    python tools/sim_score.py --first-decides now=. before=/tmp/sim-before

Every bug of tools/planted_bugs.py whose listing names the simulator is planted in a copy
of this tree's ``trio_broker/`` (its ``old`` text replaced by its ``new``), and each
named tree's ``sim/`` runs ``python -m sim`` over the seeds against it: a failed seed is
a catch. The broker is the same for every tree, so the table says what the simulator's
own checks catch (docs/verification.md, session 55: its invariants 7-11 against the
simulator before them). One line a bug and a total a tree; ``--bugs`` names a subset.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import planted_bugs as pb  # noqa: E402


def plant(work: Path, path: str, old: str, new: str) -> bool:
    target = work / path
    source = target.read_text()
    if source.count(old) != 1:
        return False
    target.write_text(source.replace(old, new))
    return True


def caught(work: Path, sim_tree: Path, seeds: str, jobs: int, timeout_s: float) -> str:
    shutil.rmtree(work / "sim", ignore_errors=True)
    shutil.copytree(sim_tree / "sim", work / "sim")
    env = dict(os.environ, PYTHONPATH=str(work))
    # Its own session, so that a hang is stopped with its --jobs workers (subprocess.run's
    # timeout kills only the parent: the workers of a hung seed ran on for 45 minutes).
    with subprocess.Popen(
        [sys.executable, "-m", "sim", "--seeds", seeds, "--jobs", str(jobs)],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return "timeout"
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    last = run.stdout.strip().splitlines()[-1:] or [run.stderr.strip()[-200:]]
    if run.returncode == 0:
        return "missed"
    if "failed" in last[0]:
        return "caught (" + last[0].split(",")[1].strip() + ")"
    return "error: " + last[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+", help="NAME=DIR, DIR holding a sim/ package")
    parser.add_argument("--seeds", default="0:30")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--first-decides", action="store_true",
        help="run the other trees only where the first caught the bug: for trees whose "
        "runs are the same and differ only in checks added to the first",
    )  # fmt: skip
    parser.add_argument(
        "--bugs", nargs="*", help="names (default: every bug listing the simulator)"
    )
    args = parser.parse_args()
    trees = [(name, Path(d).resolve()) for name, d in (t.split("=", 1) for t in args.trees)]
    bugs = [b for b in pb.every_bug() if pb.SIMULATOR in b.models]
    if args.bugs:
        bugs = [b for b in bugs if b.name in args.bugs]
    totals = {name: 0 for name, _ in trees}
    scored = 0
    for bug in bugs:
        with tempfile.TemporaryDirectory(prefix="sim-score-") as tmp:
            work = Path(tmp)
            shutil.copytree(REPO / "trio_broker", work / "trio_broker",
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            if not plant(work, bug.path, bug.old, bug.new):
                print(f"{bug.name}: does not apply to this tree", flush=True)
                continue
            scored += 1
            verdicts: list[str] = []
            for name, tree in trees:
                if args.first_decides and verdicts and "caught" not in verdicts[0]:
                    break
                started = time.monotonic()
                verdict = caught(work, tree, args.seeds, args.jobs, args.timeout)
                totals[name] += verdict.startswith("caught")
                verdicts.append(f"{name}: {verdict} {time.monotonic() - started:.0f} s")
            print(f"{bug.name} ({bug.path}): " + "; ".join(verdicts), flush=True)
    print(f"{scored} bugs scored, seeds {args.seeds}: "
          + ", ".join(f"{name} caught {n}" for name, n in totals.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
