"""Verify's frame decoding alone, on one core: the vectorized path vs the reference.

Writes a synthetic capture with bench/verify.py's generator (or reuses ``--capture
DIR``), reads it with pyarrow (not timed), cuts it into record batches of
``--batch-rows`` rows (what Spark's ``mapInArrow`` hands the decoder; Spark's default
is 10 000), then times, pinned to one CPU:

- ``fastdecode``: ``trio_broker.verify.fastdecode.decode_batch`` on every batch;
- ``reference``: what ``decode_batches`` did before (``to_pylist`` per column,
  ``decode_rows``, ``RecordBatch.from_pydict``), on the first ``--reference-rows``
  rows only (it is ~10x slower; its rate does not depend on the capture size).

Checks that both give the same number of facts of each kind on the reference rows.

    .venv/bin/python bench/verify_decode.py --frames 100000,1000000 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def _generator() -> Any:
    """bench/verify.py as a module (its write_capture makes the synthetic capture)."""
    spec = importlib.util.spec_from_file_location("bench_verify", ROOT / "bench" / "verify.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_batches(directory: Path, batch_rows: int) -> list[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trio_broker.verify.decode import NEEDED_COLUMNS

    tables = []
    for path in sorted(directory.glob("*.parquet")):
        table = pq.read_table(path)
        run = path.name.rsplit("-", 1)[0]
        table = table.append_column("run", pa.array([run] * table.num_rows, pa.string()))
        tables.append(table.select(list(NEEDED_COLUMNS)))
    table = pa.concat_tables(tables).combine_chunks()
    return list(table.to_batches(max_chunksize=batch_rows))


def time_fast(batches: list[Any]) -> tuple[float, Counter[str], dict[str, int]]:
    from trio_broker.verify.fastdecode import decode_batch

    kinds: Counter[str] = Counter()
    stats: dict[str, int] = {}
    outputs = []
    started = time.perf_counter()
    for batch in batches:
        outputs.append(decode_batch(batch, stats))
    seconds = time.perf_counter() - started
    for out in outputs:
        for facts in out:
            kinds.update(facts.column("kind").to_pylist())
    return seconds, kinds, stats


def time_reference(batches: list[Any]) -> tuple[float, Counter[str]]:
    import pyarrow as pa

    from trio_broker.verify.decode import NEEDED_COLUMNS, decode_rows, fact_schema

    schema = fact_schema()
    outputs = []
    started = time.perf_counter()
    for batch in batches:
        columns = {name: batch.column(name).to_pylist() for name in NEEDED_COLUMNS}
        outputs.append(pa.RecordBatch.from_pydict(decode_rows(columns), schema=schema))
    seconds = time.perf_counter() - started
    kinds: Counter[str] = Counter()
    for facts in outputs:
        kinds.update(facts.column("kind").to_pylist())
    return seconds, kinds


def measure(directory: Path, frames: int, batch_rows: int, reference_rows: int) -> dict[str, Any]:
    batches = load_batches(directory, batch_rows)
    rows = sum(b.num_rows for b in batches)
    fast_s, fast_kinds, stats = time_fast(batches)
    ref_batches, taken = [], 0
    for batch in batches:
        if taken >= reference_rows:
            break
        ref_batches.append(batch)
        taken += batch.num_rows
    ref_s, ref_kinds = time_reference(ref_batches)
    _, fast_subset, _ = time_fast(ref_batches)
    if fast_subset != ref_kinds:
        raise SystemExit(f"fact counts differ: fast {fast_subset} reference {ref_kinds}")
    return {
        "frames": frames,
        "rows": rows,
        "batch_rows": batch_rows,
        "facts": sum(fast_kinds.values()),
        "fast_s": round(fast_s, 3),
        "fast_frames_per_s": round(rows / fast_s),
        "fast_rows_on_reference": stats.get("reference", 0),
        "reference_rows": taken,
        "reference_s": round(ref_s, 3),
        "reference_frames_per_s": round(taken / ref_s),
        "speedup": round((rows / fast_s) / (taken / ref_s), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", default="100000,1000000")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--reference-rows", type=int, default=100_000)
    parser.add_argument("--capture", type=Path, help="decode this capture directory instead")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    results = []
    sizes = [0] if args.capture else [int(f) for f in args.frames.split(",")]
    for frames in sizes:
        with tempfile.TemporaryDirectory(prefix="verify-decode-") as tmp:
            directory = args.capture or Path(tmp)
            if not args.capture:
                started = time.perf_counter()
                frames = _generator().write_capture(frames, directory)
                print(f"wrote {frames} frames in {time.perf_counter() - started:.1f} s", flush=True)
            result = measure(directory, frames, args.batch_rows, args.reference_rows)
        results.append(result)
        print(json.dumps(result), flush=True)
    print()
    print("| frames | fastdecode frames/s | reference frames/s (rows) | speedup | to reference |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['rows']:,} | {r['fast_frames_per_s']:,} | {r['reference_frames_per_s']:,} "
            f"({r['reference_rows']:,}) | {r['speedup']}x | {r['fast_rows_on_reference']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
