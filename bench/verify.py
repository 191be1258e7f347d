"""Verify throughput: ``trio-broker verify`` (PySpark, local[2]) on synthetic captures.

Writes valid captures of N frames quickly: a template workload (idempotent
producers, one batch per Produce, a consumer fetching every FETCH_EVERY batches
of a partition) encoded once with our codec, then copied with correlation ids,
offsets, sequences and CRCs patched in place. Then, each in a subprocess with
a time limit, runs the Spark job and a naive single-process pandas checker
(bench-only baseline, below) on it, sampling the peak RSS of the process tree.
Prints a table (frames/s excludes the Spark session start) with the job's phase
seconds, and writes JSON.

    .venv/bin/python bench/verify.py --frames 100000,1000000,2400000 --time-limit 300 \
        --json out.json
    .venv/bin/python bench/verify.py --frames 10000000 --engines spark \
        --conf spark.driver.memory=1g --time-limit 600
    git archive bff0773 | tar -x -C /tmp/old    # the same capture, checked by two commits
    .venv/bin/python bench/verify.py --frames 1000000 --engines spark --trees /tmp/old,.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Not bench/ itself first on the path: a script there named like a stdlib module
# (bench/profile.py once shadowed ``profile``, which pyspark imports) would win.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

PRODUCERS = 8
PARTITIONS = 8
FETCH_EVERY = 8
ROWS_PER_FILE = 100_000
#: Row groups as small as the broker tap's files (10 000 rows): Spark splits Parquet
#: only at row groups, so this is what lets both cores read one file.
ROWS_PER_GROUP = 10_000
TIME_LIMIT_S = 60.0
_I32, _I64, _U32 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">I")
SENTINEL = 0x0123456789AB


# ------------------------------------------------------------------ synthetic captures


class Templates:
    """Encoded frames with the positions of the fields to patch."""

    def __init__(self) -> None:
        import trio_broker.protocol.messages as m
        from trio_broker.protocol.messages import encode_request, encode_response
        from trio_broker.protocol.records import build_batch

        self.batch = bytes(
            build_batch(
                [(None, b"v" * 100)],
                producer_id=7,
                producer_epoch=0,
                base_sequence=0,
                base_timestamp=0,
            )
        )
        self.produce: list[tuple[bytes, int]] = []
        for partition in range(PARTITIONS):
            part = m.ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=self.batch
            )
            body = m.ProduceRequest(
                transactional_id=None, acks=-1, timeout_ms=1000,
                topic_data=[m.ProduceRequest.TopicProduceData(name="bench", partition_data=[part])],
            )  # fmt: skip
            frame = encode_request(0, 9, 1, "bench", body)[4:]
            self.produce.append((frame, frame.find(self.batch)))
        P = m.ProduceResponse
        self.ack: list[tuple[bytes, int]] = []
        for partition in range(PARTITIONS):
            body = P(responses=[P.TopicProduceResponse(name="bench", partition_responses=[
                P.TopicProduceResponse.PartitionProduceResponse(
                    index=partition, error_code=0, base_offset=SENTINEL)])])  # fmt: skip
            frame = _join(encode_response(0, 9, 1, body))[4:]
            self.ack.append((frame, frame.find(_I64.pack(SENTINEL))))
        F = m.FetchResponse
        records = self.batch * FETCH_EVERY
        self.fetch: list[tuple[bytes, int, int]] = []
        for partition in range(PARTITIONS):
            part = F.FetchableTopicResponse.PartitionData(
                partition_index=partition, error_code=0, high_watermark=SENTINEL,
                last_stable_offset=-1, log_start_offset=0, records=records,
            )  # fmt: skip
            body = F(throttle_time_ms=0, error_code=0, session_id=0,
                     responses=[F.FetchableTopicResponse(topic="bench", partitions=[part])])  # fmt: skip
            frame = _join(encode_response(1, 12, 1, body))[4:]
            self.fetch.append((frame, frame.find(records), frame.find(_I64.pack(SENTINEL))))
        R = m.FetchRequest
        body = R(
            replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            topics=[R.FetchTopic(topic="bench", partitions=[R.FetchTopic.FetchPartition(
                partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
        )  # fmt: skip
        self.fetch_request = encode_request(1, 12, 1, "bench", body)[4:]


def _join(parts: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def _crc(producer: int, sequence: int) -> int:
    return (producer * 1_000_003 + sequence * 7919) & 0xFFFFFFFF


def write_capture(frames: int, directory: Path) -> int:
    """A capture of about ``frames`` rows in ``directory``; returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trio_broker.capture.schema import _binary_column as binary_column
    from trio_broker.capture.schema import arrow_schema

    t = Templates()
    schema = arrow_schema()
    written = 0
    files = 0
    clock = 1_000_000_000
    wall = time.time_ns()
    sequences = [0] * PRODUCERS
    next_offset = [0] * PARTITIONS
    unfetched = [0] * PARTITIONS
    corr = [0] * (PRODUCERS + 1)
    bsize = len(t.batch)

    rows: list[tuple[Any, ...]] = []

    def add(conn: int, direction: str, key: int, version: int, c: int, frame: bytes) -> None:
        nonlocal clock
        clock += 10_000
        rows.append((
            0, conn, f"10.0.0.{conn}:4000", f"bench-{conn}", direction, clock, wall + clock,
            key, version, c, len(frame), frame,
        ))  # fmt: skip

    def flush() -> None:
        nonlocal files, written
        if not rows:
            return
        values = list(zip(*rows, strict=True))
        arrays = [pa.array(list(v), f.type) for v, f in zip(values[:-1], schema, strict=False)]
        arrays.append(binary_column(list(values[-1])))
        table = pa.Table.from_arrays(arrays, schema=schema)
        pq.write_table(
            table,
            directory / f"capture-b0-1-{files:06d}.parquet",
            compression="zstd",
            row_group_size=ROWS_PER_GROUP,
        )
        files += 1
        written += len(rows)
        rows.clear()

    directory.mkdir(parents=True, exist_ok=True)
    step = 0
    while written + len(rows) < frames:
        producer = step % PRODUCERS
        partition = producer % PARTITIONS
        step += 1
        seq = sequences[producer]
        sequences[producer] += 1
        corr[producer] += 1
        frame, at = t.produce[partition]
        request = bytearray(frame)
        _I32.pack_into(request, 4, corr[producer])
        _I64.pack_into(request, at + 43, 1000 + producer)  # producer id
        _I32.pack_into(request, at + 53, seq)  # base sequence
        _U32.pack_into(request, at + 17, _crc(producer, seq))
        add(producer + 1, "request", 0, 9, corr[producer], bytes(request))
        frame, at = t.ack[partition]
        response = bytearray(frame)
        _I32.pack_into(response, 0, corr[producer])
        _I64.pack_into(response, at, next_offset[partition])
        add(producer + 1, "response", 0, 9, corr[producer], bytes(response))
        next_offset[partition] += 1
        unfetched[partition] += 1
        if unfetched[partition] == FETCH_EVERY:
            unfetched[partition] = 0
            consumer = PRODUCERS + 1
            corr[PRODUCERS] += 1
            c = corr[PRODUCERS]
            fetch_request = bytearray(t.fetch_request)
            _I32.pack_into(fetch_request, 4, c)
            add(consumer, "request", 1, 12, c, bytes(fetch_request))
            frame, records_at, hw_at = t.fetch[partition]
            fetch = bytearray(frame)
            _I32.pack_into(fetch, 0, c)
            _I64.pack_into(fetch, hw_at, next_offset[partition])
            first = next_offset[partition] - FETCH_EVERY
            # The batches acknowledged on this partition, in order: the producers of this
            # partition (producer % PARTITIONS == partition) took turns in step order.
            for i in range(FETCH_EVERY):
                at = records_at + i * bsize
                _I64.pack_into(fetch, at, first + i)
                offset = first + i
                producer_of = partition + (offset % (PRODUCERS // PARTITIONS)) * PARTITIONS
                seq_of = offset // (PRODUCERS // PARTITIONS)
                _I64.pack_into(fetch, at + 43, 1000 + producer_of)
                _I32.pack_into(fetch, at + 53, seq_of)
                _U32.pack_into(fetch, at + 17, _crc(producer_of, seq_of))
            add(consumer, "response", 1, 12, c, bytes(fetch))
        if len(rows) >= ROWS_PER_FILE:
            flush()
    flush()
    return written


# ------------------------------------------------------------------ the naive baseline
# BENCH-ONLY: a single-process pandas checker, as a yardstick for the Spark job. It runs
# the same decoder and three of the checks (acknowledged batches fetched at their offset
# with their CRC, fetch responses contiguous, producer sequences contiguous); the real
# checks live once, in trio_broker/verify/checks.py.


def pandas_baseline(directory: Path) -> dict[str, Any]:
    import pandas as pd
    import pyarrow.parquet as pq

    from trio_broker.verify.decode import NEEDED_COLUMNS, decode_rows

    started = time.monotonic()
    facts = []
    for path in sorted(directory.glob("*.parquet")):
        table = pq.read_table(path)
        columns = {n: table.column(n).to_pylist() for n in NEEDED_COLUMNS if n != "run"}
        columns["run"] = ["r"] * table.num_rows
        facts.append(pd.DataFrame(decode_rows(columns)))
    f = pd.concat(facts, ignore_index=True)
    batches = f[f.kind == "produce_batch"]
    acks = f[(f.kind == "produce_ack") & (f.error == 0)]
    acked = batches.merge(acks[["conn", "corr", "topic", "partition", "offset"]],
                          on=["conn", "corr", "topic", "partition"], suffixes=("", "_ack"))  # fmt: skip
    acked["base_offset"] = acked["offset_ack"] + acked["idx"]
    fetched = f[f.kind == "fetch_batch"].groupby(["topic", "partition", "offset", "crc"]).size()
    fetched = fetched.reset_index().rename(columns={"offset": "base_offset"})
    joined = acked.merge(fetched, on=["topic", "partition", "base_offset", "crc"], how="left")
    extent = fetched.groupby(["topic", "partition"])["base_offset"].max().rename("extent")
    joined = joined.join(extent, on=["topic", "partition"])
    missing = int((joined[0].isna() & (joined["base_offset"] <= joined["extent"])).sum())
    fb = f[f.kind == "fetch_batch"].sort_values(["conn", "corr", "topic", "partition", "idx"])
    prev = fb.groupby(["conn", "corr", "topic", "partition"])["last_offset"].shift()
    gaps = int(((fb["offset"] != prev + 1) & prev.notna()).sum())
    idem = acked[acked.producer_id >= 0].sort_values(["producer_id", "partition", "base_sequence"])
    expected = idem.groupby(["producer_id", "partition"])["base_sequence"].shift() + 1
    seq_gaps = int(((idem["base_sequence"] != expected) & expected.notna()).sum())
    return {
        "violations": missing + gaps + seq_gaps,
        "seconds": round(time.monotonic() - started, 2),
    }


# ------------------------------------------------------------------ running


def spark_verify(directory: Path, conf: dict[str, str]) -> dict[str, Any]:
    from trio_broker.verify.job import read_capture_files, spark_session, verify

    started = time.monotonic()
    # As ``trio-broker verify`` does: the capture's size picks the JIT.
    frames = read_capture_files(directory, warn=False).frames
    spark = spark_session("local[2]", conf, frames=frames)
    session_s = time.monotonic() - started
    try:
        report = verify(spark, directory)
    finally:
        spark.stop()
    return {"violations": sum(c["violations"] for c in report["checks"].values()),
            "seconds": report["seconds"], "session_seconds": round(session_s, 2),
            "phase_seconds": report["phase_seconds"],
            "acknowledged_batches": report["acknowledged_batches"]}  # fmt: skip


def _tree_rss(pid: int) -> int:
    """RSS bytes of ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
        stack.extend(children.get(p, []))
    return total


def _tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system, with reaped children's) of ``pid`` and each descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    seconds: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        seconds[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    out: dict[int, float] = {}
    stack = [pid]
    while stack:
        p = stack.pop()
        out[p] = seconds.get(p, 0.0)
        stack.extend(children.get(p, []))
    return out


def measured(
    mode: str, directory: Path, time_limit: float, conf: list[str], tree: Path = ROOT
) -> dict[str, Any]:
    """Run ``mode`` on ``directory`` in a subprocess (time-limited), sampling peak tree RSS
    and CPU seconds (the JVM and the Python workers: the machine may be shared, and CPU
    time compares runs where wall time does not). ``tree``: the checkout whose
    ``trio_broker`` runs (another commit's, for a side-by-side run)."""
    cmd = [sys.executable, str(tree / "bench" / "verify.py"), "--run", mode, str(directory)]
    cmd += [f"--conf={c}" for c in conf]
    env = dict(os.environ, PYTHONPATH=str(tree))
    # stderr to a file (Spark's progress is long): its tail explains a failed run.
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed after the run
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    peak = 0
    cpu: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            for pid, seconds in _tree_cpu(proc.pid).items():
                cpu[pid] = max(cpu.get(pid, 0.0), seconds)
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    result: dict[str, Any]
    try:
        out, _ = proc.communicate(timeout=time_limit)
        lines = out.strip().splitlines()
        if proc.returncode == 0 and lines:
            result = json.loads(lines[-1])
        else:
            errors.seek(0)
            tail = [line for line in errors.read().splitlines() if " WARN " not in line][-15:]
            result = {"failed": proc.returncode, "stderr_tail": tail}
            print("\n".join(tail), file=sys.stderr)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        result = {"timeout": True}
    errors.close()
    done.set()
    sampler.join()
    result["wall_seconds"] = round(time.monotonic() - started, 2)
    result["peak_rss_mib"] = round(peak / 2**20)
    result["cpu_seconds"] = round(sum(cpu.values()), 1)
    result["tree"] = str(tree)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", default="100000,1000000")
    parser.add_argument(
        "--time-limit", type=float, default=TIME_LIMIT_S, help="seconds per engine run"
    )
    parser.add_argument("--engines", default="spark,pandas", help="comma-separated")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    parser.add_argument(
        "--trees",
        default=str(ROOT),
        help="comma-separated checkouts to run side by side on each capture (e.g. an older "
        "commit's `git archive`), alternating their order per capture",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="write the captures here and keep them")
    parser.add_argument("--run", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        mode, directory = args.run
        if mode == "spark":
            conf = dict(c.split("=", 1) for c in args.conf)
            print(json.dumps(spark_verify(Path(directory), conf)))
        else:
            print(json.dumps(pandas_baseline(Path(directory))))
        return
    results = []
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"{'frames':>9} {'engine':<7} {'check s':>8} {'frames/s':>9} {'wall s':>7} "
          f"{'CPU s':>7} {'peak MiB':>9} {'violations':>10}  phases s")  # fmt: skip
    for n, frames in enumerate(int(x) for x in args.frames.split(",")):
        base = args.keep or Path(tempfile.mkdtemp(prefix="bench-verify-", dir=ROOT / "bench"))
        directory = base / f"capture-{frames}"
        started = time.monotonic()
        rows = write_capture(frames, directory)
        generate_s = time.monotonic() - started
        runs = [(mode, tree) for mode in args.engines.split(",") for tree in trees]
        for mode, tree in runs if n % 2 == 0 else runs[::-1]:
            r = measured(mode, directory, args.time_limit, args.conf, tree)
            r.update(engine=mode, frames=rows, generate_seconds=round(generate_s, 1))
            if len(trees) > 1:
                print(f"# {tree}", flush=True)
            if "seconds" in r:
                r["frames_per_s"] = round(rows / r["seconds"])
            results.append(r)
            failed = "timeout" if r.get("timeout") else "failed"
            rate = f"{r['frames_per_s']:>9}" if "frames_per_s" in r else f"{failed:>9}"
            phases = " ".join(f"{k} {v}" for k, v in r.get("phase_seconds", {}).items())
            print(f"{rows:>9} {mode:<7} {r.get('seconds', float('nan')):>8.1f} {rate} "
                  f"{r['wall_seconds']:>7.1f} {r['cpu_seconds']:>7.1f} {r['peak_rss_mib']:>9} "
                  f"{r.get('violations', '-'):>10}  {phases}", flush=True)  # fmt: skip
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        summary = {"machine_cores": os.cpu_count(), "load_average": os.getloadavg(),
                   "spark_conf": args.conf, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
