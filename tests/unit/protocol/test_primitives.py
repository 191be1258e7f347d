"""Kafka's primitive wire types: round trips over whole ranges, exact encodings, short input.

``trio_broker/protocol/primitives.py`` holds the one implementation of varints, zigzag,
compact lengths, bounds checks and header strings. These properties pin it to the
encodings Kafka's ``ByteUtils`` produces (LEB128, zigzag) and to the errors the codec
promises: a short buffer raises :class:`TruncatedError`, a value out of range
:class:`InvalidValueError`, and nothing else escapes.
"""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.protocol.errors import InvalidValueError, ProtocolError, TruncatedError
from trio_broker.protocol.primitives import (
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    MAX_VARINT_BYTES,
    MAX_VARLONG_BYTES,
    UINT16,
    UINT32,
    ZERO_UUID,
    check_available,
    read_compact_length,
    read_int16,
    read_int32,
    read_nullable_string,
    read_uvarint,
    read_varint,
    read_varlong,
    write_uvarint,
    write_varint,
    zigzag_decode,
    zigzag_encode,
)

INT32_RANGE = st.integers(-(2**31), 2**31 - 1)
INT64_RANGE = st.integers(-(2**63), 2**63 - 1)
UINT32_RANGE = st.integers(0, 2**32 - 1)
UINT64_RANGE = st.integers(0, 2**64 - 1)
#: Junk in front of and behind a value: readers must honour ``pos`` and stop at the end.
PADDING = st.binary(max_size=6)


def _uvarint_reference(value: int) -> bytes:
    """LEB128 written the textbook way, independent of the implementation under test."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


# --- exact encodings ------------------------------------------------------------------

KNOWN_UVARINTS = [
    (0, b"\x00"),
    (1, b"\x01"),
    (0x7F, b"\x7f"),
    (0x80, b"\x80\x01"),
    (0xFF, b"\xff\x01"),
    (300, b"\xac\x02"),
    (0x3FFF, b"\xff\x7f"),
    (0x4000, b"\x80\x80\x01"),
    (2**21 - 1, b"\xff\xff\x7f"),
    (2**28, b"\x80\x80\x80\x80\x01"),
    (2**31 - 1, b"\xff\xff\xff\xff\x07"),
    (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    (2**63 - 1, b"\xff" * 8 + b"\x7f"),
    (2**64 - 1, b"\xff" * 9 + b"\x01"),
]


@pytest.mark.parametrize(("value", "encoded"), KNOWN_UVARINTS)
def test_uvarint_known_encodings(value: int, encoded: bytes) -> None:
    assert write_uvarint(value) == encoded
    assert read_uvarint(encoded, 0, MAX_VARLONG_BYTES) == (value, len(encoded))


KNOWN_ZIGZAG = [
    (0, 0, b"\x00"),
    (-1, 1, b"\x01"),
    (1, 2, b"\x02"),
    (-2, 3, b"\x03"),
    (2, 4, b"\x04"),
    (-64, 127, b"\x7f"),
    (64, 128, b"\x80\x01"),
    (150, 300, b"\xac\x02"),
    (2**31 - 1, 2**32 - 2, b"\xfe\xff\xff\xff\x0f"),
    (-(2**31), 2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    (2**63 - 1, 2**64 - 2, b"\xfe" + b"\xff" * 8 + b"\x01"),
    (-(2**63), 2**64 - 1, b"\xff" * 9 + b"\x01"),
]


@pytest.mark.parametrize(("signed", "unsigned", "encoded"), KNOWN_ZIGZAG)
def test_zigzag_known_values(signed: int, unsigned: int, encoded: bytes) -> None:
    assert zigzag_encode(signed) == unsigned
    assert zigzag_decode(unsigned) == signed
    assert write_varint(signed) == encoded
    assert read_varlong(encoded, 0) == (signed, len(encoded))
    if len(encoded) <= MAX_VARINT_BYTES:
        assert read_varint(encoded, 0) == (signed, len(encoded))


def test_varint_of_minus_one_is_one_byte_01() -> None:
    # Kafka writes a null key/value as varint -1: a single 0x01 byte.
    assert write_varint(-1) == b"\x01"
    assert read_varint(b"\x01", 0) == (-1, 1)


def test_compact_length_known_values() -> None:
    assert read_compact_length(b"\x00", 0) == (-1, 1)  # null
    assert read_compact_length(b"\x01", 0) == (0, 1)  # empty
    assert read_compact_length(b"\x04", 0) == (3, 1)
    assert read_compact_length(b"\x80\x01", 0) == (127, 2)
    assert read_compact_length(b"\xac\x02", 0) == (299, 2)


def test_struct_layouts_are_big_endian_kafka_types() -> None:
    assert INT8.pack(-1) == b"\xff"
    assert INT16.pack(-2) == b"\xff\xfe"
    assert UINT16.pack(0xFFFE) == b"\xff\xfe"
    assert INT32.pack(1) == b"\x00\x00\x00\x01"
    assert UINT32.pack(2**32 - 1) == b"\xff\xff\xff\xff"
    assert INT64.pack(-(2**63)) == b"\x80" + b"\x00" * 7
    assert FLOAT64.pack(1.0) == b"\x3f\xf0" + b"\x00" * 6
    assert ZERO_UUID.bytes == b"\x00" * 16
    with pytest.raises(struct.error):
        INT8.pack(128)
    with pytest.raises(struct.error):
        UINT16.pack(-1)


# --- round trips over the whole ranges -------------------------------------------------


@given(UINT64_RANGE, PADDING, PADDING)
def test_uvarint_round_trip_whole_range(value: int, before: bytes, after: bytes) -> None:
    encoded = write_uvarint(value)
    assert encoded == _uvarint_reference(value)
    assert len(encoded) == max(1, -(-value.bit_length() // 7))
    buf = before + encoded + after
    assert read_uvarint(buf, len(before), MAX_VARLONG_BYTES) == (value, len(before) + len(encoded))


@given(UINT32_RANGE)
def test_uvarint_32_bit_values_fit_the_default_limit(value: int) -> None:
    encoded = write_uvarint(value)
    assert len(encoded) <= MAX_VARINT_BYTES
    assert read_uvarint(encoded, 0) == (value, len(encoded))
    assert read_uvarint(memoryview(bytearray(encoded)), 0) == (value, len(encoded))


@given(INT64_RANGE)
def test_zigzag_round_trip_and_small_magnitudes_stay_small(value: int) -> None:
    unsigned = zigzag_encode(value)
    assert 0 <= unsigned < 2**64
    assert zigzag_decode(unsigned) == value
    # zigzag interleaves: 0, -1, 1, -2, 2, ...
    assert unsigned == (2 * value if value >= 0 else -2 * value - 1)


@given(INT32_RANGE, PADDING, PADDING)
def test_varint_round_trip_int32(value: int, before: bytes, after: bytes) -> None:
    encoded = write_varint(value)
    assert len(encoded) <= MAX_VARINT_BYTES
    buf = before + encoded + after
    assert read_varint(buf, len(before)) == (value, len(before) + len(encoded))


@given(INT64_RANGE, PADDING, PADDING)
def test_varlong_round_trip_int64(value: int, before: bytes, after: bytes) -> None:
    encoded = write_varint(value)
    assert len(encoded) <= MAX_VARLONG_BYTES
    buf = before + encoded + after
    assert read_varlong(buf, len(before)) == (value, len(before) + len(encoded))


@given(st.integers(-1, 2**31 - 2), PADDING)
def test_compact_length_round_trip(length: int, before: bytes) -> None:
    encoded = write_uvarint(length + 1)
    assert read_compact_length(before + encoded, len(before)) == (
        length,
        len(before) + len(encoded),
    )


@given(st.integers(-(2**15), 2**15 - 1), PADDING, PADDING)
def test_read_int16_whole_range(value: int, before: bytes, after: bytes) -> None:
    buf = before + INT16.pack(value) + after
    assert read_int16(buf, len(before)) == (value, len(before) + 2)


@given(INT32_RANGE, PADDING, PADDING)
def test_read_int32_whole_range(value: int, before: bytes, after: bytes) -> None:
    buf = before + INT32.pack(value) + after
    assert read_int32(buf, len(before)) == (value, len(before) + 4)


@given(st.one_of(st.none(), st.text(max_size=40)), PADDING, PADDING)
def test_nullable_string_round_trip(text: str | None, before: bytes, after: bytes) -> None:
    if text is None:
        encoded = INT16.pack(-1)
    else:
        raw = text.encode("utf-8", "surrogatepass")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return  # lone surrogates cannot be sent as UTF-8
        encoded = INT16.pack(len(raw)) + raw
    buf = before + encoded + after
    assert read_nullable_string(buf, len(before)) == (text, len(before) + len(encoded))


@given(INT64_RANGE, st.floats(allow_nan=False), st.uuids())
def test_fixed_width_layouts_round_trip(i64: int, f64: float, uid: uuid.UUID) -> None:
    assert INT64.unpack(INT64.pack(i64))[0] == i64
    assert FLOAT64.unpack(FLOAT64.pack(f64))[0] == f64
    assert uuid.UUID(bytes=uid.bytes) == uid


# --- boundaries and errors -------------------------------------------------------------


def test_empty_nullable_string_is_empty_not_null() -> None:
    assert read_nullable_string(b"\x00\x00", 0) == ("", 2)
    assert read_nullable_string(b"\x00\x00rest", 0) == ("", 2)


def test_nullable_string_null_and_exact_fit() -> None:
    assert read_nullable_string(b"\xff\xff", 0) == (None, 2)
    assert read_nullable_string(b"\x00\x03abc", 0) == ("abc", 5)
    assert read_nullable_string(b"xx\x00\x01hrest", 2) == ("h", 5)
    assert read_nullable_string(b"\x00\x02\xc3\xa9", 0) == ("é", 4)


def test_nullable_string_negative_length_other_than_minus_one_is_invalid() -> None:
    with pytest.raises(InvalidValueError, match=r"^negative length -2$"):
        read_nullable_string(b"\xff\xfe", 0)
    with pytest.raises(InvalidValueError, match=r"^negative length -32768$"):
        read_nullable_string(b"\x80\x00abc", 0)


def test_nullable_string_must_be_utf8() -> None:
    with pytest.raises(InvalidValueError, match=r"^string is not valid UTF-8$") as info:
        read_nullable_string(b"\x00\x01\xff", 0)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_nullable_string_truncated() -> None:
    with pytest.raises(TruncatedError, match=r"^need 3 bytes at 2, buffer has 2$"):
        read_nullable_string(b"\x00\x03ab", 0)
    with pytest.raises(TruncatedError, match=r"^need 2 bytes at 0, buffer has 1$"):
        read_nullable_string(b"\x00", 0)


def test_check_available_boundaries() -> None:
    check_available(b"abc", 0, 3)  # exact fit
    check_available(b"abc", 3, 0)  # nothing needed at the end
    check_available(b"abc", 1, 0)
    check_available(b"", 0, 0)
    with pytest.raises(TruncatedError, match=r"^need 4 bytes at 0, buffer has 3$"):
        check_available(b"abc", 0, 4)
    with pytest.raises(TruncatedError, match=r"^need 1 bytes at 3, buffer has 0$"):
        check_available(b"abc", 3, 1)
    with pytest.raises(InvalidValueError, match=r"^negative length -1$"):
        check_available(b"abc", 0, -1)


def test_fixed_width_readers_exact_fit_and_truncation() -> None:
    assert read_int16(b"\x01\x02", 0) == (0x0102, 2)
    assert read_int32(b"\x80\x00\x00\x00", 0) == (-(2**31), 4)
    assert read_int32(b"..\x00\x00\x01\x00", 2) == (256, 6)
    with pytest.raises(TruncatedError, match=r"^need 2 bytes at 0, buffer has 1$"):
        read_int16(b"\x01", 0)
    with pytest.raises(TruncatedError, match=r"^need 2 bytes at 1, buffer has 1$"):
        read_int16(b"\x01\x02", 1)
    with pytest.raises(TruncatedError, match=r"^need 4 bytes at 0, buffer has 3$"):
        read_int32(b"\x01\x02\x03", 0)
    with pytest.raises(TruncatedError, match=r"^need 4 bytes at 2, buffer has 3$"):
        read_int32(b"\x00\x00\x01\x02\x03", 2)


@pytest.mark.parametrize(
    ("buf", "pos"),
    [
        (b"", 0),
        (b"\x80", 0),
        (b"\xff\xff", 0),
        (b"\x00\x80\x80", 1),
        (b"\x01", 1),
        (b"\xff\xff\xff\xff", 0),
    ],
)
def test_truncated_varints_raise_truncated(buf: bytes, pos: int) -> None:
    for reader in (read_varint, read_varlong, read_compact_length):
        with pytest.raises(TruncatedError, match=r"^varint runs past the end of the buffer$"):
            reader(buf, pos)
    with pytest.raises(TruncatedError, match=r"^varint runs past the end of the buffer$"):
        read_uvarint(buf, pos)


@given(UINT64_RANGE.filter(lambda v: v >= 0x80))
def test_every_strict_prefix_of_a_multibyte_varint_is_truncated(value: int) -> None:
    encoded = write_uvarint(value)
    for cut in range(len(encoded)):
        with pytest.raises(TruncatedError):
            read_uvarint(encoded[:cut], 0, MAX_VARLONG_BYTES)


def test_overlong_varints_are_invalid() -> None:
    six = b"\x80\x80\x80\x80\x80\x00"
    with pytest.raises(InvalidValueError, match=r"^varint longer than 5 bytes$"):
        read_uvarint(six, 0)
    with pytest.raises(InvalidValueError, match=r"^varint longer than 5 bytes$"):
        read_varint(six, 0)
    with pytest.raises(InvalidValueError, match=r"^varint longer than 5 bytes$"):
        read_compact_length(six, 0)
    # The same six bytes are a valid varlong (value 0, non-canonical but accepted).
    assert read_varlong(six, 0) == (0, 6)
    eleven = b"\x80" * 10 + b"\x00"
    with pytest.raises(InvalidValueError, match=r"^varint longer than 10 bytes$"):
        read_varlong(eleven, 0)
    with pytest.raises(InvalidValueError, match=r"^varint longer than 0 bytes$"):
        read_uvarint(b"\x00", 0, 0)


def test_the_last_allowed_byte_is_read() -> None:
    # Exactly max_bytes long: accepted; the last byte's bits land at shift 7 * (n - 1).
    assert read_uvarint(b"\x80\x80\x80\x80\x01", 0) == (2**28, 5)
    assert read_uvarint(b"\x80\x01", 0, 2) == (128, 2)
    assert read_uvarint(b"\x01", 0, 1) == (1, 1)
    with pytest.raises(InvalidValueError):
        read_uvarint(b"\x80\x01", 0, 1)
    assert read_varlong(b"\x80" * 9 + b"\x01", 0) == (2**62, 10)


@given(st.binary(max_size=12), st.integers(0, 14))
def test_readers_raise_only_protocol_errors(buf: bytes, pos: int) -> None:
    for reader in (
        read_uvarint,
        read_varint,
        read_varlong,
        read_compact_length,
        read_int16,
        read_int32,
        read_nullable_string,
    ):
        try:
            _value, end = reader(buf, pos)
        except ProtocolError:
            continue
        assert pos < end <= len(buf)
