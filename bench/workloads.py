"""Workloads W1-W6 against a trio-broker subprocess or a peer broker (see bench/run_all.py).

W1-W5 are issue 11's; W6 is W1 with 16 KiB records, ``batch.size=16384`` and ``linger.ms=0``:
one small batch per request, so every acknowledgement waits for a sync. Each workload takes
``start``, a function that starts a broker (default: ``trio-broker serve`` in the pipelined
model); ``kafka_peer.KafkaProcess`` has the same interface.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
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


def trio_broker(model: str = "pipelined") -> StartBroker:
    return lambda: BrokerProcess(model)


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


def w5(
    producers: int,
    partitions: int,
    rate: float,
    seconds: float,
    idle: int,
    start: StartBroker | None = None,
    consumers: int = 0,
) -> dict[str, Any]:
    """Fan-in: N producers (one connection each) at `rate` msgs/s to P partitions + idle sockets.

    ``consumers`` > 0 (issue 29; issue 11's W5 has none): that many consumers, each
    assigned every ``consumers``-th partition as a group would split them, long-poll from
    the end (``fetch.wait.max.ms=500``); their records' produce-to-consume times (the
    record's CreateTime, 1 ms resolution) are reported too.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = (start or trio_broker())()
    idle_socks: list[socket.socket] = []
    clients: list[Any] = []
    stop = threading.Event()
    readers: list[threading.Thread] = []
    e2e: list[float] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics(
            [NewTopic("w5", num_partitions=partitions, replication_factor=1)]
        ).values():
            f.result(30)
        for _ in range(idle):
            idle_socks.append(socket.create_connection(("127.0.0.1", broker.port)))
        latencies: list[float] = []
        errors = 0

        def on_delivery(err: Any, msg: Any) -> None:
            nonlocal errors
            if err is not None:
                errors += 1
            else:
                latencies.append(msg.latency())

        for _ in range(producers):
            p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
            p.produce("w5", b"warmup", partition=0)
            clients.append(p)
        for p in clients:
            p.flush(30)
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
        payload = os.urandom(100)
        sent = 0
        cpu0 = broker.cpu_seconds()
        began = time.perf_counter()
        tick = 1.0 / rate
        n = 0
        while time.perf_counter() - began < seconds:
            for i, p in enumerate(clients):
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
        cpu = broker.cpu_seconds() - cpu0
        latencies.sort()
        if consumers:  # until the consumers have what was sent, or 10 s
            deadline = time.monotonic() + 10
            while len(e2e) < sent - errors and time.monotonic() < deadline:
                time.sleep(0.05)
        consumed = sorted(e2e)
        return {
            "consumers": consumers, "consumed": len(consumed),
            "e2e_p50_ms": percentile(consumed, 0.5), "e2e_p99_ms": percentile(consumed, 0.99),
            "producers": producers, "partitions": partitions, "rate_per_producer": rate,
            "idle_connections": idle, "seconds": elapsed, "sent": sent,
            "achieved_msgs_per_s": sent / elapsed, "record_bytes": len(payload),
            "broker_cpu_s": cpu,
            "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
            "max_ms": (latencies[-1] * 1000) if latencies else float("nan"),
            "broker_peak_rss_mib": broker.rss_mib(), "errors": errors, "undelivered": undelivered,
            "cdf_ms": plots.quantiles(latencies, 1000),
        }  # fmt: skip
    finally:
        stop.set()
        for t in readers:
            t.join(30)
        clients.clear()
        for s in idle_socks:
            s.close()
        broker.stop()
