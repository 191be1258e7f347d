"""FrameReader: length-prefixed frames out of an arbitrarily chunked byte stream."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol.errors import FrameTooLargeError, InvalidValueError, ProtocolError
from trio_broker.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameReader, frame_size_prefix

SETTINGS = settings(max_examples=200, deadline=None, database=None)


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(frame_size_prefix(len(p)) + p for p in payloads)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def drain(reader: FrameReader) -> list[bytes]:
    out = []
    while (frame := reader.next_frame()) is not None:
        out.append(bytes(frame))
    return out


def read_all_by_feed(chunks: list[bytes], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list:
    reader = FrameReader(max_frame_size)
    out = []
    for chunk in chunks:
        reader.feed(chunk)
        out.extend(drain(reader))
    assert reader.buffered_bytes == 0
    return out


def read_all_by_recv_into(chunks: list[bytes]) -> list[bytes]:
    """What the network layer does: recv_into the frame body when one is offered."""
    reader = FrameReader()
    out = []
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            target = reader.body_target()
            if target is not None:
                n = min(len(target), len(view))
                target[:n] = view[:n]
                reader.body_advance(n)
                view = view[n:]
            else:
                reader.feed(view)
                view = view[len(view) :]
            out.extend(drain(reader))
    assert reader.buffered_bytes == 0
    return out


payload_lists = st.lists(st.binary(max_size=300), max_size=8)
cut_lists = st.lists(st.integers(0, 10_000), max_size=30)


@SETTINGS
@given(payloads=payload_lists, cuts=cut_lists)
def test_any_chunking_gives_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    data = framed(payloads)
    assert read_all_by_feed(split(data, cuts)) == payloads


@SETTINGS
@given(payloads=payload_lists, cuts=cut_lists)
def test_recv_into_path_gives_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    data = framed(payloads)
    assert read_all_by_recv_into(split(data, cuts)) == payloads


@SETTINGS
@given(payloads=payload_lists)
def test_byte_at_a_time(payloads: list[bytes]) -> None:
    data = framed(payloads)
    assert read_all_by_feed([data[i : i + 1] for i in range(len(data))]) == payloads


@SETTINGS
@given(payloads=payload_lists, cuts=cut_lists, max_size=st.integers(0, 400))
def test_frames_over_the_limit_raise_at_their_prefix(
    payloads: list[bytes], cuts: list[int], max_size: int
) -> None:
    data = framed(payloads)
    reader = FrameReader(max_size)
    out: list[bytes] = []
    first_big = next((i for i, p in enumerate(payloads) if len(p) > max_size), None)
    try:
        for chunk in split(data, cuts):
            reader.feed(chunk)
            while (frame := reader.next_frame()) is not None:
                out.append(bytes(frame))
    except FrameTooLargeError:
        assert first_big is not None
        assert out == payloads[:first_big]
        # Raised without buffering the big body: no allocation for it.
        assert reader.body_target() is None
    else:
        assert first_big is None
        assert out == payloads


def test_oversize_raises_as_soon_as_the_prefix_arrives() -> None:
    reader = FrameReader(max_frame_size=1000)
    reader.feed(struct.pack(">i", 1001)[:3])
    assert reader.next_frame() is None
    reader.feed(struct.pack(">i", 1001)[3:])
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()


def test_tls_client_hello_is_rejected_without_allocating() -> None:
    # A TLS ClientHello read as a Kafka size prefix: 0x16030100 ~ 369 MB.
    reader = FrameReader()
    reader.feed(b"\x16\x03\x01\x00\xa5\x01\x00\x00")
    with pytest.raises(FrameTooLargeError) as info:
        reader.next_frame()
    assert isinstance(info.value, ProtocolError)
    assert reader.body_target() is None and reader.buffered_bytes < 64


@pytest.mark.parametrize("size", [-1, -2, -(2**31)])
def test_negative_sizes_raise(size: int) -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", size) + b"abc")
    with pytest.raises(InvalidValueError):
        reader.next_frame()


def test_exact_limit_is_allowed() -> None:
    reader = FrameReader(max_frame_size=5)
    reader.feed(framed([b"12345"]))
    assert reader.next_frame() == b"12345"


def test_empty_frame() -> None:
    reader = FrameReader()
    reader.feed(framed([b"", b"x"]))
    assert drain(reader) == [b"", b"x"]


def test_large_frame_is_received_in_place() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    reader = FrameReader()
    reader.feed(frame_size_prefix(len(body)) + body[:1000])
    assert reader.next_frame() is None
    target = reader.body_target()
    assert target is not None and len(target) == len(body) - 1000
    # The whole frame is allocated once, at its exact size, and counted.
    assert reader.buffered_bytes == len(body)
    target[:] = body[1000:]
    reader.body_advance(len(target))
    assert reader.body_target() is not None and len(reader.body_target() or b"") == 0
    frame = reader.next_frame()
    assert frame == body
    assert reader.body_target() is None
    assert reader.buffered_bytes == 0
    assert reader.next_frame() is None


def test_body_target_then_feed_mixes() -> None:
    reader = FrameReader()
    reader.feed(frame_size_prefix(10) + b"abc")
    assert reader.next_frame() is None
    target = reader.body_target()
    assert target is not None
    target[:2] = b"de"
    reader.body_advance(2)
    # The rest arrives via feed, with the start of the next frame behind it.
    reader.feed(b"fghij" + frame_size_prefix(2) + b"k")
    assert reader.next_frame() == b"abcdefghij"
    assert reader.body_target() is None
    assert reader.buffered_bytes == 5  # the next frame's prefix and first byte, unparsed
    assert reader.next_frame() is None
    assert reader.buffered_bytes == 2  # now a 2-byte frame buffer, one byte filled
    target = reader.body_target()
    assert target is not None and len(target) == 1
    reader.feed(b"l")
    assert reader.next_frame() == b"kl"
    assert reader.buffered_bytes == 0


def test_body_advance_past_the_end_is_refused() -> None:
    reader = FrameReader()
    reader.feed(frame_size_prefix(4) + b"a")
    reader.next_frame()
    with pytest.raises(AssertionError):
        reader.body_advance(4)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(payloads=payload_lists, cuts=cut_lists)
def test_buffered_bytes_accounting(payloads: list[bytes], cuts: list[int]) -> None:
    """buffered_bytes = received bytes not handed out, plus the unfilled part of a frame buffer."""
    data = framed(payloads)
    reader = FrameReader()
    received = handed_out = 0
    for chunk in split(data, cuts):
        reader.feed(chunk)
        received += len(chunk)
        while (frame := reader.next_frame()) is not None:
            handed_out += 4 + len(frame)
        target = reader.body_target()
        unfilled = len(target) if target is not None else 0
        # Size prefixes of a frame being filled are consumed; its buffer is counted whole.
        prefix = 4 if target is not None else 0
        assert reader.buffered_bytes == received - handed_out - prefix + unfilled
    assert reader.buffered_bytes == 0
