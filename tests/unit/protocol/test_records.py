"""Tests for trio_broker.protocol.records (record batch v2)."""

from __future__ import annotations

import importlib
import struct
import time
import tracemalloc
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_broker.protocol.batch_header import HEADER_SIZE
from trio_broker.protocol.compression import Compression, compress
from trio_broker.protocol.errors import (
    CorruptRecordError,
    InvalidRecordError,
    ProtocolError,
    TruncatedError,
    UnsupportedCompressionError,
)
from trio_broker.protocol.records import (
    LOG_APPEND_TIME,
    Header,
    Record,
    RecordBatchView,
    build_batch,
    iter_batches,
    parse_header,
    split_batches,
)

CODEC_VARIANTS = [
    (Compression.NONE, False),
    (Compression.GZIP, False),
    (Compression.SNAPPY, False),
    (Compression.SNAPPY, True),
    (Compression.LZ4, False),
    (Compression.ZSTD, False),
]
CODEC_IDS = ["none", "gzip", "snappy-raw", "snappy-xerial", "lz4", "zstd"]

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
maybe_bytes = st.none() | st.binary(max_size=40)
headers_st = st.lists(st.builds(Header, st.text(max_size=10), maybe_bytes), max_size=3).map(tuple)


@st.composite
def record_lists(draw: st.DrawFn) -> list[Record]:
    n = draw(st.integers(1, 12))
    return [
        Record(
            offset_delta=i,
            timestamp_delta=draw(st.integers(-(2**40), 2**40)),
            key=draw(maybe_bytes),
            value=draw(maybe_bytes),
            headers=draw(headers_st),
            attributes=draw(st.sampled_from([0, 0, 1, -1, 127, -128])),
        )
        for i in range(n)
    ]


def _sample(compression: Compression = Compression.NONE, **kwargs: Any) -> bytearray:
    recs = [
        Record(0, 0, b"k0", b"v0" * 20, (Header("h", b"x"), Header("n", None))),
        Record(1, 5, None, b"v1" * 20),
        Record(2, 9, b"k2", None),
    ]
    kwargs.setdefault("base_timestamp", 1_700_000_000_000)
    return build_batch(recs, compression=compression, **kwargs)


def _with_body(body: bytes, count: int) -> bytearray:
    """A batch around raw record bytes, with a correct CRC (to test record decoding)."""
    b = _sample()
    del b[HEADER_SIZE:]
    b += body
    struct.pack_into(">i", b, 8, len(b) - 12)
    struct.pack_into(">i", b, 23, count - 1)
    struct.pack_into(">i", b, 57, count)
    _fix_crc(b)
    return b


def _fix_crc(b: bytearray) -> None:
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))


# ---------------------------------------------------------------------- round trip


@pytest.mark.parametrize(("codec", "xerial"), CODEC_VARIANTS, ids=CODEC_IDS)
@settings(max_examples=60, deadline=None)
@given(batches=st.lists(record_lists(), min_size=1, max_size=3), base=st.integers(0, 2**40))
def test_round_trip(
    codec: Compression, xerial: bool, batches: list[list[Record]], base: int
) -> None:
    blob = bytearray()
    offset = base
    for recs in batches:
        blob += build_batch(
            recs, base_offset=offset, compression=codec, base_timestamp=10**12, snappy_xerial=xerial
        )
        offset += len(recs)
    views = list(iter_batches(bytes(blob)))
    assert len(views) == len(batches)
    offset = base
    for view, recs in zip(views, batches):
        view.validate()
        assert view.compression is codec
        assert view.base_offset == offset
        assert view.record_count == len(recs)
        assert view.last_offset == offset + len(recs) - 1
        assert view.max_timestamp == 10**12 + max(r.timestamp_delta for r in recs)
        assert view.records() == recs
        offset += len(recs)


@settings(max_examples=100, deadline=None)
@given(
    base_offset=INT64,
    leader_epoch=INT32,
    producer_id=INT64,
    producer_epoch=st.integers(-(2**15), 2**15 - 1),
    base_sequence=INT32,
    base_timestamp=st.integers(-(2**62), 2**62),
    transactional=st.booleans(),
    control=st.booleans(),
    ts_type=st.sampled_from([0, 1]),
)
def test_header_fields(
    base_offset: int,
    leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    base_timestamp: int,
    transactional: bool,
    control: bool,
    ts_type: int,
) -> None:
    b = build_batch(
        [(b"k", b"v"), (None, None)],
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_timestamp=base_timestamp,
        is_transactional=transactional,
        is_control=control,
        timestamp_type=ts_type,
    )
    v = parse_header(b)
    assert (v.base_offset, v.partition_leader_epoch, v.magic) == (base_offset, leader_epoch, 2)
    assert (v.producer_id, v.producer_epoch, v.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert (v.base_timestamp, v.max_timestamp) == (base_timestamp, base_timestamp)
    assert (v.is_transactional, v.is_control, v.timestamp_type) == (transactional, control, ts_type)
    assert (v.record_count, v.last_offset_delta, v.size_in_bytes) == (2, 1, len(b))
    assert v.batch_length == len(b) - 12
    assert v.compression is Compression.NONE
    assert v.crc == crc32c.crc32c(bytes(b[21:]))
    v.validate()


def test_tuples_and_defaults() -> None:
    before = int(time.time() * 1000)
    v = parse_header(build_batch([(b"a", b"1"), (b"b", None)]))
    assert before <= v.base_timestamp <= int(time.time() * 1000)
    recs = v.records()
    assert [(v.offset_of(r), r.key, r.value, r.timestamp_delta) for r in recs] == [
        (0, b"a", b"1", 0),
        (1, b"b", None, 0),
    ]
    assert (v.producer_id, v.producer_epoch, v.base_sequence, v.partition_leader_epoch) == (
        -1,
        -1,
        -1,
        -1,
    )
    with pytest.raises(ValueError):
        build_batch([])


def test_offset_and_timestamp_helpers() -> None:
    v = parse_header(_sample(base_offset=100))
    recs = v.records()
    assert [v.offset_of(r) for r in recs] == [100, 101, 102]
    assert [v.timestamp_of(r) for r in recs] == [1_700_000_000_000 + d for d in (0, 5, 9)]
    assert v.max_timestamp == 1_700_000_000_009
    assert v.next_offset == 103


def test_header_keys_keep_arbitrary_bytes() -> None:
    # Java decodes header keys leniently; we must not reject (or alter) such bytes.
    rec = Record(
        0, 0, None, b"v", (Header(b"\xff\xfekey".decode("utf-8", "surrogateescape"), b""),)
    )
    v = parse_header(build_batch([rec]))
    (got,) = v.records()
    assert got == rec
    assert got.headers[0].key.encode("utf-8", "surrogateescape") == b"\xff\xfekey"


def test_large_values_and_multibyte_varints() -> None:
    big = bytes(range(256)) * 1000
    recs = [Record(0, -(2**62), big, big, tuple(Header(f"h{i}", big[:300]) for i in range(70)))]
    for codec, xerial in CODEC_VARIANTS:
        v = parse_header(build_batch(recs, compression=codec, snappy_xerial=xerial))
        v.validate()
        assert v.records() == recs


# ---------------------------------------------------------------- last_sequence


@pytest.mark.parametrize(
    ("base", "count", "expected"),
    [
        (0, 1, 0),
        (5, 10, 14),
        (2**31 - 1, 1, 2**31 - 1),
        (2**31 - 2, 6, 3),  # wraps past Int32 max to 0
        (2**31 - 1, 2, 0),
        (-1, 3, -1),  # no sequence
    ],
)
def test_last_sequence(base: int, count: int, expected: int) -> None:
    b = build_batch([(None, b"x")] * count, producer_id=7, producer_epoch=0, base_sequence=base)
    assert parse_header(b).last_sequence == expected


# --------------------------------------------------------------------------- CRC


@pytest.mark.parametrize(("codec", "xerial"), CODEC_VARIANTS, ids=CODEC_IDS)
def test_any_flipped_byte_in_crc_range_breaks_crc(codec: Compression, xerial: bool) -> None:
    good = _sample(codec, snappy_xerial=xerial)
    assert parse_header(good).crc_is_valid()
    for i in range(17, len(good)):  # the CRC field itself and everything it covers
        for mask in (0x01, 0x80, 0xFF):
            b = bytearray(good)
            b[i] ^= mask
            v = RecordBatchView(b)
            assert not v.crc_is_valid(), (i, mask)
            with pytest.raises(ProtocolError):
                v.validate()


def test_flips_outside_crc_range_keep_crc() -> None:
    good = _sample()
    for i in [*range(0, 8), *range(12, 16)]:  # base offset, leader epoch
        b = bytearray(good)
        b[i] ^= 0x5A
        assert RecordBatchView(b).crc_is_valid()


def test_crc_matches_kafka_python() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    for codec, xerial in CODEC_VARIANTS:
        b = _sample(codec, snappy_xerial=xerial)
        assert DefaultRecordBatch(bytes(b)).validate_crc()


# --------------------------------------------------------------- in-place rewrites


def test_set_base_offset_and_epoch_keep_crc() -> None:
    b = _sample(Compression.LZ4)
    v = parse_header(b)
    v.set_base_offset(2**40 + 3)
    v.set_partition_leader_epoch(17)
    assert (v.base_offset, v.partition_leader_epoch) == (2**40 + 3, 17)
    assert v.crc_is_valid()
    v.validate()
    assert [v.offset_of(r) for r in v.records()] == [2**40 + 3, 2**40 + 4, 2**40 + 5]
    # The view writes through to the caller's buffer.
    assert struct.unpack_from(">q", b, 0)[0] == 2**40 + 3


@pytest.mark.parametrize(("codec", "xerial"), CODEC_VARIANTS, ids=CODEC_IDS)
def test_set_log_append_time(codec: Compression, xerial: bool) -> None:
    b = _sample(codec, snappy_xerial=xerial, is_transactional=True, producer_id=1, producer_epoch=0)
    v = parse_header(b)
    v.set_log_append_time(1_800_000_000_000)
    assert v.crc_is_valid()
    v.validate()
    assert v.timestamp_type == LOG_APPEND_TIME
    assert v.max_timestamp == 1_800_000_000_000
    assert v.base_timestamp == 1_700_000_000_000  # untouched
    assert (v.compression, v.is_transactional) == (codec, True)  # other bits kept
    assert {v.timestamp_of(r) for r in v.records()} == {1_800_000_000_000}
    # aiokafka decodes every codec with cramjam, which is always installed.
    batch_cls, _builder_cls = _client_lib("aiokafka", codec)
    theirs = batch_cls(bytes(b))
    assert theirs.validate_crc()
    assert {r.timestamp for r in theirs} == {1_800_000_000_000}
    assert {r.timestamp_type for r in batch_cls(bytes(b))} == {1}


def test_set_producer_keeps_the_batch_valid() -> None:
    b = _sample(producer_id=1, producer_epoch=0, base_sequence=7)
    v = parse_header(b)
    v.set_producer(2**40 + 9, 3)
    assert v.crc_is_valid()
    v.validate()
    assert (v.producer_id, v.producer_epoch, v.base_sequence) == (2**40 + 9, 3, 7)
    theirs = _client_lib("aiokafka", Compression.NONE)[0](bytes(b))
    assert theirs.validate_crc() and theirs.producer_id == 2**40 + 9


def test_setters_need_a_writable_buffer() -> None:
    v = parse_header(bytes(_sample()))
    for setter in (v.set_base_offset, v.set_partition_leader_epoch, v.set_log_append_time):
        with pytest.raises(ValueError):
            setter(1)


# ---------------------------------------------------------------------- validate


def _mutated(offset: int, fmt: str, value: int, fix_crc: bool = True) -> RecordBatchView:
    b = _sample()
    struct.pack_into(fmt, b, offset, value)
    if fix_crc:
        _fix_crc(b)
    return RecordBatchView(b)


def test_validate_rejections() -> None:
    with pytest.raises(InvalidRecordError):
        _mutated(16, ">b", 1).validate()  # magic
    with pytest.raises(CorruptRecordError):
        _mutated(17, ">I", 12345, fix_crc=False).validate()
    with pytest.raises(InvalidRecordError):
        _mutated(57, ">i", 2).validate()  # count != lastOffsetDelta + 1
    with pytest.raises(InvalidRecordError):
        _mutated(57, ">i", 0).validate()
    with pytest.raises(InvalidRecordError):
        _mutated(23, ">i", 5).validate()
    with pytest.raises(UnsupportedCompressionError):
        _mutated(21, ">h", 6).validate()
    with pytest.raises(UnsupportedCompressionError):
        _ = _mutated(21, ">h", 7).compression
    with pytest.raises(CorruptRecordError):
        _mutated(8, ">i", 10_000).validate()  # batch_length != buffer
    with pytest.raises(CorruptRecordError):
        RecordBatchView(_sample() + b"\x00").validate()


def test_validate_accepts_kafka_python_producer_batch() -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, True, 42, 3, 10, 1 << 20)
    for i in range(5):
        builder.append(i, 1000 + i, b"k", b"v", [])
    v = parse_header(bytes(builder.build()))
    v.validate()
    assert (v.producer_id, v.producer_epoch, v.base_sequence, v.last_sequence) == (42, 3, 10, 14)
    assert v.is_transactional


# --------------------------------------------------------------------- splitting


def test_iter_batches_and_truncation() -> None:
    a, b = _sample(base_offset=0), _sample(Compression.GZIP, base_offset=3)
    blob = bytes(a + b)
    assert [v.base_offset for v in iter_batches(blob)] == [0, 3]
    assert list(iter_batches(b"")) == []
    for cut in range(1, len(blob)):
        if cut == len(a):
            continue
        with pytest.raises(TruncatedError):
            list(iter_batches(blob[:cut]))
        views, tail = split_batches(blob[:cut])
        assert len(views) == (1 if cut > len(a) else 0)
        assert bytes(tail) == blob[len(a) if cut > len(a) else 0 : cut]
        with pytest.raises(TruncatedError):
            split_batches(blob[:cut], allow_partial_tail=False)
    views, tail = split_batches(blob)
    assert [len(v.buf) for v in views] == [len(a), len(b)] and len(tail) == 0


def test_parse_header() -> None:
    blob = bytes(_sample() + _sample(base_offset=3))
    first = parse_header(blob)
    second = parse_header(blob, first.size_in_bytes)
    assert second.base_offset == 3
    with pytest.raises(TruncatedError):
        parse_header(blob[:11])
    with pytest.raises(TruncatedError):
        parse_header(blob, len(blob) - 5)
    with pytest.raises(TruncatedError):
        RecordBatchView(blob[:60])


def test_size_fields_rejected() -> None:
    b = _sample()
    for length in (-1, 0, 48, -(2**31)):
        bad = bytearray(b)
        struct.pack_into(">i", bad, 8, length)
        with pytest.raises(CorruptRecordError):
            list(iter_batches(bad))
        with pytest.raises(CorruptRecordError):
            split_batches(bad)
    # A small old-format (magic 0/1) message set is named as such.
    old = bytearray(b[:30])
    struct.pack_into(">i", old, 8, 18)
    old[16] = 1
    with pytest.raises(InvalidRecordError):
        parse_header(old)
    huge = bytearray(b)
    struct.pack_into(">i", huge, 8, 2**31 - 1)
    with pytest.raises(TruncatedError):
        parse_header(huge)


def test_iter_batches_does_not_copy() -> None:
    one = build_batch([(b"key", bytes(1000))] * 4)
    blob = bytearray(one * (1024 * 1024 // len(one) + 1))
    assert len(blob) >= 1024 * 1024
    tracemalloc.start()
    try:
        n = 0
        for v in iter_batches(blob):
            assert v.buf.obj is blob  # a view into the blob itself
            _ = (v.base_offset, v.record_count, v.max_timestamp, v.producer_id, v.compression)
            assert v.crc_is_valid()
            n += 1
        views, _tail = split_batches(blob)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == len(views) > 200
    # Views are ~200 bytes each; the 1 MiB payload is never copied.
    assert peak < 200 * 1024, peak


# -------------------------------------------------------------- record decoding


def _rec(body: bytes) -> bytes:
    """A record: zigzag varint length prefix + body (bodies here are < 64 bytes)."""
    assert len(body) < 64
    return bytes([len(body) << 1]) + body


# attributes 0, timestampDelta 0, offsetDelta 0, key null, value "v", 0 headers
GOOD_BODY = b"\x00\x00\x00\x01\x02v\x00"


def test_handmade_record_decodes() -> None:
    v = RecordBatchView(_with_body(_rec(GOOD_BODY), 1))
    v.validate()
    assert v.records() == [Record(0, 0, None, b"v")]


@pytest.mark.parametrize(
    ("body", "count"),
    [
        pytest.param(_rec(GOOD_BODY) + b"\x00", 1, id="trailing-garbage"),
        pytest.param(_rec(GOOD_BODY), 2, id="fewer-records-than-count"),
        pytest.param(_rec(GOOD_BODY + b"\x00"), 1, id="record-longer-than-fields"),
        pytest.param(bytes([(len(GOOD_BODY) - 1) << 1]) + GOOD_BODY, 1, id="record-too-short"),
        pytest.param(b"\x03" + GOOD_BODY, 1, id="negative-record-length"),
        pytest.param(b"\xff\xff\xff\xff\xff\x01" + GOOD_BODY, 1, id="varint-6-bytes"),
        pytest.param(b"\x8e\x80\x80\x80\x10" + GOOD_BODY, 1, id="varint-overflows-int32"),
        pytest.param(
            _rec(b"\x00" + b"\xff" * 10 + b"\x01" + b"\x00\x01\x01\x00"), 1, id="varlong-11-bytes"
        ),
        pytest.param(_rec(b"\x00\x00\x00\x03\x02v\x00"), 1, id="key-length-minus-2"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x03\x00"), 1, id="value-length-minus-2"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x20v\x00"), 1, id="value-past-record"),
        pytest.param(_rec(b"\x00\x00\x00\x40\x02v\x00"), 1, id="key-past-record"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x01"), 1, id="negative-header-count"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\xfe\xff\xff\xff\x0f"), 1, id="huge-header-count"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x02\x01\x00"), 1, id="null-header-key"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x02\x20ab\x00"), 1, id="header-key-past-record"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x02\x02a\x05"), 1, id="header-value-minus-3"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x02\x02a\x20"), 1, id="header-value-past-end"),
        pytest.param(_rec(b"\x00\x00\x00\x01\x02v\x04\x02a\x00"), 1, id="header-count-too-big"),
        pytest.param(b"\x80", 1, id="varint-cut-off"),
        pytest.param(b"", 1, id="no-records"),
        pytest.param(_rec(GOOD_BODY) * 3, 2**31 - 1, id="count-beyond-bytes"),
    ],
)
def test_malformed_records(body: bytes, count: int) -> None:
    v = RecordBatchView(_with_body(body, count))
    assert v.crc_is_valid()
    with pytest.raises(CorruptRecordError):
        v.records()


def test_malformed_records_inside_compression() -> None:
    body = compress(Compression.ZSTD, _rec(GOOD_BODY) + b"junk")
    b = _with_body(body, 1)
    struct.pack_into(">h", b, 21, int(Compression.ZSTD))
    _fix_crc(b)
    with pytest.raises(CorruptRecordError):
        RecordBatchView(b).records()


def test_records_rejects_other_magic_and_negative_count() -> None:
    with pytest.raises(InvalidRecordError):
        _mutated(16, ">b", 1).records()
    with pytest.raises(InvalidRecordError):
        _mutated(57, ">i", -1).records()


def test_records_decompression_limit() -> None:
    from trio_broker.protocol.errors import DecompressionLimitError

    b = build_batch([(None, bytes(2_000_000))], compression=Compression.ZSTD)
    v = parse_header(b)
    assert len(v.records()[0].value or b"") == 2_000_000
    with pytest.raises(DecompressionLimitError):
        v.records(max_uncompressed=1_000_000)


# ----------------------------------------------------------- cross-check clients


def _client_lib(name: str, codec: Compression = Compression.NONE) -> tuple[Any, Any]:
    """(DefaultRecordBatch, DefaultRecordBatchBuilder); both clients share the API."""
    package = "kafka" if name == "kafka-python" else "aiokafka"
    # kafka-python needs python-snappy / lz4 / zstandard for those codecs (aiokafka uses cramjam).
    checker = {
        Compression.SNAPPY: "has_snappy",
        Compression.LZ4: "has_lz4",
        Compression.ZSTD: "has_zstd",
    }.get(codec)
    if checker and not getattr(importlib.import_module(f"{package}.codec"), checker)():
        pytest.skip(f"{name} lacks the library for {codec.name}")
    module = importlib.import_module(f"{package}.record.default_records")
    return module.DefaultRecordBatch, module.DefaultRecordBatchBuilder


CLIENT_CODECS = [
    Compression.NONE,
    Compression.GZIP,
    Compression.SNAPPY,
    Compression.LZ4,
    Compression.ZSTD,
]


def _their_records(
    batch_cls: Any, data: bytes
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    theirs = batch_cls(data)
    out = []
    for r in theirs:
        out.append((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]))
    return out


@pytest.mark.parametrize("lib", ["kafka-python", "aiokafka"])
@pytest.mark.parametrize("codec", CLIENT_CODECS, ids=lambda c: c.name.lower())
def test_client_batches_parse_here(lib: str, codec: Compression) -> None:
    _batch_cls, builder_cls = _client_lib(lib, codec)
    builder = builder_cls(2, int(codec), False, -1, -1, -1, 1 << 20)
    expected = []
    for i in range(20):
        key = None if i % 3 == 0 else f"key-{i}".encode()
        value = None if i % 7 == 6 else b"value-%d-" % i * 20
        hdrs = [("trace", b"abc"), ("empty", None)] if i % 2 else []
        ts = 1_700_000_000_000 + i * 3 - (i % 4)  # not monotonic
        builder.append(i, ts, key, value, hdrs)
        expected.append((i, ts, key, value, hdrs))
    data = bytes(builder.build())
    v = parse_header(data)
    v.validate()
    # Every codec shrinks this data, so the client really compressed it.
    assert v.compression is codec
    got = [
        (v.offset_of(r), v.timestamp_of(r), r.key, r.value, [(h.key, h.value) for h in r.headers])
        for r in v.records()
    ]
    assert got == expected
    assert v.max_timestamp == max(e[1] for e in expected)


@pytest.mark.parametrize("lib", ["kafka-python", "aiokafka"])
@pytest.mark.parametrize(("codec", "xerial"), CODEC_VARIANTS, ids=CODEC_IDS)
@settings(max_examples=25, deadline=None)
@given(recs=record_lists(), base=st.integers(0, 2**40))
def test_our_batches_parse_in_clients(
    lib: str, codec: Compression, xerial: bool, recs: list[Record], base: int
) -> None:
    batch_cls, _builder_cls = _client_lib(lib, codec)
    recs = [
        # Clients decode header keys strictly as UTF-8 and read attributes unsigned.
        Record(r.offset_delta, r.timestamp_delta, r.key, r.value, r.headers)
        for r in recs
    ]
    b = build_batch(
        recs, base_offset=base, compression=codec, base_timestamp=10**12, snappy_xerial=xerial
    )
    theirs = batch_cls(bytes(b))
    assert theirs.validate_crc()
    assert (theirs.base_offset, theirs.compression_type) == (base, int(codec))
    expected = [
        (
            base + r.offset_delta,
            10**12 + r.timestamp_delta,
            r.key,
            r.value,
            [(h.key, h.value) for h in r.headers],
        )
        for r in recs
    ]
    assert _their_records(batch_cls, bytes(b)) == expected
