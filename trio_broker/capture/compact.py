"""Batch-header capture of Produce requests: what the checks need, without the records.

Every fact the verifier takes from a Produce request — topic, partition, and per
batch its CRC, record count and producer id/epoch/sequence — lies in the 61-byte
batch header. A compacted frame is the same request re-encoded with each batch
cut to its header (``batch_length`` = 49, so the batch still parses; its CRC
field is the client's, no longer a checksum of what follows). The row keeps the
original ``frame_length``, so a compacted frame is shorter than it: the verifier
decodes it all the same, and ``replay`` skips it (it cannot be re-sent).
"""

from __future__ import annotations

import struct
from typing import Any

from trio_broker.protocol.messages import decode_request, encode_request
from trio_broker.protocol.records import LENGTH_OVERHEAD, MIN_BATCH_LENGTH, split_batches

PRODUCE = 0
#: A batch header: base offset and batch length (12 bytes), then MIN_BATCH_LENGTH bytes.
HEADER_BYTES = LENGTH_OVERHEAD + MIN_BATCH_LENGTH
_BATCH_LENGTH = struct.Struct(">i")


def compact_produce_request(frame: Any) -> bytes:
    """The Produce request ``frame`` (no size prefix) with every batch cut to its header."""
    body: Any
    header, body = decode_request(frame)
    for topic in body.topic_data:
        for part in topic.partition_data:
            if part.records is None:
                continue
            batches, _tail = split_batches(part.records)
            heads = bytearray()
            for batch in batches:
                head = bytearray(batch.buf[:HEADER_BYTES])
                _BATCH_LENGTH.pack_into(head, 8, MIN_BATCH_LENGTH)
                heads += head
            part.records = bytes(heads)
    encoded = encode_request(
        header.api_key, header.api_version, header.correlation_id, header.client_id, body
    )
    return encoded[4:]
