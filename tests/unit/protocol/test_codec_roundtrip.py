"""Property test: every message, every version, encode -> decode is the identity.

Strategies are generated from the schema's :class:`Field` trees, so a new API or
version added to ``_schemas.py`` is covered without touching this file. Fields
that do not exist in the version under test are set to a poison value that
cannot be encoded: the encoder must not look at them, and the decoder must hand
back the field's default.

``message_strategy`` and ``expected_roundtrip`` are also used by the
cross-check and fuzz tests (they load this module by path).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol import messages
from trio_broker.protocol.codec import (
    INLINE_RECORDS_LIMIT,
    RecordsChunks,
    decode_body,
    encode_body,
    part_length,
)
from trio_broker.protocol.schema import REQUESTS, RESPONSES, SCHEMAS, Field, Message, MessageSchema

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

#: Small collections keep nested messages (Fetch responses...) fast to build.
MAX_ITEMS = 3


class Absent:
    """Stands in for a field that does not exist in the version under test.

    It has no ``len``, no ``bytes`` and no ``encode``: any attempt to encode it fails.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = Absent()


def _scalar_strategy(f: Field, version: int, nullable: bool) -> st.SearchStrategy[Any]:
    t = f.type
    s: st.SearchStrategy[Any]
    if f.fields is not None:
        assert f.struct_class is not None
        s = struct_strategy(f.struct_class, f.fields, version)
    elif t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        s = st.integers(lo, hi)
    elif t == "bool":
        s = st.booleans()
    elif t == "float64":
        s = st.floats(allow_nan=False)
    elif t == "string":
        # Sometimes long and multi-byte: lengths count bytes, and compact
        # lengths over 127 take a two-byte varint.
        s = st.text(max_size=12) | st.integers(64, 200).map(lambda n: "é" * n)
    elif t == "bytes":
        s = st.binary(max_size=24) | st.integers(128, 300).map(bytes)
    elif t == "records":
        s = st.binary(max_size=64) | st.integers(128, 300).map(lambda n: b"\x01" * n)
    elif t == "uuid":
        s = st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))
    else:  # pragma: no cover - schema.py rejects unknown types
        raise AssertionError(t)
    return st.none() | s if nullable else s


def field_strategy(f: Field, version: int) -> st.SearchStrategy[Any]:
    """Values of field ``f`` that are valid in ``version`` (None only where nullable)."""
    nullable = f.nullable_in(version)
    if f.is_array:
        items = st.lists(_scalar_strategy(f, version, nullable=False), max_size=MAX_ITEMS)
        return st.none() | items if nullable else items
    return _scalar_strategy(f, version, nullable)


def struct_strategy(
    cls: type[Message], fields: tuple[Field, ...], version: int
) -> st.SearchStrategy[Message]:
    kwargs: dict[str, st.SearchStrategy[Any]] = {
        f.attr: field_strategy(f, version) if f.present_in(version) else st.just(ABSENT)
        for f in fields
    }
    return st.builds(cls, **kwargs)


_cache: dict[tuple[str, int], st.SearchStrategy[Message]] = {}


def message_strategy(schema: MessageSchema, version: int) -> st.SearchStrategy[Message]:
    """Messages of ``schema`` for ``version``; absent fields hold :data:`ABSENT`."""
    key = (schema.name, version)
    if key not in _cache:
        _cache[key] = struct_strategy(schema.cls, schema.fields, version)
    return _cache[key]


def expected_roundtrip(msg: Message, version: int) -> Message:
    """What decoding ``msg`` encoded at ``version`` must give: absent fields at defaults."""
    cls = type(msg)
    kwargs = {}
    for f in cls._fields:
        value = getattr(msg, f.attr)
        if not f.present_in(version):
            value = f.default_value()
        elif f.fields is not None and value is not None:
            value = (
                [expected_roundtrip(v, version) for v in value]
                if f.is_array
                else expected_roundtrip(value, version)
            )
        kwargs[f.attr] = value
    return cls(**kwargs)


def body_bytes(schema: MessageSchema, version: int, msg: Message) -> bytes:
    return b"".join(bytes(p) for p in encode_body(schema, version, msg))


def all_versions(schemas: dict[int, MessageSchema]) -> list[tuple[str, int]]:
    return [
        (s.name, v)
        for _, s in sorted(schemas.items())
        for v in range(s.min_version, s.max_version + 1)
    ]


FAST = settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

REQUEST_CASES = all_versions(REQUESTS)
RESPONSE_CASES = all_versions(RESPONSES)


def _ids(case: tuple[str, int]) -> str:
    return f"{case[0]}-v{case[1]}"


def _check_body_roundtrip(schema: MessageSchema, version: int, msg: Message) -> bytes:
    wire = body_bytes(schema, version, msg)
    decoded = decode_body(schema, version, memoryview(wire))
    assert decoded == expected_roundtrip(msg, version)
    # Canonical: re-encoding what we decoded gives the same bytes.
    assert body_bytes(schema, version, decoded) == wire
    return wire


@pytest.mark.parametrize("case", REQUEST_CASES, ids=_ids)
def test_request_roundtrip(case: tuple[str, int]) -> None:
    name, version = case
    schema = SCHEMAS[name]

    @FAST
    @given(
        msg=message_strategy(schema, version),
        correlation_id=st.integers(-(2**31), 2**31 - 1),
        client_id=st.none() | st.text(max_size=10),
    )
    def check(msg: Message, correlation_id: int, client_id: str | None) -> None:
        _check_body_roundtrip(schema, version, msg)
        frame = messages.encode_request(schema.api_key, version, correlation_id, client_id, msg)
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        header, decoded = messages.decode_request(frame[4:])
        assert header == messages.RequestHeader(schema.api_key, version, correlation_id, client_id)
        assert decoded == expected_roundtrip(msg, version)

    check()


@pytest.mark.parametrize("case", RESPONSE_CASES, ids=_ids)
def test_response_roundtrip(case: tuple[str, int]) -> None:
    name, version = case
    schema = SCHEMAS[name]

    @FAST
    @given(msg=message_strategy(schema, version), correlation_id=st.integers(-(2**31), 2**31 - 1))
    def check(msg: Message, correlation_id: int) -> None:
        _check_body_roundtrip(schema, version, msg)
        parts = messages.encode_response(schema.api_key, version, correlation_id, msg)
        frame = b"".join(bytes(p) for p in parts)
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        assert sum(part_length(p) for p in parts) == len(frame)
        corr, decoded = messages.decode_response(schema.api_key, version, frame[4:])
        assert corr == correlation_id
        assert decoded == expected_roundtrip(msg, version)

    check()


def test_every_schema_version_is_covered() -> None:
    assert len(REQUEST_CASES) == sum(s.max_version - s.min_version + 1 for s in REQUESTS.values())
    assert {s.api_key for s in REQUESTS.values()} == {s.api_key for s in RESPONSES.values()}
    assert len(REQUEST_CASES) > 100


# --------------------------------------------------------------------------- targeted cases


def test_absent_fields_come_back_as_defaults() -> None:
    # Metadata v0 has only Topics; everything later must decode to its default.
    schema = REQUESTS[messages.ApiKey.METADATA]
    C: Any = schema.cls
    msg = C(
        topics=[C.MetadataRequestTopic(name="t", topic_id=uuid.uuid4())],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    decoded: Any = decode_body(schema, 0, memoryview(body_bytes(schema, 0, msg)))
    assert decoded.allow_auto_topic_creation is True  # Kafka's default for the field
    assert decoded.include_topic_authorized_operations is False
    assert decoded.topics[0].topic_id == uuid.UUID(int=0)
    assert decoded.topics[0].name == "t"


def test_tagged_fields_at_default_are_left_out() -> None:
    schema = RESPONSES[messages.ApiKey.API_VERSIONS]
    C: Any = schema.cls
    msg: Any = C(error_code=0, api_keys=[], throttle_time_ms=0)
    wire = body_bytes(schema, 3, msg)
    # error(2) + compact empty array(1) + throttle(4) + zero tagged fields(1)
    assert wire == b"\x00\x00" + b"\x01" + b"\x00\x00\x00\x00" + b"\x00"
    msg.finalized_features_epoch = 7
    wire = body_bytes(schema, 3, msg)
    assert wire.endswith(b"\x01\x01\x08" + (7).to_bytes(8, "big"))


def test_unknown_tagged_fields_are_skipped() -> None:
    schema = REQUESTS[messages.ApiKey.API_VERSIONS]
    C: Any = schema.cls
    msg = C(client_software_name="x", client_software_version="1")
    wire = body_bytes(schema, 3, msg)
    assert wire[-1] == 0
    with_tag = wire[:-1] + b"\x01" + b"\x2a\x03abc"  # tag 42, 3 bytes
    assert decode_body(schema, 3, memoryview(with_tag)) == msg


def test_large_records_are_not_copied() -> None:
    schema = SCHEMAS["ProduceRequest"]
    C: Any = schema.cls
    payload = bytes(range(256)) * 64  # 16 KiB, over the inline limit
    assert len(payload) > INLINE_RECORDS_LIMIT
    P = C.TopicProduceData.PartitionProduceData
    msg = C(
        acks=-1,
        timeout_ms=1000,
        topic_data=[C.TopicProduceData(name="t", partition_data=[P(records=payload)])],
    )
    for version in (3, 9):
        parts = encode_body(schema, version, msg)
        assert any(p is payload for p in parts)  # travels as its own part
        wire = b"".join(bytes(p) for p in parts)
        buf = memoryview(wire)
        decoded: Any = decode_body(schema, version, buf)
        records = decoded.topic_data[0].partition_data[0].records
        assert isinstance(records, memoryview)
        assert records.obj is buf.obj  # a view into the request, not a copy
        assert records == payload


def test_records_chunks_encode_as_their_parts() -> None:
    schema = SCHEMAS["FetchResponse"]
    C: Any = schema.cls
    chunks = RecordsChunks([b"a" * 10, memoryview(b"b" * 20), bytearray(b"c" * 5)])
    assert chunks.nbytes == 35
    P = C.FetchableTopicResponse.PartitionData
    for version in (4, 12, 16):
        msg = C(
            responses=[
                C.FetchableTopicResponse(
                    topic="t",
                    topic_id=uuid.UUID(int=5),
                    partitions=[P(partition_index=0, records=chunks)],
                )
            ]
        )
        parts = encode_body(schema, version, msg)
        assert any(p is chunks.parts[1] for p in parts)
        wire = b"".join(bytes(p) for p in parts)
        decoded: Any = decode_body(schema, version, memoryview(wire))
        assert decoded.responses[0].partitions[0].records == b"a" * 10 + b"b" * 20 + b"c" * 5


def test_poison_value_is_really_unencodable() -> None:
    # Guards the meaning of the roundtrip test: ABSENT must break any encoder it reaches.
    schema = SCHEMAS["ApiVersionsRequest"]
    C: Any = schema.cls
    msg = C(client_software_name=ABSENT, client_software_version="1")
    with pytest.raises((TypeError, AttributeError)):
        encode_body(schema, 3, msg)
    assert body_bytes(schema, 2, msg) == b""
