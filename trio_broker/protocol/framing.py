"""Length-prefixed framing (sans-I/O).

Every Kafka request and response is an int32 size followed by that many bytes.
:class:`FrameReader` turns received bytes into frames. It checks the size
prefix the moment it arrives — a TLS ClientHello read as a length is ~369 MB —
and allocates a frame's buffer only after that check. For a large frame it
exposes the unfilled part of the frame buffer so the network layer can
``recv_into`` it directly, saving a copy of big Produce requests.
"""

from __future__ import annotations

import struct

from trio_broker.protocol.errors import FrameTooLargeError, InvalidValueError

_SIZE = struct.Struct(">i")

#: Kafka's default for ``socket.request.max.bytes``.
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024


class FrameReader:
    """Accumulate received bytes; hand out whole frames (without the size prefix)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._pending = bytearray()  # bytes not yet part of a frame body
        self._start = 0  # consumed prefix of _pending, compacted lazily
        self._body: bytearray | None = None  # a large frame being filled in place
        self._filled = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes held that are not yet handed out (for memory accounting)."""
        body = len(self._body) if self._body is not None else 0
        return len(self._pending) - self._start + body

    def body_target(self) -> memoryview | None:
        """The unfilled tail of a large frame, to receive into directly; else None."""
        if self._body is None:
            return None
        return memoryview(self._body)[self._filled :]

    def body_advance(self, count: int) -> None:
        """``count`` bytes were written into :meth:`body_target`."""
        assert self._body is not None and self._filled + count <= len(self._body)
        self._filled += count

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._body is not None:
            take = min(len(data), len(self._body) - self._filled)
            self._body[self._filled : self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        if data:
            self._pending += data

    def next_frame(self) -> bytearray | None:
        """Return the next complete frame, or None if more bytes are needed.

        Raises :class:`FrameTooLargeError` for a size over the limit and
        :class:`InvalidValueError` for a negative size; the caller should close.
        """
        if self._body is not None:
            if self._filled < len(self._body):
                return None
            frame, self._body, self._filled = self._body, None, 0
            return frame
        available = len(self._pending) - self._start
        if available < 4:
            self._compact()
            return None
        size = _SIZE.unpack_from(self._pending, self._start)[0]
        if size < 0:
            raise InvalidValueError(f"negative frame size {size}")
        if size > self.max_frame_size:
            raise FrameTooLargeError(f"frame of {size} bytes exceeds {self.max_frame_size}")
        body_start = self._start + 4
        if available - 4 >= size:
            frame = self._pending[body_start : body_start + size]
            self._start = body_start + size
            self._compact()
            return frame
        # Incomplete: move what we have into a buffer of the frame's exact size.
        self._body = bytearray(size)
        have = available - 4
        self._body[:have] = memoryview(self._pending)[body_start:]
        self._filled = have
        self._pending = bytearray()
        self._start = 0
        return None

    def _compact(self) -> None:
        if self._start and (self._start == len(self._pending) or self._start > 65536):
            del self._pending[: self._start]
            self._start = 0


def frame_size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)
