"""Batch-header capture of Produce requests and Fetch responses: what the checks need.

Every fact the verifier takes from a record batch — its offsets, CRC, record
count and producer id/epoch/sequence — lies in the 61-byte batch header. A
compacted frame is the same message re-encoded with each batch cut to its
header (``batch_length`` = 49, so the batch still parses; its CRC field is the
original's, no longer a checksum of what follows). The row keeps the original
``frame_length``, so a compacted frame is shorter than it: the verifier decodes
it all the same, and ``replay`` skips a compacted request (it cannot be re-sent).

Fetch responses are compacted from the response message before its records
are read: only the headers are read from the log (one small read per batch),
so capturing a consumer's traffic does not copy what it consumes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, cast

from trio_broker.protocol import primitives
from trio_broker.protocol.batch_header import (
    BATCH_LENGTH_AT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
)
from trio_broker.protocol.codec import Records, RecordsChunks, part_length
from trio_broker.protocol.messages import (
    ApiKey,
    FetchResponse,
    ProduceRequest,
    decode_request,
    encode_request,
    encode_response,
)
from trio_broker.protocol.records import split_batches

PRODUCE = ApiKey.PRODUCE
FETCH = ApiKey.FETCH
_BATCH_LENGTH = primitives.INT32


def compact_produce_request(frame: Any) -> bytes:
    """The Produce request ``frame`` (no size prefix) with every batch cut to its header."""
    header, decoded = decode_request(frame)
    body = cast(ProduceRequest, decoded)  # the caller passes Produce frames only
    for topic in body.topic_data:
        for part in topic.partition_data:
            if part.records is None:
                continue
            batches, _tail = split_batches(part.records)
            part.records = b"".join(_cut_to_header(batch.buf[:HEADER_SIZE]) for batch in batches)
    encoded = encode_request(
        header.api_key, header.api_version, header.correlation_id, header.client_id, body
    )
    return encoded[4:]


def _cut_to_header(header: Any) -> bytes:
    """A batch's first HEADER_SIZE bytes, its length field set to a header-only batch's."""
    head = bytearray(header)
    _BATCH_LENGTH.pack_into(head, BATCH_LENGTH_AT, MIN_BATCH_LENGTH)
    return bytes(head)


#: Reads ``n`` bytes at ``position`` of a records part (bytes, or a region of a file).
ReadPart = Callable[[Any, int, int], bytes]


def batch_headers(parts: Sequence[Any], read: ReadPart) -> bytes:
    """The whole batches stored one after another in ``parts``, each cut to its header.

    Only the batch headers are read. A trailing partial batch (a fetch cut at its
    byte limit) is left out, as the verifier's decoder leaves it out.
    """
    lengths = [part_length(part) for part in parts]

    def read_at(position: int, n: int) -> bytes:
        out = b""
        for part, length in zip(parts, lengths, strict=True):
            if position < length and n > 0:
                take = min(n, length - position)
                out += read(part, position, take)
                n -= take
                position = 0
            else:
                position -= length
        return out

    total = sum(lengths)
    heads = []
    position = 0
    while position + HEADER_SIZE <= total:
        head = read_at(position, HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            break  # the file is shorter than its region said
        size = LOG_OVERHEAD + _BATCH_LENGTH.unpack_from(head, BATCH_LENGTH_AT)[0]
        if size < HEADER_SIZE or position + size > total:
            break
        heads.append(_cut_to_header(head))
        position += size
    return b"".join(heads)


def fetch_records(message: FetchResponse) -> list[Records | None]:
    """The records values of a Fetch response's partitions, in encoding order."""
    return [part.records for topic in message.responses for part in topic.partitions]


def compact_fetch_response(
    version: int,
    correlation_id: int,
    message: FetchResponse,
    records: list[Records | None],
    read: ReadPart,
) -> bytes:
    """The Fetch response frame (no size prefix) of ``message`` with its batches cut to headers.

    ``records`` holds each partition's records as :func:`fetch_records` lists them
    (the caller may have swapped file regions for ones it owns); the message itself
    is not changed.
    """
    compact = copy.copy(message)
    compact.responses = []
    values = iter(records)
    for topic in message.responses:
        topic_copy = copy.copy(topic)
        topic_copy.partitions = []
        for part in topic.partitions:
            part_copy = copy.copy(part)
            value = next(values)
            if value is not None:
                parts = value.parts if isinstance(value, RecordsChunks) else [value]
                part_copy.records = batch_headers(parts, read)
            topic_copy.partitions.append(part_copy)
        compact.responses.append(topic_copy)
    encoded = encode_response(FETCH, version, correlation_id, compact)
    return b"".join(bytes(piece) for piece in encoded)[4:]
