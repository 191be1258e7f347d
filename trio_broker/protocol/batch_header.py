"""The record-batch header (message format v2, magic 2): the one table of its fields.

A record batch is a fixed 61-byte header followed by the (possibly compressed)
records. This module knows the header and nothing after it: where each field
lies, and the reads and in-place patches that never decode a record, so a
compressed batch costs nothing extra here. Storage treats a batch as opaque bytes
apart from these fields; :mod:`trio_broker.protocol.records` reads them through
``RecordBatchView`` and builds whole batches with ``build_batch``.

Header layout (big-endian)::

     0 baseOffset int64        27 baseTimestamp int64
     8 batchLength int32       35 maxTimestamp int64
    12 partitionLeaderEpoch    43 producerId int64
    16 magic int8              51 producerEpoch int16
    17 crc uint32 (CRC32C of bytes 21..end)
    21 attributes int16        53 baseSequence int32
    23 lastOffsetDelta int32   57 recordCount int32

A batch is batchLength + :data:`LOG_OVERHEAD` bytes long. Nothing here validates:
callers check that the bytes they read exist.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from trio_broker.protocol import primitives
from trio_broker.protocol.primitives import Buffer

HEADER_SIZE = 61
#: baseOffset and batchLength come before the bytes batchLength counts.
LOG_OVERHEAD = 12
#: The smallest legal batchLength: a header with no records.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
MAGIC = 2

# The wire types, bound here by assignment: CPython 3.11 compiles a method call on a
# name bound by ``from ... import`` as a module attribute load, some 20 ns slower a call.
_I8, _I16, _I32 = primitives.INT8, primitives.INT16, primitives.INT32
_I64, _U32 = primitives.INT64, primitives.UINT32

# Field offsets.
BASE_OFFSET_AT = 0
BATCH_LENGTH_AT = 8
LEADER_EPOCH_AT = 12
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21  # the CRC covers from here to the end
LAST_OFFSET_DELTA_AT = 23
BASE_TIMESTAMP_AT = 27
MAX_TIMESTAMP_AT = 35
PRODUCER_ID_AT = 43
PRODUCER_EPOCH_AT = 51
BASE_SEQUENCE_AT = 53
RECORD_COUNT_AT = 57

# Attribute bits.
CODEC_MASK = 0x07
#: Timestamps are the broker's LogAppendTime (else the producer's CreateTime).
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

#: The whole header, field by field in the order of the table above.
HEADER = struct.Struct(">qiibIhiqqqhii")
assert HEADER.size == HEADER_SIZE
#: baseOffset and batchLength: the cheapest step of a walk along a log.
_PREFIX = struct.Struct(">qi")
#: batchLength, magic, lastOffsetDelta, maxTimestamp: what an append needs, in one unpack.
_APPEND_FIELDS = struct.Struct(">8xi4xb6xi8xq")
assert _APPEND_FIELDS.size == MAX_TIMESTAMP_AT + 8


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


def unpack_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Every field of the 61-byte header at ``buf[pos:]``, in one unpack (no validation)."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


# --- single fields -------------------------------------------------------------------


def base_offset_and_size(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """(baseOffset, whole batch size) of the header at ``pos``: the cheapest walk step."""
    base, length = _PREFIX.unpack_from(buf, pos)
    return base, length + LOG_OVERHEAD


def append_fields(buf: Buffer) -> tuple[int, int, int, int]:
    """(whole batch size, magic, lastOffsetDelta, maxTimestamp) of the header at 0."""
    length, magic_, delta, max_ts = _APPEND_FIELDS.unpack_from(buf)
    return length + LOG_OVERHEAD, magic_, delta, max_ts


def last_offset_delta(buf: Buffer, pos: int = 0) -> int:
    return int(_I32.unpack_from(buf, pos + LAST_OFFSET_DELTA_AT)[0])


def max_timestamp(buf: Buffer, pos: int = 0) -> int:
    return int(_I64.unpack_from(buf, pos + MAX_TIMESTAMP_AT)[0])


def magic(buf: Buffer, pos: int = 0) -> int:
    return int(_I8.unpack_from(buf, pos + MAGIC_AT)[0])


def stored_crc(buf: Buffer, pos: int = 0) -> int:
    return int(_U32.unpack_from(buf, pos + CRC_AT)[0])


# --- the CRC ---------------------------------------------------------------------------


def compute_crc(batch: Buffer, end: int | None = None) -> int:
    """CRC32C of the bytes the batch CRC covers: attributes to ``end`` (default: the
    end of ``batch``; pass the batch's size when the buffer runs on past it)."""
    return int(crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:end]))


def crc_matches(batch: Buffer) -> bool:
    return compute_crc(batch) == stored_crc(batch)


# --- patching in place -----------------------------------------------------------------


def set_base_offset(batch: bytearray | memoryview, offset: int) -> None:
    # baseOffset is outside the CRC, so no recompute.
    _I64.pack_into(batch, BASE_OFFSET_AT, offset)


def set_log_append_time(batch: bytearray | memoryview, now_ms: int, end: int | None = None) -> None:
    """Stamp LogAppendTime, as Kafka does: timestamp-type bit, maxTimestamp, and the CRC
    they change (over the batch up to ``end``, as :func:`compute_crc`).

    Records keep their deltas: consumers read every record's time from maxTimestamp
    when the bit is set, which is why only the header changes.
    """
    attributes = _I16.unpack_from(batch, ATTRIBUTES_AT)[0]
    _I16.pack_into(batch, ATTRIBUTES_AT, attributes | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(batch, MAX_TIMESTAMP_AT, now_ms)
    _U32.pack_into(batch, CRC_AT, compute_crc(batch, end))
