"""The few record-batch header fields the storage layer needs (magic v2 only).

Storage treats a batch as opaque bytes apart from its 61-byte header. These
helpers stay private to storage until ``trio_broker.protocol.records`` lands; they
never decode records, so compressed batches cost nothing extra here.

Header layout (big-endian): baseOffset int64 @0, batchLength int32 @8 (the batch
is batchLength + 12 bytes), partitionLeaderEpoch int32 @12, magic int8 @16,
crc uint32 @17 (CRC32C of bytes 21..end), attributes int16 @21,
lastOffsetDelta int32 @23, baseTimestamp int64 @27, maxTimestamp int64 @35,
producerId int64 @43, producerEpoch int16 @51, baseSequence int32 @53,
recordCount int32 @57.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c

HEADER_SIZE = 61
#: baseOffset + batchLength: the bytes batchLength does not count.
LOG_OVERHEAD = 12
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
MAGIC_V2 = 2

BASE_OFFSET_AT = 0
BATCH_LENGTH_AT = 8
LEADER_EPOCH_AT = 12
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21
LAST_OFFSET_DELTA_AT = 23
BASE_TIMESTAMP_AT = 27
MAX_TIMESTAMP_AT = 35

#: attributes bit 3: timestamps are the broker's LogAppendTime.
TIMESTAMP_TYPE_BIT = 0x08

_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qi")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
assert _HEADER.size == HEADER_SIZE


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies in a log."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the 61-byte header at ``buf[pos:]`` (no validation)."""
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def base_offset_and_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(baseOffset, whole batch size) of the header at ``pos``: the cheapest walk step."""
    base, length = _PREFIX.unpack_from(buf, pos)
    return base, length + LOG_OVERHEAD


#: batchLength, magic, lastOffsetDelta, maxTimestamp: what an append needs, in one unpack.
_APPEND_FIELDS = struct.Struct(">8xi4xb6xi8xq")
assert _APPEND_FIELDS.size == MAX_TIMESTAMP_AT + 8


def append_fields(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, int]:
    """(whole batch size, magic, lastOffsetDelta, maxTimestamp) of the header at 0."""
    length, magic_, delta, max_ts = _APPEND_FIELDS.unpack_from(buf)
    return length + LOG_OVERHEAD, magic_, delta, max_ts


def last_offset_delta(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    return int(_I32.unpack_from(buf, pos + LAST_OFFSET_DELTA_AT)[0])


def max_timestamp(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    return int(_I64.unpack_from(buf, pos + MAX_TIMESTAMP_AT)[0])


def magic(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    return int(_I8.unpack_from(buf, pos + MAGIC_AT)[0])


def stored_crc(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    return int(_U32.unpack_from(buf, pos + CRC_AT)[0])


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """CRC32C of the bytes the batch CRC covers (attributes to the end)."""
    return int(crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:]))


def crc_matches(batch: bytes | bytearray | memoryview) -> bool:
    return compute_crc(batch) == stored_crc(batch)


def set_base_offset(batch: bytearray | memoryview, offset: int) -> None:
    # baseOffset is outside the CRC, so no recompute.
    _I64.pack_into(batch, BASE_OFFSET_AT, offset)


def set_log_append_time(batch: bytearray | memoryview, now_ms: int) -> None:
    """Stamp LogAppendTime: timestamp-type bit, maxTimestamp, and the CRC they change.

    Records keep their deltas: consumers read every record's time from maxTimestamp
    when the bit is set, which is why only the header changes.
    """
    attributes = _I16.unpack_from(batch, ATTRIBUTES_AT)[0]
    _I16.pack_into(batch, ATTRIBUTES_AT, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(batch, MAX_TIMESTAMP_AT, now_ms)
    _U32.pack_into(batch, CRC_AT, compute_crc(batch))


# --- building batches (tests, benchmarks, the crash child) ---------------------------


def _varint(value: int, out: bytearray) -> None:
    """Append a zigzag varint (Kafka's record-level encoding for ints and longs)."""
    z = (value << 1) ^ (value >> 63)
    z &= (1 << 64) - 1
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def _record(
    offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None
) -> bytes:
    body = bytearray(b"\x00")  # record attributes
    _varint(timestamp_delta, body)
    _varint(offset_delta, body)
    for field in (key, value):
        if field is None:
            _varint(-1, body)
        else:
            _varint(len(field), body)
            body += field
    _varint(0, body)  # header count
    framed = bytearray()
    _varint(len(body), framed)
    return bytes(framed + body)


def build_batch(
    values: Sequence[bytes | None],
    *,
    base_offset: int = 0,
    timestamp: int = 0,
    keys: Sequence[bytes | None] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    attributes: int = 0,
) -> bytearray:
    """A valid uncompressed magic-2 batch holding one record per value.

    Every record gets ``timestamp`` (delta 0), so baseTimestamp == maxTimestamp.
    Returns a fresh bytearray because ``PartitionLog.append`` rewrites it in place.
    """
    if not values:
        raise ValueError("a batch holds at least one record")
    if keys is None:
        keys = [None] * len(values)
    records = b"".join(
        _record(i, 0, key, value) for i, (key, value) in enumerate(zip(keys, values, strict=True))
    )
    size = HEADER_SIZE + len(records)
    buf = bytearray(size)
    _HEADER.pack_into(
        buf,
        0,
        base_offset,
        size - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        len(values) - 1,
        timestamp,
        timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(values),
    )
    buf[HEADER_SIZE:] = records
    _U32.pack_into(buf, CRC_AT, compute_crc(buf))
    return buf
