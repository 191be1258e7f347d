"""A long poll with a partition that failed to read answers at once, as Kafka's does.

Kafka's ReplicaManager.fetchMessages answers a fetch without waiting when any partition
it read has an error (an offset out of range, another leader, a leader epoch that
differs, a storage error). Errors found before reading (the topic is not authorized,
unknown, or has no such partition) are answered by KafkaApis itself: they are not
waited on and do not end the wait of the other partitions, but a fetch with nothing
else left answers at once. Raw Fetch v12 requests over a socket to an in-process broker.
"""

from __future__ import annotations

import pytest
import trio

from tests.integration.raw_client import RawClient
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

TOPIC = "long-poll-errors"
Req = m.FetchRequest
#: Long enough that an answer well before it cannot be a wait that ran out.
MAX_WAIT_MS = 5000


def fetch(max_wait_ms: int, *wanted: tuple[str, int, int]) -> m.FetchRequest:
    """A consumer's fetch of (topic, partition, fetch offset)s, min_bytes 1."""
    topics = [
        Req.FetchTopic(
            topic=topic,
            partitions=[
                Req.FetchTopic.FetchPartition(
                    partition=p,
                    fetch_offset=offset,
                    log_start_offset=-1,
                    partition_max_bytes=1 << 20,
                )
                for name, p, offset in wanted
                if name == topic
            ],
        )
        for topic in dict.fromkeys(name for name, _, _ in wanted)
    ]
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1, topics=topics,
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def timed_fetch(broker: Broker, request: m.FetchRequest) -> tuple[float, m.FetchResponse]:
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        start = trio.current_time()
        response = await RawClient(stream).call(m.ApiKey.FETCH, 12, request)
        return trio.current_time() - start, response


def errors(response: m.FetchResponse) -> dict[tuple[str, int], int]:
    return {
        (t.topic, p.partition_index): p.error_code for t in response.responses for p in t.partitions
    }


async def test_an_offset_out_of_range_answers_a_long_poll_at_once(broker: Broker) -> None:
    # Fails on the old code: it waited the whole max wait for the empty partition 0.
    broker.topics.create(TOPIC, 2)
    request = fetch(MAX_WAIT_MS, (TOPIC, 0, 0), (TOPIC, 1, 5))  # partition 1 is empty
    took, response = await timed_fetch(broker, request)
    assert errors(response) == {
        (TOPIC, 0): ErrorCode.NONE, (TOPIC, 1): ErrorCode.OFFSET_OUT_OF_RANGE,
    }  # fmt: skip
    assert took < MAX_WAIT_MS / 1000 / 2, took
    assert broker.appends.statistics().registered == 0  # it never waited


async def test_a_fetch_of_only_unknown_partitions_answers_at_once(broker: Broker) -> None:
    # Fails on the old code: it waited the whole max wait on partitions that are not.
    broker.topics.create(TOPIC, 1)
    request = fetch(MAX_WAIT_MS, (TOPIC, 7, 0), ("no-such-topic", 0, 0))
    took, response = await timed_fetch(broker, request)
    assert errors(response) == {
        (TOPIC, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert took < MAX_WAIT_MS / 1000 / 2, took


@pytest.mark.parametrize("unknown", [(TOPIC, 7), ("no-such-topic", 0)])
async def test_an_unknown_partition_beside_a_known_one_waits_on_the_known_one(
    broker: Broker, unknown: tuple[str, int]
) -> None:
    # As Kafka: the unknown partition is answered before the read and not waited on;
    # the empty partition 0 is, for the max wait (kept short here), and nothing else
    # is watched.
    broker.topics.create(TOPIC, 1)
    max_wait_ms = 1500
    async with trio.open_nursery() as nursery:
        took: list[float] = []

        async def long_poll() -> None:
            took.append(
                (await timed_fetch(broker, fetch(max_wait_ms, (TOPIC, 0, 0), (*unknown, 0))))[0]
            )

        nursery.start_soon(long_poll)
        with trio.fail_after(10):
            while broker.appends.statistics().waiters == 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert broker.appends.statistics().partitions == 1  # partition 0 alone
    assert took[0] >= max_wait_ms / 1000 * 0.9, took
