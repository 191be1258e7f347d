"""Spark reads and writes trio-broker through Spark's Kafka connector ([jvm] §5).

The Structured Streaming job of ``word_count_job.py`` runs in its own process (Spark in
local mode, ``local[2]``) against a ``trio-broker serve`` process: it reads topic
``words``, counts per word with checkpointed state and writes the changed counts to
topic ``counts``. An idempotent confluent-kafka producer keeps adding words while the
broker is killed with -9 (or stopped with SIGTERM) and started again; afterwards the latest count per word in
``counts`` must equal exactly what the producer had acknowledged.

The connector (``spark-sql-kafka-0-10_2.13`` of :data:`CONNECTOR_VERSION`) and its
dependencies come from Maven Central through ``pom.xml`` (cached in ~/.m2, the classpath
in the user's cache by tests/kafka_tools/classpath.py); jars that
pyspark already ships (Scala, Hadoop, compression codecs) are left out.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

import pyspark
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from tests.kafka_tools.classpath import maven_classpath
from tests.spark.word_count_job import STARTED

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
JOB = HERE / "word_count_job.py"
#: The newest connector on Maven Central when this was written; 4.3.0 (pyspark's own
#: version) was not published there yet. Spark 4.2's connector runs on pyspark 4.3.
CONNECTOR_VERSION = "4.2.0"

WORDS = [f"w{i:02d}" for i in range(24)]
BEFORE_RESTART = 3000  # records in the topic before the job starts
DURING_RESTART = 3000  # records produced while the job runs, across the kill -9
PRODUCE_RATE = 600  # records/s for the second part

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def connector_jars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The connector's runtime jars that pyspark does not already have."""
    classpath = maven_classpath(POM, tmp_path_factory.mktemp("spark-kafka"), "runtime")
    shipped = {jar_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    jars = [jar for jar in classpath.split(os.pathsep) if jar]
    # In ~/.m2 a jar lives in .../<artifactId>/<version>/<artifactId>-<version>.jar.
    wanted = [jar for jar in jars if Path(jar).parent.parent.name not in shipped]
    names = {Path(jar).parent.parent.name for jar in wanted}
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients"} <= names, wanted
    assert any(f"/{CONNECTOR_VERSION}/" in jar for jar in wanted), wanted
    return wanted


def jar_artifact(jar: Path) -> str:
    """``scala-library-2.13.17.jar`` -> ``scala-library`` (the name before the version)."""
    parts = jar.stem.split("-")
    for index, part in enumerate(parts):
        if part[:1].isdigit():
            return "-".join(parts[:index])
    return jar.stem


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data") as process:
        yield process


class SparkJob:
    """``word_count_job.py`` as a subprocess in its own session; output to a log file."""

    def __init__(self, broker: BrokerProcess, jars: list[str], workdir: Path) -> None:
        self.log_path = workdir / "spark-job.log"
        argv = [
            sys.executable, str(JOB), "--bootstrap", broker.bootstrap,
            "--checkpoint", str(workdir / "checkpoint"), "--jars", ",".join(jars),
            "--master", "local[2]", "--trigger-seconds", "1",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        interesting = [
            line for line in self.log().splitlines() if not line.lstrip().startswith("at ")
        ]
        return "--- spark job log tail ---\n" + "\n".join(interesting[-lines:])

    def wait_started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while STARTED not in self.log():
            assert self.proc.poll() is None, f"the job exited\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"no query after {timeout}s\n{self.log_tail()}"
            time.sleep(0.2)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the job stops its query and Spark), then the whole group if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


class LatestCounts:
    """The latest value per key of topic ``counts``, read from its beginning."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "spark-e2e-reader",
             "enable.auto.commit": False, "reconnect.backoff.max.ms": 500}
        )  # fmt: skip
        self.consumer.assign([TopicPartition("counts", 0, 0)])
        self.latest: dict[str, int] = {}
        self.records = 0

    def poll(self, seconds: float) -> None:
        for message in self.consumer.consume(1000, seconds):
            error = message.error()
            if error is not None:
                # Only the outage may show: connection errors, retried by the client.
                assert error.retriable() or error.code() in (
                    KafkaError._TRANSPORT,
                    KafkaError._ALL_BROKERS_DOWN,
                ), error
                continue
            key, value = message.key(), message.value()
            assert key is not None and value is not None, message
            self.latest[key.decode()] = int(value)
            self.records += 1

    def wait_for(self, expected: dict[str, int], timeout: float, job: SparkJob) -> None:
        deadline = time.monotonic() + timeout
        while self.latest != expected:
            assert job.proc.poll() is None, f"the job exited\n{job.log_tail()}"
            assert time.monotonic() < deadline, (
                f"counts after {timeout}s: {diff(self.latest, expected)}\n{job.log_tail()}"
            )
            self.poll(0.5)

    def close(self) -> None:
        self.consumer.close()


def diff(got: dict[str, int], expected: dict[str, int]) -> str:
    wrong = {w: (got.get(w), n) for w, n in expected.items() if got.get(w) != n}
    extra = sorted(set(got) - set(expected))
    return f"(got, expected) for {len(wrong)} words: {dict(list(wrong.items())[:6])}, extra {extra}"


class WordProducer:
    """An idempotent producer; ``acked`` counts the words the broker acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
             "linger.ms": 5, "delivery.timeout.ms": 120_000, "reconnect.backoff.max.ms": 500}
        )  # fmt: skip
        self.acked: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            value = message.value()
            assert value is not None
            self.acked[value.decode()] += 1

    def produce(self, words: list[str], rate: float | None = None) -> None:
        started = time.monotonic()
        for index, word in enumerate(words):
            self.producer.produce("words", value=word.encode(), on_delivery=self._delivered)
            self.producer.poll(0)
            if rate is not None:
                ahead = started + index / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    def flush(self, timeout: float) -> None:
        assert self.producer.flush(timeout) == 0, "records still unacknowledged"
        assert not self.errors, self.errors[:3]


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_word_counts_are_exact_across_a_broker_restart(
    broker: BrokerProcess, connector_jars: list[str], tmp_path: Path, how: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # must outlive the futures
    topics = [NewTopic("words", num_partitions=3), NewTopic("counts", num_partitions=1)]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)
    rng = random.Random(5)
    producer = WordProducer(broker.bootstrap)
    producer.produce([rng.choice(WORDS) for _ in range(BEFORE_RESTART)])
    producer.flush(30)
    assert sum(producer.acked.values()) == BEFORE_RESTART

    job = SparkJob(broker, connector_jars, tmp_path)
    counts = LatestCounts(broker.bootstrap)
    try:
        job.wait_started(timeout=90)
        counts.wait_for(dict(producer.acked), timeout=90, job=job)

        # More words at a steady rate; the broker goes down a third of the way in.
        more = [rng.choice(WORDS) for _ in range(DURING_RESTART)]
        sender = threading.Thread(target=producer.produce, args=(more, PRODUCE_RATE))
        sender.start()
        time.sleep(DURING_RESTART / PRODUCE_RATE / 3)
        if how == "kill -9":
            broker.kill9()
        else:
            assert broker.stop() == 0, broker.log_tail()
        time.sleep(2.0)
        broker.start()
        sender.join(timeout=60)
        assert not sender.is_alive(), "the producer did not finish"
        producer.flush(60)
        assert sum(producer.acked.values()) == BEFORE_RESTART + DURING_RESTART

        counts.wait_for(dict(producer.acked), timeout=120, job=job)
        # Stable: nothing later overwrites a count with another value.
        counts.poll(3.0)
        assert counts.latest == dict(producer.acked), diff(counts.latest, dict(producer.acked))
    finally:
        counts.close()
        code = job.stop()
    print(job.log_tail(15))
    assert code == 0, f"the job exited with {code}\n{job.log_tail()}"
    # Spark's Kafka clients rode out the outage: the query never failed (the job would
    # have restarted it from its checkpoint, which also keeps the counts exact).
    assert "query failed" not in job.log(), job.log_tail()
    assert broker.running, broker.log_tail()
