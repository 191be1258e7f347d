"""A minimal Kafka client speaking our codec over one Trio stream (for raw-protocol tests)."""

from __future__ import annotations

import struct
from typing import Any

import trio

from trio_broker.protocol import messages as m


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
