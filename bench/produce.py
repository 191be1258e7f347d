"""Seed experiment: one producer, one partition, acks=all with fsync before every ack.

Runs the same confluent-kafka workload against a trio-broker subprocess in the
``serial`` model (Kafka's one request per connection) and the ``pipelined`` model,
side by side in one run, and prints throughput, latency percentiles and the
pipelined/serial ratios.

    .venv/bin/python bench/produce.py                 # 64 KiB x 2048 records (128 MiB)
    .venv/bin/python bench/produce.py --records 4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402

#: How long one produce() may wait for room in librdkafka's queue.
FULL_QUEUE_WAIT_S = 60.0
LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")
METRICS_ON = re.compile(r"metrics on [^\s:]+:(\d+)")
#: Seconds a broker may take to start listening. A broker run at nice 19 beside other
#: jobs (a shared machine) may take minutes to import; BENCH_START_TIMEOUT_S raises it.
START_TIMEOUT_S = float(os.environ.get("BENCH_START_TIMEOUT_S", "30"))


class BrokerProcess:
    """A `trio-broker serve` subprocess on a free port with a fresh data dir."""

    def __init__(
        self,
        model: str,
        storage: str = "file",
        extra: list[str] | None = None,
        launcher: list[str] | None = None,
        config: Callable[[Path], Path] | None = None,
    ) -> None:
        """``launcher``: a command that runs the broker command after it (e.g. py-spy record --).

        ``config``: writes the ``--config`` file, given the broker's fresh data dir.
        """
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"bench-{model}-", dir=ROOT / "bench"))
        if config is not None:
            extra = [*(extra or []), "--config", str(config(self.data_dir))]
        # The repo's venv, else the running interpreter's (a git worktree has no .venv).
        # BENCH_TRIO_BROKER: another tree's trio-broker (bench/w5_rounds.py compares two).
        exe = Path(os.environ.get("BENCH_TRIO_BROKER", ROOT / ".venv" / "bin" / "trio-broker"))
        if not exe.exists():
            exe = Path(sys.executable).with_name("trio-broker")
        cmd = [*(launcher or []),
               str(exe) if exe.exists() else "trio-broker", "serve", "--listen", "127.0.0.1:0",
               "--data-dir", str(self.data_dir), "--storage", storage,
               "--processing-model", model, "--log-level", "INFO", *(extra or [])]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        #: The /metrics port when started with ``--metrics-listen`` (logged before it listens).
        self.metrics_port: int | None = None
        self.port = self._wait_listening()
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_listening(self) -> int:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            metrics = METRICS_ON.search(line)
            if metrics:
                self.metrics_port = int(metrics.group(1))
            match = LISTENING.search(line)
            if match:
                return int(match.group(1))
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        raise RuntimeError("broker did not start")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_producer(
    bootstrap: str, topic: str, records: int, size: int, conf: dict[str, Any]
) -> dict[str, Any]:
    from confluent_kafka import Producer

    base = {
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1,
        "batch.size": 1024 * 1024, "max.in.flight.requests.per.connection": 5,
        "message.max.bytes": 1024 * 1024 + 1024, "compression.type": "none",
        "queue.buffering.max.kbytes": 512 * 1024,
        # librdkafka's statistics count the Produce requests it sent (CPU per request).
        "statistics.interval.ms": STATS_INTERVAL_MS,
    }  # fmt: skip
    base.update(conf)
    stats: list[int] = []
    base["stats_cb"] = lambda raw: stats.append(_produce_requests(raw))
    producer = Producer(base)
    # Warm up: metadata, connection (and InitProducerId when idempotent).
    producer.produce(topic, b"warmup")
    producer.flush(30)
    requests0 = _next_stats(producer, stats)
    payload = os.urandom(size)
    latencies: list[float] = []
    errors = 0

    def on_delivery(err: Any, msg: Any) -> None:
        # librdkafka measures each message's latency (produce() to ack) itself;
        # one shared callback keeps the Python side of the loop cheap.
        nonlocal errors
        if err is not None:
            errors += 1
        else:
            latencies.append(msg.latency())

    produce, poll = producer.produce, producer.poll
    start = time.perf_counter()
    for i in range(records):
        # librdkafka's queue is full (100k messages by default) while the broker is behind:
        # serve callbacks until it has room, for at most FULL_QUEUE_WAIT_S per record.
        waited_until = time.monotonic() + FULL_QUEUE_WAIT_S
        while True:
            try:
                produce(topic, payload, on_delivery=on_delivery)
                break
            except BufferError:
                if time.monotonic() > waited_until:
                    raise
                poll(0.05)
        if i % 256 == 0:
            poll(0)  # serve delivery callbacks without a call per record
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - start
    requests = _next_stats(producer, stats) - requests0
    latencies.sort()
    return {
        "records": records, "record_bytes": size, "seconds": elapsed,
        "mb_per_s": records * size / elapsed / 1e6, "records_per_s": records / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": (latencies[-1] * 1000) if latencies else float("nan"),
        "errors": errors, "undelivered": remaining, "produce_requests": requests,
        "cdf_ms": plots.quantiles(latencies, 1000),
    }  # fmt: skip


#: How often librdkafka reports its statistics (a few JSON documents per run).
STATS_INTERVAL_MS = 200


def _produce_requests(raw: str) -> int:
    """Produce requests sent to all brokers so far, from one librdkafka statistics JSON."""
    brokers = json.loads(raw).get("brokers", {}).values()
    return sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)


def _next_stats(producer: Any, stats: list[int]) -> int:
    """The Produce count of the next statistics report (one that comes after this call)."""
    seen = len(stats)
    deadline = time.monotonic() + 10 * STATS_INTERVAL_MS / 1000
    while len(stats) <= seen and time.monotonic() < deadline:
        producer.poll(STATS_INTERVAL_MS / 1000)
    return stats[-1] if len(stats) > seen else -1


def cpu_us_per_request(broker_cpu_s: float, result: dict[str, Any]) -> float | None:
    """Broker CPU µs per Produce request (None when the count is unknown)."""
    requests = result.get("produce_requests", 0)
    return broker_cpu_s / requests * 1e6 if requests > 0 else None


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    for future in futures.values():
        future.result(30)


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    broker = BrokerProcess(model, args.storage)
    try:
        topic = f"seed-{model}"
        create_topic(broker.bootstrap, topic)
        cpu_before = broker.cpu_seconds()
        conf = {"enable.idempotence": True} if args.idempotent else {}
        result = run_producer(broker.bootstrap, topic, args.records, args.record_size, conf)
        result["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
        result["broker_peak_rss_mib"] = broker.rss_mib()
        result["model"] = model
        return result
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--record-size", type=int, default=64 * 1024)
    parser.add_argument("--storage", default="file", choices=["file", "memory"])
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--models", default="serial,pipelined")
    parser.add_argument("--json", type=Path, help="write results here")
    args = parser.parse_args()
    results = [bench_model(model, args) for model in args.models.split(",")]
    header = f"{'model':<10} {'MB/s':>8} {'rec/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu s':>6} {'rss MiB':>8} {'err':>4}"
    print(header)
    for r in results:
        print(
            f"{r['model']:<10} {r['mb_per_s']:>8.1f} {r['records_per_s']:>9.0f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} {r['broker_cpu_s']:>6.1f} "
            f"{r['broker_peak_rss_mib']:>8.0f} {r['errors'] + r['undelivered']:>4}"
        )
    by_model = {r["model"]: r for r in results}
    summary: dict[str, Any] = {"results": results}
    if "serial" in by_model and "pipelined" in by_model:
        s, p = by_model["serial"], by_model["pipelined"]
        summary["throughput_ratio"] = p["mb_per_s"] / s["mb_per_s"]
        summary["p99_ratio"] = p["p99_ms"] / s["p99_ms"]
        print(
            f"pipelined/serial: throughput x{summary['throughput_ratio']:.2f}, "
            f"p99 x{summary['p99_ratio']:.2f} (target: >= 2.0 and <= 0.2)"
        )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    sys.exit(0 if all(r["errors"] == 0 and r["undelivered"] == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
