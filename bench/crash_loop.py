"""Crash loop: kill -9 the broker at random moments under acks=all load, then audit.

Two confluent-kafka producers with ``acks=all`` (one plain, one idempotent) and
one consumer in a group (manual, synchronous offset commits) run against a
``trio-broker serve`` subprocess (file storage) while the harness kills it with
SIGKILL and restarts it on the same port and data dir, ``--kills`` times, after
a random uptime. After every restart a separate client reads the group's
committed offsets: they must never be below an offset whose commit was
acknowledged before the kill. At the end the producers are flushed and every
partition is read in full over the wire. The audit:

- lost: acknowledged records missing from the log (must be 0);
- misplaced: acknowledged records not at the offset the ack gave;
- duplicated: records written more than once (must be 0 for the idempotent
  producer; the plain producer may duplicate on retry: counted and reported);
- order: per partition, each producer's sequence numbers increase (first
  occurrences for the plain producer, which runs with one request in flight);
- committed offsets never go backwards across restarts.

With ``--capture`` every broker incarnation also runs with ``serve --capture
<run>/capture`` (one directory: each incarnation writes its own
``capture-b0-<start ns>-*.parquet`` files, which verify treats as separate
runs). The last incarnation, which serves the final full read, is stopped with
SIGTERM so that its capture is complete; then ``trio-broker verify --master
local[2]`` checks the capture and its verdict (exit code, violations per check
and kind, frames) is reported next to the audit. Frames still queued in the
capture buffer at a kill -9 are not in the capture (the verifier checks what it
saw); a Parquet file being written at the kill is left as ``*.parquet.tmp``
(written, then renamed) and counted as torn.

    .venv/bin/python bench/crash_loop.py                   # 20 kills
    .venv/bin/python bench/crash_loop.py --kills 40 --json crash.json
    .venv/bin/python bench/crash_loop.py --capture --keep /tmp/crash-run

``tests/reliability/test_crash_loop.py`` runs the same harness with 8 kills.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402

from tests.e2e.conftest import BROKER_EXE  # noqa: E402
from tests.reliability.conftest import ConfiguredBroker  # noqa: E402

TOPIC = "crash-loop"
PARTITIONS = 3
GROUP = "crash-loop-group"
PRODUCERS = (("plain", False), ("idem", True))
#: Upper bound for one ``trio-broker verify`` run (Spark start ~10 s, the job ~10-60 s).
VERIFY_TIMEOUT_S = 600.0


@attrs.define
class CaptureVerdict:
    """What the capture held and what ``trio-broker verify`` said about it."""

    capture_dir: str = ""
    #: Broker incarnations that wrote capture files (one per start).
    incarnations: int = 0
    #: Incarnations whose capture was closed cleanly (a ``.stats.json`` is written on close).
    closed_cleanly: int = 0
    parquet_files: int = 0
    #: ``*.parquet.tmp`` files: a Parquet file was being written when kill -9 hit.
    torn_files: int = 0
    #: ``*.parquet`` files pyarrow cannot open (expected 0: files are renamed once complete).
    unreadable_files: int = 0
    #: Records in produce batches whose acknowledgement is in the capture (what verify can
    #: check), to compare with the records the producers saw acknowledged.
    acked_records_captured: int = 0
    #: Files verify itself skipped as unreadable (its report's ``unreadable_files``).
    skipped_by_verify: int = 0
    exit_code: int | None = None
    ok: bool = False
    frames: int = 0
    acknowledged_batches: int = 0
    frames_dropped_by_capture: int = 0
    undecodable_frames: int = 0
    violations: dict[str, int] = attrs.field(factory=dict)
    by_kind: dict[str, int] = attrs.field(factory=dict)
    seconds: float = 0.0
    #: The last lines of verify's output when it did not produce a report.
    error: str = ""

    def summary(self) -> str:
        lines = [
            f"capture: {self.incarnations} incarnations ({self.closed_cleanly} closed cleanly), "
            f"{self.parquet_files} files, torn={self.torn_files} "
            f"unreadable={self.unreadable_files} dropped={self.frames_dropped_by_capture} "
            f"acknowledged records captured={self.acked_records_captured}",
            f"verify: exit={self.exit_code} {'PASS' if self.ok else 'FAIL'} "
            f"frames={self.frames} acknowledged batches={self.acknowledged_batches} "
            f"undecodable={self.undecodable_frames} skipped files={self.skipped_by_verify} "
            f"seconds={self.seconds:.1f}",
        ]
        if self.by_kind:
            lines.append(f"verify violations: {self.by_kind}")
        if self.error:
            lines.append(f"verify error: {self.error}")
        return "\n".join(lines)


@attrs.define
class CrashLoopResult:
    kills: int = 0
    restarts: int = 0
    seconds: float = 0.0
    sent: dict[str, int] = attrs.field(factory=dict)
    acked: dict[str, int] = attrs.field(factory=dict)
    failed: dict[str, int] = attrs.field(factory=dict)
    fatal_errors: list[str] = attrs.field(factory=list)
    lost: dict[str, int] = attrs.field(factory=dict)
    misplaced: dict[str, int] = attrs.field(factory=dict)
    duplicated: dict[str, int] = attrs.field(factory=dict)
    order_violations: dict[str, int] = attrs.field(factory=dict)
    records_in_log: int = 0
    consumed: int = 0
    commits_acked: int = 0
    commits_failed: int = 0
    commit_checks: int = 0
    committed_backwards: list[str] = attrs.field(factory=list)
    final_committed: dict[int, int] = attrs.field(factory=dict)
    #: Only with capture: the verify verdict on the broker's own capture.
    verify: CaptureVerdict | None = None

    def problems(self) -> list[str]:
        out = [f"{n}: {k} lost" for n, k in self.lost.items() if k]
        out += [f"{n}: {k} misplaced" for n, k in self.misplaced.items() if k]
        out += [f"idem: {self.duplicated.get('idem', 0)} duplicated"] * bool(
            self.duplicated.get("idem", 0)
        )
        out += [f"{n}: {k} out of order" for n, k in self.order_violations.items() if k]
        out += [f"fatal producer error: {e}" for e in self.fatal_errors]
        out += [f"committed offset went back: {c}" for c in self.committed_backwards]
        if self.verify is not None and not self.verify.ok:
            out.append(
                f"verify exit {self.verify.exit_code}: {self.verify.by_kind or self.verify.error}"
            )
        if self.verify is not None and self.verify.unreadable_files:
            out.append(f"{self.verify.unreadable_files} unreadable capture files")
        return out

    def summary(self) -> str:
        lines = [
            f"kills={self.kills} restarts={self.restarts} seconds={self.seconds:.1f}",
            f"records in log={self.records_in_log} consumed={self.consumed} "
            f"commits acked={self.commits_acked} failed={self.commits_failed} "
            f"committed-offset checks={self.commit_checks}",
        ]
        for name, _ in PRODUCERS:
            lines.append(
                f"{name:5}: sent={self.sent.get(name, 0)} acked={self.acked.get(name, 0)} "
                f"failed={self.failed.get(name, 0)} lost={self.lost.get(name, 0)} "
                f"misplaced={self.misplaced.get(name, 0)} "
                f"duplicated={self.duplicated.get(name, 0)} "
                f"order-violations={self.order_violations.get(name, 0)}"
            )
        lines.append(f"final committed offsets: {self.final_committed}")
        if self.verify is not None:
            lines.append(self.verify.summary())
        problems = self.problems()
        lines.append("problems: " + ("; ".join(problems) if problems else "none"))
        return "\n".join(lines)


class _ProducerThread(threading.Thread):
    def __init__(self, bootstrap: str, name: str, idempotent: bool, rate: float) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.label = name
        self.stop = threading.Event()
        self.rate = rate
        self.lock = threading.Lock()
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed = 0
        self.sent = 0
        self.fatal: list[str] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"crash-{name}",
                "acks": "all",
                "enable.idempotence": idempotent,
                # Plain: one request in flight so that retries cannot reorder.
                "max.in.flight.requests.per.connection": 5 if idempotent else 1,
                "message.timeout.ms": 60_000,
                "linger.ms": 5,
                "retry.backoff.ms": 50,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "socket.timeout.ms": 10_000,
                "log_level": 2,  # connection-refused noise during the kills
            }
        )

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        seq = int(msg.value().split(b":")[1])
        with self.lock:
            if err is None:
                self.acked[seq] = (msg.partition(), msg.offset())
            else:
                self.failed += 1
                if err.fatal():
                    self.fatal.append(f"{self.label}: {err}")

    def run(self) -> None:
        interval = 1.0 / self.rate
        seq = 0
        while not self.stop.is_set() and not self.fatal:
            value = f"{self.label}:{seq}".encode()
            try:
                self.producer.produce(
                    TOPIC, value, partition=seq % PARTITIONS, on_delivery=self._on_delivery
                )
            except BufferError:
                self.producer.poll(0.1)
                continue
            except KafkaException as exc:  # fatal idempotence error
                self.fatal.append(f"{self.label}: produce: {exc}")
                break
            seq += 1
            self.sent = seq
            self.producer.poll(0)
            time.sleep(interval)

    def finish(self, timeout: float) -> None:
        self.stop.set()
        self.join(10)
        self.producer.flush(timeout)


class _ConsumerThread(threading.Thread):
    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="consumer", daemon=True)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.consumed = 0
        self.commits_failed = 0
        #: Acknowledged commits in order: (partition, offset).
        self.commits: list[tuple[int, int]] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "client.id": "crash-consumer",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "log_level": 2,
            }
        )

    def run(self) -> None:
        self.consumer.subscribe([TOPIC])
        since_commit = 0
        last_commit = time.monotonic()
        while not self.stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                self.consumed += 1
                since_commit += 1
            if since_commit and (since_commit >= 100 or time.monotonic() - last_commit > 0.5):
                last_commit = time.monotonic()
                try:
                    parts = self.consumer.commit(asynchronous=False)
                except KafkaException:
                    with self.lock:
                        self.commits_failed += 1
                    continue
                since_commit = 0
                with self.lock:
                    for tp in parts or []:
                        if tp.error is None and tp.offset >= 0:
                            self.commits.append((tp.partition, tp.offset))
                        elif tp.error is not None:
                            self.commits_failed += 1

    def acked_max(self) -> dict[int, int]:
        out: dict[int, int] = {}
        with self.lock:
            for partition, offset in self.commits:
                out[partition] = max(out.get(partition, -1), offset)
        return out

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        self.consumer.close()


def _committed(bootstrap: str) -> dict[int, int] | None:
    """The group's committed offsets, read by a client outside the group."""
    checker = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    try:
        parts = checker.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
    except KafkaException:
        return None
    finally:
        checker.close()
    return {tp.partition: tp.offset for tp in parts if tp.error is None}


class _CapturingBroker(ConfiguredBroker):
    """Every incarnation runs with ``--capture`` into the same directory."""

    def __init__(self, data_dir: Path, capture_dir: Path, config: dict[str, Any]) -> None:
        super().__init__(data_dir, config=config)
        self.capture_dir = capture_dir

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--capture", str(self.capture_dir)]


def run_crash_loop(
    work_dir: Path,
    kills: int = 20,
    seed: int = 0,
    uptime: tuple[float, float] = (1.0, 4.0),
    rate: float = 200.0,
    log: Callable[[str], None] = print,
    capture: bool = False,
    verify: bool = True,
) -> CrashLoopResult:
    """``capture``: every incarnation captures to ``work_dir/capture``; then, with
    ``verify``, ``trio-broker verify`` checks it (``result.verify``)."""
    rng = random.Random(seed)
    result = CrashLoopResult()
    config = {"num.partitions": PARTITIONS, "group.initial.rebalance.delay.ms": 100}
    broker: ConfiguredBroker
    if capture:
        broker = _CapturingBroker(work_dir / "data", work_dir / "capture", config)
    else:
        broker = ConfiguredBroker(work_dir / "data", config=config)
    broker.start()
    started = time.monotonic()
    try:
        with broker.connect() as conn:
            conn.metadata([TOPIC])  # create the topic with PARTITIONS partitions
        producers = [_ProducerThread(broker.bootstrap, n, i, rate) for n, i in PRODUCERS]
        consumer = _ConsumerThread(broker.bootstrap)
        for thread in [*producers, consumer]:
            thread.start()
        seen_committed: dict[int, int] = {}
        for kill in range(kills):
            time.sleep(rng.uniform(*uptime))
            acked_before = consumer.acked_max()
            broker.kill9()
            result.kills += 1
            time.sleep(rng.uniform(0.0, 0.5))
            broker.start()
            result.restarts += 1
            committed = _committed(broker.bootstrap)
            if committed is None:
                log(f"kill {kill + 1}: committed offsets not readable right after restart")
                continue
            result.commit_checks += 1
            for partition, offset in acked_before.items():
                if committed.get(partition, -1) < offset:
                    result.committed_backwards.append(
                        f"after kill {kill + 1}: partition {partition} committed "
                        f"{committed.get(partition, -1)} < acknowledged {offset}"
                    )
            for partition, offset in committed.items():
                if offset < seen_committed.get(partition, -1):
                    result.committed_backwards.append(
                        f"after kill {kill + 1}: partition {partition} committed {offset} "
                        f"< {seen_committed[partition]} seen after an earlier restart"
                    )
                seen_committed[partition] = max(seen_committed.get(partition, -1), offset)
            log(f"kill {kill + 1}/{kills}: restarted; committed {committed}")
        time.sleep(2.0)  # some load after the last restart
        for producer in producers:
            producer.finish(timeout=60)
        time.sleep(2.0)
        consumer.finish()
        final = _committed(broker.bootstrap) or {}
        result.final_committed = final
        _audit(broker, producers, consumer, result)
    finally:
        result.seconds = time.monotonic() - started
        broker.finish()  # SIGTERM: the last incarnation writes out its capture
    if isinstance(broker, _CapturingBroker) and verify:
        log("running trio-broker verify on the capture")
        result.verify = verify_capture(broker.capture_dir, work_dir / "verify-report")
    return result


def inspect_capture(capture_dir: Path) -> CaptureVerdict:
    """Count incarnations, clean closes, torn and unreadable files in a capture directory."""
    import pyarrow.parquet as pq

    verdict = CaptureVerdict(capture_dir=str(capture_dir))
    files = sorted(capture_dir.glob("*.parquet"))
    verdict.parquet_files = len(files)
    verdict.incarnations = len({p.name.rsplit("-", 1)[0] for p in files})
    verdict.closed_cleanly = len(list(capture_dir.glob("*.stats.json")))
    verdict.torn_files = len(list(capture_dir.glob("*.parquet.tmp")))
    readable = []
    for path in files:
        try:
            pq.read_metadata(path)
        except Exception:  # any pyarrow error: the file cannot be read
            verdict.unreadable_files += 1
        else:
            readable.append(path)
    verdict.acked_records_captured = _acked_records(readable)
    return verdict


def _acked_records(files: list[Path]) -> int:
    """Records in captured produce batches whose (error-free) acknowledgement was captured.

    Decoded locally with the verifier's own decoder (no Spark): a few seconds.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trio_broker.verify.fastdecode import decode_batches

    columns = ["connection_id", "monotonic_ns", "direction", "api_key", "api_version",
               "correlation_id", "frame_length", "frame"]  # fmt: skip
    acks: set[tuple[Any, ...]] = set()
    batches: list[tuple[tuple[Any, ...], int]] = []
    for path in files:
        table = pq.read_table(path, columns=columns)
        run = path.name.rsplit("-", 1)[0]
        table = table.add_column(0, "run", pa.array([run] * len(table), pa.string()))
        for facts in decode_batches(iter(table.to_batches())):
            for fact in facts.to_pylist():
                key = (fact["run"], fact["conn"], fact["corr"], fact["topic"], fact["partition"])
                if fact["kind"] == "produce_ack" and fact["error"] == 0:
                    acks.add(key)
                elif fact["kind"] == "produce_batch":
                    batches.append((key, fact["record_count"]))
    return sum(count for key, count in batches if key in acks)


def verify_cli(
    args: list[str], spark: Any = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``trio-broker verify ARGS``: a subprocess, as a user runs it; or, given a running
    Spark session (a test process's, shared and warm), in this process through the same
    ``main``, which verifies on that session and leaves it running. A fresh JVM costs its
    start and runs its first job several times slower than a warm one."""
    if spark is None:
        return subprocess.run(
            [str(BROKER_EXE), "verify", *args],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    from trio_broker.cli import main

    spark.sparkContext  # noqa: B018 - a proxy starts its session now, so main finds it running
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", *args])
    return subprocess.CompletedProcess(["verify", *args], code, out.getvalue(), err.getvalue())


def verify_capture(
    capture_dir: Path, report_dir: Path, master: str = "local[2]", spark: Any = None
) -> CaptureVerdict:
    """Run ``trio-broker verify`` (a subprocess, as a user would, or in this process on
    ``spark``: :func:`verify_cli`) and read its report."""
    verdict = inspect_capture(capture_dir)
    started = time.monotonic()
    args = [str(capture_dir), "--master", master, "--report", str(report_dir)]
    try:
        done = verify_cli(args, spark, timeout=VERIFY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        verdict.error = f"verify did not finish within {VERIFY_TIMEOUT_S:.0f} s"
        return verdict
    verdict.seconds = time.monotonic() - started
    verdict.exit_code = done.returncode
    report_path = report_dir / "report.json"
    if not report_path.exists():
        output = (done.stdout + done.stderr).splitlines()
        verdict.error = " | ".join(output[-8:])
        return verdict
    report = json.loads(report_path.read_text())
    verdict.ok = done.returncode == 0 and bool(report["ok"])
    verdict.frames = report["frames"]
    verdict.acknowledged_batches = report["acknowledged_batches"]
    verdict.frames_dropped_by_capture = report.get("frames_dropped_by_capture", 0)
    verdict.undecodable_frames = report["facts"].get("undecodable", 0)
    verdict.skipped_by_verify = len(report.get("unreadable_files", []))
    for name, check in report["checks"].items():
        verdict.violations[name] = check["violations"]
        verdict.by_kind.update(check["by_kind"])
    return verdict


def _audit(
    broker: ConfiguredBroker,
    producers: list[_ProducerThread],
    consumer: _ConsumerThread,
    result: CrashLoopResult,
) -> None:
    # Full read: (partition, offset) -> value.
    log_values: dict[tuple[int, int], bytes] = {}
    by_partition: dict[int, list[bytes]] = defaultdict(list)
    with broker.connect() as conn:
        for partition in range(PARTITIONS):
            for batch in conn.fetch_batches(TOPIC, partition):
                for record in batch.records():
                    value = bytes(record.value or b"")
                    log_values[(partition, batch.offset_of(record))] = value
                    by_partition[partition].append(value)
    result.records_in_log = len(log_values)
    occurrences = Counter(log_values.values())
    present = set(occurrences)
    for producer in producers:
        name = producer.label
        result.sent[name] = producer.sent
        result.acked[name] = len(producer.acked)
        result.failed[name] = producer.failed
        result.fatal_errors.extend(producer.fatal)
        lost = misplaced = 0
        for seq, where in producer.acked.items():
            value = f"{name}:{seq}".encode()
            if value not in present:
                lost += 1
            elif log_values.get(where) != value:
                misplaced += 1
        result.lost[name] = lost
        result.misplaced[name] = misplaced
        prefix = f"{name}:".encode()
        result.duplicated[name] = sum(
            n - 1 for v, n in occurrences.items() if v.startswith(prefix) and n > 1
        )
        violations = 0
        for values in by_partition.values():
            last = -1
            seen: set[int] = set()
            for value in values:
                if not value.startswith(prefix):
                    continue
                seq = int(value.split(b":")[1])
                if seq in seen:
                    continue  # a duplicate (counted above); order is about first copies
                seen.add(seq)
                if seq <= last:
                    violations += 1
                last = max(last, seq)
        result.order_violations[name] = violations
    result.consumed = consumer.consumed
    result.commits_acked = len(consumer.commits)
    result.commits_failed = consumer.commits_failed
    acked_max = consumer.acked_max()
    for partition, offset in acked_max.items():
        if result.final_committed.get(partition, -1) < offset:
            result.committed_backwards.append(
                f"at the end: partition {partition} committed "
                f"{result.final_committed.get(partition, -1)} < acknowledged {offset}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--rate", type=float, default=200.0, help="records/s per producer")
    parser.add_argument(
        "--uptime", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"),
        help="seconds the broker runs between kills, drawn uniformly (default 1 4)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument(
        "--capture", action="store_true",
        help="run every incarnation with serve --capture, then trio-broker verify the capture",
    )  # fmt: skip
    parser.add_argument(
        "--keep", type=Path, metavar="DIR",
        help="work in DIR (data, capture, verify report, broker log) and keep it",
    )  # fmt: skip
    args = parser.parse_args(argv)
    print(f"crash loop: {args.kills} kills, seed {args.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="crash-loop-") as tmp:
        work_dir = Path(tmp) if args.keep is None else args.keep
        work_dir.mkdir(parents=True, exist_ok=True)
        result = run_crash_loop(
            work_dir, kills=args.kills, seed=args.seed, rate=args.rate,
            uptime=(args.uptime[0], args.uptime[1]),
            log=lambda s: print(s, flush=True), capture=args.capture,
        )  # fmt: skip
    print(result.summary())
    if args.json:
        args.json.write_text(json.dumps(attrs.asdict(result), indent=2, default=str))
    return 1 if result.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
