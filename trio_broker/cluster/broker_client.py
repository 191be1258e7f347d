"""A broker's own Kafka client for talking to other brokers (replica fetches).

One connection, one request at a time, our codec both ways: enough for a follower that
sends a Fetch, waits for its answer, appends and sends the next.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trio_broker.protocol import messages as m
from trio_broker.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from trio_broker.protocol.primitives import INT32

__all__ = ["BrokerClient", "BrokerConnectionError", "OpenStream"]

#: Opens a byte stream to (host, port): TCP by default; the deterministic simulation
#: (sim/) passes its in-memory network's.
OpenStream = Callable[[str, int], Awaitable[trio.abc.Stream]]


class BrokerConnectionError(Exception):
    """The other broker could not be reached, hung up, or sent something unreadable."""


class BrokerClient:
    def __init__(
        self, host: str, port: int, client_id: str, open_stream: OpenStream | None = None
    ) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._open_stream: OpenStream = open_stream or trio.open_tcp_stream
        self._stream: trio.abc.Stream | None = None
        self._buffer = bytearray()
        self._correlation = itertools.count(1)

    async def connect(self, timeout_s: float = 5.0) -> None:
        try:
            with trio.fail_after(timeout_s):
                self._stream = await self._open_stream(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise BrokerConnectionError(f"{self.host}:{self.port}: {exc}") from None

    async def close(self) -> None:
        # What was read of an unfinished answer belongs to this connection alone: kept,
        # it would be taken for the start of the next connection's first answer.
        self._buffer.clear()
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def call(self, api_key: int, version: int, request: Any, timeout_s: float) -> Any:
        """Send ``request`` and return the decoded response."""
        if self._stream is None:
            await self.connect()
        assert self._stream is not None
        correlation_id = next(self._correlation)
        frame = m.encode_request(api_key, version, correlation_id, self.client_id, request)
        try:
            with trio.fail_after(timeout_s):
                await self._stream.send_all(frame)
                body = await self._read_frame()
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            await self.close()
            raise BrokerConnectionError(f"{self.host}:{self.port}: {exc!r}") from None
        try:
            got, response = m.decode_response(api_key, version, body)
        except m.ProtocolError as exc:
            await self.close()
            raise BrokerConnectionError(f"unreadable response: {exc}") from None
        if got != correlation_id:
            await self.close()
            raise BrokerConnectionError(f"correlation id {got}, expected {correlation_id}")
        return response

    async def _read_frame(self) -> bytes:
        assert self._stream is not None
        while True:
            if len(self._buffer) >= 4:
                size = INT32.unpack_from(self._buffer, 0)[0]
                if not 0 <= size <= DEFAULT_MAX_FRAME_SIZE:
                    raise OSError(f"response size {size} out of range")
                if len(self._buffer) >= 4 + size:
                    body = bytes(self._buffer[4 : 4 + size])
                    del self._buffer[: 4 + size]
                    return body
            chunk = await self._stream.receive_some(1 << 20)
            if not chunk:
                raise OSError("connection closed")
            self._buffer += chunk
