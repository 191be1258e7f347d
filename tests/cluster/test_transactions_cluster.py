"""Transactions across a three-broker cluster, with real processes and confluent-kafka.

The coordinator of a transactional id is the leader of its partition of the replicated
``__transaction_state`` (RF=3, made on the first FindCoordinator); markers go to each
data partition's leader (WriteTxnMarkers between brokers).

- a transactional producer commits and aborts transactions over six RF=3 partitions led
  by different brokers: a read_committed consumer reads exactly the committed records;
- the coordinator's broker killed with -9 between transactions: the producer goes on
  with the new coordinator (the leader of the same ``__transaction_state`` partition);
  killed again during a commit: a new producer with the same transactional id re-inits,
  the open transaction ends whole (committed or aborted), and read_committed output has
  every committed transaction whole and no aborted record;
- consume-transform-produce with send_offsets_to_transaction (needs replicated
  ``__consumer_offsets``: skipped until the group coordinator has it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.cluster.test_cluster_e2e import eventually, every_broker_knows
from tests.cluster.test_cluster_faults import (
    ConfiguredBroker,
    admin_of,
    create_topic,
    full_isr,
    servers,
    three_brokers,
)
from trio_broker.cluster.broker_client import BrokerClient
from trio_broker.groups import GroupCoordinator
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.services.internal_topics import TRANSACTION_STATE, partition_for

pytestmark = pytest.mark.timeout(300)

TXN_PARTITIONS = 3
CONFIG = (
    "min.insync.replicas=2\n"
    "replica.lag.time.max.ms=3000\n"
    "default.replication.factor=3\n"
    "zookeeper.session.timeout.ms=4000\n"
    f"transaction.state.log.num.partitions={TXN_PARTITIONS}\n"
    "transaction.state.log.replication.factor=3\n"
    "transaction.abort.timed.out.transaction.cleanup.interval.ms=500\n"
    "offsets.topic.num.partitions=3\n"
    "offsets.topic.replication.factor=3\n"
    # The one consumer's group forms at once, not after Kafka's 3 s wait for more members.
    "group.initial.rebalance.delay.ms=0\n"
)
TOPIC = "txdata"
PARTITIONS = 6

Cluster = dict[int, ConfiguredBroker]


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    """A cluster of the test's own, for a test that kills its brokers."""
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str) -> Iterator[Cluster]:
    """One cluster for the tests that leave its brokers alone, each with its own topic
    and transactional id: three brokers start and stop once, not once per test."""
    with three_brokers(tmp_path_factory.mktemp("shared"), module_zookeeper, CONFIG) as brokers:
        yield brokers


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "transaction.timeout.ms": 60_000, "linger.ms": 5, "metadata.max.age.ms": 2000,
        "topic.metadata.refresh.interval.ms": 1000, "retry.backoff.ms": 100,
        "request.timeout.ms": 5000, "socket.timeout.ms": 10000,
        "message.timeout.ms": 60_000,
    })  # fmt: skip
    producer.init_transactions(90)
    return producer


def values_of(tag: str, per_partition: int) -> list[str]:
    return [f"{tag}-{p}-{i}" for p in range(PARTITIONS) for i in range(per_partition)]


def send(producer: Producer, tag: str, per_partition: int, topic: str = TOPIC) -> list[str]:
    """Begin a transaction and produce ``per_partition`` records to every partition."""
    producer.begin_transaction()
    values = values_of(tag, per_partition)
    for value in values:
        partition = int(value.split("-")[1])
        producer.produce(topic, value=value.encode(), partition=partition)
        producer.poll(0)
    return values


def commit(producer: Producer, timeout_s: float = 90.0) -> None:
    """commit_transaction, retried while librdkafka calls the error retriable."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.commit_transaction(max(deadline - time.monotonic(), 1.0))
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise


def read_committed(bootstrap: str, expected: int, topic: str = TOPIC) -> list[str]:
    """Everything a read_committed consumer reads from the topic: at least ``expected``
    records, and on until its position is the last stable offset of every partition
    (nothing more can show; 60 s at most)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"rc-{time.monotonic_ns()}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

    def at_stable_end() -> bool:
        for tp in consumer.position(partitions):
            try:
                # A read_committed consumer's ListOffsets answers the last stable offset.
                _, stable = consumer.get_watermark_offsets(tp, timeout=10)
            except KafkaException:  # a leader moving after a kill: ask again later
                return False
            if max(tp.offset, 0) < stable:  # (no position yet: OFFSET_INVALID, < 0)
                return False
        return True

    got: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                if message.error() is None:
                    got.append(message.value().decode())
            elif len(got) >= expected and at_stable_end():  # looked at once idle: slow
                break
    finally:
        consumer.close()
    return got


def leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    meta = admin.list_topics(topic, timeout=5).topics[topic]
    return {p.id: p.leader for p in meta.partitions.values()}


def coordinator_of(admin: AdminClient, transactional_id: str) -> int:
    """The broker leading the id's __transaction_state partition (-1 while none)."""
    partition = partition_for(transactional_id, TXN_PARTITIONS)
    return leaders(admin, TRANSACTION_STATE).get(partition, -1)


def known_coordinator(admin: AdminClient, transactional_id: str) -> int:
    """:func:`coordinator_of` once Metadata names one: the broker asked may not have read
    the partition's state yet, even right after another one said its ISR is full."""
    found: list[int] = []

    def named() -> bool:
        found[:] = [coordinator_of(admin, transactional_id)]
        return found[0] >= 1

    eventually(named, f"a coordinator for {transactional_id}")
    return found[0]


def setup(cluster: Cluster, topic: str = TOPIC) -> AdminClient:
    admin = create_topic(cluster, topic, PARTITIONS)
    led_by = set(leaders(admin, topic).values())
    assert len(led_by) >= 2, f"all partitions led by one broker: {led_by}"
    return admin


def test_commit_and_abort_across_partition_leaders(shared: Cluster) -> None:
    topic = "tx-spread"
    setup(shared, topic)
    bootstrap = servers(shared)
    producer = transactional_producer(bootstrap, "tx-spread")
    committed = send(producer, "c1", 5, topic)
    commit(producer)
    send(producer, "a1", 5, topic)
    producer.flush(30)  # in the logs before the abort: the markers must hide them
    producer.abort_transaction(60)
    committed += send(producer, "c2", 3, topic)
    commit(producer)
    got = read_committed(bootstrap, len(committed), topic)
    assert sorted(got) == sorted(committed)
    # The coordinator is the leader of the id's __transaction_state partition.
    admin = admin_of(shared)
    full_isr(admin, TRANSACTION_STATE, TXN_PARTITIONS)
    assert known_coordinator(admin, "tx-spread") in shared


def test_coordinator_kill_9_between_and_during_transactions(cluster: Cluster) -> None:
    tid = "tx-failover"
    admin = setup(cluster)
    bootstrap = servers(cluster)
    producer = transactional_producer(bootstrap, tid)
    committed = send(producer, "c1", 4)
    commit(producer)
    full_isr(admin, TRANSACTION_STATE, TXN_PARTITIONS)

    # Between transactions: the coordinator's broker dies; the producer goes on with
    # the new leader of the same __transaction_state partition.
    first = known_coordinator(admin, tid)
    cluster[first].kill9()
    admin = admin_of(cluster)
    eventually(lambda: coordinator_of(admin, tid) not in (-1, first), "a new coordinator")
    committed += send(producer, "c2", 4)
    commit(producer)
    send(producer, "a2", 2)
    producer.flush(60)
    producer.abort_transaction(90)

    # The dead broker returns; then the coordinator dies during a commit.
    cluster[first].start()
    admin = admin_of(cluster)
    full_isr(admin, TRANSACTION_STATE, TXN_PARTITIONS, timeout_s=90)
    full_isr(admin, TOPIC, PARTITIONS, timeout_s=90)
    second = known_coordinator(admin, tid)
    in_doubt = send(producer, "d3", 4)
    producer.flush(60)
    outcome: list[BaseException | None] = []

    def committing() -> None:
        try:
            producer.commit_transaction(60)
            outcome.append(None)
        except KafkaException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=committing, daemon=True)
    thread.start()
    cluster[second].kill9()
    thread.join(90)
    admin = admin_of(cluster)
    eventually(lambda: coordinator_of(admin, tid) not in (-1, second), "a third coordinator")
    # A new producer with the same id: its init ends the transaction in doubt (the new
    # coordinator finishes a prepared commit, or aborts one still open) and fences the
    # old producer.
    again = transactional_producer(servers(cluster), tid)
    committed += send(again, "c4", 3)
    commit(again)

    got = read_committed(servers(cluster), len(committed))
    doubtful = [v for v in got if v.startswith("d3-")]
    assert not doubtful or sorted(doubtful) == sorted(in_doubt), (
        f"transaction in doubt read in part: {len(doubtful)} of {len(in_doubt)}"
    )
    if outcome == [None]:  # the client was told it committed: it must be there
        assert sorted(doubtful) == sorted(in_doubt)
    rest = [v for v in got if not v.startswith("d3-")]
    assert sorted(rest) == sorted(committed), "committed transactions whole, aborted ones absent"


async def _raw_verification_check(
    cluster: Cluster, admin: AdminClient, topic: str
) -> dict[str, int]:
    """Our own inter-broker client as a transactional producer: the answers Produce gives a
    transactional batch before its partition is added, once added, and after the
    abort (a late batch), at a partition leader other than the coordinator and at one
    that is the coordinator."""
    tid = "tx-raw"
    clients = {
        b: BrokerClient("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1]), "raw-test")
        for b, broker in cluster.items()
    }
    try:
        coordinator = -1
        with trio.fail_after(60):
            while coordinator < 0:
                find = await clients[1].call(m.ApiKey.FIND_COORDINATOR, 3, m.FindCoordinatorRequest(
                    key=tid, key_type=1), 10)  # fmt: skip
                if find.error_code == ErrorCode.NONE:
                    coordinator = find.node_id
                else:
                    await trio.sleep(0.2)
        # Broker 1's FindCoordinator may have made __transaction_state just now; a
        # partition leader asks the coordinator its own view names (NOT_COORDINATOR while
        # it names none), so every broker must know the topic's leaders first.
        await trio.to_thread.run_sync(
            lambda: every_broker_knows(cluster, TRANSACTION_STATE, TXN_PARTITIONS)
        )
        with trio.fail_after(60):
            init = m.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000,
                                           producer_id=-1, producer_epoch=-1)  # fmt: skip
            while True:
                ids = await clients[coordinator].call(m.ApiKey.INIT_PRODUCER_ID, 4, init, 10)
                if ids.error_code == ErrorCode.NONE:
                    break
                await trio.sleep(0.2)
        pid, epoch = ids.producer_id, ids.producer_epoch
        by_leader = leaders(admin, topic)
        remote = next(p for p, leader in by_leader.items() if leader != coordinator)
        local = next((p for p, leader in by_leader.items() if leader == coordinator), None)
        answers: dict[str, int] = {}
        sequences: dict[int, int] = {}

        async def produce(partition: int, label: str) -> None:
            sequence = sequences.get(partition, 0)
            batch = build_batch([(None, label.encode())], producer_id=pid,
                                producer_epoch=epoch, base_sequence=sequence,
                                is_transactional=True)  # fmt: skip
            Topic = m.ProduceRequest.TopicProduceData
            request = m.ProduceRequest(transactional_id=tid, acks=-1, timeout_ms=10_000,
                                       topic_data=[Topic(name=topic, partition_data=[
                                           Topic.PartitionProduceData(index=partition,
                                                                      records=bytes(batch))])])  # fmt: skip
            response = await clients[by_leader[partition]].call(m.ApiKey.PRODUCE, 9, request, 15)
            error = response.responses[0].partition_responses[0].error_code
            if error == ErrorCode.NONE:
                sequences[partition] = sequence + 1
            answers[label] = error

        async def add(partition: int) -> None:
            Topic = m.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
            request = m.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[Topic(name=topic, partitions=[partition])],
            )  # fmt: skip
            response = await clients[coordinator].call(m.ApiKey.ADD_PARTITIONS_TO_TXN, 3,
                                                       request, 15)  # fmt: skip
            [result] = response.results_by_topic_v3_and_below
            assert result.results_by_partition[0].partition_error_code == ErrorCode.NONE

        targets = {"remote": remote} if local is None else {"remote": remote, "local": local}
        for where, partition in targets.items():
            await produce(partition, f"{where}-before-add")
            await add(partition)
            await produce(partition, f"{where}-added")
            await produce(partition, f"{where}-second")
        end = m.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                              committed=False)  # fmt: skip
        ended = await clients[coordinator].call(m.ApiKey.END_TXN, 3, end, 30)
        assert ended.error_code == ErrorCode.NONE
        for where, partition in targets.items():
            await produce(partition, f"{where}-late")
        return answers
    finally:
        for client in clients.values():
            await client.close()


def test_produce_verifies_a_transactions_first_batch_with_the_coordinator(
    shared: Cluster,
) -> None:
    """KIP-890: a partition leader asks the id's coordinator (over the inter-broker
    client, or its own table) before a batch begins the producer's transaction there:
    refused before AddPartitionsToTxn and after the abort (a late batch that would
    otherwise leave a transaction hanging), accepted in between."""
    admin = setup(shared, "tx-raw")
    answers = trio.run(_raw_verification_check, shared, admin, "tx-raw")
    for where in ("remote", "local"):
        if f"{where}-added" not in answers:
            continue  # every partition led by another broker than the coordinator
        assert answers[f"{where}-before-add"] == ErrorCode.INVALID_TXN_STATE, answers
        assert answers[f"{where}-added"] == ErrorCode.NONE, answers
        assert answers[f"{where}-second"] == ErrorCode.NONE, answers
        assert answers[f"{where}-late"] == ErrorCode.INVALID_TXN_STATE, answers
    assert "remote-added" in answers


@pytest.mark.skipif(
    not hasattr(GroupCoordinator, "complete_transaction_in_partition"),
    reason="needs replicated __consumer_offsets (the group coordinator's "
    "complete_transaction_in_partition, branch groupsrepl): run after that merge",
)
def test_consume_transform_produce_commits_offsets_with_the_transaction(
    shared: Cluster,
) -> None:
    topic = "tx-ctp"
    setup(shared, topic)
    bootstrap = servers(shared)
    source = "txsource"
    create_topic(shared, source, 3)
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(30):
        plain.produce(source, value=str(i).encode(), partition=i % 3)
    assert plain.flush(60) == 0
    group = "ctp-group"
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
    })  # fmt: skip
    consumer.subscribe([source])
    producer = transactional_producer(bootstrap, "tx-ctp")
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while len(seen) < 30 and time.monotonic() < deadline:
        messages = consumer.consume(10, 1.0)
        records = [m for m in messages if m.error() is None]
        if not records:
            continue
        producer.begin_transaction()
        for record in records:
            value = f"out-{record.value().decode()}"
            producer.produce(topic, value=value.encode(), partition=int(value[4:]) % PARTITIONS)
            seen.append(value)
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        commit(producer)
    consumer.close()
    assert len(seen) == 30
    # The group's committed offsets came with the transactions: a new member starts at
    # the end, and the output holds each input once.
    check = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = check.committed([TopicPartition(source, p) for p in range(3)], timeout=30)
    check.close()
    assert {tp.partition: tp.offset for tp in offsets} == {0: 10, 1: 10, 2: 10}
    assert sorted(read_committed(bootstrap, 30, topic)) == sorted(seen)
