"""The partition side of transactions over real sockets, on a real in-process broker.

The transaction coordinator is built separately (trio_broker/transactions); here the
broker's ``transactions`` service is a small real implementation of the
``Transactions`` protocol (handlers/base.py) written in this test: it answers NONE for
the partitions the test added to a producer's transaction, as AddPartitionsToTxn
would. Transactional batches go in through the real Produce path (our raw client);
markers through ``append_txn_marker``, exactly as the coordinator writes them.
Real clients read: confluent-kafka and kafka-python with isolation level
read_committed see committed records only, never aborted ones, and stop at an open
transaction (the LSO). A broker subprocess killed with -9 rebuilds the open and
aborted transactions from its log.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.e2e.conftest import BrokerProcess
from tests.integration.raw_client import RawClient, file_broker_and_client
from tests.waits import eventually
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, build_control_batch
from trio_broker.server.broker import Broker
from trio_broker.services.txn_markers import MarkerRejected, append_txn_marker

pytestmark = pytest.mark.timeout(300)

TOPIC = "txn"
PRODUCE_V = 9
FETCH_V = 11
LIST_OFFSETS_V = 5
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class AddedPartitions:
    """A real (small) ``Transactions``: the partitions each producer epoch added."""

    def __init__(self) -> None:
        self.added: set[tuple[int, int, str, int]] = set()

    def add(self, producer_id: int, epoch: int, topic: str = TOPIC, partition: int = 0) -> None:
        self.added.add((producer_id, epoch, topic, partition))

    def partition_in_transaction(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> int:
        if (producer_id, producer_epoch, topic, partition) in self.added:
            return ErrorCode.NONE
        if any(pid == producer_id and e > producer_epoch for pid, e, _, _ in self.added):
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.INVALID_TXN_STATE

    async def verify_batches(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: list[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:  # fmt: skip
        """KIP-890's question, which Produce asks first: the same answers."""
        return {
            (topic, partition): ErrorCode(
                self.partition_in_transaction(producer_id, producer_epoch, topic, partition)
            )
            for topic, partition in partitions
        }


@asynccontextmanager
async def running_broker(data_dir: Path) -> AsyncIterator[tuple[Broker, RawClient]]:
    async with file_broker_and_client(data_dir) as (broker, client):
        broker.topics.create(TOPIC, 1)
        yield broker, client


def txn_batch(pid: int, seq: int, values: list[bytes], epoch: int = 0) -> bytes:
    return bytes(
        build_batch(
            [(None, v) for v in values],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=True,
        )
    )


async def produce(client: RawClient, batch: bytes) -> tuple[int, int]:
    Req = m.ProduceRequest
    body = Req(
        transactional_id="t",
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            Req.TopicProduceData(
                name=TOPIC,
                partition_data=[Req.TopicProduceData.PartitionProduceData(index=0, records=batch)],
            )
        ],
    )
    response = await client.call(m.ApiKey.PRODUCE, PRODUCE_V, body)
    part = response.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def fetch_body(offset: int, isolation: int, max_wait_ms: int = 0) -> Any:
    Req = m.FetchRequest
    return Req(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=isolation, session_id=0, session_epoch=-1,
        topics=[Req.FetchTopic(topic=TOPIC, partitions=[Req.FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip


def list_offsets_body(isolation: int) -> Any:
    Req = m.ListOffsetsRequest
    return Req(
        replica_id=-1, isolation_level=isolation,
        topics=[Req.ListOffsetsTopic(name=TOPIC, partitions=[
            Req.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)])],
    )  # fmt: skip


async def latest(client: RawClient, isolation: int) -> int:
    response = await client.call(
        m.ApiKey.LIST_OFFSETS, LIST_OFFSETS_V, list_offsets_body(isolation)
    )
    part = response.topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


async def marker(broker: Broker, pid: int, committed: bool, epoch: int = 0) -> int:
    log, offset = append_txn_marker(
        broker.topics, broker.producers, broker.durability, broker.appends,
        TOPIC, 0, pid, epoch, committed, 0, broker.now_ms(), leaders=broker.replication,
    )  # fmt: skip
    await broker.durability.wait_durable(log, offset)
    return offset


# ------------------------------------------------------------------------------- produce


async def test_produce_asks_the_coordinator_and_refuses_control_batches(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "data") as (broker, client):
        batch = txn_batch(7, 0, [b"x"])
        # The broker's coordinator knows no such transactional id: KIP-890's answer.
        assert (await produce(client, batch))[0] == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        coordinator = AddedPartitions()
        broker.transactions = coordinator
        assert (await produce(client, batch))[0] == ErrorCode.INVALID_TXN_STATE  # not added
        coordinator.add(7, 1)
        assert (await produce(client, batch))[0] == ErrorCode.INVALID_PRODUCER_EPOCH  # fenced
        coordinator.add(7, 0)
        assert await produce(client, batch) == (ErrorCode.NONE, 0)
        control = bytes(build_control_batch(7, 0, committed=True, coordinator_epoch=0, timestamp=1))
        assert (await produce(client, control))[0] == ErrorCode.INVALID_RECORD
        assert await latest(client, READ_COMMITTED) == 0  # the open transaction
        assert await latest(client, READ_UNCOMMITTED) == 1
        # The producer moves to epoch 1; a marker of epoch 0 is then refused.
        assert await produce(client, txn_batch(7, 0, [b"y"], epoch=1)) == (ErrorCode.NONE, 1)
        with pytest.raises(MarkerRejected) as older:
            await marker(broker, 7, True, epoch=0)
        assert older.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert await marker(broker, 7, True, epoch=1) == 2
        assert await latest(client, READ_COMMITTED) == 3


# ----------------------------------------------------------------------- the read path


async def write_mixed_transactions(broker: Broker, client: RawClient) -> dict[str, Any]:
    """A aborted, B committed, plain records, C left open; returns the offsets."""
    coordinator = AddedPartitions()
    broker.transactions = coordinator
    for pid in (100, 101, 102):
        coordinator.add(pid, 0)
    offsets: dict[str, Any] = {}
    assert (await produce(client, txn_batch(100, 0, [b"a0", b"a1"])))[0] == 0
    offsets["a_first"] = 0
    assert (await produce(client, txn_batch(101, 0, [b"b0"])))[0] == 0
    assert (await produce(client, bytes(build_batch([(None, b"plain0")]))))[0] == 0
    assert (await produce(client, txn_batch(100, 2, [b"a2"])))[0] == 0
    assert (await produce(client, txn_batch(101, 1, [b"b1", b"b2"])))[0] == 0
    offsets["a_marker"] = await marker(broker, 100, committed=False)
    offsets["b_marker"] = await marker(broker, 101, committed=True)
    assert (await produce(client, bytes(build_batch([(None, b"plain1")]))))[0] == 0
    err, offsets["c_first"] = await produce(client, txn_batch(102, 0, [b"c0"]))
    assert err == 0
    assert (await produce(client, bytes(build_batch([(None, b"plain2")]))))[0] == 0
    return offsets


COMMITTED_BEFORE_C = [b"b0", b"plain0", b"b1", b"b2", b"plain1"]


def consume_confluent(bootstrap: str, want: int, settle_s: float) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        settle_until = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) >= want and settle_until is None:
                settle_until = time.monotonic() + settle_s  # anything more would be wrong
            if settle_until is not None and time.monotonic() > settle_until:
                break
        return got
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, want: int, settle_s: float) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=int(settle_s * 1000),
    )
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < want + 5:
            batch = list(consumer)  # stops after consumer_timeout_ms without records
            got += [r.value for r in batch]
            if len(got) >= want:
                break
        # Give a wrong broker the chance to hand over more.
        got += [r.value for r in consumer]
        return got
    finally:
        consumer.close()


async def test_read_committed_clients_see_committed_records_only(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "data") as (broker, client):
        offsets = await write_mixed_transactions(broker, client)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        # The LSO holds read_committed readers at C's open transaction.
        assert await latest(client, READ_COMMITTED) == offsets["c_first"]
        end = await latest(client, READ_UNCOMMITTED)
        assert end == offsets["c_first"] + 2
        response = await client.call(m.ApiKey.FETCH, FETCH_V, fetch_body(0, READ_COMMITTED))
        part = response.responses[0].partitions[0]
        assert part.high_watermark == end and part.last_stable_offset == offsets["c_first"]
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(100, 0)]
        # read_uncommitted sees the LSO too (Kafka always fills it) but no aborted list.
        response = await client.call(m.ApiKey.FETCH, FETCH_V, fetch_body(0, READ_UNCOMMITTED))
        part = response.responses[0].partitions[0]
        assert part.last_stable_offset == offsets["c_first"] and part.aborted_transactions is None

        got = await trio.to_thread.run_sync(consume_confluent, bootstrap, 5, 1.5)
        assert got == COMMITTED_BEFORE_C
        got = await trio.to_thread.run_sync(consume_kafka_python, bootstrap, 5, 1.5)
        assert got == COMMITTED_BEFORE_C

        await marker(broker, 102, committed=True)
        everything = [*COMMITTED_BEFORE_C, b"c0", b"plain2"]
        assert await latest(client, READ_COMMITTED) == end + 1  # the marker's offset too
        got = await trio.to_thread.run_sync(consume_confluent, bootstrap, 7, 1.0)
        assert got == everything
        got = await trio.to_thread.run_sync(consume_kafka_python, bootstrap, 7, 1.0)
        assert got == everything


async def test_read_committed_long_poll_wakes_when_a_marker_moves_the_lso(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path / "data") as (broker, client):
        offsets = await write_mixed_transactions(broker, client)
        lso = offsets["c_first"]
        answered: list[Any] = []

        async def waiting_fetch() -> None:
            body = fetch_body(lso, READ_COMMITTED, max_wait_ms=120_000)
            answered.append(await client.call(m.ApiKey.FETCH, FETCH_V, body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting_fetch)
            # Registered as waiting: the broker read the partition and held the answer.
            await eventually(lambda: broker.appends.statistics().waiters == 1, "the long poll")
            assert not answered, "a read_committed fetch at the LSO must wait"
            started = trio.current_time()
            await marker(broker, 102, committed=True)
        # Woken by the marker, not by max_wait: half of max_wait apart, so that a busy
        # machine makes the wake-up slower, not the test red.
        assert trio.current_time() - started < 60
        part = answered[0].responses[0].partitions[0]
        assert part.last_stable_offset == part.high_watermark
        assert part.records is not None and len(bytes(part.records)) > 0


async def test_describe_producers_shows_open_transactions(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "data") as (broker, client):
        offsets = await write_mixed_transactions(broker, client)
        Req = m.DescribeProducersRequest
        body = Req(
            topics=[
                Req.TopicRequest(name=TOPIC, partition_indexes=[0, 3]),
                Req.TopicRequest(name="nope", partition_indexes=[0]),
            ]
        )
        response = await client.call(m.ApiKey.DESCRIBE_PRODUCERS, 0, body)
        known, missing = response.topics[0].partitions
        assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert response.topics[1].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert known.error_code == 0
        states = {p.producer_id: p for p in known.active_producers}
        assert sorted(states) == [100, 101, 102]
        assert states[102].current_txn_start_offset == offsets["c_first"]
        assert states[100].current_txn_start_offset == -1  # aborted: no open transaction
        assert states[100].coordinator_epoch == 0 and states[102].coordinator_epoch == -1
        assert (states[101].producer_epoch, states[101].last_sequence) == (0, 2)
        # A producer whose only entry is a fencing marker: its epoch, and the marker's
        # time as its last activity (Kafka's lastTimestamp; -1 before).
        before_ms = broker.now_ms()
        await marker(broker, 200, committed=False, epoch=3)
        again = await client.call(m.ApiKey.DESCRIBE_PRODUCERS, 0, body)
        fenced = {p.producer_id: p for p in again.topics[0].partitions[0].active_producers}[200]
        assert (fenced.producer_epoch, fenced.last_sequence) == (3, -1)
        assert fenced.last_timestamp >= before_ms, fenced


# ----------------------------------------------------------------------------- recovery


def _answers(broker: BrokerProcess) -> tuple[int, int, list[tuple[int, int]]]:
    """(read_committed LATEST, fetch LSO, aborted list) from a running subprocess."""
    with broker.connect() as conn:
        listed = conn.request(m.ApiKey.LIST_OFFSETS, LIST_OFFSETS_V, list_offsets_body(1))
        fetched = conn.request(m.ApiKey.FETCH, FETCH_V, fetch_body(0, READ_COMMITTED))
    part = fetched.responses[0].partitions[0]
    aborted = [(a.producer_id, a.first_offset) for a in part.aborted_transactions]
    return listed.topics[0].partitions[0].offset, part.last_stable_offset, aborted


async def test_transactions_survive_kill_9(tmp_path: Path) -> None:
    crash_image = tmp_path / "crashed"
    async with running_broker(tmp_path / "data") as (broker, client):
        offsets = await write_mixed_transactions(broker, client)
        # Everything is durable (acks=-1, markers awaited): copy the data directory as a
        # crash would leave it — no producer state snapshot is written before shutdown.
        await trio.to_thread.run_sync(shutil.copytree, tmp_path / "data", crash_image)
    expected = (offsets["c_first"], offsets["c_first"], [(100, offsets["a_first"])])

    def restart_and_check() -> None:
        process = BrokerProcess(crash_image, "serial", "file")
        process.start()
        try:
            assert not list(crash_image.rglob("*.snapshot"))
            assert _answers(process) == expected  # rebuilt from the log alone
            process.kill9()
            process.start()
            assert _answers(process) == expected  # again after kill -9
            assert process.stop() == 0  # a clean stop writes the snapshot ...
            assert list(crash_image.rglob("*.snapshot"))
            process.start()
            assert _answers(process) == expected  # ... which the next start reads
        finally:
            if process.running:
                process.stop()

    await trio.to_thread.run_sync(restart_and_check)
