"""Fuzz the request decoder: whatever the bytes, it succeeds or raises ProtocolError.

Inputs mix plain random bytes with valid requests (generated from the schemas)
that are then damaged: bytes flipped, cut short, or given absurd array counts
and lengths. A decoded request must also be re-encodable, and re-decoding that
must be stable (``encode . decode`` is a normal form).

Hostile sizes get their own checks: a count of 2**31-1 in front of 10 bytes
must fail at once and without allocating for the count (CVE-2022-34917).
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import tracemalloc
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol import messages
from trio_broker.protocol.codec import decode_body, encode_body
from trio_broker.protocol.errors import ProtocolError, UnsupportedVersionError
from trio_broker.protocol.primitives import write_uvarint
from trio_broker.protocol.schema import REQUESTS, Field, Message, MessageSchema

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path) -> ModuleType:
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(path):
            return module
    spec = importlib.util.spec_from_file_location(f"_trio_broker_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rt = _load(ROOT / "tests" / "unit" / "protocol" / "test_codec_roundtrip.py")

CASES: list[tuple[MessageSchema, int]] = [
    (s, v) for _, s in sorted(REQUESTS.items()) for v in range(s.min_version, s.max_version + 1)
]
HUGE = 2**31 - 1

FUZZ = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _body(schema: MessageSchema, version: int, msg: Message) -> bytes:
    return b"".join(bytes(p) for p in encode_body(schema, version, msg))


def check_decode_request(frame: bytes | bytearray) -> None:
    """The fuzz property for a whole request frame (without its size prefix)."""
    try:
        header, msg = messages.decode_request(frame)
    except ProtocolError:
        return
    schema = REQUESTS[header.api_key]
    again = _body(schema, header.api_version, msg)
    reread = decode_body(schema, header.api_version, memoryview(again))
    assert _body(schema, header.api_version, reread) == again


def check_decode_body(schema: MessageSchema, version: int, body: bytes | bytearray) -> None:
    try:
        msg = decode_body(schema, version, memoryview(body))
    except ProtocolError:
        return
    again = _body(schema, version, msg)
    assert _body(schema, version, decode_body(schema, version, memoryview(again))) == again


# --------------------------------------------------------------------------- strategies


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    schema, version = draw(st.sampled_from(CASES))
    msg = draw(rt.message_strategy(schema, version))
    corr = draw(st.integers(-(2**31), 2**31 - 1))
    client_id = draw(st.none() | st.text(max_size=8))
    return messages.encode_request(schema.api_key, version, corr, client_id, msg)[4:]


#: Values that make a length or count absurd, as int32, int16 and uvarint bytes.
HOSTILE = [
    struct.pack(">i", HUGE),
    struct.pack(">i", -2),
    struct.pack(">i", -(2**31)),
    struct.pack(">h", 32767),
    struct.pack(">h", -2),
    write_uvarint(2**31),
    write_uvarint(2**32 - 1),
    b"\xff\xff\xff\xff\xff\xff",  # over-long varint
]


@st.composite
def mutate(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "hostile", "insert", "delete"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and buf:
            buf[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "hostile":
            value = draw(st.sampled_from(HOSTILE))
            if draw(st.booleans()):
                buf[pos : pos + len(value)] = value  # overwrite
            else:
                buf[pos:pos] = value
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
    return bytes(buf)


def _header_prefix(schema: MessageSchema, version: int) -> bytes:
    head = struct.pack(">hhih", schema.api_key, version, 1, 1) + b"c"
    return head + (b"\x00" if schema.is_flexible(version) else b"")


any_frame = st.one_of(
    st.binary(max_size=64),
    # A valid header for a real (api, version) followed by random bytes.
    st.builds(
        lambda case, tail: _header_prefix(*case) + tail,
        st.sampled_from(CASES),
        st.binary(max_size=64),
    ),
    valid_frames().flatmap(mutate),
)


# --------------------------------------------------------------------------- properties


@FUZZ
@given(frame=any_frame)
def test_decode_request_raises_only_protocol_errors(frame: bytes) -> None:
    check_decode_request(frame)


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(frame=valid_frames())
def test_valid_frames_decode(frame: bytes) -> None:
    header, _ = messages.decode_request(frame)
    assert header.api_key in REQUESTS


@pytest.mark.parametrize(("schema", "version"), CASES, ids=[f"{s.name}-v{v}" for s, v in CASES])
def test_decode_body_raises_only_protocol_errors(schema: MessageSchema, version: int) -> None:
    valid = rt.message_strategy(schema, version).map(lambda m: _body(schema, version, m))

    @settings(
        max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(body=st.binary(max_size=48) | valid.flatmap(mutate))
    def check(body: bytes) -> None:
        check_decode_body(schema, version, body)

    check()


# --------------------------------------------------------------------------- hostile sizes


def _assert_fails_fast(decode: Any, data: bytes) -> None:
    """``decode(data)`` raises ProtocolError (or succeeds) in little memory.

    No timing assertion here (speed belongs in bench/): a decoder that trusted a
    hostile count would allocate for it, which the memory bound catches.
    """
    tracemalloc.start()
    try:
        decode(data)
    except ProtocolError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 1 << 20, f"peak allocation {peak} bytes"


#: The sweep's subset of HOSTILE: the biggest int32, int16 and uvarint, and an over-long varint.
SWEEP = [HOSTILE[0], HOSTILE[3], HOSTILE[5], HOSTILE[7]]


def _sweep(body: bytes) -> list[bytes]:
    """A hostile size at every offset of ``body`` (inserted or overwriting), then 10 bytes."""
    out = []
    for pos in range(len(body) + 1):
        for value in SWEEP:
            out.append(body[:pos] + value + body[pos : pos + 10])
            out.append(body[:pos] + value + body[pos + len(value) : pos + len(value) + 10])
    return out


_SAMPLES: dict[str, Any] = {
    "bool": True, "int8": 1, "int16": 2, "uint16": 3, "int32": 4, "uint32": 5, "int64": 6,
    "float64": 1.5, "string": "ab", "bytes": b"cd", "records": b"ef",
    "uuid": uuid.UUID(int=7),
}  # fmt: skip


def rich_message(cls: type[Message], fields: tuple[Field, ...], version: int) -> Message:
    """A deterministic message with every field set and every array of two items."""
    kwargs: dict[str, Any] = {}
    for f in fields:
        if not f.present_in(version):
            continue
        if f.fields is not None:
            assert f.struct_class is not None
            value: Any = rich_message(f.struct_class, f.fields, version)
        else:
            value = _SAMPLES[f.type]
        kwargs[f.attr] = [value, value] if f.is_array else value
    return cls(**kwargs)


@pytest.mark.parametrize(("schema", "version"), CASES, ids=[f"{s.name}-v{v}" for s, v in CASES])
def test_hostile_sizes_fail_fast(schema: MessageSchema, version: int) -> None:
    msg = rich_message(schema.cls, schema.fields, version)
    body = _body(schema, version, msg)
    assert decode_body(schema, version, memoryview(body)) == msg  # compiles the decoder
    inputs = _sweep(body)
    tracemalloc.start()
    for data in inputs:
        try:
            decode_body(schema, version, memoryview(data))
        except ProtocolError:
            pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20, f"peak allocation {peak} bytes"


@pytest.mark.parametrize(
    "data",
    [
        # Metadata v4: topics count 2**31-1, then 10 bytes.
        struct.pack(">hhih", 3, 4, 1, -1) + struct.pack(">i", HUGE) + b"\x00" * 10,
        # Metadata v12 (flexible): compact count 2**31.
        struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + write_uvarint(2**31) + b"\x00" * 10,
        # Produce v3: one topic, one partition, records length 2**31-1.
        struct.pack(">hhih", 0, 3, 1, -1)
        + struct.pack(">hhi", -1, 1, 1000)
        + struct.pack(">ih", 1, 1) + b"t"
        + struct.pack(">iii", 1, 0, HUGE)
        + b"\x00" * 10,
        # OffsetCommit v2: a string length of 32767 with 10 bytes.
        struct.pack(">hhih", 8, 2, 1, -1) + struct.pack(">h", 32767) + b"\x00" * 10,
        # ApiVersions v3: a compact string length of 2**32-1.
        struct.pack(">hhih", 18, 3, 1, -1) + b"\x00" + write_uvarint(2**32 - 1) + b"\x00" * 10,
        # Tagged fields: count 2**31 in the header.
        struct.pack(">hhih", 18, 3, 1, -1) + write_uvarint(2**31) + b"\x00" * 10,
        # Tagged field of size 2**31 in the body: no header tags, two empty compact
        # strings, one tagged field (tag 1) whose size runs far past the frame.
        struct.pack(">hhih", 18, 3, 1, -1) + b"\x00" + b"\x01\x01" + b"\x01\x01" + write_uvarint(2**31),
        # Fetch v4: topics 1, partitions count 2**31-1.
        struct.pack(">hhih", 1, 4, 1, -1)
        + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
        + struct.pack(">ih", 1, 1) + b"t"
        + struct.pack(">i", HUGE)
        + b"\x00" * 10,
    ],
    ids=["metadata-v4-count", "metadata-v12-compact-count", "produce-v3-records",
         "offsetcommit-v2-string", "apiversions-v3-compact-string", "header-tag-count",
         "body-tag-size", "fetch-v4-partitions"],
)  # fmt: skip
def test_huge_sizes_in_small_frames(data: bytes) -> None:
    _assert_fails_fast(messages.decode_request, data)
    with pytest.raises(ProtocolError):
        messages.decode_request(data)


def test_unsupported_versions_are_protocol_errors() -> None:
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(struct.pack(">hhih", 0, 2, 1, -1))
    assert (info.value.api_key, info.value.api_version) == (0, 2)


def test_corpus_frames_pass_the_property() -> None:
    corpus = ROOT / "fuzz" / "corpus"
    files = sorted(corpus.glob("*")) if corpus.is_dir() else []
    for path in files:
        if path.is_file():
            check_decode_request(path.read_bytes())
