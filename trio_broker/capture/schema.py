"""The capture row and its Parquet schema, shared by the broker tap and the pcap importer.

``frame`` holds a frame's bytes without the 4-byte size prefix (a request starts
with its header, a response with its correlation id), or a prefix of them;
``frame_length`` is always the whole frame's length.
"""

from __future__ import annotations

from array import array
from typing import Any

import attrs

from trio_broker.protocol.messages import ApiKey

REQUEST = "request"
RESPONSE = "response"

#: SaslHandshake and SaslAuthenticate: their bodies may carry secrets.
REDACTED_API_KEYS = frozenset(
    {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.ALTER_USER_SCRAM_CREDENTIALS}
)  # the last carries salted SCRAM passwords (KIP-554)
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
    #: bytes, or a view into the tap's reused buffers until the row is written
    frame: bytes | memoryview


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


def redact(direction: str, api_key: int, frame: Any) -> Any:
    """Keep only the ids of SASL frames; everything else as is."""
    if api_key in REDACTED_API_KEYS:
        return frame[: REDACTED_PREFIX[direction]]
    return frame


#: Frames at least this big become their own zero-copy Arrow chunk; smaller ones are joined.
ZERO_COPY_BYTES = 64 * 1024


def _joined(values: list[Any]) -> Any:
    import pyarrow as pa

    offsets = array("i", [0]) * (len(values) + 1)
    total = 0
    for i, value in enumerate(values):
        total += len(value)
        offsets[i + 1] = total
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
    )


def _binary_column(values: list[Any]) -> Any:
    """The ``frame`` column without copying big frames in Python.

    ``pa.array`` on megabyte frames re-grows (re-copies, page-faults) its value
    buffer while holding the GIL, which stalls the broker's event loop; here a
    big frame's bytes object becomes an Arrow buffer as is (one chunk), and
    only small frames are joined (the Parquet writer copies in C++).
    """
    import pyarrow as pa

    chunks: list[Any] = []
    small: list[Any] = []
    for value in values:
        if len(value) < ZERO_COPY_BYTES:
            small.append(value)
            continue
        if small:
            chunks.append(_joined(small))
            small = []
        offsets = array("i", [0, len(value)])
        chunks.append(
            pa.Array.from_buffers(
                pa.binary(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(value)]
            )
        )
    if small or not chunks:
        chunks.append(_joined(small))
    return pa.chunked_array(chunks, pa.binary())


def rows_to_table(rows: list[CaptureRow]) -> Any:
    import pyarrow as pa

    columns = {name: [getattr(r, name) for r in rows] for name in COLUMNS if name != "frame"}
    schema = arrow_schema()
    arrays = [pa.array(columns[f.name], f.type) for f in schema if f.name != "frame"]
    arrays.append(_binary_column([r.frame for r in rows]))
    return pa.Table.from_arrays(arrays, schema=schema)


CAPTURE_SCHEMA = COLUMNS
