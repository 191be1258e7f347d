"""The transaction coordinator in a cluster, in process: per-partition tables and markers.

A stand-in replica manager says which partitions this broker leads (and in which epoch)
and answers ``wait_committed`` at once (or LEADERSHIP_LOST once the term is gone); the
logs, producer state and handlers are real. What is checked:

- routing: an id's table is that of ``partition_for(id, n)``; ids of a partition still
  loading answer COORDINATOR_LOAD_IN_PROGRESS, of one not led NOT_COORDINATOR;
- loading replays the partition's log; ``recover`` then finishes a prepared commit with
  the partition's leader epoch as coordinator epoch; resigning drops the table and a
  write in flight answers NOT_COORDINATOR;
- marker routing: each partition to its leader, the groups' ``__consumer_offsets``
  partitions too, gone partitions left out;
- WriteTxnMarkers on a cluster leader: appended in its epoch and answered once
  committed; NOT_LEADER_OR_FOLLOWER where it does not lead; an older coordinator epoch
  TRANSACTION_COORDINATOR_FENCED.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import attrs
import pytest
import trio
import trio.testing

from tests.clustered_broker import Replication, Term
from tests.unit.transactions.test_txn_coordinator import Services, append_marker, call, markers
from trio_broker.cluster.txn_marker_channel import TxnMarkerChannel, marker_targets, route_markers
from trio_broker.config import BrokerConfig
from trio_broker.handlers.describe_transactions import handle_describe_transactions
from trio_broker.handlers.find_coordinator import handle_find_coordinator
from trio_broker.handlers.write_txn_markers import handle_write_txn_markers
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import iter_batches
from trio_broker.services.cluster_view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.internal_topics import (
    CONSUMER_OFFSETS,
    TRANSACTION_STATE,
    partition_for,
)
from trio_broker.services.local_replication import LeadsNothing
from trio_broker.transactions import state as st
from trio_broker.transactions.coordinator import CoordinatorUnavailable, TransactionCoordinator
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator
from trio_broker.transactions.state import TxnMetadata, TxnState

PARTITIONS = 3


@attrs.define
class Sent:
    calls: list[tuple[str, int, int, bool, int, int]] = attrs.Factory(list)

    async def __call__(
        self, prepared: TxnMetadata, committed: bool, coordinator_epoch: int, txn_partition: int
    ) -> None:
        self.calls.append((prepared.transactional_id, prepared.producer_id,
                           prepared.producer_epoch, committed, coordinator_epoch,
                           txn_partition))  # fmt: skip


def ids_in(partition: int, count: int = 2) -> list[str]:
    """Transactional ids that hash to ``partition``."""
    found = []
    i = 0
    while len(found) < count:
        tid = f"tid-{i}"
        if partition_for(tid, PARTITIONS) == partition:
            found.append(tid)
        i += 1
    return found


@pytest.fixture
def clustered() -> tuple[Services, Replication, Sent]:
    services = Services(config=BrokerConfig(transaction_state_log_num_partitions=PARTITIONS))
    services.topics.create("a", 2)
    services.topics.create("b", 2)
    services.topics.create(TRANSACTION_STATE, PARTITIONS, internal=True)
    replication = Replication()
    sent = Sent()

    def make_table(
        partition: int, leader_epoch: int, log: Any, repl: Any, send: Any
    ) -> TransactionCoordinator:
        return TransactionCoordinator(
            log, topics=services.topics, producers=services.producers,
            durability=services.durability, appends=services.appends, groups=services.groups,
            allocate_producer_id=services.producers.allocator.allocate,
            write_marker=append_marker, now_ms=services.now_ms, replication=repl,
            txn_partition=partition, coordinator_epoch=leader_epoch, send_markers=send,
            owns_log=False,
        )  # fmt: skip

    coordinator = PartitionedTransactionCoordinator(PARTITIONS, make_table, LeadsNothing(0))
    coordinator.replication = replication
    coordinator.send_markers = sent
    services.transactions = coordinator
    services.replication = replication
    return services, replication, sent


def lead(
    services: Services, replication: Replication, topic: str, partition: int, epoch: int
) -> None:
    """As the replica manager's ``_become_leader``: this broker's term of a data
    partition, and its Partition taken in that term (the marker writer only looks it
    up)."""
    term = replication.terms[topic, partition] = Term(epoch)
    held = services.topics.get(topic)
    assert held is not None
    held.make_leader(partition, cast(Any, term), services.producers.entry(topic, partition))


def elect(services: Services, replication: Replication, partition: int, epoch: int) -> None:
    replication.terms[TRANSACTION_STATE, partition] = Term(epoch)
    log = services.topics.log(TRANSACTION_STATE, partition)
    services.transactions.elected(partition, epoch, log)


def resign(services: Services, replication: Replication, partition: int) -> None:
    del replication.terms[TRANSACTION_STATE, partition]
    services.transactions.resigned(partition)


async def init(services: Services, tid: str) -> Any:
    coordinator = services.transactions
    return await coordinator.init_producer_id(tid, -1, -1, 60_000, ErrorCode.PRODUCER_FENCED)


async def test_ids_route_to_their_partitions_table(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    coordinator = services.transactions
    [mine] = ids_in(1, 1)
    [elsewhere] = ids_in(2, 1)
    assert (await init(services, mine)).error == ErrorCode.NOT_COORDINATOR
    elect(services, replication, 1, 4)
    assert (await init(services, mine)).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert [t.txn_partition for t in coordinator.load_pending()] == [1]
    first = await init(services, mine)
    assert (first.error, first.producer_epoch) == (ErrorCode.NONE, 0)
    assert (await init(services, elsewhere)).error == ErrorCode.NOT_COORDINATOR
    # The record went into partition 1's log only.
    sizes = [services.topics.log(TRANSACTION_STATE, p).log_end_offset for p in range(3)]
    assert sizes == [0, 1, 0]
    # The record carries the leader's epoch (append_committed stamps it).
    log = services.topics.log(TRANSACTION_STATE, 1)
    [region] = log.read(0, 1 << 20, log.log_end_offset)
    [batch] = list(iter_batches(region.read_bytes()))
    assert batch.partition_leader_epoch == 4


async def test_named_leader_before_the_term_begins_is_load_in_progress(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    """The view names this broker leader of the id's partition before the replica
    manager begins the term: COORDINATOR_LOAD_IN_PROGRESS (retried here), not
    NOT_COORDINATOR (FindCoordinator would name this broker again)."""
    services, replication, _ = clustered
    [mine] = ids_in(1, 1)
    partitions = {p: PartitionInfo((1, 2), 2, 0, (1, 2)) for p in range(PARTITIONS)}
    replication.view.topics[TRANSACTION_STATE] = TopicInfo(
        TRANSACTION_STATE, uuid.uuid4(), partitions
    )
    assert (await init(services, mine)).error == ErrorCode.NOT_COORDINATOR
    partitions[1] = PartitionInfo((1, 2), 1, 1, (1, 2))
    assert (await init(services, mine)).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    elect(services, replication, 1, 1)
    services.transactions.load_pending()
    assert (await init(services, mine)).error == ErrorCode.NONE


async def test_a_new_leader_loads_the_log_and_finishes_a_prepared_commit(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, sent = clustered
    coordinator = services.transactions
    [tid] = ids_in(0, 1)
    elect(services, replication, 0, 0)
    coordinator.load_pending()
    producer = await init(services, tid)
    pid = producer.producer_id
    assert await coordinator.add_to_transaction(
        tid, pid, 0, [("a", 0), ("b", 1)], [], ErrorCode.PRODUCER_FENCED
    ) == ErrorCode.NONE  # fmt: skip
    # The PrepareCommit is written, then leadership moves before the markers.
    table = coordinator.tables[0]
    prepared = st.decide_end(table.get(tid), pending=False, producer_id=pid, producer_epoch=0,
                             committed=True, now_ms=services.now_ms(),
                             fenced_error=ErrorCode.PRODUCER_FENCED).target  # fmt: skip
    assert prepared is not None
    await table._write(tid, prepared)
    resign(services, replication, 0)
    assert coordinator.tables == {}
    assert coordinator.get(tid) is None
    # Elected again in epoch 3 (as the next leader would be): the log is replayed.
    elect(services, replication, 0, 3)
    [loaded] = coordinator.load_pending()
    assert loaded.get(tid).state == TxnState.PREPARE_COMMIT
    assert await loaded.recover() == 1
    assert sent.calls == [(tid, pid, 0, True, 3, 0)]  # coordinator epoch = leader epoch
    assert coordinator.get(tid).state == TxnState.COMPLETE_COMMIT


async def test_a_new_epoch_of_the_same_leadership_keeps_the_table(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    coordinator = services.transactions
    elect(services, replication, 2, 1)
    [table] = coordinator.load_pending()
    elect(services, replication, 2, 2)  # an ISR change: no resign in between
    assert coordinator.tables[2] is table and table.coordinator_epoch == 2
    assert coordinator.loading == {}


async def test_a_write_in_flight_when_leadership_goes_answers_not_coordinator(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    [tid] = ids_in(1, 1)
    elect(services, replication, 1, 0)
    services.transactions.load_pending()
    replication.hold = trio.Event()
    results: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def initialising() -> None:
            results.append(await init(services, tid))

        nursery.start_soon(initialising)
        await trio.testing.wait_all_tasks_blocked()
        resign(services, replication, 1)
        replication.hold.set()
    assert results[0].error == ErrorCode.NOT_COORDINATOR
    assert services.transactions.get(tid) is None


def test_markers_go_to_each_partitions_leader() -> None:
    view = ClusterView(1, {b: BrokerInfo(b, "127.0.0.1", 9000 + b) for b in (1, 2, 3)})

    def topic(name: str, leaders: list[int]) -> TopicInfo:
        return TopicInfo(name, uuid.uuid4(), {
            p: PartitionInfo((1, 2, 3), leader, 0, (1, 2, 3)) for p, leader in enumerate(leaders)
        })  # fmt: skip

    view.topics = {"a": topic("a", [1, 2, -1]), CONSUMER_OFFSETS: topic(CONSUMER_OFFSETS,
                                                                         [3, 3, 2])}  # fmt: skip
    meta = TxnMetadata("t", 7, producer_epoch=0, state=TxnState.PREPARE_COMMIT,
                       partitions=frozenset({("a", 0), ("a", 1), ("a", 2), ("gone", 0)}),
                       groups=frozenset({"g1"}))  # fmt: skip
    targets = marker_targets(meta, 3)
    offsets_partition = partition_for("g1", 3)
    assert targets == {("a", 0), ("a", 1), ("a", 2), ("gone", 0),
                       (CONSUMER_OFFSETS, offsets_partition)}  # fmt: skip
    by_leader, leaderless, gone = route_markers(targets, view)
    offsets_leader = [3, 3, 2][offsets_partition]
    expected: dict[int, list[tuple[str, int]]] = {1: [("a", 0)], 2: [("a", 1)]}
    expected.setdefault(offsets_leader, []).insert(0, (CONSUMER_OFFSETS, offsets_partition))
    assert by_leader == expected
    assert (leaderless, gone) == ([("a", 2)], [("gone", 0)])


def marker_request(coordinator_epoch: int, *partitions: tuple[str, int]) -> Any:
    Marker = m.WriteTxnMarkersRequest.WritableTxnMarker
    return m.WriteTxnMarkersRequest(markers=[Marker(
        producer_id=7, producer_epoch=0, transaction_result=True,
        coordinator_epoch=coordinator_epoch,
        topics=[Marker.WritableTxnMarkerTopic(name=t, partition_indexes=[p])
                for t, p in partitions],
    )])  # fmt: skip


async def write_markers(services: Services, request: Any) -> dict[tuple[str, int], int]:
    response = await call(services, handle_write_txn_markers, m.ApiKey.WRITE_TXN_MARKERS, 1,
                          request)  # fmt: skip
    return {(t.name, p.partition_index): p.error_code
            for t in response.markers[0].topics for p in t.partitions}  # fmt: skip


async def test_write_txn_markers_on_a_cluster_leader(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    lead(services, replication, "a", 0, 5)
    errors = await write_markers(services, marker_request(2, ("a", 0), ("a", 1), ("zz", 0)))
    # No replica of zz-0 here: UNKNOWN_TOPIC_OR_PARTITION, as Kafka's (and as a node
    # alone answers); the coordinator routes it again or, once gone, needs no marker.
    assert errors == {("a", 0): ErrorCode.NONE, ("a", 1): ErrorCode.NOT_LEADER_OR_FOLLOWER,
                      ("zz", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}  # fmt: skip
    assert markers(services, "a", 0) == [(7, 0, True)]
    assert markers(services, "a", 1) == []
    log = services.topics.log("a", 0)
    [region] = log.read(0, 1 << 20, log.log_end_offset)
    [batch] = list(iter_batches(region.read_bytes()))
    assert batch.partition_leader_epoch == 5
    # A marker from an older coordinator (a deposed leader of __transaction_state).
    errors = await write_markers(services, marker_request(1, ("a", 0)))
    assert errors == {("a", 0): ErrorCode.TRANSACTION_COORDINATOR_FENCED}
    assert markers(services, "a", 0) == [(7, 0, True)]


async def test_find_coordinator_answers_the_partitions_leader(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    request = m.FindCoordinatorRequest(key_type=1, coordinator_keys=["x"])

    async def find() -> Any:
        response = await call(services, handle_find_coordinator, m.ApiKey.FIND_COORDINATOR, 4,
                              request)  # fmt: skip
        return response.coordinators[0]

    first = await find()
    assert first.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert [name for name, *_ in replication.created] == [TRANSACTION_STATE]  # made on first use
    view = replication.view
    view.brokers = {b: BrokerInfo(b, "127.0.0.1", 9000 + b) for b in (1, 2, 3)}
    led = partition_for("x", PARTITIONS)
    view.topics[TRANSACTION_STATE] = TopicInfo(TRANSACTION_STATE, uuid.uuid4(), {
        p: PartitionInfo((1, 2, 3), 3 if p == led else -1, 0, (1, 2, 3))
        for p in range(PARTITIONS)
    })  # fmt: skip
    found = await find()
    assert (found.error_code, found.node_id, found.port) == (ErrorCode.NONE, 3, 9003)
    view.topics[TRANSACTION_STATE].partitions[led] = PartitionInfo((1, 2, 3), -1, 1, (1, 2, 3))
    assert (await find()).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_describe_transactions_answers_not_coordinator_elsewhere(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    [mine] = ids_in(0, 1)
    [elsewhere] = ids_in(1, 1)
    elect(services, replication, 0, 0)
    services.transactions.load_pending()
    await init(services, mine)
    request = m.DescribeTransactionsRequest(transactional_ids=[mine, elsewhere])
    response = await call(services, handle_describe_transactions,
                          m.ApiKey.DESCRIBE_TRANSACTIONS, 0, request)  # fmt: skip
    errors = [(s.transactional_id, s.error_code) for s in response.transaction_states]
    assert errors == [(mine, ErrorCode.NONE), (elsewhere, ErrorCode.NOT_COORDINATOR)]


async def test_produce_verification_asks_the_ids_coordinator(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    coordinator = services.transactions
    [here] = ids_in(0, 1)
    [there] = ids_in(2, 1)
    elect(services, replication, 0, 0)
    coordinator.load_pending()
    producer = await init(services, here)
    pid = producer.producer_id
    await coordinator.add_to_transaction(here, pid, 0, [("a", 0)], [], ErrorCode.PRODUCER_FENCED)
    # This broker's own table answers.
    assert await coordinator.verify_batches(here, pid, 0, [("a", 0), ("a", 1)]) == {
        ("a", 0): ErrorCode.NONE, ("a", 1): ErrorCode.INVALID_TXN_STATE,
    }  # fmt: skip
    assert await coordinator.verify_batches(here, pid, 1, [("a", 0)]) == {
        ("a", 0): ErrorCode.INVALID_TXN_STATE,  # an epoch the coordinator never gave
    }  # fmt: skip
    # Once the end begins, a late first batch is refused (the hanging transaction KIP-890
    # closes): the partition is no longer in an ongoing transaction.
    assert await coordinator.end_transaction(here, pid, 0, False, ErrorCode.PRODUCER_FENCED) == (
        ErrorCode.NONE
    )
    assert await coordinator.verify_batches(here, pid, 0, [("a", 0)]) == {
        ("a", 0): ErrorCode.INVALID_TXN_STATE,
    }  # fmt: skip
    # Another broker's coordinator is asked (AddPartitionsToTxn verify_only); what it
    # cannot answer now becomes NOT_ENOUGH_REPLICAS, which producers retry.
    asked: list[tuple[str, int, int, list[tuple[str, int]], int]] = []

    async def ask(tid: str, producer_id: int, epoch: int, partitions: Any, txn_partition: int
                  ) -> dict[tuple[str, int], ErrorCode]:  # fmt: skip
        asked.append((tid, producer_id, epoch, partitions, txn_partition))
        return {("a", 0): ErrorCode.NONE, ("b", 0): ErrorCode.NOT_COORDINATOR,
                ("b", 1): ErrorCode.PRODUCER_FENCED}  # fmt: skip

    coordinator.ask_coordinator = ask
    answers = await coordinator.verify_batches(there, 9, 3, [("a", 0), ("b", 0), ("b", 1)])
    assert answers == {("a", 0): ErrorCode.NONE, ("b", 0): ErrorCode.NOT_ENOUGH_REPLICAS,
                       ("b", 1): ErrorCode.INVALID_PRODUCER_EPOCH}  # fmt: skip
    assert asked == [(there, 9, 3, [("a", 0), ("b", 0), ("b", 1)], 2)]


def topic_led_by(name: str, leaders: list[int]) -> TopicInfo:
    return TopicInfo(name, uuid.uuid4(), {
        p: PartitionInfo((1, 2, 3), leader, 0, (1, 2, 3)) for p, leader in enumerate(leaders)
    })  # fmt: skip


async def test_the_channel_retries_until_each_leader_has_its_marker(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    """Partition a-1's leader is a broker that cannot be reached (nothing listens on its
    port): the channel retries; once the view names this broker as the new leader, the
    marker is appended here. a-0 is led here from the start; a gone partition needs no
    marker. Each local marker carries the coordinator epoch and this leader's epoch."""
    services, replication, _ = clustered
    view = replication.view
    view.brokers = {1: BrokerInfo(1, "127.0.0.1", 9001), 2: BrokerInfo(2, "127.0.0.1", 1)}
    view.topics = {"a": topic_led_by("a", [1, 2])}
    replication.terms[TRANSACTION_STATE, 0] = Term(4)
    lead(services, replication, "a", 0, 7)
    channel = TxnMarkerChannel(services, replication, offsets_partitions=3)
    meta = TxnMetadata("t", 11, producer_epoch=0, state=TxnState.PREPARE_ABORT,
                       partitions=frozenset({("a", 0), ("a", 1), ("gone", 0)}))  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.send, meta, False, 4, 0)
        with trio.fail_after(10):  # a first round: the local marker, the unreachable broker
            while markers(services, "a", 0) == []:  # noqa: ASYNC110 - plain data
                await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
        assert markers(services, "a", 0) == [(11, 0, False)]
        assert markers(services, "a", 1) == []
        view.topics = {"a": topic_led_by("a", [1, 1])}  # broker 1 (this one) took over
        lead(services, replication, "a", 1, 8)
    assert markers(services, "a", 1) == [(11, 0, False)]
    await channel.close()


async def test_the_channel_stops_when_this_broker_stops_coordinating(
    clustered: tuple[Services, Replication, Sent],
) -> None:
    services, replication, _ = clustered
    replication.view.brokers = {1: BrokerInfo(1, "127.0.0.1", 9001)}
    replication.view.topics = {"a": topic_led_by("a", [-1, -1])}  # no leader: rounds go on
    replication.terms[TRANSACTION_STATE, 0] = Term(4)
    channel = TxnMarkerChannel(services, replication, offsets_partitions=3)
    meta = TxnMetadata("t", 11, producer_epoch=0, state=TxnState.PREPARE_COMMIT,
                       partitions=frozenset({("a", 0)}))  # fmt: skip

    async def resign_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()  # a first round waits for a leader

        del replication.terms[TRANSACTION_STATE, 0]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(resign_soon)
        with pytest.raises(CoordinatorUnavailable) as raised:
            await channel.send(meta, True, 4, 0)
    assert raised.value.error_code == ErrorCode.NOT_COORDINATOR
