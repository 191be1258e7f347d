"""A connection never has more requests in flight than ``max.in.flight.per.connection``.

A client pipelines eight long-polling Fetch requests on one connection of an
in-process broker whose cap is 3. The reader takes requests until three are read and
unanswered, then stops reading (the connection is muted for IN_FLIGHT_LIMIT) until an
answer goes out. Sampled every few milliseconds while the fetches wait, the count of
requests read and not yet answered reaches the cap and never passes it; every request
is answered, in order. (An audit planted `>` for `>=` in the reader's check, letting a
fourth request in, and nothing caught it: issue 31.)
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker

CAP, REQUESTS, TOPIC = 3, 8, "capped"


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage="memory", max_in_flight_per_connection=CAP
    )


def long_poll(max_wait_ms: int) -> m.FetchRequest:
    Req = m.FetchRequest
    partition = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=TOPIC, partitions=[partition])],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def read_frame(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    while len(buffer) < 4 or len(buffer) < 4 + struct.unpack(">i", buffer[:4])[0]:
        chunk = await stream.receive_some(65536)
        assert chunk, "the broker closed the connection"
        buffer += chunk
    size = struct.unpack(">i", buffer[:4])[0]
    frame = bytes(buffer[4 : 4 + size])
    del buffer[: 4 + size]
    return frame


async def test_the_reader_stops_at_the_cap_and_answers_everything_in_order(
    broker: Broker,
) -> None:
    broker.topics.create(TOPIC, 1)
    host, port = broker.bound[0]
    frames = b"".join(
        m.encode_request(m.ApiKey.FETCH, 12, correlation_id, "capped", long_poll(200))
        for correlation_id in range(1, REQUESTS + 1)
    )
    peak, answered = 0, []
    async with await trio.open_tcp_stream(host, port) as stream:
        await stream.send_all(frames)  # all eight at once: the socket buffers what is not read

        async def sample() -> None:
            nonlocal peak
            while True:
                for conn in list(broker.connections.values()):
                    peak = max(peak, conn.sequencer.in_flight)
                await trio.sleep(0.002)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            buffer = bytearray()
            with trio.fail_after(60):
                for _ in range(REQUESTS):
                    body = await read_frame(stream, buffer)
                    correlation_id, answer = m.decode_response(m.ApiKey.FETCH, 12, body)
                    assert isinstance(answer, m.FetchResponse) and answer.error_code == 0
                    answered.append(correlation_id)
            nursery.cancel_scope.cancel()
    assert answered == list(range(1, REQUESTS + 1))
    assert peak == CAP, f"{peak} requests in flight on a connection capped at {CAP}"
