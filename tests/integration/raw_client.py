"""A minimal Kafka client speaking our codec over one Trio stream (for raw-protocol tests)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker


class RawClient:
    """One connection: ``call`` sends a request and returns the decoded response."""

    def __init__(self, stream: trio.SocketStream, client_id: str = "raw-test") -> None:
        self.stream = stream
        self.client_id = client_id
        self.correlation_id = 0
        self.buf = bytearray()

    async def _read_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = await self.stream.receive_some(65536)
            assert chunk, "broker closed the connection"
            self.buf += chunk
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        self.correlation_id += 1
        frame = m.encode_request(api_key, version, self.correlation_id, self.client_id, request)
        await self.stream.send_all(frame)
        with trio.fail_after(10):
            (size,) = struct.unpack(">i", await self._read_exactly(4))
            body = await self._read_exactly(size)
        correlation_id, response = m.decode_response(api_key, version, body)
        assert correlation_id == self.correlation_id
        return response


def create_topics_request(name: str, partitions: int = 1) -> m.CreateTopicsRequest:
    """CreateTopics of one topic, replication factor 1, no configs, waiting up to 10 s."""
    Req = m.CreateTopicsRequest
    topic = Req.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                               assignments=[], configs=[])  # fmt: skip
    return Req(topics=[topic], timeout_ms=10_000, validate_only=False)


@asynccontextmanager
async def file_broker_and_client(data_dir: Path) -> AsyncIterator[tuple[Broker, RawClient]]:
    """An in-process broker on ``data_dir`` (file storage, a free port) and one raw
    client connected to it; the broker shuts down cleanly on the way out."""
    config = BrokerConfig(port=0, data_dir=data_dir, storage="file")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        client = RawClient(await trio.open_tcp_stream("127.0.0.1", broker.bound[0][1]))
        try:
            yield broker, client
        finally:
            await client.stream.aclose()
            await broker.shutdown()
