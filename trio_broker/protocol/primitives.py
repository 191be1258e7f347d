"""Kafka's primitive wire types as small pure functions.

The generated message codecs (``codec.py``) inline the fixed-size cases; the
variable-length ones (varints, compact lengths) live here so that they have one
implementation that Hypothesis and CrossHair can check. Every reader takes a
buffer and a position and returns ``(value, new_position)``; every reader raises
only :class:`~trio_broker.protocol.errors.ProtocolError` subclasses.
"""

from __future__ import annotations

import struct
import uuid

from trio_broker.protocol.errors import InvalidValueError, TruncatedError

Buffer = bytes | bytearray | memoryview

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")

#: A varint longer than this many bytes cannot hold a 32-bit (or 64-bit) value.
MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10

ZERO_UUID = uuid.UUID(int=0)


def read_uvarint(buf: Buffer, pos: int, max_bytes: int = MAX_VARINT_BYTES) -> tuple[int, int]:
    """Read an unsigned LEB128 varint.

    pre: 0 <= pos
    raises: TruncatedError, InvalidValueError
    post: __return__[1] > pos
    post: __return__[0] >= 0
    """
    result = 0
    shift = 0
    end = len(buf)
    for i in range(max_bytes):
        if pos + i >= end:
            raise TruncatedError("varint runs past the end of the buffer")
        byte = buf[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos + i + 1
        shift += 7
    raise InvalidValueError(f"varint longer than {max_bytes} bytes")


def write_uvarint(value: int) -> bytes:
    """Encode a non-negative int as an unsigned LEB128 varint.

    pre: 0 <= value < 2**64
    post: read_uvarint(__return__, 0, 10) == (value, len(__return__))
    """
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag_encode(value: int) -> int:
    """Map signed to unsigned so small magnitudes stay small (Kafka's varint/varlong).

    pre: -(2**63) <= value < 2**63
    post: __return__ >= 0
    post: zigzag_decode(__return__) == value
    """
    return (value << 1) ^ (value >> 63)


def zigzag_decode(value: int) -> int:
    """Inverse of :func:`zigzag_encode`.

    pre: value >= 0
    """
    return (value >> 1) ^ -(value & 1)


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """A signed (zigzag) 32-bit varint."""
    raw, pos = read_uvarint(buf, pos, MAX_VARINT_BYTES)
    return zigzag_decode(raw), pos


def read_varlong(buf: Buffer, pos: int) -> tuple[int, int]:
    """A signed (zigzag) 64-bit varint."""
    raw, pos = read_uvarint(buf, pos, MAX_VARLONG_BYTES)
    return zigzag_decode(raw), pos


def write_varint(value: int) -> bytes:
    """A signed (zigzag) varint; the same encoding serves varint and varlong."""
    return write_uvarint(zigzag_encode(value) & 0xFFFFFFFFFFFFFFFF)


def read_compact_length(buf: Buffer, pos: int) -> tuple[int, int]:
    """A compact (KIP-482) length: uvarint N+1, where 0 means null (returned as -1).

    pre: 0 <= pos
    raises: TruncatedError, InvalidValueError
    post: __return__[0] >= -1
    """
    raw, pos = read_uvarint(buf, pos)
    return raw - 1, pos


def check_available(buf: Buffer, pos: int, size: int) -> None:
    """Raise unless ``size`` bytes are present at ``pos``: allocate only after this check."""
    if size < 0:
        raise InvalidValueError(f"negative length {size}")
    if pos + size > len(buf):
        raise TruncatedError(f"need {size} bytes at {pos}, buffer has {len(buf) - pos}")


def read_int16(buf: Buffer, pos: int) -> tuple[int, int]:
    check_available(buf, pos, 2)
    return INT16.unpack_from(buf, pos)[0], pos + 2


def read_int32(buf: Buffer, pos: int) -> tuple[int, int]:
    check_available(buf, pos, 4)
    return INT32.unpack_from(buf, pos)[0], pos + 4


def read_nullable_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    """A classic (int16-length) nullable string, as in request headers."""
    size, pos = read_int16(buf, pos)
    if size == -1:
        return None, pos
    check_available(buf, pos, size)
    try:
        return str(buf[pos : pos + size], "utf-8"), pos + size
    except UnicodeDecodeError as exc:
        raise InvalidValueError("string is not valid UTF-8") from exc
