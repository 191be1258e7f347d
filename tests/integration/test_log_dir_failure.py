"""A failed log dir goes offline alone (JBOD, Kafka's LogDirFailureChannel rule).

An in-process broker with two log dirs, ``a`` and ``b``; every fsync of a log in ``a``
fails with EIO from a chosen moment (``Flusher.sync``, how the flusher makes a log
durable, replaced for that dir). One failed fsync takes the whole of ``a`` offline:

- every partition in ``a`` answers KAFKA_STORAGE_ERROR (56) to Produce (confluent-kafka),
  ListOffsets (confluent-kafka's AdminClient) and Fetch (our codec over the socket: the
  real clients retry a 56 fetch silently), the one never written since too;
- the partition in ``b`` keeps taking produces and serving fetches (confluent-kafka);
- DescribeLogDirs (kafka-python, and Kafka's own kafka-log-dirs tool) answers ``a``
  with the storage error and no partitions, ``b`` as before;
- a new topic goes to ``b`` although ``b`` holds more partitions; AlterReplicaLogDirs
  into ``a`` answers KAFKA_STORAGE_ERROR;
- once fsync works again a produce starts a probe of the dir, and all of ``a``'s
  partitions come back together, every acknowledged record intact.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors

from tests.disk_faults import fail_fsyncs_in
from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")
STORAGE_ERROR = ErrorCode.KAFKA_STORAGE_ERROR


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "a", extra_log_dirs=(tmp_path / "b",), storage="file"
    )


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def produce(bootstrap: str, topic: str, value: bytes) -> tuple[int, int]:
    """(error code, offset) of one acks=all record, no retries: the broker's answer."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0,
                         "message.timeout.ms": 30_000})  # fmt: skip
    got: list[tuple[int, int]] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        got.append((0, msg.offset()) if err is None else (err.code(), -1))

    producer.produce(topic, value=value, on_delivery=delivered)
    assert producer.flush(60) == 0
    return got[0]


def list_offsets(bootstrap: str, topic: str) -> int | None:
    """The latest offset of partition 0, or None with the error code in ``errors``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_offsets({CTopicPartition(topic, 0): OffsetSpec.latest()})
    [(_, result)] = future.items()
    try:
        return int(result.result(timeout=60).offset)
    except Exception as exc:  # confluent-kafka's KafkaException, the error in args[0]
        error = exc.args[0]
        assert isinstance(error, KafkaError), exc
        return -error.code()


def consume(bootstrap: str, topic: str, last: bytes) -> list[bytes]:
    """Partition 0 of ``topic`` from the start, until the record ``last``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "jbod-failure",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([CTopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(300):  # bounded: 300 x 0.2 s
            got += [msg.value() for msg in consumer.consume(100, 0.2) if msg.error() is None]
            if last in got:
                break
    finally:
        consumer.close()
    return got


def describe_dirs(bootstrap: str) -> dict[str, tuple[int, list[str]]]:
    """log dir -> (error code, topics in it), as kafka-python's DescribeLogDirs says."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [answer] = admin.describe_log_dirs()
    finally:
        admin.close()
    return {
        d["log_dir"]: (d["error_code"], sorted(t["name"] for t in d["topics"]))
        for d in answer["log_dirs"]
    }


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [created] = admin.create_topics([NewTopic(name, num_partitions=1)]).values()
    created.result(timeout=60)


def move(bootstrap: str, topic: str, log_dir: Path) -> dict[Any, Any]:
    """AlterReplicaLogDirs of ``topic``'s partition 0 into ``log_dir`` (kafka-python)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return dict(admin.alter_replica_log_dirs({(topic, 0, 0): str(log_dir)}))
    finally:
        admin.close()


async def fetch_code(broker: Broker, topic: str) -> int:
    host, port = broker.bound[0]
    F = m.FetchRequest
    body = F(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        topics=[F.FetchTopic(topic=topic, partitions=[
            F.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                        partition_max_bytes=1 << 20)])],
    )  # fmt: skip
    async with await trio.open_tcp_stream(host, port) as stream:
        response = await RawClient(stream, "jbod").call(m.ApiKey.FETCH, 11, body)
    return int(response.responses[0].partitions[0].error_code)


async def test_a_failed_dir_goes_offline_alone_and_comes_back_whole(
    broker: Broker, bootstrap: str, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    broker.topics.create("in-a", 1)  # a tie: the first dir
    broker.topics.create("in-b", 1)  # then the dir with fewer
    broker.topics.create("quiet-a", 1)  # a tie again: a
    with trio.fail_after(240):
        assert await in_thread(lambda: describe_dirs(bootstrap)) == {
            str(a): (0, ["in-a", "quiet-a"]),
            str(b): (0, ["in-b"]),
        }
        for topic in ("in-a", "in-b", "quiet-a"):
            assert await in_thread(lambda t=topic: produce(bootstrap, t, b"before")) == (0, 0)

        failing = [True]
        fail_fsyncs_in(broker, a, failing)
        code, _ = await in_thread(lambda: produce(bootstrap, "in-a", b"doomed"))
        assert code == STORAGE_ERROR
        # The whole dir is offline: the partition nobody wrote to since answers 56 too,
        # to produce, fetch and ListOffsets alike.
        for topic in ("in-a", "quiet-a"):
            assert await in_thread(lambda t=topic: produce(bootstrap, t, b"no")) == (
                STORAGE_ERROR,
                -1,
            )
            assert await fetch_code(broker, topic) == STORAGE_ERROR
            assert await in_thread(lambda t=topic: list_offsets(bootstrap, t)) == -STORAGE_ERROR
        # The other dir serves as before.
        assert await in_thread(lambda: produce(bootstrap, "in-b", b"during")) == (0, 1)
        assert await fetch_code(broker, "in-b") == 0
        assert await in_thread(lambda: consume(bootstrap, "in-b", b"during")) == [
            b"before",
            b"during",
        ]
        assert await in_thread(lambda: list_offsets(bootstrap, "in-b")) == 2
        # DescribeLogDirs: the failed dir's error and no partitions.
        assert await in_thread(lambda: describe_dirs(bootstrap)) == {
            str(a): (STORAGE_ERROR, []),
            str(b): (0, ["in-b"]),
        }
        # A new topic goes to the online dir, though it holds more partitions.
        await in_thread(lambda: create_topic(bootstrap, "new"))
        new_log = broker.topics.log("new", 0)
        assert new_log is not None and broker.topics.log_dir_of(new_log) == b
        # Nothing moves into an offline dir.
        moved = await in_thread(lambda: move(bootstrap, "in-b", a))
        assert moved == {("in-b", 0, 0): kafka_errors.KafkaStorageError}

        # fsync works again: a produce starts a probe of the dir (1 s back-off), and
        # the dir comes back whole: the partition not written to serves again too.
        failing[0] = False

        for _ in range(120):  # bounded retries: the client's, after the back-off
            code, _ = await in_thread(lambda: produce(bootstrap, "in-a", b"after"))
            if code == 0:
                break
            assert code == STORAGE_ERROR
            await trio.sleep(0.25)
        assert code == 0, "the offline dir did not come back"
        assert await fetch_code(broker, "quiet-a") == 0
        # The refused record may be there or not (its fsync failed, as in Kafka a
        # failed produce may have been written); every acknowledged one is, in order.
        in_a = await in_thread(lambda: consume(bootstrap, "in-a", b"after"))
        assert [v for v in in_a if v != b"doomed"] == [b"before", b"after"]
        assert await in_thread(lambda: consume(bootstrap, "quiet-a", b"before")) == [b"before"]
        assert await in_thread(lambda: describe_dirs(bootstrap)) == {
            str(a): (0, ["in-a", "quiet-a"]),
            str(b): (0, ["in-b", "new"]),
        }


async def test_kafka_log_dirs_tool_shows_the_failed_dir(
    broker: Broker, bootstrap: str, tmp_path: Path
) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("Kafka's kafka-log-dirs tool needs Java 17 and Maven")
    from tests.kafka_tools import tool
    from tests.kafka_tools.classpath import kafka_tools_classpath

    a, b = tmp_path / "a", tmp_path / "b"
    broker.topics.create("in-a", 1)
    broker.topics.create("in-b", 1)
    classpath = await in_thread(lambda: kafka_tools_classpath(tmp_path / "kafka-tools"))
    fail_fsyncs_in(broker, a, [True])
    with trio.fail_after(240):
        code, _ = await in_thread(lambda: produce(bootstrap, "in-a", b"doomed"))
        assert code == STORAGE_ERROR
        run = await in_thread(lambda: tool.run_tool(
            classpath, "LogDirsCommand", "--bootstrap-server", bootstrap, "--describe",
        ))  # fmt: skip
    [line] = [s for s in run.stdout.splitlines() if s.startswith("{")]
    [described] = json.loads(line)["brokers"]
    dirs = {d["logDir"]: d for d in described["logDirs"]}
    assert "KafkaStorageException" in (dirs[str(a)]["error"] or ""), run.stdout
    assert dirs[str(a)]["partitions"] == []
    assert dirs[str(b)]["error"] is None
    assert [p["partition"] for p in dirs[str(b)]["partitions"]] == ["in-b-0"]
