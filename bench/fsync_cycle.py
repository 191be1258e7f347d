"""The strict group-commit cycle without the broker: what the disk alone allows.

    .venv/bin/python bench/fsync_cycle.py [--dir DIR] [--rounds 4] [--seconds 2]
        [--json FILE]

Per round, each case for ``--seconds`` (a file in DIR, default: a temp dir under
bench/, on the disk the broker's data would use):

* raw       - 16 x 64 KiB ``os.write`` then ``fdatasync`` (1 MiB), appending: the
  raw loop of bench/storage.py; run before, between and after the other two.
* appending - 8 x 64 KiB ``os.write`` then ``fdatasync``, appending: the strict
  x8 case of bench/storage.py with no event loop, flusher or log in the way.
* prewritten - the same cycle overwriting a region first filled with zeros and
  synced (that filling is not timed): the fdatasync then has no file size or
  block allocation to journal.

Each case prints MB/s and its ratio to the mean of the raw runs around it, and
the median fdatasync time. Bounded: at most 1 GiB per case.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

KIB = 1024
MIB = 1024 * KIB
WRITE = b"x" * (64 * KIB)
LIMIT = 1024 * MIB


def cycle(path: Path, seconds: float, writes_per_sync: int, prewritten: bool) -> dict[str, float]:
    """Write ``writes_per_sync`` x 64 KiB then fdatasync, until ``seconds`` or LIMIT."""
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
    try:
        if prewritten:
            zeros = b"\0" * MIB
            for _ in range(LIMIT // MIB):
                os.write(fd, zeros)
            os.fdatasync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        step = writes_per_sync * len(WRITE)
        written = 0
        syncs: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds and written + step <= LIMIT:
            for _ in range(writes_per_sync):
                os.write(fd, WRITE)
            before = time.perf_counter()
            os.fdatasync(fd)
            syncs.append(time.perf_counter() - before)
            written += step
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return {
        "mb_s": written / elapsed / 1e6,
        "sync_ms": statistics.median(syncs) * 1e3,
        "bytes": written,
        "seconds": elapsed,
        "syncs": len(syncs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent
    directory = args.dir or Path(tempfile.mkdtemp(prefix="fsync-cycle-", dir=root))
    directory.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for _ in range(args.rounds):
            raw = [cycle(directory / "raw", args.seconds, 16, False)]
            appending = cycle(directory / "cycle", args.seconds, 8, False)
            raw.append(cycle(directory / "raw", args.seconds, 16, False))
            prewritten = cycle(directory / "cycle", args.seconds, 8, True)
            raw.append(cycle(directory / "raw", args.seconds, 16, False))
            base = statistics.mean(r["mb_s"] for r in raw)
            row = {
                "raw_mb_s": [round(r["mb_s"]) for r in raw],
                "raw_sync_ms": round(statistics.median(r["sync_ms"] for r in raw), 3),
                "appending_mb_s": round(appending["mb_s"]),
                "appending_ratio": round(appending["mb_s"] / base, 2),
                "appending_sync_ms": round(appending["sync_ms"], 3),
                "prewritten_mb_s": round(prewritten["mb_s"]),
                "prewritten_ratio": round(prewritten["mb_s"] / base, 2),
                "prewritten_sync_ms": round(prewritten["sync_ms"], 3),
            }
            results.append(row)
            print(
                f"raw {'/'.join(map(str, row['raw_mb_s']))} MB/s (sync {row['raw_sync_ms']} ms)"
                f" | 8x64 KiB appending {row['appending_mb_s']} MB/s"
                f" ({row['appending_ratio']:.0%}, sync {row['appending_sync_ms']} ms)"
                f" | prewritten {row['prewritten_mb_s']} MB/s"
                f" ({row['prewritten_ratio']:.0%}, sync {row['prewritten_sync_ms']} ms)",
                flush=True,
            )
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"load_average": os.getloadavg(), "rounds": results}))


if __name__ == "__main__":
    main()
