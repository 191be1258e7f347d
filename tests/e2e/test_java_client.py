"""The Java client (org.apache.kafka:kafka-clients 4.x) against a real trio-broker serve.

The JUnit tests live in the Maven module ``tests/jvm`` (see docs/compatibility.md for
what each class covers). One broker process serves four listeners, so one ``mvn test``
(Maven starts slowly) covers them all::

    PLAINTEXT       -Dbootstrap          most tests; the client is User:ANONYMOUS
    SASL_PLAINTEXT  -Dbootstrap.sasl     PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    SASL_SSL        -Dbootstrap.sasl.ssl the same over TLS (CA in -Dpki.ca, PEM)
    MTLS            -Dbootstrap.mtls     SSL requiring a client certificate (-Dpki.alice,
                                         PKCS#8 key + certificate PEM) mapped to User:alice-cert

A second system, ``trio-broker cluster up --brokers 3`` (a private ZooKeeper and three
brokers, replication factor 3, ``min.insync.replicas`` 2), is passed as
``-Dbootstrap.cluster`` to ``ClusterTest``; after Maven it is stopped with SIGTERM and
must exit 0.

The ACL authorizer is on with ``allow.everyone.if.no.acl.found``: resources without ACLs
are open, and the ACL tests lock single topics and groups.

Before Maven runs, a kafka-python and a librdkafka consumer join one group on a
six-partition topic (``-Dmixed.*``); the Java consumer of ``MixedGroupTest`` joins them
and checks the three-way assignment; this test checks the Python members' side.

The test reads the Surefire report and requires exactly ``EXPECTED_TESTS`` passed tests.
Maven and Java come from scripts/install-system-deps.sh; artifacts are cached in ~/.m2.
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography.hazmat.primitives import serialization
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor

from tests.e2e.conftest import BROKER_EXE, add_scram_user
from tests.e2e.test_security import SecureBroker
from tests.kafka_python_groups import knows_its_topics
from tests.kafka_tools.classpath import maven_env
from tests.leak_check import kill_tree
from tests.waits import wait_until

JVM_MODULE = Path(__file__).resolve().parents[1] / "jvm"
#: The first run downloads kafka-clients, JUnit and the plugins from Maven Central.
MAVEN_TIMEOUT_S = 600
#: The JUnit tests the module holds, parameterized cases counted one by one.
EXPECTED_TESTS = 52
USER, PASSWORD = "alice", "java-s3cret"
LISTENERS = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "MTLS")
#: The mixed group: six partitions, this many records in each, two Python members.
MIXED_PARTITIONS, MIXED_PER_PARTITION = 6, 25
PYTHON_CLIENT_IDS = ("kafka-python-member", "librdkafka-member")
#: Deadlines only (waits return as soon as their condition holds): room for a busy machine.
WAIT_S = 90
#: cluster up gives ZooKeeper and each broker 60 s to start; it then exits 1.
CLUSTER_START_S = 120
CLUSTER_LINE = "cluster ready: bootstrap "


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, the broker's certificate, and alice's client key + certificate in one PEM."""
    base = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    paths = {name: base / f"{name}.pem" for name in ("ca", "server", "alice")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(paths["server"])
    )
    alice = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Example")
    key = serialization.load_pem_private_key(alice.private_key_pem.bytes(), password=None)
    # Java's PEM key store reads PKCS#8 keys only ("BEGIN PRIVATE KEY").
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    paths["alice"].write_bytes(pkcs8 + alice.cert_chain_pems[0].bytes())
    return paths


@pytest.fixture(scope="module")
def java_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]
) -> Iterator[SecureBroker]:
    base = tmp_path_factory.mktemp("java")
    data_dir = base / "data"
    add_scram_user(data_dir, USER, PASSWORD)
    config = base / "broker.toml"
    config.write_text(f'''
listeners = "{",".join(f"{name}://127.0.0.1:0" for name in LISTENERS)}"
"listener.security.protocol.map" = "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL"
"sasl.enabled.mechanisms" = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
"ssl.keystore.location" = "{pki["server"]}"
"ssl.truststore.location" = "{pki["ca"]}"
"listener.name.mtls.ssl.client.auth" = "required"
"listener.name.mtls.ssl.principal.mapping.rules" = "RULE:^CN=([^,]+),.*$/$1-cert/L,DEFAULT"
"group.initial.rebalance.delay.ms" = 0
# KIP-848 members learn each assignment change from a heartbeat: 1 s between them, not 5.
"group.consumer.heartbeat.interval.ms" = 1000
"group.consumer.min.heartbeat.interval.ms" = 1000
"authorizer.class.name" = "acl"
"allow.everyone.if.no.acl.found" = true
''')  # fmt: skip
    broker = SecureBroker(data_dir, config)
    broker.start()
    try:
        broker.wait_for_listeners(set(LISTENERS))
        yield broker
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


class ClusterUp:
    """``trio-broker cluster up --brokers 3`` in its own process group, stopped by its PID."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [str(BROKER_EXE), "cluster", "up", "--brokers", "3", "--base-port", "0",
             "--data-dir", str(data_dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.data_dir = data_dir
        try:
            self.bootstrap = self._ready_line().removeprefix(CLUSTER_LINE)
        except BaseException:  # the fixture's try has not begun: no cluster left behind
            self.kill()
            raise

    def _ready_line(self) -> str:
        """The first stdout line, read with a deadline (its children may hold the pipe)."""
        assert self.proc.stdout is not None
        fd, line = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + CLUSTER_START_S
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            assert left > 0, f"cluster up printed {line!r} in {CLUSTER_START_S} s"
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1)
                assert chunk, f"cluster up exited ({self.proc.poll()}) after {line!r}"
                line += chunk
        text = line.decode().strip()
        assert text.startswith(CLUSTER_LINE) and len(text.split(",")) == 3, text
        return text

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        """Last resort: SIGKILL to it and every process below it (its brokers run in
        sessions of their own: killing its process group would miss them)."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            for log in sorted(self.data_dir.glob("broker-*.log"))
        )


@pytest.fixture(scope="module")
def java_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUp]:
    cluster = ClusterUp(tmp_path_factory.mktemp("java-cluster"))
    try:
        yield cluster
    finally:
        cluster.kill()


class PythonMember:
    """A group member polling in its own thread; keeps every assignment and record seen."""

    def __init__(self, name: str, poll: Callable[[], list[tuple[int, bytes]]],
                 assignment: Callable[[], set[int]], close: Callable[[], None]) -> None:  # fmt: skip
        self.name = name
        self.assignments: list[set[int]] = []
        self.records: set[tuple[int, bytes]] = set()
        self.error: BaseException | None = None
        self._poll, self._assignment, self._close = poll, assignment, close
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + MAVEN_TIMEOUT_S + 60
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                self.records.update(self._poll())
                now = self._assignment()
                if not self.assignments or self.assignments[-1] != now:
                    self.assignments.append(now)
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            self._close()

    @property
    def current(self) -> set[int]:
        return self.assignments[-1] if self.assignments else set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), f"{self.name} did not stop"
        assert self.error is None, f"{self.name}: {self.error!r}"


def kafka_python_member(bootstrap: str, topic: str, group: str) -> PythonMember:
    consumer = knows_its_topics(KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, client_id=PYTHON_CLIENT_IDS[0],
        enable_auto_commit=False, auto_offset_reset="earliest", heartbeat_interval_ms=500,
        session_timeout_ms=10_000, partition_assignment_strategy=[RangePartitionAssignor],
    ))  # fmt: skip

    def poll() -> list[tuple[int, bytes]]:
        batches = consumer.poll(timeout_ms=200)
        return [(r.partition, r.value) for records in batches.values() for r in records]

    return PythonMember(
        "kafka-python",
        poll,
        lambda: {tp.partition for tp in consumer.assignment()},
        lambda: consumer.close(autocommit=False),
    )


def librdkafka_member(bootstrap: str, topic: str, group: str) -> PythonMember:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "client.id": PYTHON_CLIENT_IDS[1],
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "heartbeat.interval.ms": 500, "session.timeout.ms": 10_000,
        "partition.assignment.strategy": "range",
    })  # fmt: skip
    consumer.subscribe([topic])

    def poll() -> list[tuple[int, bytes]]:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            return []
        partition, value = msg.partition(), msg.value()
        assert partition is not None and value is not None, msg
        return [(partition, value)]

    return PythonMember(
        "librdkafka",
        poll,
        lambda: {tp.partition for tp in consumer.assignment()},
        consumer.close,
    )


def mixed_topic(bootstrap: str) -> str:
    topic = "java-mixed-group"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, MIXED_PARTITIONS, 1)]).values():
        future.result(WAIT_S)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(MIXED_PARTITIONS):
        for i in range(MIXED_PER_PARTITION):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(WAIT_S) == 0
    return topic


def run_maven(properties: dict[str, Any]) -> dict[str, int]:
    """``mvn test`` with ``-Dkey=value`` properties; the Surefire totals."""
    mvn = shutil.which("mvn")
    assert mvn is not None, "Maven is missing: scripts/install-system-deps.sh installs it"
    reports = JVM_MODULE / "target" / "surefire-reports"
    # One ``mvn test`` at a time in the module (pytest-xdist may run two test modules
    # that build it at once): they share target/ and its reports.
    with open(JVM_MODULE / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(reports, ignore_errors=True)
        run = subprocess.run(
            [mvn, "-B", "-q", "-f", str(JVM_MODULE / "pom.xml"), "test",
             *(f"-D{key}={value}" for key, value in properties.items())],
            capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, stdin=subprocess.DEVNULL,
            env=maven_env(),
        )  # fmt: skip
        # Read under the lock: the next ``mvn test`` in the module deletes the reports.
        suites = [ET.parse(p).getroot() for p in reports.glob("TEST-*.xml")]
        assert run.returncode == 0, maven_failure(run, suites)
    return {
        key: sum(int(s.get(key, 0)) for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }


#: How much of a failed JUnit test's stack trace a failure message quotes.
STACK_LINES = 15


def failed_junit_tests(suites: list[ET.Element]) -> list[str]:
    """Each failed or erring JUnit test of the Surefire reports: its name, the assertion's
    message, the top of its stack trace and what the test printed to stderr."""
    failed = []
    for case in (case for suite in suites for case in suite.iter("testcase")):
        for outcome in ("failure", "error"):
            for problem in case.findall(outcome):
                stack = (problem.text or "").strip().splitlines()[:STACK_LINES]
                stderr = (case.findtext("system-err") or "").strip().splitlines()[-STACK_LINES:]
                failed.append("\n".join([
                    f"{case.get('classname')}#{case.get('name')} {outcome} after "
                    f"{case.get('time')} s: {problem.get('message')}",
                    *stack, *(["stderr:", *stderr] if stderr else []),
                ]))  # fmt: skip
    return failed


def maven_failure(run: subprocess.CompletedProcess[str], suites: list[ET.Element]) -> str:
    """Why ``mvn test`` failed: the failed JUnit tests first (Maven's own output, quiet or
    not, may be cut off before them), then the end of Maven's output."""
    failed = failed_junit_tests(suites)
    head = (
        f"{len(failed)} JUnit test(s) failed:\n" + "\n\n".join(failed)
        if failed
        else f"mvn exited {run.returncode} with no failed test in {len(suites)} report(s)"
    )
    return f"{head}\n--- mvn stdout (end)\n{run.stdout[-4000:]}\n--- stderr\n{run.stderr[-2000:]}"


@pytest.mark.timeout(MAVEN_TIMEOUT_S + 120)
def test_the_java_client_end_to_end(
    java_broker: SecureBroker, java_cluster: ClusterUp, pki: dict[str, Path]
) -> None:
    ports = java_broker.ports()
    bootstrap = java_broker.bootstrap
    topic = mixed_topic(bootstrap)
    group = "java-python-librdkafka"
    members = [
        kafka_python_member(bootstrap, topic, group),
        librdkafka_member(bootstrap, topic, group),
    ]
    try:
        half = MIXED_PARTITIONS // 2
        wait_until(
            lambda: all(len(m.current) == half for m in members), "the Python members", WAIT_S
        )
        totals = run_maven({
            "bootstrap": bootstrap,
            "bootstrap.sasl": f"127.0.0.1:{ports['SASL_PLAINTEXT']}",
            "bootstrap.sasl.ssl": f"127.0.0.1:{ports['SASL_SSL']}",
            "bootstrap.mtls": f"127.0.0.1:{ports['MTLS']}",
            "bootstrap.cluster": java_cluster.bootstrap,
            "sasl.user": USER, "sasl.password": PASSWORD,
            "pki.ca": pki["ca"], "pki.alice": pki["alice"],
            "mixed.topic": topic, "mixed.group": group,
            "mixed.per.partition": MIXED_PER_PARTITION,
            "mixed.clients": ",".join(PYTHON_CLIENT_IDS),
        })  # fmt: skip
        # When the Java member left, the Python members took its partitions back.
        wait_until(
            lambda: all(len(m.current) == half for m in members), "the group without Java", WAIT_S
        )
    finally:
        for member in members:
            member.stop()
    assert java_cluster.stop() == 0, java_cluster.logs()
    assert totals == {"tests": EXPECTED_TESTS, "failures": 0, "errors": 0, "skipped": 0}, totals
    # While the Java member was in, each Python member had two partitions, none shared.
    thirds = [[a for a in m.assignments if len(a) == 2] for m in members]
    assert all(thirds), [m.assignments for m in members]
    assert not set.intersection(*(t[0] for t in thirds)), thirds
    everything = {(p, f"{p}-{i}".encode()) for p in range(MIXED_PARTITIONS)
                  for i in range(MIXED_PER_PARTITION)}  # fmt: skip
    assert set.union(*(m.records for m in members)) == everything
