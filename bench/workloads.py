"""Workloads W1-W6 against a trio-broker subprocess or a peer broker (see bench/run_all.py).

W1-W5 are issue 11's; W6 is W1 with 16 KiB records, ``batch.size=16384`` and ``linger.ms=0``:
one small batch per request, so every acknowledgement waits for a sync. Each workload takes
``start``, a function that starts a broker (default: ``trio-broker serve`` in the pipelined
model); ``kafka_peer.KafkaProcess`` has the same interface.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from produce import BrokerProcess, cpu_us_per_request, create_topic, percentile, run_producer

KIB = 1024
#: confluent_kafka.OFFSET_END: a consumer assigned there reads what comes after.
OFFSET_END = -1


class Broker(Protocol):
    """What a workload needs of a broker process (produce.BrokerProcess, KafkaProcess)."""

    port: int

    @property
    def bootstrap(self) -> str: ...

    def cpu_seconds(self) -> float: ...

    def rss_mib(self) -> float: ...

    def stop(self) -> None: ...


StartBroker = Callable[[], Broker]


def trio_broker(model: str = "pipelined", metrics: bool = False) -> StartBroker:
    """``metrics``: with a /metrics listener on a free port (BrokerProcess.metrics_port)."""
    extra = ["--metrics-listen", "127.0.0.1:0"] if metrics else None
    return lambda: BrokerProcess(model, extra=extra)


def w1(
    model: str,
    records: int,
    keep: bool = False,
    start: StartBroker | None = None,
    record_size: int = 64 * KIB,
    conf: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Broker | None]:
    """1 producer, 1 partition, 64 KiB records, batch 1 MiB, linger 1 ms, 5 in flight, acks=all."""
    broker = (start or trio_broker(model))()
    try:
        create_topic(broker.bootstrap, "w1")
        cpu0 = broker.cpu_seconds()
        r = run_producer(broker.bootstrap, "w1", records, record_size, conf or {})
        r["broker_cpu_s"] = broker.cpu_seconds() - cpu0
        r["broker_cpu_us_per_request"] = cpu_us_per_request(r["broker_cpu_s"], r)
        r["broker_peak_rss_mib"] = broker.rss_mib()
        r["model"] = model
    except BaseException:
        broker.stop()
        raise
    if keep:
        return r, broker
    broker.stop()
    return r, None


#: W6: one 16 KiB record per batch and per request (librdkafka sends a record larger than
#: batch.size alone), no linger; acks=all and 5 in flight as W1.
W6_CONF = {"batch.size": 16 * KIB, "linger.ms": 0}


def w6(model: str, records: int, start: StartBroker | None = None) -> dict[str, Any]:
    """W1 with 16 KiB records, batch.size 16384, linger 0: every ack waits for a sync."""
    return w1(model, records, start=start, record_size=16 * KIB, conf=W6_CONF)[0]


def w2(
    records: int,
    idempotent: bool = False,
    model: str = "pipelined",
    start: StartBroker | None = None,
) -> dict[str, Any]:
    """1 KiB records, linger 5 ms, acks=all (W4: enable.idempotence=true)."""
    broker = (start or trio_broker(model))()
    try:
        create_topic(broker.bootstrap, "w2")
        conf: dict[str, Any] = {"linger.ms": 5}
        if idempotent:
            conf["enable.idempotence"] = True
        cpu0 = broker.cpu_seconds()
        t0 = os.times()
        r = run_producer(broker.bootstrap, "w2", records, KIB, conf)
        t1 = os.times()
        r["broker_cpu_s"] = broker.cpu_seconds() - cpu0
        r["broker_cpu_s_per_100k"] = r["broker_cpu_s"] / records * 100_000
        r["broker_cpu_us_per_request"] = cpu_us_per_request(r["broker_cpu_s"], r)
        # The client process's own CPU (librdkafka threads + the Python produce loop).
        r["client_cpu_s"] = (t1.user - t0.user) + (t1.system - t0.system)
        r["broker_peak_rss_mib"] = broker.rss_mib()
        return r
    finally:
        broker.stop()


def w3(
    broker: Broker, records: int, time_limit: float = 120.0, topic: str = "w1", passes: int = 1
) -> dict[str, Any]:
    """One consumer reading W1's data (or `topic`'s, written by run_producer) from offset 0.

    ``passes`` > 1 reads the log that many times (a seek back to 0 after each): a small log
    read once takes tens of milliseconds, too short a time to measure a rate.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": "w3", "enable.auto.commit": False,
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "receive.message.max.bytes": 80 * 1024 * 1024,
        # A seek waits for the fetch in flight, which at the log's end waits this long.
        **({"fetch.wait.max.ms": 5} if passes > 1 else {}),
    })  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = nbytes = errors = 0
    # The warm-up record of W1 is in the log too.
    per_pass = records + 1
    want = per_pass * passes
    cpu0 = broker.cpu_seconds()
    t0 = os.times()
    start = time.perf_counter()
    try:
        # poll() returns as soon as a record is there (consume(n, t) would wait out its
        # timeout on the last, short batch and bias the figure).
        poll = consumer.poll
        while got < want and time.perf_counter() - start < time_limit:
            msg = poll(1.0)
            if msg is None:
                continue
            if msg.error():
                errors += 1
                continue
            got += 1
            nbytes += len(msg.value() or b"")
            if got % per_pass == 0 and got < want:
                consumer.seek(TopicPartition(topic, 0, 0))
        elapsed = time.perf_counter() - start
        cpu = broker.cpu_seconds() - cpu0
        t1 = os.times()
    finally:
        consumer.close()
    return {
        "records": got, "bytes": nbytes, "seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6,
        "broker_cpu_s": cpu, "broker_cpu_cores": cpu / elapsed, "errors": errors,
        "broker_peak_rss_mib": broker.rss_mib(),
        "client_cpu_cores": ((t1.user - t0.user) + (t1.system - t0.system)) / elapsed,
        "passes": passes, "complete": got >= want,
    }  # fmt: skip


#: The broker's stage histograms (trio_broker/server/histogram.py RequestStages) that
#: W5 reads for Produce, then the loop's lag and the fsyncs (unlabelled), then the garbage
#: collector's pauses per generation (``gc_pause_gen0`` ...).
PRODUCE_STAGES = ("request_queue", "request_local", "request_remote", "response_send",
                  "request_total")  # fmt: skip
UNLABELLED = ("event_loop_lag", "fsync_duration")
_BUCKET = re.compile(r'^trio_broker_(\w+)_seconds_bucket\{(.*)le="([^"]+)"\} (\S+)$')
_GENERATION = re.compile(r'generation="(\d+)"')


def scrape_histograms(port: int) -> dict[str, list[tuple[float, float]]]:
    """Produce's stage histograms, the unlabelled ones and the collector's pauses from a
    broker's /metrics: name -> [(upper bound, cumulative count)]."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[float, float]]] = {}
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match is None:
            continue
        name, labels, le, count = match.groups()
        generation = _GENERATION.search(labels) if name == "gc_pause" else None
        if generation is not None:
            name = f"gc_pause_gen{generation.group(1)}"
        elif not (
            (name in PRODUCE_STAGES and 'api="produce"' in labels)
            or (name in UNLABELLED and not labels)
        ):
            continue
        out.setdefault(name, []).append((float(le), float(count)))
    return out


def histogram_summary(
    before: dict[str, list[tuple[float, float]]], after: dict[str, list[tuple[float, float]]]
) -> dict[str, dict[str, float]]:
    """Per histogram, over the interval: count, and the bucket bounds holding p50/p99/max
    (a percentile is read as its bucket's upper bound: 'at most')."""
    summary: dict[str, dict[str, float]] = {}
    for name, buckets in after.items():
        old = dict(before.get(name, []))
        delta = [(le, count - old.get(le, 0.0)) for le, count in buckets]
        total = delta[-1][1] if delta else 0.0
        row: dict[str, float] = {"count": total}
        for label, q in (("p50_le_ms", 0.5), ("p99_le_ms", 0.99), ("max_le_ms", 1.0)):
            bound = next((le for le, c in delta if total and c >= q * total), float("nan"))
            row[label] = bound * 1000
        summary[name] = row
    return summary


class ClientLatencies:
    """librdkafka's own per-broker windows (statistics.interval.ms) of W5's producers:
    int_latency (produce() to the request being built: the producer's queue), outbuf_latency
    (built to written to the socket), rtt (written to the response read, as the client's
    broker thread saw it). Each window's avg and p99 are kept, per producer."""

    KEYS = ("int_latency", "outbuf_latency", "rtt")

    def __init__(self) -> None:
        self.windows: dict[str, list[tuple[float, float, int]]] = {k: [] for k in self.KEYS}
        self.recording = False

    def on_stats(self, raw: str) -> None:
        if not self.recording:
            return
        for b in json.loads(raw).get("brokers", {}).values():
            if b.get("nodeid", -1) < 0:  # the bootstrap entry, not the broker
                continue
            for key in self.KEYS:
                window = b.get(key) or {}
                if window.get("cnt"):
                    self.windows[key].append((window["avg"], window["p99"], window["cnt"]))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per key, in ms: the count-weighted mean, and the median and max over windows of
        the per-producer p99 (a window's p99 over ~20 values is about its maximum)."""
        out: dict[str, dict[str, float]] = {}
        for key, rows in self.windows.items():
            if not rows:
                continue
            count = sum(c for _, _, c in rows)
            p99s = sorted(p for _, p, _ in rows)
            out[key] = {
                "mean_ms": sum(a * c for a, _, c in rows) / count / 1000,
                "window_p99_median_ms": percentile(p99s, 0.5) / 1000,
                "window_p99_p99_ms": percentile(p99s, 0.99) / 1000,
                "window_p99_max_ms": p99s[-1] / 1000,
                "windows": len(rows),
            }
        return out


#: W5's record value size.
W5_RECORD_BYTES = 100


def _w5_produce(
    bootstrap: str,
    first: int,
    count: int,
    partitions: int,
    rate: float,
    seconds: float,
    client_stats: bool,
    ready: Any = None,
) -> dict[str, Any]:
    """W5's producers ``first`` .. ``first + count - 1`` (one connection each, acks=all,
    linger.ms=0), each sending to partition ``(index + tick) % partitions`` every 1/rate s.

    Run in the bench's process, or in one of several (``client_processes``): then
    ``ready`` is a barrier the parent passes once every process has warmed up its
    producers, and the ticks start when it opens.
    """
    from confluent_kafka import Producer

    latencies: list[float] = []
    errors = 0
    stats = ClientLatencies()

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal errors
        if err is not None:
            errors += 1
        else:
            latencies.append(msg.latency())

    clients: list[Any] = []
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0}
    if client_stats:
        conf |= {"statistics.interval.ms": 1000, "stats_cb": stats.on_stats}
    try:
        for _ in range(count):
            p = Producer(conf)
            p.produce("w5", b"warmup", partition=0)
            clients.append(p)
        for p in clients:
            p.flush(30)
        if ready is not None:
            ready.wait(120)
        payload = os.urandom(W5_RECORD_BYTES)
        sent = 0
        stats.recording = True
        t0 = os.times()
        began = time.perf_counter()
        tick = 1.0 / rate
        n = 0
        while time.perf_counter() - began < seconds:
            for i, p in enumerate(clients, first):
                p.produce("w5", payload, partition=(i + n) % partitions, on_delivery=on_delivery)
                p.poll(0)
                sent += 1
            n += 1
            # msg.latency() is read in the delivery callback, so serve callbacks every
            # ~5 ms until the next tick: the figure carries at most ~5 ms of polling slack.
            while time.perf_counter() < began + n * tick:
                for p in clients:
                    p.poll(0)
                time.sleep(0.005)
        elapsed = time.perf_counter() - began
        undelivered = sum(p.flush(30) for p in clients)
        stats.recording = False
        t1 = os.times()
        return {
            "latencies": latencies, "errors": errors, "sent": sent, "elapsed": elapsed,
            "undelivered": undelivered, "stats": stats.windows,
            "client_cpu_s": (t1.user - t0.user) + (t1.system - t0.system),
        }  # fmt: skip
    finally:
        clients.clear()


def _w5_produce_child(out: Any, *args: Any) -> None:
    """A client process's share of W5's producers; its result goes to the ``out`` queue."""
    out.put(_w5_produce(*args))


def w5(
    producers: int,
    partitions: int,
    rate: float,
    seconds: float,
    idle: int,
    start: StartBroker | None = None,
    consumers: int = 0,
    client_processes: int = 1,
    client_stats: bool = False,
) -> dict[str, Any]:
    """Fan-in: N producers (one connection each) at `rate` msgs/s to P partitions + idle sockets.

    ``consumers`` > 0 (issue 29; issue 11's W5 has none): that many consumers, each
    assigned every ``consumers``-th partition as a group would split them, long-poll from
    the end (``fetch.wait.max.ms=500``); their records' produce-to-consume times (the
    record's CreateTime, 1 ms resolution) are reported too.

    ``client_processes`` > 1 runs the producers split across that many processes (the
    same producers, rate and partitions): 100 librdkafka instances in one Python process
    share one GIL and its delivery-callback loop, which may be the bench's own limit.
    ``client_stats`` adds librdkafka's per-window latencies (ClientLatencies). A broker
    with a /metrics listener (``metrics_port``) also reports Produce's stage times
    (histogram_summary) over the measured interval.
    """
    import multiprocessing

    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = (start or trio_broker(metrics=True))()
    idle_socks: list[socket.socket] = []
    stop = threading.Event()
    readers: list[threading.Thread] = []
    children: list[Any] = []
    e2e: list[float] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics(
            [NewTopic("w5", num_partitions=partitions, replication_factor=1)]
        ).values():
            f.result(30)
        for _ in range(idle):
            idle_socks.append(socket.create_connection(("127.0.0.1", broker.port)))
        ready = threading.Barrier(consumers + 1) if consumers else None

        def consume(index: int) -> None:
            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"w5-{index}",
                          "enable.auto.commit": False, "fetch.wait.max.ms": 500})  # fmt: skip
            try:
                c.assign([TopicPartition("w5", p, OFFSET_END)
                          for p in range(index, partitions, consumers)])  # fmt: skip
                c.poll(1.0)  # resolves the end offsets before the producers start
                assert ready is not None
                ready.wait(60)
                while not stop.is_set():
                    msg = c.poll(0.1)
                    if msg is not None and msg.error() is None:
                        e2e.append(time.time() * 1000 - msg.timestamp()[1])
            finally:
                c.close()

        for index in range(consumers):
            readers.append(threading.Thread(target=consume, args=(index,), daemon=True))
            readers[-1].start()
        if ready is not None:
            ready.wait(60)
        metrics_port = getattr(broker, "metrics_port", None)
        shares = [producers // client_processes + (k < producers % client_processes)
                  for k in range(client_processes)]  # fmt: skip
        firsts = [sum(shares[:k]) for k in range(client_processes)]
        if client_processes == 1:
            before = scrape_histograms(metrics_port) if metrics_port else {}
            cpu0 = broker.cpu_seconds()
            parts = [_w5_produce(broker.bootstrap, 0, producers, partitions, rate, seconds,
                                 client_stats)]  # fmt: skip
        else:
            context = multiprocessing.get_context("spawn")
            out = context.Queue()
            go = context.Barrier(client_processes + 1)
            for k in range(client_processes):
                args = (out, broker.bootstrap, firsts[k], shares[k], partitions, rate, seconds,
                        client_stats, go)  # fmt: skip
                children.append(context.Process(target=_w5_produce_child, args=args))
                children[-1].start()
            go.wait(180)  # every process has warmed up its producers
            before = scrape_histograms(metrics_port) if metrics_port else {}
            cpu0 = broker.cpu_seconds()
            parts = [out.get(timeout=seconds + 240) for _ in children]
        cpu = broker.cpu_seconds() - cpu0
        after = scrape_histograms(metrics_port) if metrics_port else {}
        latencies = sorted(x for part in parts for x in part["latencies"])
        errors = sum(part["errors"] for part in parts)
        sent = sum(part["sent"] for part in parts)
        elapsed = max(part["elapsed"] for part in parts)
        if consumers:  # until the consumers have what was sent, or 10 s
            deadline = time.monotonic() + 10
            while len(e2e) < sent - errors and time.monotonic() < deadline:
                time.sleep(0.05)
        consumed = sorted(e2e)
        windows = ClientLatencies()
        for part in parts:
            for key, rows in part["stats"].items():
                windows.windows[key] += rows
        return {
            "consumers": consumers, "consumed": len(consumed),
            "e2e_p50_ms": percentile(consumed, 0.5), "e2e_p99_ms": percentile(consumed, 0.99),
            "producers": producers, "partitions": partitions, "rate_per_producer": rate,
            "idle_connections": idle, "seconds": elapsed, "sent": sent,
            "achieved_msgs_per_s": sent / elapsed, "record_bytes": W5_RECORD_BYTES,
            "broker_cpu_s": cpu, "broker_cpu_us_per_request": cpu / max(sent, 1) * 1e6,
            "client_processes": client_processes,
            "client_cpu_s": sum(part["client_cpu_s"] for part in parts),
            "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
            "max_ms": (latencies[-1] * 1000) if latencies else float("nan"),
            "broker_peak_rss_mib": broker.rss_mib(), "errors": errors,
            "undelivered": sum(part["undelivered"] for part in parts),
            "broker_stages": histogram_summary(before, after),
            "client_latencies": windows.summary(),
            "cdf_ms": plots.quantiles(latencies, 1000),
        }  # fmt: skip
    finally:
        stop.set()
        for t in readers:
            t.join(30)
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
        for s in idle_socks:
            s.close()
        broker.stop()
