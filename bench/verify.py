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
    .venv/bin/python bench/verify.py --frames 1000000,2000000 --engines spark \
        --transactions --profile    # transactional producers; each check timed alone
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
#: ``--transactions``: each producer's batches are transactional, TXN_BATCHES to a
#: transaction (then its EndTxn and the marker: FETCH_EVERY log entries), every
#: ABORT_EVERY-th transaction aborted; the consumer reads committed.
TXN_BATCHES = FETCH_EVERY - 1
ABORT_EVERY = 4
TRANSACTIONAL = 0x10
CONTROL = 0x20
ROWS_PER_FILE = 100_000
#: Row groups as small as the broker tap's files (10 000 rows): Spark splits Parquet
#: only at row groups, so this is what lets both cores read one file.
ROWS_PER_GROUP = 10_000
TIME_LIMIT_S = 60.0
_I16, _I32, _I64, _U32 = (struct.Struct(f) for f in (">h", ">i", ">q", ">I"))
SENTINEL = 0x0123456789AB
LSO_SENTINEL = 0x0123456789AC
ABORTED_PID_SENTINEL = 0x0123456789AD
ABORTED_FIRST_SENTINEL = 0x0123456789AE


# ------------------------------------------------------------------ synthetic captures


class Templates:
    """Encoded frames with the positions of the fields to patch."""

    def __init__(self, transactions: bool = False) -> None:
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
                transactional_id=f"tx-{partition}" if transactions else None,
                acks=-1, timeout_ms=1000,
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
        # Per partition: (frame, records at, HW at, LSO at or -1), and in
        # ``fetch_aborted`` the same with one aborted transaction listed, whose producer id
        # and first offset are at ``aborted_at`` and ``aborted_at + 8``.
        self.fetch: list[tuple[bytes, int, int, int]] = []
        self.fetch_aborted: list[tuple[bytes, int, int, int, int]] = []
        Aborted = F.FetchableTopicResponse.PartitionData.AbortedTransaction
        for partition in range(PARTITIONS):
            for aborted in (False, True) if transactions else (False,):
                part = F.FetchableTopicResponse.PartitionData(
                    partition_index=partition, error_code=0, high_watermark=SENTINEL,
                    last_stable_offset=LSO_SENTINEL if transactions else -1,
                    log_start_offset=0, records=records,
                    aborted_transactions=[Aborted(producer_id=ABORTED_PID_SENTINEL,
                                                  first_offset=ABORTED_FIRST_SENTINEL)]
                    if aborted else None,
                )  # fmt: skip
                body = F(throttle_time_ms=0, error_code=0, session_id=0,
                         responses=[F.FetchableTopicResponse(topic="bench", partitions=[part])])  # fmt: skip
                frame = _join(encode_response(1, 12, 1, body))[4:]
                at = (frame.find(records), frame.find(_I64.pack(SENTINEL)),
                      frame.find(_I64.pack(LSO_SENTINEL)))  # fmt: skip
                if aborted:
                    self.fetch_aborted.append(
                        (frame, *at, frame.find(_I64.pack(ABORTED_PID_SENTINEL)))
                    )
                else:
                    self.fetch.append((frame, *at))
        # Per producer: its EndTxn request frames, aborting (index 0) and committing (1).
        self.end_txn: list[list[bytes]] = []
        self.end_txn_ack = b""
        if transactions:
            for producer in range(PRODUCERS):
                self.end_txn.append([
                    encode_request(26, 3, 1, "bench", m.EndTxnRequest(
                        transactional_id=f"tx-{producer}", producer_id=1000 + producer,
                        producer_epoch=0, committed=committed))[4:]
                    for committed in (False, True)
                ])  # fmt: skip
            ack = m.EndTxnResponse(throttle_time_ms=0, error_code=0)
            self.end_txn_ack = _join(encode_response(26, 3, 1, ack))[4:]
        R = m.FetchRequest
        body = R(
            replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
            isolation_level=1 if transactions else 0,
            topics=[R.FetchTopic(topic="bench", partitions=[R.FetchTopic.FetchPartition(
                partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
        )  # fmt: skip
        self.fetch_request = encode_request(1, 12, 1, "bench", body)[4:]


def _join(parts: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def _crc(producer: int, sequence: int) -> int:
    return (producer * 1_000_003 + sequence * 7919) & 0xFFFFFFFF


def write_capture_rows(directory: Path) -> int:
    """The rows of a capture that :func:`main` wrote and kept before (``--keep``)."""
    return int((directory / "done").read_text())


def write_capture(frames: int, directory: Path, *, transactions: bool = False) -> int:
    """A capture of about ``frames`` rows in ``directory``; returns the rows written.

    ``transactions``: transactional producers (EndTxn after every TXN_BATCHES batches,
    every ABORT_EVERY-th transaction aborted, its marker in the log) and a read_committed
    consumer (last stable offsets, aborted-transaction lists), which the transaction
    checks need to have something to join."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trio_broker.capture.schema import _binary_column as binary_column
    from trio_broker.capture.schema import arrow_schema

    if transactions and PRODUCERS != PARTITIONS:
        raise ValueError("--transactions needs one producer per partition")
    t = Templates(transactions)
    schema = arrow_schema()
    written = 0
    files = 0
    clock = 1_000_000_000
    wall = time.time_ns()
    sequences = [0] * PRODUCERS
    transactions_ended = [0] * PRODUCERS
    txn_first = [0] * PRODUCERS  # the first offset of the producer's open transaction
    # Per partition, the log entries not yet fetched: (producer id, sequence, CRC,
    # attributes), in offset order.
    unfetched: list[list[tuple[int, int, int, int]]] = [[] for _ in range(PARTITIONS)]
    # Per partition, the aborted transaction whose entries the next fetch returns.
    aborted: list[tuple[int, int] | None] = [None] * PARTITIONS
    next_offset = [0] * PARTITIONS
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

    def fetch(partition: int) -> None:
        consumer = PRODUCERS + 1
        corr[PRODUCERS] += 1
        c = corr[PRODUCERS]
        fetch_request = bytearray(t.fetch_request)
        _I32.pack_into(fetch_request, 4, c)
        add(consumer, "request", 1, 12, c, bytes(fetch_request))
        listed = aborted[partition]
        if listed is None:
            frame, records_at, hw_at, lso_at = t.fetch[partition]
        else:
            frame, records_at, hw_at, lso_at, aborted_at = t.fetch_aborted[partition]
        response = bytearray(frame)
        _I32.pack_into(response, 0, c)
        _I64.pack_into(response, hw_at, next_offset[partition])
        if lso_at >= 0:  # no transaction is open when the consumer fetches
            _I64.pack_into(response, lso_at, next_offset[partition])
        if listed is not None:
            _I64.pack_into(response, aborted_at, listed[0])
            _I64.pack_into(response, aborted_at + 8, listed[1])
            aborted[partition] = None
        first = next_offset[partition] - FETCH_EVERY
        for i, (producer_id, sequence, crc, attributes) in enumerate(unfetched[partition]):
            at = records_at + i * bsize
            _I64.pack_into(response, at, first + i)
            _I16.pack_into(response, at + 21, attributes)
            _I64.pack_into(response, at + 43, producer_id)
            _I32.pack_into(response, at + 53, sequence)
            _U32.pack_into(response, at + 17, crc)
        unfetched[partition].clear()
        add(consumer, "response", 1, 12, c, bytes(response))

    directory.mkdir(parents=True, exist_ok=True)
    step = 0
    while written + len(rows) < frames:
        producer = step % PRODUCERS
        partition = producer % PARTITIONS
        step += 1
        seq = sequences[producer]
        sequences[producer] += 1
        corr[producer] += 1
        attributes = TRANSACTIONAL if transactions else 0
        crc = _crc(producer, seq)
        frame, at = t.produce[partition]
        request = bytearray(frame)
        _I32.pack_into(request, 4, corr[producer])
        _I16.pack_into(request, at + 21, attributes)
        _I64.pack_into(request, at + 43, 1000 + producer)  # producer id
        _I32.pack_into(request, at + 53, seq)  # base sequence
        _U32.pack_into(request, at + 17, crc)
        add(producer + 1, "request", 0, 9, corr[producer], bytes(request))
        frame, at = t.ack[partition]
        response = bytearray(frame)
        _I32.pack_into(response, 0, corr[producer])
        _I64.pack_into(response, at, next_offset[partition])
        add(producer + 1, "response", 0, 9, corr[producer], bytes(response))
        if transactions and seq % TXN_BATCHES == 0:
            txn_first[producer] = next_offset[partition]
        unfetched[partition].append((1000 + producer, seq, crc, attributes))
        next_offset[partition] += 1
        if transactions and (seq + 1) % TXN_BATCHES == 0:
            # The transaction ends: EndTxn, answered, then its marker in the log.
            number = transactions_ended[producer]
            transactions_ended[producer] += 1
            committed = number % ABORT_EVERY != ABORT_EVERY - 1
            corr[producer] += 1
            end = bytearray(t.end_txn[producer][committed])
            _I32.pack_into(end, 4, corr[producer])
            add(producer + 1, "request", 26, 3, corr[producer], bytes(end))
            ack = bytearray(t.end_txn_ack)
            _I32.pack_into(ack, 0, corr[producer])
            add(producer + 1, "response", 26, 3, corr[producer], bytes(ack))
            if not committed:
                aborted[partition] = (1000 + producer, txn_first[producer])
            marker_crc = _crc(producer, 1 << 24 | number)
            unfetched[partition].append((1000 + producer, -1, marker_crc, TRANSACTIONAL | CONTROL))
            next_offset[partition] += 1
        if len(unfetched[partition]) == FETCH_EVERY:
            fetch(partition)
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


def spark_verify(directory: Path, conf: dict[str, str], profile: bool = False) -> dict[str, Any]:
    from trio_broker.verify import job
    from trio_broker.verify.job import read_capture_files, spark_session, verify

    started = time.monotonic()
    # As ``trio-broker verify`` does: the capture's size picks the JIT.
    frames = read_capture_files(directory, warn=False).frames
    spark = spark_session("local[2]", conf, frames=frames)
    session_s = time.monotonic() - started
    steps: dict[str, dict[str, float]] = {}
    if profile:
        _profile_steps(job, spark, frames, steps)
    try:
        report = verify(spark, directory)
    finally:
        spark.stop()
    return {"violations": sum(c["violations"] for c in report["checks"].values()),
            "by_kind": {k: n for c in report["checks"].values() for k, n in c["by_kind"].items()},
            "seconds": report["seconds"], "session_seconds": round(session_s, 2),
            "phase_seconds": report["phase_seconds"],
            "acknowledged_batches": report["acknowledged_batches"],
            "transactional_batches": report.get("transactional_batches"),
            **({"steps": steps} if profile else {})}  # fmt: skip


def _profile_steps(job: Any, spark: Any, frames: int, steps: dict[str, dict[str, float]]) -> None:
    """``--profile``: time each cached table as it is built and each check alone (wall and
    CPU seconds of this process tree: the JVM and the Python workers), before the job runs
    the checks query as usual (then on a warmer JVM: its phase time is lower than in a
    run without ``--profile``)."""
    keep, all_checks_sql = job.keep, job.all_checks_sql
    names = iter(["facts", *(["frames"] if frames < job.LINEAGE_CUT_BELOW_FRAMES else []),
                  *job.MATERIALIZED])  # fmt: skip

    def measure(name: str, action: Any) -> Any:
        cpu = sum(_tree_cpu(os.getpid()).values())
        wall = time.monotonic()
        out = action()
        steps[name] = {
            "wall_s": round(time.monotonic() - wall, 2),
            "cpu_s": round(sum(_tree_cpu(os.getpid()).values()) - cpu, 2),
        }
        print(f"[profile] {name}: {steps[name]}", file=sys.stderr, flush=True)
        return out

    def timed_keep(frame: Any, session: Any, n: int) -> Any:
        kept = keep(frame, session, n)
        measure(f"view {next(names, '?')}", kept.count)
        return kept

    def timed_checks(present: set[str] | None = None) -> str:
        # Only the checks the job runs (checks.NEEDS): the others are left out of its query.
        for name in job.checks_to_run(present):
            query = job.sql(job.CHECKS[name][1], present)
            measure(f"check {name}", spark.sql(query).count)
        return str(all_checks_sql(present))

    job.keep, job.all_checks_sql = timed_keep, timed_checks


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
    mode: str,
    directory: Path,
    time_limit: float,
    conf: list[str],
    tree: Path = ROOT,
    profile: bool = False,
) -> dict[str, Any]:
    """Run ``mode`` on ``directory`` in a subprocess (time-limited), sampling peak tree RSS
    and CPU seconds (the JVM and the Python workers: the machine may be shared, and CPU
    time compares runs where wall time does not). ``tree``: the checkout whose
    ``trio_broker`` runs (another commit's, for a side-by-side run)."""
    cmd = [sys.executable, str(tree / "bench" / "verify.py"), "--run", mode, str(directory)]
    cmd += [f"--conf={c}" for c in conf]
    if profile and mode == "spark":
        cmd.append("--profile")
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
    parser.add_argument(
        "--transactions",
        action="store_true",
        help="transactional producers (commits and aborts) and a read_committed consumer",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="Spark only: also time each cached view and each check alone (wall, CPU s)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="write the captures here and keep them")
    parser.add_argument("--run", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        mode, directory = args.run
        if mode == "spark":
            conf = dict(c.split("=", 1) for c in args.conf)
            print(json.dumps(spark_verify(Path(directory), conf, "--profile" in sys.argv)))
        else:
            print(json.dumps(pandas_baseline(Path(directory))))
        return
    results = []
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"{'frames':>9} {'engine':<7} {'check s':>8} {'frames/s':>9} {'wall s':>7} "
          f"{'CPU s':>7} {'peak MiB':>9} {'violations':>10}  phases s")  # fmt: skip
    for n, frames in enumerate(int(x) for x in args.frames.split(",")):
        base = args.keep or Path(tempfile.mkdtemp(prefix="bench-verify-", dir=ROOT / "bench"))
        directory = base / f"capture-{frames}{'-txn' if args.transactions else ''}"
        started = time.monotonic()
        if (directory / "done").exists():  # a capture kept by --keep before
            rows = write_capture_rows(directory)
        else:
            rows = write_capture(frames, directory, transactions=args.transactions)
            (directory / "done").write_text(f"{rows}\n")
        generate_s = time.monotonic() - started
        runs = [(mode, tree) for mode in args.engines.split(",") for tree in trees]
        for mode, tree in runs if n % 2 == 0 else runs[::-1]:
            r = measured(mode, directory, args.time_limit, args.conf, tree, args.profile)
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
            if r.get("violations"):
                print(f"  violations: {r['by_kind']}", flush=True)
            for step, spent in r.get("steps", {}).items():
                print(f"  {step:<40} wall {spent['wall_s']:>7.1f}  CPU {spent['cpu_s']:>7.1f}")
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        summary = {"machine_cores": os.cpu_count(), "load_average": os.getloadavg(),
                   "spark_conf": args.conf, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
