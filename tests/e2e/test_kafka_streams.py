"""Kafka Streams with ``processing.guarantee=exactly_once_v2`` against trio-broker ([exactly-once]).

A word count (``tests/streams/WordCount.java``, org.apache.kafka:kafka-streams 4.4.0) reads
lines, repartitions by word, counts in a changelogged state store and writes word -> count.
Exactly-once means every one of those writes and the consumed offsets commit in one
transaction per commit interval. The broker is killed with -9 and restarted while the
application runs and input keeps coming. Afterwards a read_committed consumer must see,
for every word, counts that only grow (an aborted, redone transaction never shows) and
end exactly at the number of times the word was written: no count lost, none doubled.
"""

from __future__ import annotations

import random
import struct
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from tests.kafka_tools.classpath import FAST_START_JVM, maven_classpath

pytestmark = pytest.mark.timeout(420)

STREAMS_DIR = Path(__file__).resolve().parents[1] / "streams"
INPUT, OUTPUT, APPLICATION = "wc-lines", "wc-counts", "wc-exactly-once"
WORDS = [f"word{i:02d}" for i in range(30)]
LINES, WORDS_PER_LINE = 600, 5
#: How long the application may take to catch up with all the input, after the restart.
CATCH_UP_S = 150


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data") as process:
        yield process


class StreamsApp:
    """The word count as a ``java`` subprocess; its stdout lines collected in a thread."""

    def __init__(self, classpath: str, bootstrap: str, state_dir: Path) -> None:
        argv = ["java", "-Xmx384m", *FAST_START_JVM, "-cp", classpath, str(STREAMS_DIR / "WordCount.java"),
                bootstrap, INPUT, OUTPUT, APPLICATION, str(state_dir)]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def states(self) -> list[str]:
        return [line.split()[1] for line in list(self.lines) if line.startswith("STATE ")]

    def tail(self, count: int = 40) -> str:
        return "\n".join(list(self.lines)[-count:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the shutdown hook closes the application
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(timeout=10)


def produce_lines(bootstrap: str, lines: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 120_000})  # fmt: skip
    for number, line in enumerate(lines):
        producer.produce(INPUT, key=str(number).encode(), value=line.encode())
        producer.poll(0)
    assert producer.flush(120) == 0, "input not acknowledged"


def read_counts(bootstrap: str) -> dict[str, list[int]]:
    """Every count the output holds, per word, in log order (read_committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wc-checker",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    counts: dict[str, list[int]] = {}
    try:
        # Assigned, not subscribed: no group join (and its initial delay) before reading.
        consumer.assign([TopicPartition(OUTPUT, p, OFFSET_BEGINNING) for p in (0, 1)])
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 3:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            idle_since = time.monotonic()
            (count,) = struct.unpack(">q", message.value())
            counts.setdefault(message.key().decode(), []).append(count)
    finally:
        consumer.close()
    return counts


def wait_for_committed_output(bootstrap: str, app: StreamsApp, timeout_s: float = 60) -> None:
    """Until a read_committed consumer sees a first count: a transaction has committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wc-probe",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([TopicPartition(OUTPUT, p, OFFSET_BEGINNING) for p in (0, 1)])
        deadline = time.monotonic() + timeout_s
        while (message := consumer.poll(0.5)) is None or message.error():
            assert app.proc.poll() is None, f"the application exited:\n{app.tail()}"
            assert time.monotonic() < deadline, f"no committed output:\n{app.tail()}"
    finally:
        consumer.close()


def test_word_count_is_exact_across_a_broker_kill_9(broker: BrokerProcess, tmp_path: Path) -> None:
    classpath = maven_classpath(STREAMS_DIR / "pom.xml", tmp_path)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics(
        [NewTopic(INPUT, num_partitions=2), NewTopic(OUTPUT, num_partitions=2)]
    ).values():
        future.result(timeout=60)
    rng = random.Random(20261125)
    lines = [" ".join(rng.choice(WORDS) for _ in range(WORDS_PER_LINE)) for _ in range(LINES)]
    expected = Counter(word for line in lines for word in line.split())
    half = LINES // 2

    app = StreamsApp(classpath, broker.bootstrap, tmp_path / "streams-state")
    try:
        produce_lines(broker.bootstrap, lines[:half])
        deadline = time.monotonic() + 120
        while "RUNNING" not in app.states():
            assert app.proc.poll() is None, f"the application exited:\n{app.tail()}"
            assert time.monotonic() < deadline, f"the application never ran:\n{app.tail()}"
            time.sleep(0.2)
        # Some transactions done (their output visible to read_committed), the next one
        # likely open: the kill lands mid-stream.
        wait_for_committed_output(broker.bootstrap, app)
        broker.kill9()
        time.sleep(1)  # the outage (a fault's shape, not a wait for a condition)
        broker.start()
        produce_lines(broker.bootstrap, lines[half:])

        deadline = time.monotonic() + CATCH_UP_S
        while True:
            counts = read_counts(broker.bootstrap)
            finals = {word: seen[-1] for word, seen in counts.items()}
            if finals == dict(expected) or time.monotonic() > deadline:
                break
            assert app.proc.poll() is None, f"the application exited:\n{app.tail()}"
            time.sleep(2)
    finally:
        app.stop()
    missing = {w: (finals.get(w), n) for w, n in expected.items() if finals.get(w) != n}
    assert not missing, f"word: (last count, expected) {missing}\n{app.tail()}"
    for word, seen in counts.items():
        assert seen == sorted(seen), f"{word}'s count went backwards: {seen}"
        assert seen[-1] == expected[word]
