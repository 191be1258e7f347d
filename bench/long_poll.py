"""Long-poll fan-out: one produced-to partition, many consumers long-polling others.

Every consumer is assigned one partition of its own (no group), with
fetch.wait.max.ms=500, so the broker holds one long-poll fetch per consumer. A
producer writes to partition 0 only, at a fixed rate; one of the consumers reads
partition 0 and times each record from produce to consume. Reported: the broker's
CPU seconds while producing, and the end-to-end latency on partition 0. A broker
that wakes every long poll on every append spends CPU on the idle consumers' fetches
too (issue 29); one that wakes only the fetches of the partition appended to does not.

    python bench/long_poll.py                      # 30 idle consumers, 200 msg/s, 8 s
    python bench/long_poll.py --idle 60 --rate 400 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce import BrokerProcess, percentile


def run(idle: int, rate: float, seconds: float) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess("pipelined")
    consumers: list[Any] = []
    stop = threading.Event()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic("lp", num_partitions=idle + 1)]).values():
            f.result(30)
        conf = {"bootstrap.servers": broker.bootstrap, "group.id": "lp-bench",
                "enable.auto.commit": False, "fetch.wait.max.ms": 500,
                "auto.offset.reset": "earliest"}  # fmt: skip
        for p in range(idle + 1):
            c = Consumer(conf)
            c.assign([TopicPartition("lp", p, 0)])
            consumers.append(c)
        latencies: list[float] = []

        def poll(c: Any, measure: bool) -> None:
            while not stop.is_set():
                msg = c.poll(0.2)
                if measure and msg is not None and not msg.error() and len(msg.value()) >= 8:
                    (sent,) = struct.unpack(">d", msg.value()[:8])
                    latencies.append((time.time() - sent) * 1000)

        threads = [
            threading.Thread(target=poll, args=(c, i == 0), daemon=True)
            for i, c in enumerate(consumers)
        ]
        for t in threads:
            t.start()
        time.sleep(3)  # let every consumer reach its long poll (a warm-up, not a sync)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1, "linger.ms": 0})
        cpu0 = broker.cpu_seconds()
        began = time.perf_counter()
        sent = 0
        while time.perf_counter() - began < seconds:
            producer.produce("lp", struct.pack(">d", time.time()) + b"x" * 92, partition=0)
            producer.poll(0)
            sent += 1
            time.sleep(max(0.0, began + sent / rate - time.perf_counter()))
        producer.flush(30)
        deadline = time.monotonic() + 10
        while len(latencies) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = broker.cpu_seconds() - cpu0
        ordered = sorted(latencies)
        return {
            "idle_consumers": idle, "rate": rate, "seconds": seconds, "sent": sent,
            "consumed": len(latencies), "broker_cpu_s": round(cpu, 3),
            "broker_cpu_ms_per_msg": round(cpu * 1000 / max(sent, 1), 3),
            "p50_ms": round(percentile(ordered, 0.5), 2),
            "p99_ms": round(percentile(ordered, 0.99), 2),
            "max_ms": round(ordered[-1], 2) if ordered else None,
            # Near the 500 ms max wait: a long poll that was not woken by its append.
            "over_400_ms": sum(1 for x in ordered if x > 400),
        }  # fmt: skip
    finally:
        stop.set()
        for c in consumers:
            c.close()
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=30)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(json.dumps(run(args.idle, args.rate, args.seconds)))


if __name__ == "__main__":
    main()
