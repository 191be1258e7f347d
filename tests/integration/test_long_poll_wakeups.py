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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.integration.raw_client import RawClient
from trio_broker.handlers import fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

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


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(WAIT_S):
        # The count changes in the broker's tasks, which set no event a test could await.
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")


def waiting(broker: Broker) -> bool:
    """A fetch is registered in the purgatory (watching from its handler's read on)."""
    return broker.appends.statistics().waiters == 1


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The partitions of each read of the logs by a fetch."""
    done: list[tuple[int, ...]] = []
    read = fetch.read_partitions

    def recording(ctx: Any, request: m.FetchRequest, wanted: list[Any]) -> Any:
        done.append(tuple(p.partition for t in wanted for p in t.partitions))
        return read(ctx, request, wanted)

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
        await wait_until(lambda: waiting(broker), "the fetch to wait")
        assert reads_of_b() == 1  # the handler's read is the long poll's first
        await trio.to_thread.run_sync(produce, bootstrap, A)
        # The produce was answered after its append notified A, and the answer went
        # through the client's thread: a fetch woken by it would have read B by now.
        assert reads_of_b() == 1 and not answers
        await trio.to_thread.run_sync(produce, bootstrap, B)
        await wait_until(lambda: bool(answers), "the fetch's answer")
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
        await wait_until(lambda: waiting(broker), "the fetch to wait")
        assert reads == [(A, B)]
        await trio.to_thread.run_sync(produce, bootstrap, A)
        await wait_until(lambda: len(reads) == 2, "the fetch to look at A")
        assert reads[1] == (A,) and not answers  # one small record: not enough yet
        await trio.to_thread.run_sync(produce, bootstrap, B, 4000)
        await wait_until(lambda: bool(answers), "the fetch's answer")
    # B alone looked at, then one read of both to answer.
    assert reads[2:] == [(B,), (A, B)]
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
        await wait_until(lambda: waiting(broker), "the fetch to wait")
        await trio.to_thread.run_sync(delete_topic, bootstrap)
    (answer,) = answers
    assert answer.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
