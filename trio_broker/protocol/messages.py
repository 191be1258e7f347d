"""The public face of the codec: headers, requests and responses by API key.

Message classes are generated from the schema table; reach them as
``messages.ProduceRequest``, ``messages.ProduceResponse`` and so on (typed for mypy
by the generated :mod:`~trio_broker.protocol.message_types`), or by API key with
:func:`request_schema` / :func:`response_schema`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from trio_broker.protocol.codec import decode_body, encode_body, part_length
from trio_broker.protocol.errors import (
    InvalidValueError,
    ProtocolError,
    TruncatedError,
    UnsupportedVersionError,
)
from trio_broker.protocol.framing import frame_size_prefix
from trio_broker.protocol.message_types import *  # noqa: F403 - every message class, typed
from trio_broker.protocol.primitives import (
    INT16,
    INT32,
    read_nullable_string,
    read_uvarint,
)
from trio_broker.protocol.schema import (
    API_NAMES,
    REQUESTS,
    RESPONSES,
    SCHEMAS,
    Message,
    MessageSchema,
    snake_case,
)


class ApiKey:
    """API keys by name, e.g. ``ApiKey.PRODUCE == 0``."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    INITIALIZE_SHARE_GROUP_STATE = 83
    READ_SHARE_GROUP_STATE = 84
    WRITE_SHARE_GROUP_STATE = 85
    DELETE_SHARE_GROUP_STATE = 86
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


#: API key -> its name as in :class:`ApiKey` ("PRODUCE", "LIST_OFFSETS"), derived from
#: the schema table (metrics labels and verify reports spell it their way from here);
#: tests/unit/protocol/test_api_names.py checks that ApiKey's constants agree with it.
API_KEY_NAMES: dict[int, str] = {key: snake_case(name).upper() for key, name in API_NAMES.items()}
API_VERSIONS_KEY = ApiKey.API_VERSIONS


@attrs.frozen
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def request_schema(api_key: int) -> MessageSchema:
    try:
        return REQUESTS[api_key]
    except KeyError:
        raise UnsupportedVersionError(f"unknown API key {api_key}", api_key) from None


def response_schema(api_key: int) -> MessageSchema:
    return RESPONSES[api_key]


def peek_request_ids(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the first 8 bytes of every request header."""
    if len(frame) < 8:
        raise TruncatedError("request shorter than its header")
    api_key, api_version = INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0]
    return api_key, api_version, INT32.unpack_from(frame, 4)[0]


def decode_request_header(frame: memoryview) -> tuple[RequestHeader, int]:
    """Parse a request header (v1, or v2 for flexible versions); return it and the body offset.

    Raises :class:`UnsupportedVersionError` for an unknown key or a version outside
    the schema's range (the header is still returned in the exception's args).
    """
    api_key, api_version, correlation_id = peek_request_ids(frame)
    client_id, pos = read_nullable_string(frame, 8)
    header = RequestHeader(api_key, api_version, correlation_id, client_id)
    schema = REQUESTS.get(api_key)
    if schema is None or not schema.min_version <= api_version <= schema.max_version:
        raise UnsupportedVersionError(
            f"{API_NAMES.get(api_key, f'API {api_key}')} v{api_version} is not supported",
            api_key,
            api_version,
        )
    if schema.is_flexible(api_version):
        # Header v2: tagged fields after the client id; we know none, so skip them.
        count, pos = read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            if pos + size > len(frame):
                raise TruncatedError("header tagged field runs past the frame")
            pos += size
    return header, pos


def decode_request(frame: bytes | bytearray | memoryview) -> tuple[RequestHeader, Message]:
    """Decode a whole request frame (without its size prefix)."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    header, pos = decode_request_header(view)
    body = decode_body(
        REQUESTS[header.api_key], header.api_version, view[pos:], allow_trailing=True
    )
    return header, body


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, message: Message
) -> bytes:
    """A whole request frame with its size prefix (for tests and tools)."""
    schema = REQUESTS[api_key]
    head = bytearray(INT16.pack(api_key) + INT16.pack(version) + INT32.pack(correlation_id))
    if client_id is None:
        head += INT16.pack(-1)
    else:
        raw = client_id.encode()
        head += INT16.pack(len(raw)) + raw
    if schema.is_flexible(version):
        head.append(0)
    body = b"".join(bytes(p) for p in encode_body(schema, version, message))
    return frame_size_prefix(len(head) + len(body)) + bytes(head) + body


def response_header_is_flexible(api_key: int, version: int) -> bool:
    # ApiVersions responses always use header v0 so that a client can read the
    # error even when it asked for a version the broker does not know.
    return api_key != API_VERSIONS_KEY and RESPONSES[api_key].is_flexible(version)


def encode_response(api_key: int, version: int, correlation_id: int, message: Message) -> list[Any]:
    """A whole response frame as parts: size prefix and header first, payloads as-is."""
    body = encode_body(RESPONSES[api_key], version, message)
    head = bytearray(INT32.pack(correlation_id))
    if response_header_is_flexible(api_key, version):
        head.append(0)
    size = len(head) + sum(part_length(p) for p in body)
    if body and isinstance(body[0], bytearray) and len(body[0]) < 65536:
        body[0][0:0] = frame_size_prefix(size) + head  # one small buffer instead of two
        return body
    return [frame_size_prefix(size) + bytes(head), *body]


def decode_response(api_key: int, version: int, frame: bytes | memoryview) -> tuple[int, Message]:
    """Decode a response frame (without its size prefix): (correlation_id, message)."""
    view = memoryview(frame)
    if len(view) < 4:
        raise TruncatedError("response shorter than its header")
    correlation_id = INT32.unpack_from(view, 0)[0]
    pos = 4
    if response_header_is_flexible(api_key, version):
        count, pos = read_uvarint(view, pos)
        if count:
            raise InvalidValueError("unexpected tagged fields in response header")
    return correlation_id, decode_body(RESPONSES[api_key], version, view[pos:])


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        # A message added to the schema table before message_types.py was regenerated
        # still works at run time; mypy (which does not see this) and
        # tests/unit/protocol/test_message_types.py ask for the regeneration.
        schema = SCHEMAS.get(name)
        if schema is None:
            raise AttributeError(name)
        return schema.cls


__all__ = [
    "API_KEY_NAMES",
    "API_NAMES",
    "REQUESTS",
    "RESPONSES",
    "ApiKey",
    "ProtocolError",
    "RequestHeader",
    "decode_request",
    "decode_request_header",
    "decode_response",
    "encode_request",
    "encode_response",
    "peek_request_ids",
    "request_schema",
    "response_schema",
]
