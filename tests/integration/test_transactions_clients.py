"""Transactions end to end: real clients, real sockets, a real broker.

* confluent-kafka commits a transaction over 2 topics x 2 partitions and aborts a
  second; every partition gets its commit/abort marker, and a read_committed
  consumer sees exactly the committed records.
* A second producer with the same transactional.id fences the first (fatal error
  for the first), after its open transaction is aborted.
* A transaction left open past transaction.timeout.ms is aborted by the broker.
* send_offsets_to_transaction: the group's offsets commit with the transaction and
  are dropped with an abort.
* kafka-python and aiokafka transactional producers commit and abort.
* A broker killed (-9) mid-transaction: after the restart the producer's re-init
  aborts the open transaction, and committed data is intact.

The read_committed checks need the partition side (LSO, aborted transactions in
Fetch) and the offsets test the group side (TxnOffsetCommit); the markers themselves
are checked in the logs. Clients run in worker
threads so the in-process broker keeps serving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import iter_batches, read_control_marker
from trio_broker.server.broker import Broker
from trio_broker.transactions.state import TxnState

pytestmark = pytest.mark.timeout(300)

TOPICS = ("txa", "txb")
PARTITIONS = [(topic, partition) for topic in TOPICS for partition in (0, 1)]
#: The coordinator's timer runs this often in these tests (ms).
ABORT_CHECK_MS = 200


@pytest.fixture(params=["file", "memory"])
def broker_config(tmp_path: Path, request: pytest.FixtureRequest) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage=request.param,
        transaction_abort_timed_out_transaction_cleanup_interval_ms=ABORT_CHECK_MS,
    )  # fmt: skip


@pytest.fixture
def topics(broker: Broker) -> None:
    for topic in TOPICS:
        broker.topics.create(topic, 2)


def control_markers(broker: Broker, topic: str, partition: int) -> list[tuple[int, int, bool]]:
    """(producer id, epoch, committed) of each marker in the partition log, in order."""
    log = broker.topics.log(topic, partition)
    assert log is not None
    found = []
    for region in log.read(0, 1 << 24, log.log_end_offset):
        for batch in iter_batches(region.read_bytes()):
            if batch.is_control:
                committed = read_control_marker(batch).committed
                found.append((batch.producer_id, batch.producer_epoch, committed))
    return found


def produce_txn(producer: Producer, tag: str, per_partition: int, *, commit: bool) -> list[bytes]:
    producer.begin_transaction()
    values = []
    for topic, partition in PARTITIONS:
        for i in range(per_partition):
            value = f"{tag}-{topic}-{partition}-{i}".encode()
            producer.produce(topic, value=value, partition=partition)
            values.append(value)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # the records are in the log before the abort
        producer.abort_transaction(30)
    return values


def read_committed(bootstrap: str, expected: int, settle_s: float = 2.0) -> list[bytes]:
    """Everything a read_committed consumer gets from the test partitions (bounded)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"rc-{time.monotonic_ns()}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })  # fmt: skip
    consumer.assign([TopicPartition(t, p, 0) for t, p in PARTITIONS])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    settled_at = None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(bytes(message.value()))
            if len(got) >= expected:
                # Keep polling a little: anything beyond is a record that should not show.
                settled_at = settled_at or time.monotonic()
                if time.monotonic() - settled_at > settle_s:
                    break
    finally:
        consumer.close()
    return got


async def in_thread(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


# ------------------------------------------------------------------ confluent-kafka


async def test_confluent_commit_and_abort(broker: Broker, bootstrap: str, topics: None) -> None:
    def run() -> tuple[list[bytes], list[bytes]]:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "cf-1"})
        producer.init_transactions(30)
        committed = produce_txn(producer, "c", 5, commit=True)
        aborted = produce_txn(producer, "a", 3, commit=False)
        return committed, aborted

    committed, aborted = await in_thread(run)
    meta = broker.transactions.get("cf-1")
    assert meta.state == TxnState.COMPLETE_ABORT and meta.producer_epoch == 0
    for topic, partition in PARTITIONS:
        assert control_markers(broker, topic, partition) == [
            (meta.producer_id, 0, True), (meta.producer_id, 0, False),
        ]  # fmt: skip
    seen = await in_thread(read_committed, bootstrap, len(committed))
    assert sorted(seen) == sorted(committed)
    assert not set(seen) & set(aborted)


async def test_confluent_second_producer_fences_the_first(
    broker: Broker, bootstrap: str, topics: None
) -> None:
    def run() -> KafkaException:
        settings = {"bootstrap.servers": bootstrap, "transactional.id": "cf-fence"}
        first = Producer(settings)
        first.init_transactions(30)
        first.begin_transaction()
        first.produce("txa", value=b"zombie", partition=0)
        first.flush(30)
        second = Producer(settings)
        second.init_transactions(30)  # aborts first's transaction, then takes the id
        second.begin_transaction()
        second.produce("txa", value=b"winner", partition=0)
        second.commit_transaction(30)
        try:
            first.commit_transaction(30)
        except KafkaException as exc:
            return exc
        raise AssertionError("the fenced producer committed")

    refused = await in_thread(run)
    error = refused.args[0]
    assert error.fatal(), error
    meta = broker.transactions.get("cf-fence")
    pid = meta.producer_id
    # epoch 0's transaction aborted with epoch 1; the second producer got epoch 2.
    assert control_markers(broker, "txa", 0) == [(pid, 1, False), (pid, 2, True)]
    assert (meta.state, meta.producer_epoch) == (TxnState.COMPLETE_COMMIT, 2)


async def test_confluent_transaction_timeout_is_aborted_by_the_broker(
    broker: Broker, bootstrap: str, topics: None
) -> None:
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": "cf-timeout",
        "transaction.timeout.ms": 1500, "message.timeout.ms": 1500,
    })  # fmt: skip

    def start() -> None:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("txb", value=b"left-open", partition=1)
        producer.flush(30)

    await in_thread(start)
    pid = broker.transactions.get("cf-timeout").producer_id
    with trio.fail_after(15):
        # A bounded poll of the coordinator's table: the abort is the broker's own timer.
        while broker.transactions.get("cf-timeout").state != TxnState.COMPLETE_ABORT:  # noqa: ASYNC110
            await trio.sleep(0.1)
    assert control_markers(broker, "txb", 1) == [(pid, 1, False)]

    def commit() -> KafkaException | None:
        try:
            producer.commit_transaction(30)
        except KafkaException as exc:
            return exc
        return None

    refused = await in_thread(commit)
    assert refused is not None, "a timed-out transaction committed"
    assert control_markers(broker, "txb", 1) == [(pid, 1, False)]


async def test_confluent_offsets_commit_and_abort_with_the_transaction(
    broker: Broker, bootstrap: str, topics: None
) -> None:
    """Consume-transform-produce: the group's offsets follow the transaction's outcome."""

    def run() -> tuple[int, int]:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "cf-eos"})
        consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "eos-group",
            "enable.auto.commit": False, "isolation.level": "read_committed",
        })  # fmt: skip
        try:
            producer.init_transactions(30)
            offsets = []
            for position, commit in ((5, True), (9, False)):
                producer.begin_transaction()
                producer.produce("txb", value=b"out-%d" % position, partition=0)
                # Written before the end: librdkafka adds a partition to the transaction
                # only when it sends to it, and an abort purges what is still queued.
                assert producer.flush(30) == 0
                producer.send_offsets_to_transaction(
                    [TopicPartition("txa", 0, position)], consumer.consumer_group_metadata(), 30
                )
                if commit:
                    producer.commit_transaction(30)
                else:
                    producer.abort_transaction(30)
                [committed] = consumer.committed([TopicPartition("txa", 0)], 30)
                offsets.append(committed.offset)
            return offsets[0], offsets[1]
        finally:
            consumer.close()

    after_commit, after_abort = await in_thread(run)
    assert (after_commit, after_abort) == (5, 5)
    meta = broker.transactions.get("cf-eos")
    assert control_markers(broker, "txb", 0) == [
        (meta.producer_id, 0, True), (meta.producer_id, 0, False),
    ]  # fmt: skip


# ------------------------------------------------------------------ kafka-python, aiokafka


async def test_kafka_python_commit_and_abort(broker: Broker, bootstrap: str, topics: None) -> None:
    from kafka import KafkaProducer

    def run() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-1")
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("txa", b"kp-commit", partition=1).get(30)
            producer.send("txb", b"kp-commit", partition=0).get(30)
            producer.commit_transaction()
            producer.begin_transaction()
            producer.send("txa", b"kp-abort", partition=1).get(30)
            producer.abort_transaction()
        finally:
            producer.close(5)

    await in_thread(run)
    meta = broker.transactions.get("kp-1")
    pid, epoch = meta.producer_id, meta.producer_epoch
    assert meta.state == TxnState.COMPLETE_ABORT
    assert control_markers(broker, "txa", 1) == [(pid, epoch, True), (pid, epoch, False)]
    assert control_markers(broker, "txb", 0) == [(pid, epoch, True)]


async def test_aiokafka_commit_and_abort(broker: Broker, bootstrap: str, topics: None) -> None:
    from aiokafka import AIOKafkaProducer

    class Rollback(Exception):
        pass

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aio-1")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait("txb", b"aio-commit", partition=1)
            try:
                async with producer.transaction():
                    await producer.send_and_wait("txb", b"aio-abort", partition=1)
                    raise Rollback
            except Rollback:
                pass
        finally:
            await producer.stop()

    await in_thread(lambda: asyncio.run(run()))
    meta = broker.transactions.get("aio-1")
    pid, epoch = meta.producer_id, meta.producer_epoch
    assert meta.state == TxnState.COMPLETE_ABORT
    assert control_markers(broker, "txb", 1) == [(pid, epoch, True), (pid, epoch, False)]


# ------------------------------------------------------------------ kill -9 and restart


@pytest.fixture
def process(tmp_path: Path) -> Iterator[BrokerProcess]:
    properties = f"transaction.abort.timed.out.transaction.cleanup.interval.ms={ABORT_CHECK_MS}\n"
    with running_broker(tmp_path / "data", properties=properties) as broker:
        yield broker


def describe(process: BrokerProcess, transactional_id: str) -> Any:
    with process.connect() as conn:
        response = conn.request(
            m.ApiKey.DESCRIBE_TRANSACTIONS, 0,
            m.DescribeTransactionsRequest(transactional_ids=[transactional_id]),
        )  # fmt: skip
    return response.transaction_states[0]


def markers_over_the_wire(process: BrokerProcess, topic: str, partition: int) -> list[bool]:
    with process.connect() as conn:
        batches = conn.fetch_batches(topic, partition)
    return [read_control_marker(batch).committed for batch in batches if batch.is_control]


def test_kill_9_mid_transaction_then_restart(process: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": process.bootstrap})
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in TOPICS]).values():
        future.result(30)
    settings = {"bootstrap.servers": process.bootstrap, "transactional.id": "crash"}
    producer = Producer(settings)
    producer.init_transactions(30)
    committed = produce_txn(producer, "before", 4, commit=True)
    producer.begin_transaction()
    for topic, partition in PARTITIONS:
        producer.produce(topic, value=b"in-flight", partition=partition)
    producer.flush(30)
    assert describe(process, "crash").transaction_state == "Ongoing"
    process.kill9()
    process.start()
    # The table came back from __transaction_state: still open, four partitions.
    open_txn = describe(process, "crash")
    assert open_txn.transaction_state == "Ongoing"
    assert sorted((t.topic, p) for t in open_txn.topics for p in t.partitions) == PARTITIONS
    # A new producer instance (the application restarted too) re-inits: the open
    # transaction is aborted, then it commits its own.
    again = Producer(settings)
    again.init_transactions(30)
    after = produce_txn(again, "after", 2, commit=True)
    final = describe(process, "crash")
    assert (final.transaction_state, final.producer_epoch) == ("CompleteCommit", 2)
    for topic, partition in PARTITIONS:
        assert markers_over_the_wire(process, topic, partition) == [True, False, True]
    seen = read_committed(process.bootstrap, len(committed) + len(after))
    assert sorted(seen) == sorted(committed + after)
