"""Fetch path costs: producers fanning in to long-polling consumers, and small produces.

``fanin``: N producers (one connection each, acks=1, linger 0) write small records in
turn to P partitions at a fixed rate each (as W5); C consumers, each assigned all P
partitions (no group, fetch.wait.max.ms=500), long-poll them, so every record wakes
every consumer's waiting fetch. ``single``: one producer writes one small record at a
time to one partition, waiting for each ack, while one consumer long-polls it.
Reported: the broker's CPU per record and per request, ack latency (single) and
produce-to-consume latency. The broker runs as a subprocess with the caller's
PYTHONPATH, so the same script measures another tree's broker. ``cycle`` (in-process,
a steadier number on a busy machine): a raw Fetch of P partitions long-polls, a raw
Produce of one record to partition 0 wakes it; the process's CPU per such cycle
(client side included, the same in both trees but for the codec). ``read`` (in-process,
the handler alone): the thread's CPU per ``read_partitions`` of a Fetch of P
partitions of one record each, on a broker's own services and on-disk logs, the best
and the median of 7 rounds; ``--isolation 1`` reads read_committed. Compare two trees
by running it under each PYTHONPATH in turn, interleaved.

    python bench/fetch_path.py                        # fanin and single, default sizes
    python bench/fetch_path.py --only fanin --json out.json
    python bench/fetch_path.py --only cycle --partitions 128
    python bench/fetch_path.py --only read --partitions 32 --isolation 1
    PYTHONPATH=/tmp/base python bench/fetch_path.py   # a broker from another tree
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import struct
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce import BrokerProcess, percentile

#: Room for the timestamp a record carries, then padding: 100-byte records.
PAD = b"x" * 92


def _consumers(
    bootstrap: str, topic: str, partitions: int, count: int
) -> tuple[list[Any], list[float], threading.Event, list[threading.Thread]]:
    """``count`` consumers of every partition, each polled by its own thread, timing
    each record from its produce; the threads run until the event is set."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": bootstrap, "group.id": "fetch-path", "enable.auto.commit": False,
            "fetch.wait.max.ms": 500, "auto.offset.reset": "earliest"}  # fmt: skip
    consumers = []
    for _ in range(count):
        c = Consumer(conf)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        consumers.append(c)
    latencies: list[float] = []
    stop = threading.Event()

    def poll(c: Any) -> None:
        while not stop.is_set():
            msg = c.poll(0.2)
            if msg is not None and not msg.error() and len(msg.value()) >= 8:
                (sent,) = struct.unpack(">d", msg.value()[:8])
                latencies.append((time.time() - sent) * 1000)

    threads = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
    for t in threads:
        t.start()
    return consumers, latencies, stop, threads


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        f.result(30)


def _wait_for(latencies: list[float], want: int, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while len(latencies) < want and time.monotonic() < deadline:
        time.sleep(0.05)


def _broker() -> tuple[BrokerProcess, str]:
    """A broker with /metrics (on a port free a moment ago), and its metrics address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    return BrokerProcess("pipelined", extra=["--metrics-listen", address]), address


REQUESTS = re.compile(r'^trio_broker_requests_total\{api="(\w+)",[^}]*\} (\d+)', re.MULTILINE)


def _requests(metrics: str) -> dict[str, int]:
    """Requests handled so far, per API (the same series in every tree)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {api: int(n) for api, n in REQUESTS.findall(text)}


def _costs(
    cpu: float, before: dict[str, int], after: dict[str, int], records: int
) -> dict[str, Any]:
    """The broker's CPU per record and per request, and the requests it took."""
    fetches = after.get("fetch", 0) - before.get("fetch", 0)
    produces = after.get("produce", 0) - before.get("produce", 0)
    return {
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_ms_per_record": round(cpu * 1000 / max(records, 1), 3),
        "fetch_requests": fetches, "produce_requests": produces,
        "broker_cpu_us_per_request": round(cpu * 1e6 / max(fetches + produces, 1), 1),
    }  # fmt: skip


def _stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": round(percentile(ordered, 0.5), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
    }


def fanin(
    producers: int, partitions: int, consumers: int, rate: float, seconds: float
) -> dict[str, Any]:
    from confluent_kafka import Producer

    broker, metrics = _broker()
    stop: threading.Event | None = None
    clients: list[Any] = []
    try:
        _create(broker.bootstrap, "fanin", partitions)
        clients, latencies, stop, _ = _consumers(broker.bootstrap, "fanin", partitions, consumers)
        senders = [
            Producer({"bootstrap.servers": broker.bootstrap, "acks": 1, "linger.ms": 0})
            for _ in range(producers)
        ]
        for p in senders:
            p.list_topics("fanin", 30)
        time.sleep(3)  # every consumer reaches its long poll (a warm-up, not a sync)
        requests0, cpu0 = _requests(metrics), broker.cpu_seconds()
        began = time.perf_counter()
        sent = n = 0
        while time.perf_counter() - began < seconds:
            for i, p in enumerate(senders):
                p.produce("fanin", struct.pack(">d", time.time()) + PAD,
                          partition=(i + n) % partitions)  # fmt: skip
                p.poll(0)
                sent += 1
            n += 1
            time.sleep(max(0.0, began + n / rate - time.perf_counter()))
        for p in senders:
            p.flush(30)
        _wait_for(latencies, sent * consumers)
        cpu = broker.cpu_seconds() - cpu0
        costs = _costs(cpu, requests0, _requests(metrics), sent)
        senders.clear()  # their connections close before the broker stops
        return {
            "workload": "fanin", "producers": producers, "partitions": partitions,
            "consumers": consumers, "rate_per_producer": rate, "sent": sent,
            "consumed": len(latencies), **costs, **_stats(latencies),
        }  # fmt: skip
    finally:
        if stop is not None:
            stop.set()
        for c in clients:
            c.close()
        broker.stop()


def single(records: int) -> dict[str, Any]:
    from confluent_kafka import Producer

    broker, metrics = _broker()
    stop: threading.Event | None = None
    clients: list[Any] = []
    try:
        _create(broker.bootstrap, "single", 1)
        clients, latencies, stop, _ = _consumers(broker.bootstrap, "single", 1, 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1, "linger.ms": 0})
        producer.list_topics("single", 30)
        time.sleep(2)  # the consumer reaches its long poll (a warm-up, not a sync)
        acks: list[float] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                acks.append(msg.latency() * 1000)

        requests0, cpu0 = _requests(metrics), broker.cpu_seconds()
        for _ in range(records):
            producer.produce("single", struct.pack(">d", time.time()) + PAD, partition=0,
                             on_delivery=on_delivery)  # fmt: skip
            producer.flush(30)  # one record in flight: each produce is a request of its own
        _wait_for(latencies, records)
        cpu = broker.cpu_seconds() - cpu0
        costs = _costs(cpu, requests0, _requests(metrics), records)
        del producer  # its connection closes before the broker stops
        ack = _stats(acks)
        return {
            "workload": "single", "records": records, "consumed": len(latencies), **costs,
            "ack_p50_ms": ack["p50_ms"], "ack_p99_ms": ack["p99_ms"], **_stats(latencies),
        }  # fmt: skip
    finally:
        if stop is not None:
            stop.set()
        for c in clients:
            c.close()
        broker.stop()


async def _call(stream: Any, api_key: int, version: int, request: Any) -> Any:
    """One request and its answer over a Trio stream (the codec of the tree measured)."""
    from trio_broker.protocol import messages as m

    await stream.send_all(m.encode_request(api_key, version, 1, "bench", request))
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = await stream.receive_some(1 << 16)
        assert chunk, "the broker closed the connection"
        data += chunk
    return m.decode_response(api_key, version, data[4:])[1]


def cycle(partitions: int, cycles: int) -> dict[str, Any]:
    import tempfile

    import trio
    import trio.testing

    from trio_broker.config import BrokerConfig
    from trio_broker.protocol import messages as m
    from trio_broker.protocol.records import build_batch
    from trio_broker.server.broker import Broker

    Req = m.FetchRequest
    Produce = m.ProduceRequest
    offsets = [0] * partitions
    record = bytes(build_batch([(b"k", PAD)]))

    def fetch() -> Any:
        parts = [
            Req.FetchTopic.FetchPartition(
                partition=p,
                fetch_offset=offsets[p],
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
            for p in range(partitions)
        ]
        return Req(replica_id=-1, max_wait_ms=5000, min_bytes=1, max_bytes=1 << 20,
                   isolation_level=0, session_id=0, session_epoch=-1,
                   topics=[Req.FetchTopic(topic="cycle", partitions=parts)],
                   forgotten_topics_data=[], rack_id="")  # fmt: skip

    produce = Produce(acks=1, timeout_ms=10_000, topic_data=[Produce.TopicProduceData(
        name="cycle", partition_data=[Produce.TopicProduceData.PartitionProduceData(
            index=0, records=record)])])  # fmt: skip
    result: dict[str, Any] = {}

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            config = BrokerConfig(port=0, data_dir=Path(tmp), storage="memory")
            async with trio.open_nursery() as nursery:
                broker = await nursery.start(Broker(config).run)
                broker.topics.create("cycle", partitions)
                host, port = broker.bound[0]
                consumer = await trio.open_tcp_stream(host, port)
                producer = await trio.open_tcp_stream(host, port)

                async def one() -> None:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(_call, consumer, m.ApiKey.FETCH, 12, fetch())
                        # Produce once the fetch waits. Every task blocked is not enough:
                        # a task waiting for its socket counts as blocked though the
                        # fetch's bytes have arrived, until the loop polls it again.
                        for _ in range(10_000):
                            await trio.testing.wait_all_tasks_blocked()
                            if broker.appends.statistics().waiters == 1:
                                break
                            await trio.lowlevel.checkpoint()
                        else:
                            raise AssertionError("the fetch never waited")
                        await _call(producer, m.ApiKey.PRODUCE, 9, produce)
                    offsets[0] += 1

                for _ in range(min(50, cycles)):  # warm-up
                    await one()
                began = time.process_time()
                for _ in range(cycles):
                    await one()
                cpu = time.process_time() - began
                result.update(
                    workload="cycle", partitions=partitions, cycles=cycles,
                    cpu_us_per_cycle=round(cpu * 1e6 / cycles, 1),
                )  # fmt: skip
                nursery.cancel_scope.cancel()

    trio.run(run)
    return result


def read(partitions: int, calls: int, isolation: int) -> dict[str, Any]:
    import tempfile

    import trio

    from trio_broker.config import BrokerConfig
    from trio_broker.handlers.base import ClientInfo, RequestContext
    from trio_broker.handlers.fetch import read_partitions
    from trio_broker.partition.append import Origin, append
    from trio_broker.protocol import messages as m
    from trio_broker.protocol.messages import RequestHeader
    from trio_broker.protocol.records import build_batch
    from trio_broker.server.broker import Broker

    Req = m.FetchRequest
    parts = [
        Req.FetchTopic.FetchPartition(
            partition=p, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
        )
        for p in range(partitions)
    ]
    request = Req(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                  isolation_level=isolation, session_id=0, session_epoch=-1,
                  topics=[Req.FetchTopic(topic="read", partitions=parts)],
                  forgotten_topics_data=[], rack_id="")  # fmt: skip
    result: dict[str, Any] = {}

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            broker = Broker(BrokerConfig(port=0, data_dir=Path(tmp)))
            topic = broker.topics.create("read", partitions)

            for p in range(partitions):
                led = topic.leading(p)
                append(led, build_batch([(b"k", PAD)]), origin=Origin.CLIENT, now_ms=0,
                       durability=None)  # fmt: skip
                led.log.flush()  # the group commit's sync (a node alone's HW: durable end)
            header = RequestHeader(m.ApiKey.FETCH, 12, 1, "bench")
            ctx = RequestContext(header=header, services=broker, client=ClientInfo(1, "x", 1))
            for _ in range(100):  # warm-up
                read_partitions(ctx, request, request.topics)
            rounds = []
            for _ in range(7):
                began = time.thread_time()
                for _ in range(calls):
                    read_partitions(ctx, request, request.topics)
                rounds.append((time.thread_time() - began) * 1e6 / calls)
            rounds.sort()
            result.update(
                workload="read", partitions=partitions, isolation=isolation,
                cpu_us_best=round(rounds[0], 1), cpu_us_median=round(rounds[3], 1),
            )  # fmt: skip
            broker.topics.close()

    trio.run(run)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["fanin", "single", "cycle", "read"])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50.0, help="records/s per producer")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--records", type=int, default=1000, help="single: records")
    parser.add_argument("--cycles", type=int, default=500, help="cycle: cycles")
    parser.add_argument("--calls", type=int, default=200, help="read: calls per round")
    parser.add_argument("--isolation", type=int, default=0, help="read: isolation level")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = []
    if args.only in (None, "fanin"):
        results.append(
            fanin(args.producers, args.partitions, args.consumers, args.rate, args.seconds)
        )
        print(json.dumps(results[-1]), flush=True)
    if args.only in (None, "single"):
        results.append(single(args.records))
        print(json.dumps(results[-1]), flush=True)
    if args.only == "cycle":
        results.append(cycle(args.partitions, args.cycles))
        print(json.dumps(results[-1]), flush=True)
    if args.only == "read":
        results.append(read(args.partitions, args.calls, args.isolation))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
