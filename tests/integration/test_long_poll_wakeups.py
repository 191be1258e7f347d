"""A long-poll fetch waits on its own partitions: a produce elsewhere does not wake it.

A raw Fetch (max wait 20 s) waits for records in partition B of an in-process broker.
A confluent-kafka producer writes to partition A: the fetch has read B once (in the
handler: its long poll watches from that read on) and reads nothing more. Before the
purgatory keyed by partition (issue 29) the produce to A woke it and it read B again.
Then a write to B: the fetch answers with the record.

A fetch of A and B that needs more bytes than one record, woken by a write to A, reads
A again and not B, and answers once B's write brings the bytes.

And, as Kafka completes a delayed fetch whose partition went away: deleting the topic
answers a fetch waiting on it at once (UNKNOWN_TOPIC_OR_PARTITION), not at its max wait.
An append that lands between the handler's read and the long poll's first wait is not
lost: the fetch answers with it. A follower's long poll, too, reads again only what
changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.integration.raw_client import RawClient
from tests.integration.stand_in import stand_in_replica_manager
from tests.waits import eventually
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.handlers import fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.server.fetch_waits import FetchWait
from trio_broker.services.cluster_view import PartitionInfo, TopicInfo

TOPIC, A, B = "wakeups", 0, 1
WAIT_S = 20.0


def fetch_b(
    max_wait_ms: int, partitions: tuple[int, ...] = (B,), min_bytes: int = 1
) -> m.FetchRequest:
    Req = m.FetchRequest
    parts = [
        Req.FetchTopic.FetchPartition(
            partition=p, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
        )
        for p in partitions
    ]
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=TOPIC, partitions=parts)],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


def produce(bootstrap: str, partition: int, size: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0})
    value = f"to {partition}".encode() + b"x" * size
    producer.produce(TOPIC, value=value, partition=partition)
    assert producer.flush(WAIT_S) == 0


def waiting(broker: Broker) -> bool:
    """A fetch is registered in the purgatory (watching from its handler's read on)."""
    return broker.appends.statistics().waiters == 1


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The partitions of each read of the logs by a fetch."""
    done: list[tuple[int, ...]] = []
    read = fetch.read_partitions

    def recording(
        ctx: Any,
        request: m.FetchRequest,
        wanted: list[Any],
        look: bool = False,
        first: bool = False,
    ) -> Any:
        done.append(tuple(p.partition for t in wanted for p in t.partitions))
        return read(ctx, request, wanted, look, first)

    monkeypatch.setattr(fetch, "read_partitions", recording)
    return done


@pytest.fixture
def reads_of_b(reads: list[tuple[int, ...]]) -> Callable[[], int]:
    """How often a fetch of partition B alone read the logs."""
    return lambda: reads.count((B,))


async def test_a_produce_to_another_partition_does_not_wake_a_long_poll(
    broker: Broker, bootstrap: str, reads_of_b: Callable[[], int]
) -> None:
    broker.topics.create(TOPIC, 2)
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, fetch_b(20_000)))

        nursery.start_soon(long_poll)
        await eventually(lambda: waiting(broker), "the fetch to wait")
        assert reads_of_b() == 1  # the handler's read is the long poll's first
        await trio.to_thread.run_sync(produce, bootstrap, A)
        # The produce was answered after its append notified A, and the answer went
        # through the client's thread: a fetch woken by it would have read B by now.
        assert reads_of_b() == 1 and not answers
        await trio.to_thread.run_sync(produce, bootstrap, B)
        await eventually(lambda: bool(answers), "the fetch's answer")
    (answer,) = answers
    assert answer.responses[0].partitions[0].records  # B's record
    # Answered: its watch is gone from the purgatory (nothing left registered).
    assert broker.appends.statistics().waiters == 0


async def test_a_woken_fetch_reads_again_only_the_partition_that_changed(
    broker: Broker, bootstrap: str, reads: list[tuple[int, ...]]
) -> None:
    broker.topics.create(TOPIC, 2)
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            request = fetch_b(20_000, partitions=(A, B), min_bytes=2000)
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, request))

        nursery.start_soon(long_poll)
        await eventually(lambda: waiting(broker), "the fetch to wait")
        assert reads == [(A, B)]
        await trio.to_thread.run_sync(produce, bootstrap, A)
        await eventually(lambda: len(reads) >= 2, "the fetch to look at A")
        # A alone looked at (its append, and its sync, which moves a node alone's high
        # watermark: one look or two); one small record: not enough yet.
        assert set(reads[1:]) == {(A,)} and not answers
        # A's record synced, so below the HW: the answer holds it.
        log_a = broker.topics.log(TOPIC, A)
        assert log_a is not None
        await eventually(lambda: log_a.durable_end_offset >= 1, "A's record to be synced")
        await trio.to_thread.run_sync(produce, bootstrap, B, 4000)
        await eventually(lambda: bool(answers), "the fetch's answer")
    # Each look read only the partition that changed (B's, and A's sync if it came
    # late), then one read of both to answer.
    assert reads[-1] == (A, B) and set(reads[1:-1]) <= {(A,), (B,)}
    (answer,) = answers
    assert [bool(p.records) for p in answer.responses[0].partitions] == [True, True]


def delete_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([TOPIC]).values():
        future.result(WAIT_S)


async def test_deleting_the_topic_answers_a_long_poll_on_it(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, 2)
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            # A minute's wait: longer than the raw client waits for any answer (10 s).
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, fetch_b(60_000)))

        nursery.start_soon(long_poll)
        await eventually(lambda: waiting(broker), "the fetch to wait")
        await trio.to_thread.run_sync(delete_topic, bootstrap)
    (answer,) = answers
    assert answer.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_an_append_between_the_read_and_the_park_answers_the_long_poll(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No lost wake-up: the record reaches B after the handler's read found nothing and
    before the shell first waits for the long poll (it subscribes to its wake-ups); the
    fetch (max wait a minute, longer than the raw client waits for any answer) answers
    with it."""
    topic = broker.topics.create(TOPIC, 2)
    subscribe = FetchWait.subscribe
    parked: list[float] = []

    def append_then_subscribe(self: FetchWait, wake: Callable[[], None]) -> Callable[[], None]:
        if not parked:
            # As a produce's append would: the record, its sync, the partition's notify.
            log_b = topic.logs[B]
            log_b.append(build_batch([(None, b"to 1")]), now_ms=0)
            broker.flusher.mark_dirty(log_b)
            broker.appends.notify(TOPIC, B)
            parked.append(trio.current_time())
        return subscribe(self, wake)

    monkeypatch.setattr(FetchWait, "subscribe", append_then_subscribe)
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        answer = await RawClient(stream).call(m.ApiKey.FETCH, 12, fetch_b(60_000))
    assert parked and trio.current_time() - parked[0] < WAIT_S
    assert answer.responses[0].partitions[0].records  # B's record


FOLLOWER = 99


async def lead_both(broker: Broker, throttle_rate: int | None = None) -> ReplicaManager:
    """The in-process broker leads A and B (epoch 1) with FOLLOWER as the other replica,
    as its replica manager would once the controller elected it. ``throttle_rate``: the
    leader throttles FOLLOWER (a replica a reassignment adds) at this rate, on a clock
    that stands still (the budget spent is what was charged)."""
    me = broker.config.node_id
    topic = broker.topics.create(TOPIC, 2)
    throttle = {} if throttle_rate is None else {"leader_throttle_rate": throttle_rate}
    still = {} if throttle_rate is None else {"now_ms": lambda: 0}
    manager = stand_in_replica_manager(broker, **still, **throttle)
    # A throttled joiner is out of the ISR: Kafka never throttles an in-sync replica.
    adding = () if throttle_rate is None else (FOLLOWER,)
    isr = (me, FOLLOWER) if throttle_rate is None else (me,)
    infos = {p: PartitionInfo((me, FOLLOWER), me, 1, isr, adding) for p in (A, B)}
    assert topic.topic_id is not None
    manager.view.topics[TOPIC] = TopicInfo(TOPIC, topic.topic_id, infos)
    for p, info in infos.items():
        await manager._become_leader(TOPIC, p, info)
    broker.replication = manager
    return manager


async def test_a_woken_follower_fetch_reads_again_only_the_partition_that_changed(
    broker: Broker, reads: list[tuple[int, ...]]
) -> None:
    """A follower's long poll, woken by a change to A that brings it nothing (its HW, say),
    reads A again, not B; a record on B answers it. Followers used to read everything at
    every wake-up (so that only the answer's read counted against the leader throttle:
    a look is not counted now)."""
    await lead_both(broker)
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            request = fetch_b(20_000, partitions=(A, B))
            request.replica_id = FOLLOWER
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, request))

        nursery.start_soon(long_poll)
        await eventually(lambda: waiting(broker), "the follower's fetch to wait")
        assert reads == [(A, B)]
        broker.appends.notify(TOPIC, A)
        await eventually(lambda: len(reads) == 2, "the fetch to look at A")
        assert reads[1] == (A,) and not answers
        await produce_raw(host, port, B)
        await eventually(lambda: bool(answers), "the fetch's answer")
    assert reads[2:] == [(B,), (A, B)]
    (answer,) = answers
    assert [bool(p.records) for p in answer.responses[0].partitions] == [False, True]


async def produce_raw(host: str, port: int, partition: int, size: int = 0) -> None:
    """A raw Produce (acks=1) through the produce handler: the clients' metadata would
    name no broker for the hand-made cluster of :func:`lead_both`."""
    batch = build_batch([(None, b"to %d" % partition + b"x" * size)])
    part = m.ProduceRequest.TopicProduceData.PartitionProduceData(
        index=partition, records=bytes(batch)
    )
    request = m.ProduceRequest(acks=1, timeout_ms=10_000, topic_data=[
        m.ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[part])])  # fmt: skip
    async with await trio.open_tcp_stream(host, port) as stream:
        produced = await RawClient(stream).call(m.ApiKey.PRODUCE, 9, request)
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.NONE


async def test_a_throttled_follower_pays_for_what_it_is_sent_not_for_its_looks(
    broker: Broker, reads: list[tuple[int, ...]]
) -> None:
    """A throttled follower's long poll looks at B after each record (the first too small
    for min_bytes); the leader's budget is charged for the answer's bytes only."""
    rate = 1 << 20
    manager = await lead_both(broker, throttle_rate=rate)
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            request = fetch_b(20_000, partitions=(A, B), min_bytes=3000)
            request.replica_id = FOLLOWER
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, request))

        nursery.start_soon(long_poll)
        await eventually(lambda: waiting(broker), "the follower's fetch to wait")
        await produce_raw(host, port, B, 2000)
        await eventually(lambda: len(reads) >= 2, "the fetch to look at B")
        assert not answers
        await produce_raw(host, port, B, 2000)
        await eventually(lambda: bool(answers), "the fetch's answer")
    # Looks at B alone, after each record (and after the leader's sync of it, which
    # moves the HW of a leader alone in its ISR: one look or two each), then the answer.
    assert reads[0] == reads[-1] == (A, B) and set(reads[1:-1]) == {(B,)}
    assert len(reads) >= 4
    (answer,) = answers
    sent = answer.responses[0].partitions[1].records
    assert sent is not None and len(sent) > 4000  # both records
    budget = manager.throttles.leader_throttle
    assert budget is not None and rate - budget.available(0) == len(sent)
