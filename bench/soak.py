"""Soak: mixed load on one broker for N minutes, sampling RSS, fds and latency.

The load, all against one ``trio-broker serve`` subprocess (file storage, small
segments and a byte retention so that rolling and deletion run too):

- a confluent-kafka producer, acks=all, ``--rate`` records/s of 1 KiB over 3
  partitions; produce latency = delivery report time - produce() time;
- a consumer group member (confluent-kafka) reading everything and committing
  synchronously every second;
- connection churn: a raw client that connects, asks Metadata and disconnects,
  a few times a second (fd leaks show up here);
- ``--idle`` idle connections held open for the whole run.

Segments are 1 MiB with 3 MiB retention per partition, so segments roll every
few seconds and are deleted soon after; a deleted segment's files stay open
for ``file.delete.delay.ms`` (60 s, as in Kafka) before they are closed, so the
fd count climbs for the first ~80 s and then levels off.

Every ``--interval`` seconds a sample: broker RSS and open fds (/proc/PID),
records produced/acknowledged/failed in the window, latency p50/p99/max. At
the end: a table, a trend (least-squares slope of RSS and fds over the second
half of the run, per minute) and a JSON file.

    .venv/bin/python bench/soak.py                  # 30 minutes
    .venv/bin/python bench/soak.py --minutes 2 --json soak.json
"""

from __future__ import annotations

import argparse
import functools
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer  # noqa: E402

from tests.reliability.conftest import ConfiguredBroker, open_fds, rss_bytes  # noqa: E402

TOPIC = "soak"
PARTITIONS = 3
VALUE = b"s" * 1024


@attrs.define
class Sample:
    t: float
    rss_mib: float
    fds: int
    connections_churned: int
    acked: int
    failed: int
    consumed: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@attrs.define
class Load:
    stop: threading.Event = attrs.field(factory=threading.Event)
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    latencies: list[float] = attrs.field(factory=list)
    acked: int = 0
    failed: int = 0
    consumed: int = 0
    commits: int = 0
    commit_errors: int = 0
    churned: int = 0
    churn_errors: int = 0
    errors: list[str] = attrs.field(factory=list)

    def take_window(self) -> list[float]:
        with self.lock:
            window, self.latencies = self.latencies, []
        return window


def _producer(bootstrap: str, load: Load, rate: float) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "soak-producer",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "log_level": 3,
        }
    )

    def delivered(err: KafkaError | None, msg: Any, sent_at: float) -> None:
        latency = time.monotonic() - sent_at
        with load.lock:
            if err is None:
                load.acked += 1
                load.latencies.append(latency)
            else:
                load.failed += 1
                if len(load.errors) < 20:
                    load.errors.append(f"produce: {err}")

    interval = 1.0 / rate
    next_at = time.monotonic()
    seq = 0
    while not load.stop.is_set():
        sent_at = time.monotonic()
        try:
            producer.produce(
                TOPIC,
                VALUE,
                partition=seq % PARTITIONS,
                on_delivery=functools.partial(delivered, sent_at=sent_at),
            )
        except BufferError:
            producer.poll(0.05)
            continue
        seq += 1
        producer.poll(0)
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()  # behind: do not burst to catch up
    producer.flush(30)


def _consumer(bootstrap: str, load: Load) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "soak-group",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    consumer.subscribe([TOPIC])
    last_commit = time.monotonic()
    try:
        while not load.stop.is_set():
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                with load.lock:
                    load.consumed += 1
            if time.monotonic() - last_commit > 1.0:
                last_commit = time.monotonic()
                try:
                    consumer.commit(asynchronous=False)
                    load.commits += 1
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError._NO_OFFSET:
                        load.commit_errors += 1
    finally:
        consumer.close()


def _churn(broker: ConfiguredBroker, load: Load, per_second: float) -> None:
    while not load.stop.wait(1.0 / per_second):
        try:
            with broker.connect(timeout=5.0) as conn:
                conn.metadata(topics=None)
            load.churned += 1
        except (OSError, AssertionError) as exc:
            load.churn_errors += 1
            if len(load.errors) < 20:
                load.errors.append(f"churn: {exc!r}")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), in value per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60


def run_soak(
    work_dir: Path,
    minutes: float,
    interval: float = 5.0,
    rate: float = 500.0,
    idle: int = 200,
    churn_per_second: float = 5.0,
    log: Any = print,
) -> dict[str, Any]:
    broker = ConfiguredBroker(
        work_dir / "data",
        config={
            "num.partitions": PARTITIONS,
            "group.initial.rebalance.delay.ms": 100,
            "log.segment.bytes": 1 << 20,
            "log.retention.bytes": 3 << 20,
            "log.retention.check.interval.ms": 5_000,
        },
    )
    broker.start()
    load = Load()
    samples: list[Sample] = []
    idle_socks: list[socket.socket] = []
    try:
        with broker.connect() as conn:
            conn.metadata([TOPIC])
        for _ in range(idle):
            idle_socks.append(socket.create_connection(("127.0.0.1", broker.port), timeout=5))
        threads = [
            threading.Thread(target=_producer, args=(broker.bootstrap, load, rate), daemon=True),
            threading.Thread(target=_consumer, args=(broker.bootstrap, load), daemon=True),
            threading.Thread(target=_churn, args=(broker, load, churn_per_second), daemon=True),
        ]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        end = started + minutes * 60
        log(
            f"{'t(s)':>6} {'RSS MiB':>8} {'fds':>5} {'churn':>6} {'acked':>8} {'failed':>6} "
            f"{'consumed':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
        )
        while time.monotonic() < end:
            time.sleep(min(interval, max(0.0, end - time.monotonic())))
            assert broker.running, f"broker died\n{broker.log_tail()}"
            window = load.take_window()
            sample = Sample(
                t=round(time.monotonic() - started, 1),
                rss_mib=round(rss_bytes(broker.pid) / (1 << 20), 1),
                fds=open_fds(broker.pid),
                connections_churned=load.churned,
                acked=load.acked,
                failed=load.failed,
                consumed=load.consumed,
                p50_ms=round(_percentile(window, 0.50), 1),
                p99_ms=round(_percentile(window, 0.99), 1),
                max_ms=round(max(window, default=0.0) * 1000, 1),
            )
            samples.append(sample)
            log(
                f"{sample.t:6.0f} {sample.rss_mib:8.1f} {sample.fds:5d} "
                f"{sample.connections_churned:6d} {sample.acked:8d} {sample.failed:6d} "
                f"{sample.consumed:8d} {sample.p50_ms:7.1f} {sample.p99_ms:7.1f} "
                f"{sample.max_ms:7.1f}"
            )
        load.stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        load.stop.set()
        for sock in idle_socks:
            sock.close()
        broker.finish()
    second_half = samples[len(samples) // 2 :]
    rss_slope = _slope_per_minute([(s.t, s.rss_mib) for s in second_half])
    fd_slope = _slope_per_minute([(s.t, float(s.fds)) for s in second_half])
    all_latency = [s.p99_ms for s in samples]
    summary = {
        "minutes": minutes,
        "rate_per_s": rate,
        "idle_connections": idle,
        "samples": len(samples),
        "acked": load.acked,
        "failed": load.failed,
        "consumed": load.consumed,
        "commits": load.commits,
        "commit_errors": load.commit_errors,
        "connections_churned": load.churned,
        "churn_errors": load.churn_errors,
        "errors": load.errors,
        "rss_mib_first": samples[0].rss_mib if samples else None,
        "rss_mib_last": samples[-1].rss_mib if samples else None,
        "rss_mib_max": max((s.rss_mib for s in samples), default=None),
        "fds_first": samples[0].fds if samples else None,
        "fds_last": samples[-1].fds if samples else None,
        "rss_slope_mib_per_min_second_half": round(rss_slope, 3),
        "fd_slope_per_min_second_half": round(fd_slope, 3),
        "p99_ms_worst_window": max(all_latency, default=None),
        "table": [attrs.asdict(s) for s in samples],
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--rate", type=float, default=500.0, help="records/s produced")
    parser.add_argument("--idle", type=int, default=200, help="idle connections held open")
    parser.add_argument("--json", type=Path, help="write the samples and summary here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        summary = run_soak(
            Path(tmp), args.minutes, args.interval, args.rate, args.idle,
            log=lambda s: print(s, flush=True),
        )  # fmt: skip
    print(
        f"\nacked={summary['acked']} failed={summary['failed']} consumed={summary['consumed']} "
        f"commits={summary['commits']} commit_errors={summary['commit_errors']} "
        f"churned={summary['connections_churned']} churn_errors={summary['churn_errors']}"
    )
    print(
        f"RSS {summary['rss_mib_first']} -> {summary['rss_mib_last']} MiB "
        f"(max {summary['rss_mib_max']}); fds {summary['fds_first']} -> {summary['fds_last']}"
    )
    print(
        f"trend over the second half: RSS {summary['rss_slope_mib_per_min_second_half']:+.3f} "
        f"MiB/min, fds {summary['fd_slope_per_min_second_half']:+.3f} /min; "
        f"worst p99 window {summary['p99_ms_worst_window']} ms"
    )
    if summary["errors"]:
        print("errors:", *summary["errors"], sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 1 if summary["failed"] or summary["churn_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
