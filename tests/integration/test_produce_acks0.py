"""Produce with acks=0 has no response, so a failure is reported by closing the connection."""

from __future__ import annotations

import trio

from tests.integration.raw_client import create_topics_request
from tests.waits import eventually
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker


def produce_request(topic: str, acks: int, correlation_id: int) -> bytes:
    batch = build_batch([(b"k", b"v")])
    partition = m.ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(batch)
    )
    request = m.ProduceRequest(
        acks=acks,
        timeout_ms=1000,
        topic_data=[m.ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])],
    )
    return m.encode_request(m.ApiKey.PRODUCE, 9, correlation_id, "acks0-test", request)


async def read_frame(stream: trio.SocketStream) -> bytes | None:
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    return data[4:]


async def test_failed_acks0_produce_closes_the_connection(broker: Broker) -> None:
    host, port = broker.bound[0]
    broker.topics.create("exists", 1)
    stream = await trio.open_tcp_stream(host, port)
    with trio.fail_after(10):
        # A good acks=0 produce: no answer, the connection stays open; the next
        # request (acks=1) is answered and sees the first append before it.
        await stream.send_all(produce_request("exists", 0, 1))
        await stream.send_all(produce_request("exists", 1, 2))
        frame = await read_frame(stream)
        assert frame is not None
        correlation_id, response = m.decode_response(m.ApiKey.PRODUCE, 9, frame)
        assert correlation_id == 2
        assert response.responses[0].partition_responses[0].base_offset == 1
        # An acks=0 produce to a partition that does not exist: the broker closes.
        await stream.send_all(produce_request("exists-not", 0, 3))
        assert await read_frame(stream) is None
    assert broker.topics.get("exists").logs[0].log_end_offset == 2


async def test_acks0_produces_sent_just_before_a_close_are_all_written(broker: Broker) -> None:
    # An acks=0 producer closes as soon as its last request is on the wire (kcat does):
    # every request the broker read is still written, as Kafka does. The handler pool
    # used to drop what was queued behind a connection that had closed meanwhile.
    host, port = broker.bound[0]
    broker.topics.create("sent-then-closed", 1)
    stream = await trio.open_tcp_stream(host, port)
    count = 50
    await stream.send_all(b"".join(produce_request("sent-then-closed", 0, i) for i in range(count)))
    await stream.aclose()
    log = broker.topics.get("sent-then-closed").logs[0]
    await eventually(lambda: log.log_end_offset >= count, "every produce written")
    assert log.log_end_offset == count


async def test_any_request_sent_just_before_a_close_is_handled(broker: Broker) -> None:
    # Not only Produce: a client that sends CreateTopics (or an OffsetCommit) and closes
    # without waiting has still made the request, and Kafka carries it out. The handler
    # pool used to skip every request but Produce whose connection had closed by the
    # time a handler took it up.
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    names = [f"created-then-closed-{i}" for i in range(20)]
    await stream.send_all(b"".join(
        m.encode_request(m.ApiKey.CREATE_TOPICS, 5, i, "closing-admin", create_topics_request(name))
        for i, name in enumerate(names)
    ))  # fmt: skip
    await stream.aclose()
    await eventually(
        lambda: all(broker.topics.get(name) is not None for name in names), "every topic created"
    )
    assert [name for name in names if broker.topics.get(name) is None] == []
