"""The PySpark verification job behind ``trio-broker verify``.

Starts the Spark session, reads capture Parquet files, decodes frames on the executors
(:func:`trio_broker.verify.compact.decode_compact` in ``mapInArrow``), caches the facts
and runs the checks of :mod:`trio_broker.verify.checks` (Spark SQL, each check once) and
the traffic statistics over them, then writes the summary and the report. Fact kinds,
runs and topics are numbers in Spark (see :mod:`~trio_broker.verify.compact`); the
report names them again (:class:`Readable`).
Exit code 0 when no check found a violation, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from trio_broker.protocol.messages import ApiKey
from trio_broker.protocol.schema import TOPIC_ID_VERSIONS
from trio_broker.verify.checks import (
    CHECKS,
    CO_PARTITIONED,
    EXAMPLES,
    MATERIALIZED,
    VIEWS,
    all_checks_sql,
    captures_view_sql,
    checks_to_run,
    named_view_sql,
    run_brokers_view_sql,
    sql,
)
from trio_broker.verify.compact import COMPACT_DDL, KIND_CODE, KINDS, decode_compact, topic_hash
from trio_broker.verify.report import write_report
from trio_broker.verify.stats import traffic_stats

#: The client id of the brokers' replica fetchers (cluster/replica_fetcher.py).
REPLICA_FETCHER_CLIENT_ID = "replica-fetcher-"

__all__ = [
    "CHECKS",
    "run_verify",
    "spark_session",
    "summary_text",
    "verify",
    "verify_many",
    "write_report",
]


def _log(message: str) -> None:
    print(f"[verify] {message}", file=sys.stderr, flush=True)


#: From this many frames on, the JVM keeps its optimising JIT compiler (C2): Spark's
#: generated code then runs several times faster, which outweighs the compile time. Below
#: it, C1 only (``-XX:TieredStopAtLevel=1``) starts and finishes small captures sooner.
C2_FROM_FRAMES = 500_000
#: Driver (local mode: the whole job's) heap per frame of capture, when the caller sets
#: none: Spark's default 1 GiB ran out of memory on the ~1.3M frames of a 30-minute
#: 3-broker Jepsen run, which passed with 6 GiB. At least 1 GiB, at most half the RAM.
DRIVER_BYTES_PER_FRAME = 4096
#: The cached facts get one partition per this many frames (rounded up to a multiple of
#: the cores): each cached block and each sort of the checks then fits a small executor
#: (10M frames with a 1 GiB driver ran out of memory building 2M-frame blocks).
FRAMES_PER_PARTITION = 500_000
#: Read splits aim at this many tasks per core, so every core decodes (Parquet splits only
#: at row groups, so small files stay one task each).
SPLITS_PER_CORE = 4


def _local_cores(master: str) -> int:
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    return 2


def spark_session(
    master: str, conf: dict[str, str] | None = None, *, frames: int | None = None
) -> Any:
    """A session tuned for small machines; ``conf`` adds Spark settings, ``frames`` (the
    capture's size, when known) picks the JIT (see :data:`C2_FROM_FRAMES`)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log4j = Path(__file__).with_name("log4j2.properties")
    # The parallel collector: in same-run A/B pairs at 2.4M frames on 2 cores the checks
    # and statistics took 50-53 s with it against 56-62 s with G1, Java's default.
    java_opts = f"-XX:+UseParallelGC -Dlog4j2.configurationFile=file:{log4j}"
    if frames is None or frames < C2_FROM_FRAMES:
        # C1's 48 MB default code cache filled up (and compilation stopped) on the
        # captures of a 3-broker Jepsen-style run: one scan per broker run, each with
        # its own generated code.
        java_opts = f"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m {java_opts}"
    cores = _local_cores(master)
    builder = (
        SparkSession.builder.master(master)
        .appName("trio-broker-verify")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.files.maxPartitionBytes", str(4 * 1024 * 1024))
        .config("spark.sql.adaptive.enabled", "true")
        # Joins keyed by (topic, partition, ...) reuse the facts' (topic, partition)
        # partitioning instead of shuffling both sides again (see verify).
        .config("spark.sql.requireAllClusterKeysForCoPartition", "false")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    memory = driver_memory(frames, conf or {})
    if memory is not None:
        builder = builder.config("spark.driver.memory", memory)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def driver_memory(frames: int | None, conf: dict[str, str]) -> str | None:
    """``spark.driver.memory`` for a capture of ``frames`` (None: leave Spark's default,
    or what the caller chose in ``conf`` or ``PYSPARK_SUBMIT_ARGS``)."""
    if frames is None or "spark.driver.memory" in conf:
        return None
    if "--driver-memory" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return None
    gib = 1 << 30
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    wanted = max(gib, min(frames * DRIVER_BYTES_PER_FRAME, ram // 2))
    return f"{-(-wanted // gib)}g"


@attrs.frozen
class Capture:
    """The readable capture files of a directory, with their row count and size from the
    Parquet footers (no Spark job needed to count the frames)."""

    files: list[str]
    unreadable: list[str]
    frames: int
    size: int


CaptureDirs = Path | Sequence[Path]


def capture_dirs(spec: CaptureDirs) -> list[Path]:
    """The capture directories to check together: those given, and for a directory with
    no capture file of its own, its subdirectories that have some (one per broker of a
    cluster: ``captures/broker1``, ``captures/broker2``, ...)."""
    given = [Path(spec)] if isinstance(spec, str | Path) else [Path(d) for d in spec]
    out: list[Path] = []
    for directory in given:
        if not any(directory.glob("*.parquet")):
            subdirs = (
                sorted(d for d in directory.iterdir() if d.is_dir()) if directory.is_dir() else []
            )
            with_files = [d for d in subdirs if any(d.glob("*.parquet"))]
            if with_files:
                out.extend(with_files)
                continue
        out.append(directory)
    return out


def read_capture_files(capture_dir: CaptureDirs, *, warn: bool = True) -> Capture:
    """Capture files whose Parquet footer reads, and those skipped (a file truncated by an
    OS crash before the data reached the disk would otherwise fail the whole Spark job)."""
    import pyarrow.parquet as pq

    readable: list[str] = []
    unreadable: list[str] = []
    frames = size = 0
    paths = [p for d in capture_dirs(capture_dir) for p in sorted(d.glob("*.parquet"))]
    for path in paths:
        try:
            meta = pq.read_metadata(path)
        except Exception as exc:  # any pyarrow error: not a complete Parquet file
            if warn:
                _log(f"warning: skipping unreadable capture file {path.name}: {exc}")
            unreadable.append(path.name)
        else:
            readable.append(str(path))
            frames += meta.num_rows
            size += path.stat().st_size
    return Capture(readable, unreadable, frames, size)


def run_name(path: str) -> str:
    """The broker run a capture file belongs to: its name without ``-<sequence>.parquet``."""
    name = Path(path).name
    match = re.match(r"(.+)-\d+\.parquet$", name)
    return match.group(1) if match else name


def broker_id(files: list[str]) -> int:
    """The node id of the broker that wrote a run's capture files (its rows' ``broker_id``,
    the same in every row of a run): read from the first row of its first file."""
    import pyarrow.parquet as pq

    for path in files:
        parquet = pq.ParquetFile(path)
        if not parquet.metadata.num_row_groups:
            continue
        column = parquet.read_row_group(0, columns=["broker_id"]).column(0)
        if len(column):
            return int(column[0].as_py())
    return -1


#: Below this many frames the queries run interpreted, without generated code: on a
#: 160-frame capture, the first verify in a fresh JVM took 80 s of CPU instead of 97
#: (compiling each stage's generated code outweighs running it over a few rows); later
#: verifies in the same JVM cost the same either way (28 s). Results are the same.
INTERPRETED_BELOW_FRAMES = 10_000

#: Below this many frames the cached facts and views are local checkpoints, not persisted
#: DataFrames (see :func:`keep`).
LINEAGE_CUT_BELOW_FRAMES = 100_000

#: Bytes a frame's facts take in Spark's columnar cache, uncompressed (measured: 157 MB
#: for the 2.4M frames of bench/verify.py's capture; 124 MB compressed).
CACHE_BYTES_PER_FRAME = 66


def cache_level(spark: Any, frames: int) -> Any:
    """Memory (spilling to disk) while the facts take at most a quarter of the executor
    heap, else disk only: a spilled block is read back into one heap buffer of its size,
    and that ran a 1 GiB driver out of memory at 10M frames (the OS page cache still
    keeps disk-only blocks in memory when the machine has room).

    In memory the cache is kept uncompressed: building it took about 3 s less at 2.4M
    frames (8.9 s against 11.6 s for decoding, the shuffle and the cache together) for a
    quarter more bytes; on disk, compression saves the I/O.
    """
    from pyspark import StorageLevel

    context = spark.sparkContext
    jvm = context._jvm
    if context.master.startswith("local"):
        heap = int(jvm.java.lang.Runtime.getRuntime().maxMemory())
    else:
        memory = context.getConf().get("spark.executor.memory", "1g")
        heap = int(jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(memory))
    in_memory = frames * CACHE_BYTES_PER_FRAME <= heap // 4
    compressed = "false" if in_memory else "true"
    spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", compressed)
    return StorageLevel.MEMORY_AND_DISK if in_memory else StorageLevel.DISK_ONLY


def keep(frame: Any, spark: Any, frames: int) -> Any:
    """``frame`` computed once and kept (at :func:`cache_level`) for the queries after it.

    A small capture's are local checkpoints: tables without lineage, so the checks query,
    which refers to the facts and views many times, is analysed and optimised over a few
    leaves instead of every view's plan inlined again (on a 40-frame capture the analysis
    took 9-13 s of the query's 30, and each verify() about 26 s of CPU against 14 s). A
    checkpoint forgets the facts' (topic, partition) partitioning, so the joins shuffle
    again: negligible for a small capture, not for millions of frames, which stay
    persisted DataFrames. (Being local, a checkpoint cannot be recomputed if an executor
    is lost: only with ``--master`` on a cluster, for a small capture.)"""
    level = cache_level(spark, frames)
    if frames < LINEAGE_CUT_BELOW_FRAMES:
        return frame.localCheckpoint(eager=True, storageLevel=level)
    return frame.persist(level)


def release(frame: Any, frames: int) -> None:
    """Free what :func:`keep` kept."""
    if frames < LINEAGE_CUT_BELOW_FRAMES:
        # The checkpoint's blocks belong to the RDD its plan reads (no DataFrame API).
        frame._jdf.queryExecution().analyzed().rdd().unpersist(False)
    else:
        frame.unpersist()


def verify(spark: Any, capture_dir: CaptureDirs) -> dict[str, Any]:
    """Run every check on the capture in ``capture_dir``; return the report as a dict.

    Several directories (or one whose subdirectories hold the captures) are checked as
    one history: the captures of every broker of a cluster, each broker run a run of its
    own. Connections of the brokers' own replica fetchers are left out: the checks are
    about what clients were told, and a follower is shown records above the high
    watermark that a new leader may rightly truncate."""
    return verify_many(spark, [capture_dir])[0]


def verify_many(spark: Any, captures: Sequence[CaptureDirs]) -> list[dict[str, Any]]:
    """:func:`verify` of each capture in ``captures`` (each a directory, or the several
    directories of one cluster), all in one Spark job: the report of each, in order.

    Spark's fixed cost (planning, scheduling and warming up each stage, 8-40 s for a tiny
    capture) is paid once instead of once per capture. The captures stay apart: every
    fact carries its capture's index (``cap``), and every join, aggregation and window of
    the checks and statistics is keyed by it, so a violation is reported for its own
    capture only, and two captures that would violate a check together (the same
    producer id and sequences, offsets, groups) are each judged alone. ``seconds`` and
    ``phase_seconds`` of each report are the whole job's."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    parts: list[tuple[list[Path], Capture]] = []
    for spec in captures:
        dirs = capture_dirs(spec)
        capture = read_capture_files(dirs)
        if not capture.files:
            raise FileNotFoundError(f"no capture Parquet files in {', '.join(map(str, dirs))}")
        parts.append((dirs, capture))
    if not parts:
        return []
    frames = sum(capture.frames for _, capture in parts)
    size = sum(capture.size for _, capture in parts)
    files = sum(len(capture.files) for _, capture in parts)
    _log(f"{frames} frames in {files} capture files of {len(parts)} captures; decoding")
    cores = int(spark.sparkContext.defaultParallelism)
    split = max(1 << 20, min(128 << 20, size // max(1, cores * SPLITS_PER_CORE)))
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
    # Per call, as the session may verify captures of any size (a test suite's does).
    interpreted = frames < INTERPRETED_BELOW_FRAMES
    spark.conf.set("spark.sql.codegen.wholeStage", str(not interpreted).lower())
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN" if interpreted else "FALLBACK")
    # ``run``: the index of a run among all captures' runs (each capture's in sorted run
    # names), one literal per run's files (a per-row regexp over input_file_name() cost
    # more than the decoding); ``run_caps[run]``: its capture.
    runs: list[tuple[int, str, list[str]]] = []
    for cap, (dirs, capture) in enumerate(parts):
        several = len(dirs) > 1
        run_of = (lambda f: f"{Path(f).parent}/{run_name(f)}") if several else run_name
        for name in sorted({run_of(f) for f in capture.files}):
            runs.append((cap, name, [f for f in capture.files if run_of(f) == name]))
    run_caps = [cap for cap, _, _ in runs]
    # Broker ids date writes and fetches with leader epochs, compared across runs: only
    # for a cluster's captures. One directory's runs stay judged apart, as before: a
    # broker alone names leader epoch 0 in every life, which is no leader term.
    brokers = [
        (cap, index, broker_id(run_files))
        for index, (cap, _, run_files) in enumerate(runs)
        if len(parts[cap][0]) > 1
    ]
    spark.sql(run_brokers_view_sql(brokers)).createOrReplaceTempView("run_brokers")
    alone = [len(dirs) == 1 for dirs, _ in parts]
    spark.sql(captures_view_sql(alone)).createOrReplaceTempView("captures")
    raw = None
    for index, (cap, _, run_files) in enumerate(runs):
        part = spark.read.parquet(*run_files)
        part = part.withColumn("run", F.lit(index)).withColumn("cap", F.lit(cap))
        raw = part if raw is None else raw.unionByName(part)
    assert raw is not None
    # The replica fetchers' connections, found once (a few per cluster run) and left out
    # of every later read as a literal: as a lazy anti join each read of ``raw`` (the
    # decoding pass, the fetch requests, the statistics' five queries) scanned every
    # run's client ids again to find them; one broker alone has none, and no join.
    fetchers = (
        raw.where(F.col("client_id").startswith(REPLICA_FETCHER_CLIENT_ID))
        .select("run", "connection_id")
        .distinct()
        .collect()
    )
    if fetchers:
        pairs = [(r["run"], r["connection_id"]) for r in fetchers]
        known = spark.createDataFrame(pairs, "run INT, connection_id LONG")
        raw = raw.join(F.broadcast(known), ["run", "connection_id"], "left_anti")
    raw.drop("frame").createOrReplaceTempView("frames")
    decode_input = raw.select(
        F.col("run").cast("string").alias("run"), "connection_id", "monotonic_ns",
        "direction", "api_key", "api_version", "correlation_id", "frame_length", "frame",
    )  # fmt: skip
    topic_ids = _topic_ids(decode_input, run_caps)
    facts = decode_input.mapInArrow(decode_compact, COMPACT_DDL)
    fetch_requests = raw.where(f"direction = 'request' AND api_key = {ApiKey.FETCH}").select(
        F.col("run"),
        F.col("connection_id").alias("conn"),
        F.col("correlation_id").alias("corr"),
        F.col("monotonic_ns").alias("ts"),
        F.lit(KIND_CODE["fetch_request"]).cast("tinyint").alias("kind"),
    )
    facts.unionByName(fetch_requests, allowMissingColumns=True).createOrReplaceTempView("decoded")
    # The one cached table: every frame is decoded once, by the count in _verify_facts
    # (for a small capture, by the checkpoint of keep()).
    # Hash-partitioned by (topic, partition) once: nearly every join, aggregation and
    # window of the checks is keyed by (topic, partition, ...), so with
    # spark.sql.requireAllClusterKeysForCoPartition off none of them shuffles the facts
    # again. Spills to disk rather than failing when the facts outgrow the memory.
    parts_n = cores * max(1, -(-frames // (FRAMES_PER_PARTITION * cores)))
    named = spark.sql(named_view_sql(topic_ids, run_caps))
    named = named.repartition(parts_n, "tname", "partition")
    cached = [keep(named, spark, frames)]
    if frames < LINEAGE_CUT_BELOW_FRAMES:
        # The frames without their bytes, read by the statistics (five queries) and one
        # check: a small capture's as a checkpoint too, so each query reads a few cached
        # blocks, not every run's files again (one scan per run: at 16 runs in one job the
        # statistics took 40-70 s of its 90-140 on a busy machine).
        kept_frames = keep(spark.table("frames"), spark, frames)
        kept_frames.createOrReplaceTempView("frames")
        cached.append(kept_frames)
    try:
        runs_named = [name for _, name, _ in runs]
        return _verify_facts(spark, cached, parts, runs_named, started, parts_n)
    finally:
        for frame in cached:
            release(frame, frames)


#: Requests and responses that may name topics by id (Produce v13+, Fetch v13+,
#: OffsetCommit and OffsetFetch v10+, from the schema table); only captures holding
#: such frames need the Metadata pass.
_BY_ID = " OR ".join(
    f"(api_key = {key} AND api_version >= {first})"
    for key, first in sorted(TOPIC_ID_VERSIONS.items())
)


def _topic_ids(decode_input: Any, run_caps: list[int]) -> list[tuple[int, int, int]]:
    """The distinct (capture, hash of ``id:<uuid>``, hash of the name) triples of the
    captures' Metadata responses, decoded in a pass of their own so the main pass can name
    every fact's topic before partitioning by it (empty when no frame names a topic by
    id). Per capture: an id is named only by the Metadata answers of its own capture."""
    if not decode_input.where(_BY_ID).select("api_key").limit(1).collect():
        return []
    metadata = decode_input.where(f"direction = 'response' AND api_key = {ApiKey.METADATA}")
    rows = (
        metadata.mapInArrow(decode_compact, COMPACT_DDL)
        .where(sql("kind = {topic_id}"))
        .select("run", "note", "topic")
        .distinct()
        .collect()
    )
    return sorted({(run_caps[r["run"]], topic_hash(r["note"]), r["topic"]) for r in rows})


def _verify_facts(
    spark: Any,
    cached: list[Any],
    parts: list[tuple[list[Path], Capture]],
    runs: list[str],
    started: float,
    partitions: int,
) -> list[dict[str, Any]]:
    """The checks and statistics over the cached facts (``cached[0]``, in ``partitions``
    hash partitions by topic and partition) of the captures ``parts`` (their directories
    and files), one report each; appends what else it caches to ``cached`` for the caller
    to release."""

    facts = cached[0]
    facts.createOrReplaceTempView("facts")
    frames = sum(capture.frames for _, capture in parts)
    counts: list[dict[str, int]] = [{} for _ in parts]
    for r in facts.groupBy("cap", "kind").count().collect():
        if KINDS[r["kind"]] != "topic_name":
            counts[r["cap"]][KINDS[r["kind"]]] = r["count"]
    phases = {"decode": time.monotonic() - started}
    total = {k: sum(c.get(k, 0) for c in counts) for k in sorted({k for c in counts for k in c})}
    _log(f"facts: {total} ({time.monotonic() - started:.1f} s)")
    # Topic hashes back to names, for the report.
    names = {r["topic"]: r["note"] for r in spark.sql(sql(
        "SELECT DISTINCT topic, note FROM facts WHERE kind = {topic_name}"
    )).collect()}  # fmt: skip
    facts.createOrReplaceTempView("named")
    readable = Readable(names, runs)
    undecodable: list[list[dict[str, Any]]] = [[] for _ in parts]
    if total.get("undecodable"):
        for r in spark.sql(sql(f"""
            SELECT cap, run, conn, corr, note FROM (
              SELECT *, row_number() OVER (PARTITION BY cap ORDER BY run, conn, corr) AS rn
              FROM facts WHERE kind = {{undecodable}}
            ) WHERE rn <= {EXAMPLES}"""
        )).collect():  # fmt: skip
            row = r.asDict()
            undecodable[row.pop("cap")].append(_plain(readable.row(row)))
    # The checks read ``acked`` five times and ``fetched`` four: cached, each is computed
    # once (inlined, every reference was its own join or aggregation, with its shuffles).
    # Each is kept as soon as its view is made, so the views after it read the kept table
    # (a repartitioned one is a plan of its own, which no later view would match).
    counted: dict[str, list[int]] = {}
    kinds = {kind for kind, n in total.items() if n}
    for name, view in VIEWS.items():
        # Gates (``{has_...}``) on the kinds and on the views made so far; a view not yet
        # made counts as present.
        known = kinds | {v for v in MATERIALIZED if v not in counted or any(counted[v])}
        table = spark.sql(sql(view, known))
        if name not in MATERIALIZED:
            table.createOrReplaceTempView(name)
            continue
        if name in CO_PARTITIONED:
            # As the facts: joins with them and windows over (topic, partition, ...) then
            # reuse this partitioning instead of shuffling.
            table = table.repartition(partitions, "topic", "partition")
        kept = keep(table, spark, frames)
        kept.createOrReplaceTempView(name)  # the checkpoint, when one
        cached.append(kept)
        counted[name] = [0] * len(parts)
        for r in kept.groupBy("cap").count().collect():
            counted[name][r["cap"]] = r["count"]
    # The fact kinds and views the job holds rows of: a check that needs one it lacks can
    # find no violation and is left out of the query (see checks.NEEDS).
    present = kinds | {name for name, n in counted.items() if any(n)}
    running = checks_to_run(present)
    left_out = [name for name in CHECKS if name not in running]
    _log(f"running {len(running)} checks: {', '.join(running)}")
    if left_out:
        _log(f"left out, no facts to find a violation in: {', '.join(left_out)}")
    results: list[dict[str, Any]] = [
        {
            name: {"meaning": meaning, "violations": 0, "by_kind": {}, "examples": []}
            for name, (meaning, _) in CHECKS.items()
        }
        for _ in parts
    ]
    for row in spark.sql(all_checks_sql(present)).collect():
        check = results[row["cap"]][row["check_name"]]
        if row["violation"] not in check["by_kind"]:
            check["by_kind"][row["violation"]] = row["n"]
            check["violations"] += row["n"]
        if len(check["examples"]) < EXAMPLES:
            example = json.loads(row["example"])
            example.pop("cap", None)
            check["examples"].append(readable.row(example))
    phases["checks"] = time.monotonic() - started - sum(phases.values())
    _log(f"checks done ({time.monotonic() - started:.1f} s); latency and throughput")
    traffic = traffic_stats(spark, len(parts))
    phases["stats"] = time.monotonic() - started - sum(phases.values())
    _log(f"statistics done ({time.monotonic() - started:.1f} s)")
    reports = []
    for cap, (dirs, capture) in enumerate(parts):
        dropped = 0
        for stats in (s for d in dirs for s in d.glob("*.stats.json")):
            try:
                dropped += int(json.loads(stats.read_text()).get("dropped", 0))
            except (OSError, ValueError):
                pass
        reports.append({
            "capture_dir": ", ".join(map(str, dirs)),
            "capture_dirs": [str(d) for d in dirs],
            "frames": capture.frames,
            "facts": dict(sorted(counts[cap].items())),
            "acknowledged_batches": counted["acked"][cap],
            "transactional_batches": counted["txn_batches"][cap],
            "frames_dropped_by_capture": dropped,
            "unreadable_files": capture.unreadable,
            "undecodable_examples": undecodable[cap],
            "checks": results[cap],
            "stats": traffic[cap],
            "ok": all(c["violations"] == 0 for c in results[cap].values()),
            "seconds": round(time.monotonic() - started, 2),
            # decode: reading and decoding every frame into the cached facts; checks: the
            # checks query (and topic names, undecodable examples); stats: traffic_stats.
            "phase_seconds": {name: round(seconds, 2) for name, seconds in phases.items()},
            # How many captures the job checked (its seconds are all of theirs).
            "captures_in_job": len(parts),
        })  # fmt: skip
    return reports


@attrs.frozen
class Readable:
    """Names for the numbers in a fact row: topic hashes and run indexes."""

    topics: dict[int, str]
    runs: list[str]

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        if isinstance(out.get("topic"), int):
            out["topic"] = self.topics.get(out["topic"], out["topic"])
        if isinstance(out.get("run"), int) and 0 <= out["run"] < len(self.runs):
            out["run"] = self.runs[out["run"]]
        return out


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list | tuple) else v) for k, v in row.items()}


def summary_text(report: dict[str, Any]) -> str:
    lines = [
        f"capture {report['capture_dir']}: {report['frames']} frames, "
        f"{report['acknowledged_batches']} acknowledged produce batches"
    ]
    if report.get("frames_dropped_by_capture"):
        lines.append(
            f"  warning: the capture dropped {report['frames_dropped_by_capture']} frames "
            "(queue full): violations may be the capture's, not the broker's"
        )
    if report.get("unreadable_files"):
        lines.append(
            f"  warning: {len(report['unreadable_files'])} unreadable capture files skipped: "
            + ", ".join(report["unreadable_files"])
        )
    if report["facts"].get("undecodable"):
        lines.append(f"  warning: {report['facts']['undecodable']} undecodable frames")
    for name, check in report["checks"].items():
        status = "ok" if check["violations"] == 0 else f"{check['violations']} VIOLATIONS"
        lines.append(f"  {name}: {status}")
        if check["violations"]:
            lines.append(f"    ({check['meaning']})")
            for kind, n in sorted(check["by_kind"].items()):
                lines.append(f"    {kind}: {n}")
            for ex in check["examples"]:
                lines.append(f"    e.g. {json.dumps(ex, default=str)}")
    latency = (report.get("stats") or {}).get("latency_by_api") or []
    if latency:
        lines.append("  latency ms (p50 / p99 / p99.9 / max), per API:")
        for row in latency:
            values = " / ".join(
                f"{row[k]:.3g}" if row[k] is not None else "-"
                for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")
            )
            lines.append(f"    {row['api']}: {values} ({row['requests']} requests)")
    lines.append("PASS" if report["ok"] else "FAIL")
    return "\n".join(lines)


def run_verify(
    capture_dir: CaptureDirs, *, master: str = "local[2]", report_dir: Path | None
) -> int:
    """``trio-broker verify``: 0 when every check holds, 1 on any violation, 2 on bad input."""
    given = [Path(capture_dir)] if isinstance(capture_dir, str | Path) else list(capture_dir)
    for directory in given:
        if not Path(directory).is_dir():
            print(f"trio-broker: {directory} is not a directory", file=sys.stderr)
            return 2
    from pyspark.sql import SparkSession

    # A session already running in this process (a test suite's, shared by its modules)
    # is used and left running: only the one started here is stopped.
    started_here = SparkSession.getActiveSession() is None
    _log(f"starting Spark ({master})" if started_here else "using the running Spark session")
    frames = read_capture_files(given, warn=False).frames
    spark = spark_session(master, frames=frames)
    try:
        report = verify(spark, given)
    except FileNotFoundError as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 2
    finally:
        if started_here:
            spark.stop()
    print(summary_text(report))
    if report_dir is not None:
        write_report(report, Path(report_dir))
    return 0 if report["ok"] else 1
