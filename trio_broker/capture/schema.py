"""The capture row and its Parquet schema, shared by the broker tap and the pcap importer.

``frame`` holds a frame's bytes without the 4-byte size prefix (a request starts
with its header, a response with its correlation id), or a prefix of them;
``frame_length`` is always the whole frame's length.
"""

from __future__ import annotations

from typing import Any

import attrs

REQUEST = "request"
RESPONSE = "response"

#: SaslHandshake and SaslAuthenticate: their bodies may carry secrets.
REDACTED_API_KEYS = frozenset({17, 36, 51})  # 51: salted SCRAM passwords (KIP-554)
#: Bytes kept of a redacted frame: the request header ids / the correlation id.
REDACTED_PREFIX = {REQUEST: 8, RESPONSE: 4}

COLUMNS = (
    "broker_id",
    "connection_id",
    "client_address",
    "client_id",
    "direction",
    "monotonic_ns",
    "wall_ns",
    "api_key",
    "api_version",
    "correlation_id",
    "frame_length",
    "frame",
)


@attrs.define(slots=True)
class CaptureRow:
    broker_id: int
    connection_id: int
    client_address: str
    client_id: str | None
    direction: str
    monotonic_ns: int
    wall_ns: int
    api_key: int
    api_version: int
    correlation_id: int
    frame_length: int
    frame: bytes


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("broker_id", pa.int32()),
            ("connection_id", pa.int64()),
            ("client_address", pa.string()),
            ("client_id", pa.string()),
            ("direction", pa.string()),
            ("monotonic_ns", pa.int64()),
            ("wall_ns", pa.int64()),
            ("api_key", pa.int16()),
            ("api_version", pa.int16()),
            ("correlation_id", pa.int32()),
            ("frame_length", pa.int64()),
            ("frame", pa.binary()),
        ]
    )


def redact(direction: str, api_key: int, frame: bytes) -> bytes:
    """Keep only the ids of SASL frames; everything else as is."""
    if api_key in REDACTED_API_KEYS:
        return frame[: REDACTED_PREFIX[direction]]
    return frame


def rows_to_table(rows: list[CaptureRow]) -> Any:
    import pyarrow as pa

    columns = {name: [getattr(r, name) for r in rows] for name in COLUMNS}
    return pa.Table.from_pydict(columns, schema=arrow_schema())


CAPTURE_SCHEMA = COLUMNS
