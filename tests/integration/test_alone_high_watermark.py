"""A node alone's high watermark is its durable end (issue 29: a cluster of one, ISR =
{self}, HW = the durable end), on a real in-process broker over a socket.

The fsync of one partition is held (``Flusher.sync`` waits on a gate, in its worker
thread). A record produced with acks=1 is answered once appended, but a consumer's
Fetch is not answered it, nor a high watermark past it, while it is not synced: a power
cut then would lose it. A long poll waiting for it is answered once the sync comes,
woken by the sync itself (``Flusher.on_synced`` -> ``LocalReplication.log_synced``), not
at its max wait (two minutes, past this test's deadline).

A cluster's leader alone in its ISR counts its log the same way (``leader_synced``): its
term takes a sync when the flusher reports it (``ReplicaManager.log_synced``), so an
acks=1 record reaches a consumer's long poll then, not at the next refresh of the term
(the lag loop, every replica.lag.time.max.ms / 4, which the stand-in does not even run).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from tests.integration.raw_client import RawClient
from tests.integration.stand_in import stand_in_replica_manager
from tests.integration.test_long_poll_wakeups import waiting
from tests.waits import eventually
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.server.flusher import flush_log
from trio_broker.services.cluster_view import PartitionInfo, TopicInfo

TOPIC = "held"
#: A long poll's max wait that only a wake-up beats within the test's deadline.
LONG_POLL_MS = 120_000


async def produce(client: RawClient, value: bytes, acks: int) -> Any:
    P = m.ProduceRequest
    part = P.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(build_batch([(None, value)]))
    )
    body = P(acks=acks, timeout_ms=30_000,
             topic_data=[P.TopicProduceData(name=TOPIC, partition_data=[part])])  # fmt: skip
    return (await client.call(m.ApiKey.PRODUCE, 9, body)).responses[0].partition_responses[0]


def fetch_request(fetch_offset: int, max_wait_ms: int) -> m.FetchRequest:
    F = m.FetchRequest
    return F(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[F.FetchTopic(topic=TOPIC, partitions=[F.FetchTopic.FetchPartition(
            partition=0, fetch_offset=fetch_offset, log_start_offset=-1,
            partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip


async def long_poll(stream: trio.SocketStream, fetch_offset: int) -> Any:
    """A Fetch whose answer may take longer than ``RawClient.call`` waits (10 s)."""
    frame = m.encode_request(
        m.ApiKey.FETCH, 12, 1, "long-poll", fetch_request(fetch_offset, LONG_POLL_MS)
    )
    await stream.send_all(frame)
    received = bytearray()
    while len(received) < 4 or len(received) < 4 + struct.unpack(">i", received[:4])[0]:
        chunk = await stream.receive_some()
        assert chunk, "the broker closed the connection"
        received += chunk
    _, response = m.decode_response(m.ApiKey.FETCH, 12, bytes(received[4:]))
    return response.responses[0].partitions[0]


async def answer_once_waiting(
    broker: Broker, poller: trio.SocketStream, fetch_offset: int,
    meanwhile: Callable[[], Awaitable[None]],
) -> Any:  # fmt: skip
    """A long poll's answer: the poll is sent, and once the broker holds it waiting,
    ``meanwhile`` runs (what should wake it)."""
    answers: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def poll() -> None:
            answers.append(await long_poll(poller, fetch_offset))

        nursery.start_soon(poll)
        await eventually(lambda: waiting(broker), "the long poll to wait")
        await meanwhile()
    (part,) = answers
    return part


def offsets(part: Any) -> list[int]:
    return [
        batch.offset_of(record)
        for batch in iter_batches(bytes(part.records or b""))
        for record in batch.records()
    ]


async def test_a_consumer_of_a_node_alone_reads_only_what_is_synced(
    broker: Broker, tmp_path: Path
) -> None:
    broker.topics.create(TOPIC, 1)
    held_dir = tmp_path / "data" / f"{TOPIC}-0"
    gate = threading.Event()

    def held_sync(log: Any) -> int:
        if getattr(log, "directory", None) == held_dir:
            gate.wait()  # in the flusher's worker thread
        return flush_log(log)

    host, port = broker.bound[0]
    client = RawClient(await trio.open_tcp_stream(host, port), "hw")
    poller = await trio.open_tcp_stream(host, port)
    try:
        with trio.fail_after(60):
            assert (await produce(client, b"synced", acks=-1)).error_code == 0
            broker.flusher.sync = held_sync
            part = await produce(client, b"not synced", acks=1)  # answered once appended
            assert (part.error_code, part.base_offset) == (0, 1)
            answer = (await client.call(m.ApiKey.FETCH, 12, fetch_request(0, 0))).responses[0]
            part = answer.partitions[0]
            assert (part.error_code, part.high_watermark, offsets(part)) == (0, 1, [0])

            async def let_the_sync_through() -> None:  # the sync of offset 1
                gate.set()

            part = await answer_once_waiting(broker, poller, 1, let_the_sync_through)
            assert (part.error_code, part.high_watermark, offsets(part)) == (0, 2, [1])
    finally:
        gate.set()  # never leave the flusher's thread waiting
        await client.stream.aclose()
        await poller.aclose()


async def test_a_cluster_leader_alone_in_its_isr_shows_a_record_once_synced(
    broker: Broker,
) -> None:
    me = broker.config.node_id
    topic = broker.topics.create(TOPIC, 1)
    manager = stand_in_replica_manager(broker)
    info = PartitionInfo((me,), me, 1, (me,))
    assert topic.topic_id is not None
    manager.view.topics[TOPIC] = TopicInfo(TOPIC, topic.topic_id, {0: info})
    await manager._become_leader(TOPIC, 0, info)
    broker.replication = manager  # as broker_node.py's joined() would
    host, port = broker.bound[0]
    client = RawClient(await trio.open_tcp_stream(host, port), "hw")
    poller = await trio.open_tcp_stream(host, port)
    try:
        with trio.fail_after(60):

            async def produce_acks_1() -> None:
                part = await produce(client, b"acks=1", acks=1)
                assert (part.error_code, part.base_offset) == (0, 0)

            part = await answer_once_waiting(broker, poller, 0, produce_acks_1)
            assert (part.error_code, part.high_watermark, offsets(part)) == (0, 1, [0])
    finally:
        await client.stream.aclose()
        await poller.aclose()
