"""A broker's own client to its peers (``cluster/broker_client.py``) starts every new
connection with nothing left of the old one.

Why it matters: a call that times out (or fails) in the middle of a response leaves
that response's first bytes read. The client closes the connection, and the next call
opens another; if those bytes were kept, they would be read as the start of the new
connection's first answer, so that answer (and, once the frames are misaligned, every
later one) would be misread: a peer connection that fails once would keep failing.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_broker.cluster.broker_client import BrokerClient, BrokerConnectionError
from trio_broker.protocol import messages as m
from trio_broker.protocol.framing import frame_size_prefix

API_VERSIONS = m.ApiKey.API_VERSIONS
VERSION = 0


async def read_request(stream: trio.abc.Stream) -> int:
    """Read one request frame from ``stream``; its correlation id."""
    data = bytearray()
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = await stream.receive_some()
        assert chunk, "the client hung up"
        data += chunk
    header, _ = m.decode_request(memoryview(data)[4:])
    return header.correlation_id


def answer(correlation_id: int) -> bytes:
    response = m.ApiVersionsResponse(error_code=0, api_keys=[])
    parts = m.encode_response(API_VERSIONS, VERSION, correlation_id, response)
    return b"".join(bytes(p) for p in parts)


async def test_a_call_cut_off_mid_answer_leaves_nothing_for_the_next_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    connections: list[trio.abc.Stream] = []

    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        ours, theirs = trio.testing.memory_stream_pair()
        connections.append(theirs)
        return ours

    client = BrokerClient("peer", 9092, "test", open_stream)
    request = m.ApiVersionsRequest()
    async with trio.open_nursery() as nursery:

        async def first_peer_answers_half() -> None:
            peer = connections[0]
            await read_request(peer)
            # A 100-byte answer announced, 10 bytes of it sent, then silence.
            await peer.send_all(frame_size_prefix(100) + bytes(10))

        async def second_peer_answers() -> None:
            peer = connections[1]
            await peer.send_all(answer(await read_request(peer)))

        await client.connect()
        nursery.start_soon(first_peer_answers_half)
        try:
            await client.call(API_VERSIONS, VERSION, request, timeout_s=1.0)
        except BrokerConnectionError:
            pass
        else:
            raise AssertionError("the half answer was taken as an answer")

        await client.connect()
        nursery.start_soon(second_peer_answers)
        response = await client.call(API_VERSIONS, VERSION, request, timeout_s=1.0)
        assert isinstance(response, m.ApiVersionsResponse)
        assert response.error_code == 0
    await client.close()
