"""Request and response headers, API/version dispatch and its errors."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_broker.protocol import messages
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import (
    InvalidValueError,
    ProtocolError,
    TruncatedError,
    UnsupportedVersionError,
)
from trio_broker.protocol.schema import REQUESTS, RESPONSES

#: Generated classes, typed Any: their attributes come from the schema at import time.
API_VERSIONS_RESPONSE: Any = RESPONSES[18].cls
HEARTBEAT_RESPONSE: Any = RESPONSES[12].cls

SETTINGS = settings(max_examples=100, deadline=None, database=None)


def header_v1(api_key: int, version: int, corr: int, client_id: bytes | None) -> bytes:
    head = struct.pack(">hhi", api_key, version, corr)
    if client_id is None:
        return head + b"\xff\xff"
    return head + struct.pack(">h", len(client_id)) + client_id


# --------------------------------------------------------------------------- request headers


def test_request_header_v1() -> None:
    # Metadata v4 is not flexible: header v1 and the body follows the client id.
    frame = header_v1(3, 4, 99, b"client") + struct.pack(">i", -1) + b"\x01"
    header, pos = messages.decode_request_header(memoryview(frame))
    assert header == messages.RequestHeader(3, 4, 99, "client")
    assert pos == 8 + 2 + 6
    body: Any = messages.decode_request(frame)[1]
    assert body.topics is None and body.allow_auto_topic_creation is True


def test_request_header_v2_has_tagged_fields_and_a_classic_client_id() -> None:
    # Metadata v12 is flexible: header v2. The client id keeps its int16 length
    # (it is never a compact string), then comes the header's tagged-field section.
    body = b"\x00" + b"\x01" + b"\x00" + b"\x00"  # null topics, auto create, no auth ops, no tags
    frame = header_v1(3, 12, 7, b"abc") + b"\x00" + body
    header, pos = messages.decode_request_header(memoryview(frame))
    assert header == messages.RequestHeader(3, 12, 7, "abc")
    assert pos == 8 + 2 + 3 + 1
    msg: Any = messages.decode_request(frame)[1]
    assert msg.topics is None


def test_request_header_v2_unknown_tags_are_skipped() -> None:
    tags = b"\x02" + b"\x05\x02ab" + b"\x09\x00"  # two unknown tags: 2 bytes and 0 bytes
    frame = header_v1(18, 3, 1, b"c") + tags + b"\x02x\x021\x00"
    _header, pos = messages.decode_request_header(memoryview(frame))
    assert pos == len(frame) - 5
    msg: Any = messages.decode_request(frame)[1]
    assert (msg.client_software_name, msg.client_software_version) == ("x", "1")


def test_request_header_tag_past_the_end_raises() -> None:
    frame = header_v1(18, 3, 1, b"c") + b"\x01\x05\x7f" + b"ab"
    with pytest.raises(TruncatedError):
        messages.decode_request_header(memoryview(frame))


def test_null_client_id() -> None:
    frame = header_v1(18, 0, 5, None)
    header, decoded = messages.decode_request(frame)
    assert header.client_id is None
    encoded = messages.encode_request(18, 0, 5, None, decoded)
    assert encoded[4:] == frame


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x12\x00",
        header_v1(18, 0, 1, b"")[:-1],  # client id length cut
        struct.pack(">hhih", 18, 0, 1, 5) + b"ab",  # client id shorter than its length
        struct.pack(">hhih", 18, 0, 1, -2),  # negative client id length
    ],
)
def test_truncated_or_bad_headers_raise_protocol_errors(frame: bytes) -> None:
    with pytest.raises((TruncatedError, InvalidValueError)):
        messages.decode_request(frame)


def test_client_id_must_be_utf8() -> None:
    with pytest.raises(InvalidValueError):
        messages.decode_request(header_v1(18, 0, 1, b"\xff\xfe"))


@SETTINGS
@given(
    key=st.sampled_from(sorted(REQUESTS)),
    data=st.data(),
    corr=st.integers(-(2**31), 2**31 - 1),
    client_id=st.none() | st.text(max_size=20),
)
def test_encode_request_header_roundtrip(
    key: int, data: st.DataObject, corr: int, client_id: str | None
) -> None:
    schema = REQUESTS[key]
    version = data.draw(st.integers(schema.min_version, schema.max_version))
    frame = messages.encode_request(key, version, corr, client_id, schema.cls())
    header, pos = messages.decode_request_header(memoryview(frame[4:]))
    assert header == messages.RequestHeader(key, version, corr, client_id)
    raw_id = b"" if client_id is None else client_id.encode()
    assert pos == 10 + len(raw_id) + (1 if schema.is_flexible(version) else 0)
    assert messages.peek_request_ids(frame[4:]) == (key, version, corr)


# --------------------------------------------------------------------------- dispatch errors


@pytest.mark.parametrize("api_key", [-1, 4, 7, 1000, 32767])
def test_unknown_api_key(api_key: int) -> None:
    frame = header_v1(api_key, 0, 42, b"c") + b"junk"
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(frame)
    assert (info.value.api_key, info.value.api_version) == (api_key, 0)
    assert info.value.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert isinstance(info.value, ProtocolError)
    with pytest.raises(UnsupportedVersionError) as info2:
        messages.request_schema(api_key)
    assert info2.value.api_key == api_key


@pytest.mark.parametrize("key", sorted(REQUESTS))
def test_versions_outside_the_range(key: int) -> None:
    schema = REQUESTS[key]
    for version in (schema.min_version - 1, schema.max_version + 1, -1, 32767):
        if schema.min_version <= version <= schema.max_version:
            continue
        # Whatever follows the header: the version is checked before the body.
        frame = header_v1(key, version, 42, b"c") + b"\xff" * 3
        with pytest.raises(UnsupportedVersionError) as info:
            messages.decode_request(frame)
        assert (info.value.api_key, info.value.api_version) == (key, version)
        # The correlation id is still readable for the error answer.
        assert messages.peek_request_ids(frame) == (key, version, 42)


def test_api_versions_unsupported_version_is_answerable() -> None:
    # A client newer than us asks ApiVersions v127 with a body we cannot parse.
    frame = header_v1(18, 127, 9, b"future") + b"\x00\x01\x02"
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(frame)
    assert (info.value.api_key, info.value.api_version) == (18, 127)
    api_key, version, corr = messages.peek_request_ids(frame)
    assert (api_key, version, corr) == (18, 127, 9)
    # The answer is a v0 body with a v0 header.
    answer = API_VERSIONS_RESPONSE(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=[API_VERSIONS_RESPONSE.ApiVersion(api_key=18, min_version=0, max_version=4)],
    )
    wire = b"".join(bytes(p) for p in messages.encode_response(18, 0, corr, answer))
    assert wire == struct.pack(">ii", 4 + 2 + 4 + 6, 9) + struct.pack(">hi", 35, 1) + struct.pack(
        ">hhh", 18, 0, 4
    )


# --------------------------------------------------------------------------- peek


def test_peek_request_ids() -> None:
    assert messages.peek_request_ids(struct.pack(">hhi", 0, 9, -5)) == (0, 9, -5)
    assert messages.peek_request_ids(memoryview(struct.pack(">hhi", 1, 2, 3) + b"rest")) == (
        1,
        2,
        3,
    )
    with pytest.raises(TruncatedError):
        messages.peek_request_ids(b"\x00" * 7)


# --------------------------------------------------------------------------- response headers


def _wire(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_response_header_v0_for_non_flexible() -> None:
    wire = _wire(messages.encode_response(12, 3, 77, HEARTBEAT_RESPONSE(error_code=0)))
    # size, correlation id, then the body (throttle, error) — no tagged fields.
    assert wire == struct.pack(">iiih", 4 + 4 + 2, 77, 0, 0)


def test_response_header_v1_for_flexible() -> None:
    wire = _wire(messages.encode_response(12, 4, 77, HEARTBEAT_RESPONSE(error_code=0)))
    # correlation id, header tagged fields (0), throttle, error, body tagged fields (0)
    assert (
        wire
        == struct.pack(">ii", 4 + 1 + 4 + 2 + 1, 77) + b"\x00" + struct.pack(">ih", 0, 0) + b"\x00"
    )
    assert messages.decode_response(12, 4, wire[4:]) == (77, HEARTBEAT_RESPONSE(error_code=0))


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_header_is_always_v0(version: int) -> None:
    msg = API_VERSIONS_RESPONSE(
        api_keys=[API_VERSIONS_RESPONSE.ApiVersion(api_key=0, min_version=3, max_version=13)]
    )
    wire = _wire(messages.encode_response(18, version, 5, msg))
    assert wire[4:8] == struct.pack(">i", 5)
    assert wire[8:10] == b"\x00\x00"  # the error code comes right after the correlation id
    assert messages.response_header_is_flexible(18, version) is False
    corr, decoded = messages.decode_response(18, version, wire[4:])
    assert isinstance(decoded, API_VERSIONS_RESPONSE)
    assert corr == 5 and decoded.api_keys[0].max_version == 13


@pytest.mark.parametrize("key", sorted(RESPONSES))
def test_response_header_flexibility_follows_the_schema(key: int) -> None:
    schema = RESPONSES[key]
    for version in range(schema.min_version, schema.max_version + 1):
        expected = key != 18 and schema.is_flexible(version)
        assert messages.response_header_is_flexible(key, version) is expected
        wire = _wire(messages.encode_response(key, version, 1, schema.cls()))
        assert struct.unpack(">i", wire[:4])[0] == len(wire) - 4
        assert messages.decode_response(key, version, wire[4:])[0] == 1
        if expected:
            assert wire[8] == 0  # empty header tagged fields


def test_decode_response_rejects_short_frames() -> None:
    with pytest.raises(TruncatedError):
        messages.decode_response(12, 0, b"\x00\x00")


def test_message_classes_by_name() -> None:
    assert messages.ProduceRequest is REQUESTS[0].cls
    assert messages.FetchResponse is RESPONSES[1].cls
    produce: Any = messages.ProduceRequest
    assert produce.TopicProduceData.kafka_name == "ProduceRequest.TopicProduceData"
    with pytest.raises(AttributeError):
        messages.NoSuchRequest  # noqa: B018
    for name in ("PRODUCE", "FETCH", "METADATA", "API_VERSIONS", "INIT_PRODUCER_ID"):
        key = getattr(messages.ApiKey, name)
        assert key in REQUESTS and messages.API_NAMES[key].upper().replace("_", "") == (
            name.replace("_", "")
        )
