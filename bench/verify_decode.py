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
    .venv/bin/python bench/verify_decode.py --mixed --frames 100000
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


def write_mixed_capture(frames: int, directory: Path, seed: int = 7) -> int:
    """A capture of varied shapes (no verification meaning): 2 000 random Produce
    requests/responses (v3-v13: 1-3 topics x 1-4 partitions x 1-3 batches) and Fetch
    responses (v4-v18: 1-2 topics x 1-6 partitions x 0-10 batches, some aborted
    transactions, some errors), tiled to ``frames`` rows; plus 1 % Metadata responses,
    which go to the reference."""
    import random
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    import trio_broker.protocol.messages as m
    from trio_broker.protocol.messages import encode_request, encode_response
    from trio_broker.protocol.records import build_batch

    rnd = random.Random(seed)
    P, R, F = m.ProduceRequest, m.ProduceResponse, m.FetchResponse
    PPR = R.TopicProduceResponse.PartitionProduceResponse
    PD = F.FetchableTopicResponse.PartitionData
    batch = [
        bytes(
            build_batch([(None, b"v" * 100)] * n, producer_id=3, base_sequence=0, base_timestamp=0)
        )
        for n in (1, 5)
    ]

    def records(count: int) -> bytes:
        return b"".join(rnd.choice(batch) for _ in range(count))

    def join(parts: list[Any]) -> bytes:
        return b"".join(bytes(p) for p in parts)

    def topic() -> tuple[str, uuid.UUID]:
        return f"topic-{rnd.randrange(20)}", uuid.UUID(int=rnd.getrandbits(128))

    templates: list[tuple[str, int, int, bytes]] = []
    for i in range(2000):
        kind = rnd.choice(["produce", "ack", "fetch"])
        if kind == "produce":
            v = rnd.randrange(3, 14)
            topics = [P.TopicProduceData(name=n, topic_id=t, partition_data=[
                P.TopicProduceData.PartitionProduceData(index=j, records=records(rnd.randint(1, 3)))
                for j in range(rnd.randint(1, 4))])
                for n, t in (topic() for _ in range(rnd.randint(1, 3)))]  # fmt: skip
            body = P(acks=-1, timeout_ms=1000, topic_data=topics)
            templates.append(("request", 0, v, encode_request(0, v, i, "mixed", body)[4:]))
        elif kind == "ack":
            v = rnd.randrange(3, 14)
            topics = [R.TopicProduceResponse(name=n, topic_id=t, partition_responses=[
                PPR(index=j, base_offset=rnd.randrange(1 << 40)) for j in range(rnd.randint(1, 4))])
                for n, t in (topic() for _ in range(rnd.randint(1, 3)))]  # fmt: skip
            templates.append(
                ("response", 0, v, join(encode_response(0, v, i, R(responses=topics)))[4:])
            )
        else:
            v = rnd.randrange(4, 19)
            topics = [F.FetchableTopicResponse(topic=n, topic_id=t, partitions=[
                PD(partition_index=j, error_code=rnd.choice([0] * 9 + [1]), high_watermark=9,
                   aborted_transactions=[PD.AbortedTransaction(producer_id=1)] * rnd.randint(0, 2),
                   records=records(rnd.randint(0, 10))) for j in range(rnd.randint(1, 6))])
                for n, t in (topic() for _ in range(rnd.randint(1, 2)))]  # fmt: skip
            templates.append(
                ("response", 1, v, join(encode_response(1, v, i, F(responses=topics)))[4:])
            )
    T = m.MetadataResponse.MetadataResponseTopic
    metadata = m.MetadataResponse(
        topics=[T(name=f"topic-{j}", topic_id=uuid.UUID(int=j + 1)) for j in range(20)]
    )
    templates += [("response", 3, 12, join(encode_response(3, 12, 0, metadata))[4:])] * 20
    rows = [templates[i % len(templates)] for i in range(frames)]
    rnd.shuffle(rows)
    directory.mkdir(parents=True, exist_ok=True)
    n = len(rows)
    table = pa.table({
        "connection_id": pa.array([i % 50 for i in range(n)], pa.int64()),
        "direction": [r[0] for r in rows], "monotonic_ns": pa.array(range(n), pa.int64()),
        "api_key": pa.array([r[1] for r in rows], pa.int16()),
        "api_version": pa.array([r[2] for r in rows], pa.int16()),
        "correlation_id": pa.array(range(n), pa.int32()),
        "frame_length": pa.array([len(r[3]) for r in rows], pa.int64()),
        "frame": pa.array([r[3] for r in rows], pa.binary()),
    })  # fmt: skip
    pq.write_table(table, directory / "mixed-b0-1-000000.parquet")
    return n


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


def measure(
    directory: Path, frames: int, batch_rows: int, reference_rows: int, workload: str
) -> dict[str, Any]:
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
        "workload": workload,
        "frames": frames,
        "rows": rows,
        "batch_rows": batch_rows,
        "facts": sum(fast_kinds.values()),
        "fast_s": round(fast_s, 3),
        "fast_frames_per_s": round(rows / fast_s),
        "fast_rows_on_reference": stats.get("reference", 0),
        "fast_facts_per_s": round(sum(fast_kinds.values()) / fast_s),
        "reference_rows": taken,
        "reference_facts_per_s": round(sum(ref_kinds.values()) / ref_s),
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
    parser.add_argument(
        "--mixed", action="store_true", help="varied random shapes, not bench/verify.py's workload"
    )
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
                write = write_mixed_capture if args.mixed else _generator().write_capture
                frames = write(frames, directory)
                print(f"wrote {frames} frames in {time.perf_counter() - started:.1f} s", flush=True)
            workload = "capture" if args.capture else "mixed" if args.mixed else "bench/verify.py"
            result = measure(directory, frames, args.batch_rows, args.reference_rows, workload)
        results.append(result)
        print(json.dumps(result), flush=True)
    print()
    print("| workload | frames | facts/frame | fastdecode frames/s (facts/s) "
          "| reference frames/s (facts/s) [rows] | speedup | rows to reference |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['workload']} | {r['rows']:,} | {r['facts'] / r['rows']:.1f} "
            f"| {r['fast_frames_per_s']:,} ({r['fast_facts_per_s']:,}) "
            f"| {r['reference_frames_per_s']:,} ({r['reference_facts_per_s']:,}) "
            f"[{r['reference_rows']:,}] | {r['speedup']}x | {r['fast_rows_on_reference']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
