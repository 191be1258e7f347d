"""The ``trio_broker`` pytest plugin as a user meets it: pytester writes a user's test
files that use ``kafka_broker`` / ``kafka_topic`` / ``kafka_cluster`` with the real client
libraries, runs pytest on them in a subprocess, and the outcome is checked.

When trio-broker is installed with its ``pytest11`` entry point, pytest loads the plugin
by itself; otherwise (an editable install that predates the entry point) the runs load
it with ``-p``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from trio_broker.cluster.local_zookeeper import ZOOKEEPER_JAR

pytest_plugins = ["pytester"]

PLUGIN = "trio_broker.testing.pytest_plugin"
REGISTERED = bool(entry_points(group="pytest11", name="trio_broker"))
LOAD = [] if REGISTERED else ["-p", PLUGIN]

pytestmark = pytest.mark.e2e

#: A user's application tests: each client library produces and consumes in a group.
USER_TESTS = r"""
import asyncio
import json
import os
import time
import uuid

def test_bootstrap(kafka_broker):
    host, port = kafka_broker.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    with open(os.environ["RESULTS"], "a") as out:
        out.write(json.dumps({"bootstrap": kafka_broker.bootstrap, "pid": kafka_broker.pid,
                              "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\n")

def test_confluent_kafka(kafka_broker, kafka_topic_factory):
    from confluent_kafka import Consumer, Producer
    topic = kafka_topic_factory(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(30):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "g-" + topic,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got, deadline = set(), time.monotonic() + 60
    while len(got) < 30 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.add(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == {f"v{i}".encode() for i in range(30)}

def test_kafka_python(kafka_broker, kafka_topic):
    from kafka import KafkaConsumer, KafkaProducer
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    for i in range(10):
        producer.send(kafka_topic, f"k{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_broker.bootstrap,
                             group_id="g-" + kafka_topic, auto_offset_reset="earliest",
                             consumer_timeout_ms=30000)
    got = []
    for record in consumer:
        got.append(record.value)
        if len(got) == 10:
            break
    consumer.commit()
    consumer.close()
    assert got == [f"k{i}".encode() for i in range(10)]

def test_aiokafka(kafka_broker, kafka_topic_factory):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    topic = kafka_topic_factory(partitions=2, config={"retention.ms": "3600000"})

    async def roundtrip():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(topic, f"a{i}".encode(), partition=i % 2)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap,
                                    group_id="g-" + topic, auto_offset_reset="earliest")
        await consumer.start()
        got = set()
        try:
            async with asyncio.timeout(60):
                async for record in consumer:
                    got.add(record.value)
                    if len(got) == 10:
                        break
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(roundtrip()) == {f"a{i}".encode() for i in range(10)}

def test_topics_are_fresh(kafka_broker, kafka_topic_factory):
    names = {kafka_topic_factory() for _ in range(3)}
    assert len(names) == 3
"""


def run_user_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*LOAD, "-p", "no:cacheprovider", *args, timeout=240)


@pytest.fixture
def results(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = pytester.path / "results.jsonl"
    monkeypatch.setenv("RESULTS", str(path))
    return path


def test_three_clients_in_a_users_suite(pytester: pytest.Pytester, results: Path) -> None:
    pytester.makepyfile(test_app=USER_TESTS)
    result = run_user_suite(pytester, "-p", "no:xdist")
    result.assert_outcomes(passed=5)
    (line,) = results.read_text().splitlines()
    assert json.loads(line)["bootstrap"].startswith("127.0.0.1:")


def test_installing_the_package_registers_the_plugin() -> None:
    """Issue 32: installing trio-broker registers the plugin (entry point ``pytest11``,
    name ``trio_broker``). The runs below fall back to ``-p`` for an install that
    predates it, so without this check a lost entry point would go unnoticed."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {"trio_broker": PLUGIN}
    [installed] = entry_points(group="pytest11", name="trio_broker")
    assert installed.value == PLUGIN


#: docs/pytest-plugin.md's worked examples: under each client's heading, an ``# app.py``
#: block and a ``# test_app.py`` block.
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "pytest-plugin.md"
EXAMPLES = ("confluent-kafka", "aiokafka", "kafka-python")


def worked_examples() -> dict[str, dict[str, str]]:
    """Client -> {"app.py": code, "test_app.py": code}, as the guide prints them."""
    text = GUIDE.read_text()
    found: dict[str, dict[str, str]] = {}
    for client in EXAMPLES:
        section = text.split(f"\n### {client}\n", 1)[1].split("\n##", 1)[0]
        blocks = section.split("```python\n")[1:]
        files = {}
        for block in blocks:
            code = block.split("```", 1)[0]
            name = code.splitlines()[0].removeprefix("# ")
            files[name] = code
        assert set(files) == {"app.py", "test_app.py"}, (client, sorted(files))
        found[client] = files
    return found


def test_the_guides_worked_examples_pass_as_printed(pytester: pytest.Pytester) -> None:
    """A new user copies an example of docs/pytest-plugin.md: it passes. The three share
    one run (one broker); each app module gets the client's name so that each test
    imports its own (``from app import`` becomes ``from app_<client> import``)."""
    for client, files in worked_examples().items():
        module = "app_" + client.replace("-", "_")
        pytester.makepyfile(**{
            module: files["app.py"],
            f"test_{module}": files["test_app.py"].replace("from app import", f"from {module} import"),
        })  # fmt: skip
    result = run_user_suite(pytester, "-p", "no:xdist")
    result.assert_outcomes(passed=len(EXAMPLES))


def test_disk_storage_and_a_failing_test_shows_the_broker_log(
    pytester: pytest.Pytester, results: Path
) -> None:
    """One user's run checks both: the disk-backed broker keeps its logs in files, and
    the test that fails gets the broker's log in its report (one pytest and one broker
    start instead of two)."""
    pytester.makepyfile(
        test_disk="""
        def test_disk(kafka_broker, kafka_topic_factory):
            from kafka import KafkaProducer
            topic = kafka_topic_factory(partitions=1)
            producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
            producer.send(topic, b"on disk").get(timeout=30)
            producer.close()
            assert kafka_broker.data_dir is not None
            assert any(kafka_broker.data_dir.rglob("*.log")), list(kafka_broker.data_dir.rglob("*"))

        def test_fails(kafka_broker):
            assert False, "the application failed"
        """
    )
    result = run_user_suite(pytester, "-p", "no:xdist", "--kafka-broker-storage=disk")
    result.assert_outcomes(passed=1, failed=1)
    # The failed test's report carries the end of the broker's log.
    result.stdout.fnmatch_lines(
        ["*_ test_fails _*", "*the application failed*", "*trio-broker log*",
         "*listening on 127.0.0.1:*"]
    )  # fmt: skip


def test_one_broker_per_xdist_worker(pytester: pytest.Pytester, results: Path) -> None:
    pytest.importorskip("xdist")
    # Seven copies of the bootstrap test, spread over two workers. The client libraries'
    # round trips run once, in test_three_clients_in_a_users_suite: a worker's broker
    # is the same session fixture, so running them here again checked nothing more.
    bootstrap_test = USER_TESTS[USER_TESTS.index("def test_bootstrap") :]
    bootstrap_test = bootstrap_test[: bootstrap_test.index("def test_confluent_kafka")]
    pytester.makepyfile(
        test_app="import json\nimport os\nimport pytest\n\n" + bootstrap_test
        + "@pytest.mark.parametrize('n', range(6))\n"
        "def test_more(kafka_broker, n):\n    test_bootstrap(kafka_broker)\n"
    )  # fmt: skip
    result = run_user_suite(pytester, "-n", "2", "--dist", "load")
    result.assert_outcomes(passed=7)
    seen = [json.loads(line) for line in results.read_text().splitlines()]
    by_worker: dict[str, set[tuple[str, int]]] = {}
    for entry in seen:
        by_worker.setdefault(entry["worker"], set()).add((entry["bootstrap"], entry["pid"]))
    # Each worker had exactly one broker of its own, on its own port.
    assert all(len(brokers) == 1 for brokers in by_worker.values()), by_worker
    ports = [next(iter(b))[0] for b in by_worker.values()]
    assert len(set(ports)) == len(ports)


def test_an_unused_plugin_starts_nothing(pytester: pytest.Pytester) -> None:
    """A suite that asks for no fixture of the plugin gets no broker: loading the plugin
    imports neither trio nor the broker."""
    pytester.makepyfile(
        test_plain="""
        import sys
        def test_plain():
            assert "trio_broker.testing.pytest_plugin" in sys.modules
            assert "trio" not in sys.modules and "trio_broker.server" not in sys.modules
        """
    )
    run_user_suite(pytester, "-p", "no:xdist", "-p", "no:trio").assert_outcomes(passed=1)


def test_a_log_level_that_hides_the_listening_line_is_refused(pytester: pytest.Pytester) -> None:
    """At WARNING the broker would never log "listening on": refused at once, not a
    start-up timeout later."""
    pytester.makeini("[pytest]\nkafka_broker_log_level = warning\n")
    pytester.makepyfile(test_quiet="def test_quiet(kafka_broker):\n    pass\n")
    result = run_user_suite(pytester, "-p", "no:xdist")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*kafka_broker_log_level must be INFO or DEBUG, not 'WARNING'*"])
    refused = run_user_suite(pytester, "-p", "no:xdist", "--kafka-broker-log-level=WARNING")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR


def _gone(pid: int) -> bool:
    """Exited (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_pytest_leaves_no_broker(pytester: pytest.Pytester) -> None:
    """pytest killed by SIGKILL runs no teardown; the broker must not outlive it."""
    pid_file = pytester.path / "broker.pid"
    pytester.makepyfile(
        test_hang=f"""
        import threading
        def test_hang(kafka_broker):
            with open({str(pid_file)!r}, "w") as f:
                f.write(str(kafka_broker.pid))
            threading.Event().wait(600)  # until killed
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", *LOAD, "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert run.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.1)
        broker_pid = int(pid_file.read_text())
        assert not _gone(broker_pid)
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    deadline = time.monotonic() + 60
    while not _gone(broker_pid):
        if time.monotonic() > deadline:
            os.kill(broker_pid, signal.SIGKILL)  # ours: do not leave it running
            pytest.fail(f"broker {broker_pid} outlived the killed pytest by 60 s")
        time.sleep(0.1)


@pytest.mark.skipif(
    not ZOOKEEPER_JAR.is_file() or shutil.which("java") is None, reason="needs ZooKeeper"
)
@pytest.mark.slow
def test_cluster_failover(pytester: pytest.Pytester) -> None:
    # A test-sized ZooKeeper session: broker 2's restart after its kill -9 waits for
    # its previous session to expire (18 s by default). The one consumer's group forms
    # at once, not after Kafka's 3 s wait for more members.
    pytester.makeini(
        "[pytest]\nkafka_cluster_brokers = 2\n"
        "kafka_cluster_broker_config =\n    zookeeper.session.timeout.ms=4000\n"
        "    group.initial.rebalance.delay.ms=0\n"
    )
    pytester.makepyfile(
        test_cluster="""
        import time
        from confluent_kafka import Consumer, Producer

        def produce(cluster, topic, values):
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                 "message.timeout.ms": 60000})
            for v in values:
                producer.produce(topic, v)
            assert producer.flush(90) == 0

        def test_failover(kafka_cluster):
            assert len(kafka_cluster.bootstrap.split(",")) == 2
            topic = "failover"
            kafka_cluster.create_topic(topic, partitions=1, replication_factor=2)
            produce(kafka_cluster, topic, [b"before"])
            with kafka_cluster.broker_stopped(1):
                assert kafka_cluster.status()[1]["state"] == "stopped"
                produce(kafka_cluster, topic, [b"while 1 is down"])
            kafka_cluster.kill_broker(2)
            kafka_cluster.wait_running(2, timeout=90)
            with open(kafka_cluster.data_dir / "broker-2.properties") as f:
                assert "zookeeper.session.timeout.ms=4000" in f.read()
            produce(kafka_cluster, topic, [b"after"])
            consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "g",
                                 "auto.offset.reset": "earliest"})
            consumer.subscribe([topic])
            got, deadline = [], time.monotonic() + 90
            while len(got) < 3 and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
            consumer.close()
            assert got == [b"before", b"while 1 is down", b"after"]
        """
    )
    result = pytester.runpytest_subprocess(*LOAD, "-p", "no:xdist", timeout=600)
    result.assert_outcomes(passed=1)
