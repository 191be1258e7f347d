"""Fuzz target: record batch parsing raises only ProtocolError, whatever the bytes.

Run under pytest (Hypothesis), or with atheris for coverage-guided fuzzing::

    .venv/bin/python fuzz/test_fuzz_records.py [corpus_dir] [-max_total_time=60]
"""

from __future__ import annotations

import contextlib
import struct
import sys

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol.batch_header import HEADER_SIZE
from trio_broker.protocol.compression import Compression, compress
from trio_broker.protocol.errors import ProtocolError
from trio_broker.protocol.records import (
    Header,
    Record,
    RecordBatchView,
    build_batch,
    iter_batches,
    parse_header,
    split_batches,
)

# Small enough that a bomb costs nothing, large enough for every valid seed.
MAX_UNCOMPRESSED = 1 << 20


def _touch(view: RecordBatchView) -> None:
    """Every read-only operation a broker performs on a peer's batch."""
    _ = (
        view.base_offset,
        view.batch_length,
        view.partition_leader_epoch,
        view.magic,
        view.crc,
        view.attributes,
        view.last_offset_delta,
        view.base_timestamp,
        view.max_timestamp,
        view.producer_id,
        view.producer_epoch,
        view.base_sequence,
        view.record_count,
        view.timestamp_type,
        view.is_transactional,
        view.is_control,
        view.last_offset,
        view.size_in_bytes,
        view.last_sequence,
        view.crc_is_valid(),
    )
    with contextlib.suppress(ProtocolError):
        _ = view.compression
    with contextlib.suppress(ProtocolError):
        view.validate()
    with contextlib.suppress(ProtocolError):
        for record in view.records(MAX_UNCOMPRESSED):
            view.offset_of(record)
            view.timestamp_of(record)


def exercise(data: bytes) -> None:
    """Anything but a ProtocolError escaping from here is a bug."""
    with contextlib.suppress(ProtocolError):
        list(iter_batches(data))
    with contextlib.suppress(ProtocolError):
        parse_header(data)
    try:
        views, _tail = split_batches(data)
    except ProtocolError:
        views = []
    for view in views:
        _touch(view)
    # A view over the whole input, as storage recovery might build one.
    with contextlib.suppress(ProtocolError):
        _touch(RecordBatchView(data))


def _fix_crc(b: bytearray) -> None:
    if len(b) >= HEADER_SIZE:
        struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))


def _fix_length(b: bytearray) -> None:
    if len(b) >= 12:
        struct.pack_into(">i", b, 8, len(b) - 12)


# ------------------------------------------------------------------- strategies

maybe_bytes = st.none() | st.binary(max_size=30)
records_st = st.lists(
    st.builds(
        Record,
        offset_delta=st.integers(-5, 40),
        timestamp_delta=st.integers(-(2**50), 2**50),
        key=maybe_bytes,
        value=maybe_bytes,
        headers=st.lists(st.builds(Header, st.text(max_size=6), maybe_bytes), max_size=3).map(
            tuple
        ),
        attributes=st.integers(-128, 127),
    ),
    min_size=1,
    max_size=6,
)
codecs_st = st.sampled_from(list(Compression))


@st.composite
def valid_batches(draw: st.DrawFn) -> bytearray:
    return build_batch(
        draw(records_st),
        base_offset=draw(st.integers(0, 2**62)),
        compression=draw(codecs_st),
        snappy_xerial=draw(st.booleans()),
        producer_id=draw(st.sampled_from([-1, 0, 2**40])),
        base_sequence=draw(st.sampled_from([-1, 0, 2**31 - 1])),
        base_timestamp=draw(st.integers(-(2**40), 2**40)),
    )


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    """A valid batch (or several) with a few byte-level edits, CRC optionally repaired."""
    blob = bytearray()
    for b in draw(st.lists(valid_batches(), min_size=1, max_size=3)):
        blob += b
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "field"]))
        pos = draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[pos] ^= draw(st.integers(1, 255))
        elif op == "set" and blob:
            blob[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            blob[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del blob[pos : pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            del blob[pos:]
        elif op == "field" and len(blob) >= HEADER_SIZE:
            # Interesting values in the header's count/length/attribute fields.
            offset, fmt = draw(
                st.sampled_from([(8, ">i"), (21, ">h"), (23, ">i"), (57, ">i"), (16, ">b")])
            )
            lo, hi = (-128, 127) if fmt == ">b" else (-(2**15), 2**15 - 1)
            if fmt == ">i":
                lo, hi = -(2**31), 2**31 - 1
            struct.pack_into(fmt, blob, offset, draw(st.integers(lo, hi)))
    if draw(st.booleans()):
        _fix_length(blob)
    if draw(st.booleans()):
        _fix_crc(blob)
    return bytes(blob)


@st.composite
def corrupted_bodies(draw: st.DrawFn) -> bytes:
    """Well-framed batches whose (possibly compressed) record bytes are mutated:
    this reaches the record decoder behind every codec."""
    codec = draw(codecs_st)
    batch = build_batch(draw(records_st), base_timestamp=0)
    body = bytearray(batch[HEADER_SIZE:])
    for _ in range(draw(st.integers(1, 3))):
        if body and draw(st.booleans()):
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        else:
            pos = draw(st.integers(0, len(body)))
            body[pos:pos] = draw(st.binary(min_size=1, max_size=6))
    payload = compress(codec, body, snappy_xerial=draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0:  # sometimes damage the compressed stream too
        payload = payload[: draw(st.integers(0, len(payload)))]
    out = bytearray(batch[:HEADER_SIZE]) + payload
    struct.pack_into(">h", out, 21, int(codec))
    struct.pack_into(">i", out, 57, draw(st.integers(-2, 8)))
    _fix_length(out)
    _fix_crc(out)
    return bytes(out)


@st.composite
def plausible_headers(draw: st.DrawFn) -> bytes:
    """Random record bytes under a header that passes the size and CRC checks."""
    body = draw(st.binary(max_size=300))
    head = bytearray(HEADER_SIZE)
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))
    head[16] = 2
    struct.pack_into(">h", head, 21, draw(st.integers(0, 7)))
    struct.pack_into(">i", head, 57, draw(st.integers(-3, 50)))
    out = head + body
    _fix_crc(out)
    return bytes(out)


_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=2000))
def test_any_bytes(data: bytes) -> None:
    exercise(data)


@_FUZZ
@given(mutated_batches())
def test_mutated_batches(data: bytes) -> None:
    exercise(data)


@_FUZZ
@given(corrupted_bodies())
def test_corrupted_record_bytes(data: bytes) -> None:
    exercise(data)


@_FUZZ
@given(plausible_headers())
def test_random_records_behind_valid_header(data: bytes) -> None:
    exercise(data)


@settings(max_examples=100, deadline=None)
@given(valid_batches())
def test_valid_batches_pass(batch: bytearray) -> None:
    # The mutation strategies start from batches that do parse (offset deltas
    # may be out of order, which only validate() cares about).
    (view,) = iter_batches(batch)
    assert view.crc_is_valid()
    view.records()


def main() -> None:  # pragma: no cover - atheris entry point
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, exercise)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()
