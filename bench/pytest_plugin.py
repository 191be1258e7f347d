"""Start-up and per-test cost of the pytest plugin's fixtures (docs/pytest-plugin.md).

    .venv/bin/python bench/pytest_plugin.py [--runs 5] [--kafka] [--json FILE]

Measures, each ``--runs`` times (median, min, max in the table):

- ``kafka_broker`` start: ``start_broker()`` of the plugin (a ``trio-broker serve``
  subprocess, memory storage) from ``Popen`` to its ``listening on`` line, then to the
  first Metadata answered (a librdkafka AdminClient, as a test's first client would ask);
  and the clean stop (SIGTERM to exit);
- the in-process alternative the plugin does not use: ``Broker.run`` in a Trio run on a
  thread of this process, once with the imports (a fresh interpreter) and warm;
- ``kafka_topic``: CreateTopics + DeleteTopics with the plugin's admin client, per test;
- a pytest run of a file of 51 tests asking for ``kafka_topic``: the wall time of the
  whole ``pytest`` subprocess, and each test's time as pytest reports it (JUnit XML:
  setup + call + teardown): the first includes the broker's start, the others are the
  per-test cost of the fixture;
- with ``--kafka``: Apache Kafka 4.4 as one KRaft node from ``bench/kafka_peer.py``'s
  cache (storage format + JVM start until Metadata lists the node), and the same topic
  create/delete against it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path
from xml.etree import ElementTree

from trio_broker.admin.client import BlockingClient, check
from trio_broker.testing.pytest_plugin import start_broker, stop_broker

ROOT = Path(__file__).resolve().parent.parent

IN_PROCESS = """
import sys, threading, time
t0 = time.perf_counter()
import trio
from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker

def once():
    started = time.perf_counter()
    ready, box = threading.Event(), {}
    async def main():
        async with trio.open_nursery() as nursery:
            box["token"], box["scope"] = trio.lowlevel.current_trio_token(), nursery.cancel_scope
            await nursery.start(Broker(BrokerConfig(port=0, storage="memory")).run)
            ready.set()
    thread = threading.Thread(target=trio.run, args=(main,))
    thread.start()
    ready.wait()
    took = time.perf_counter() - started
    box["token"].run_sync_soon(box["scope"].cancel)
    thread.join()
    return took
first = once() + (time.perf_counter() - t0)
print(first, once())
"""


def _metadata_answered(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers


def topic_round_trip(bootstrap: str, n: int) -> float:
    """Create and delete one topic; the seconds it took."""
    started = time.perf_counter()
    with BlockingClient(bootstrap) as client:
        name = f"bench-{os.getpid()}-{n}"
        result = client.create_topic(name, 1, {})
        check(result.error_code, "create", result.error_message)
    with BlockingClient(bootstrap) as client:
        deleted = client.delete_topic(name)
        check(deleted.error_code, "delete", deleted.error_message)
    return time.perf_counter() - started


def pytest_run(tests: int, work: Path) -> tuple[float, list[float]]:
    """Wall time of ``pytest`` on ``tests`` tests that ask for ``kafka_topic``, and each
    test's setup + call + teardown as pytest timed it (its JUnit XML)."""
    body = "".join(f"def test_{i}(kafka_topic):\n    assert kafka_topic\n\n" for i in range(tests))
    (work / f"test_n{tests}.py").write_text(body)
    # Installed with its entry point pytest loads the plugin itself; -p too would clash.
    registered = bool(entry_points(group="pytest11", name="trio_broker"))
    load = [] if registered else ["-p", "trio_broker.testing.pytest_plugin"]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *load, "-p", "no:cacheprovider", "-p",
         "no:xdist", f"test_n{tests}.py", "--junitxml", "junit.xml"],
        cwd=work, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - started
    cases = ElementTree.parse(work / "junit.xml").iter("testcase")
    return wall, [float(case.get("time", "0")) for case in cases]


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kafka", action="store_true", help="Apache Kafka 4.4 beside")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    listening, metadata, stopping, topics = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            started = time.perf_counter()
            broker = start_broker(Path(tmp) / f"b{run}")
            listening.append(time.perf_counter() - started)
            _metadata_answered(broker.bootstrap)
            metadata.append(time.perf_counter() - started)
            topics += [topic_round_trip(broker.bootstrap, i) for i in range(10)]
            started = time.perf_counter()
            stop_broker(broker)
            stopping.append(time.perf_counter() - started)
        results["kafka_broker: listening"] = summary(listening)
        results["kafka_broker: first Metadata answered"] = summary(metadata)
        results["kafka_broker: clean stop"] = summary(stopping)
        results["kafka_topic: create + delete"] = summary(topics)
        cold, warm = [], []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", IN_PROCESS], capture_output=True,
                                 text=True, check=True, timeout=120).stdout.split()  # fmt: skip
            cold.append(float(out[0]))
            warm.append(float(out[1]))
        results["in-process Broker (not used): first, with imports"] = summary(cold)
        results["in-process Broker (not used): warm"] = summary(warm)
        walls, firsts, others = [], [], []
        for _ in range(args.runs):
            wall, times = pytest_run(51, Path(tmp))
            walls.append(wall)
            firsts.append(times[0])
            others += times[1:]
        results["pytest run of 51 tests with kafka_topic (wall)"] = summary(walls)
        results["its first test (broker start + topic)"] = summary(firsts)
        results["each other test (topic create + delete)"] = summary(others)
        if args.kafka:
            sys.path.insert(0, str(ROOT / "bench"))
            from kafka_peer import KafkaProcess

            kafka_start, kafka_topics = [], []
            for _ in range(args.runs):
                started = time.perf_counter()
                kafka = KafkaProcess(label="pytest-plugin")
                kafka_start.append(time.perf_counter() - started)
                try:
                    kafka_topics += [topic_round_trip(kafka.bootstrap, i) for i in range(10)]
                finally:
                    kafka.stop()
            results["Kafka 4.4 KRaft node: format + start to Metadata"] = summary(kafka_start)
            results["Kafka 4.4: create + delete topic"] = summary(kafka_topics)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(
        f"{'what':58} {'median':>9} {'min':>9} {'max':>9}   (ms; load {load}, {os.cpu_count()} CPUs)"
    )
    for name, s in results.items():
        print(f"{name:58} {s['median_ms']:9.1f} {s['min_ms']:9.1f} {s['max_ms']:9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
