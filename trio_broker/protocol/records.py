"""Kafka record batches, message format v2 (magic 2), sans-I/O.

A batch is a fixed 61-byte header (its layout:
:mod:`trio_broker.protocol.batch_header`) followed by the (possibly compressed)
records. :class:`RecordBatchView` reads header fields straight out of a
memoryview, so splitting a Produce or Fetch payload into batches, checking
CRCs and rewriting offsets never copy the payload. Decoding the records
themselves (:meth:`RecordBatchView.records`) is the only step that copies.

Anything decoded from peer bytes raises only the :class:`ProtocolError` family.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence

import attrs
import crc32c as _crc32c

from trio_broker.protocol import batch_header, primitives
from trio_broker.protocol.batch_header import (
    ATTRIBUTES_AT,
    BASE_SEQUENCE_AT,
    BASE_TIMESTAMP_AT,
    BATCH_LENGTH_AT,
    CODEC_MASK,
    CONTROL_BIT,
    CRC_AT,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_AT,
    LEADER_EPOCH_AT,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_AT,
    MAX_TIMESTAMP_AT,
    MIN_BATCH_LENGTH,
    PRODUCER_EPOCH_AT,
    PRODUCER_ID_AT,
    RECORD_COUNT_AT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
)
from trio_broker.protocol.compression import Compression, compress, decompress
from trio_broker.protocol.errors import (
    CorruptRecordError,
    InvalidRecordError,
    TruncatedError,
    UnsupportedCompressionError,
)

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "ControlMarker",
    "Header",
    "Record",
    "RecordBatchView",
    "build_batch",
    "build_control_batch",
    "iter_batches",
    "parse_header",
    "read_control_marker",
    "split_batches",
]

Buffer = bytes | bytearray | memoryview

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Bound by assignment, not ``from ... import``, so that method calls on them compile to
# the fast method load (see batch_header).
_HEADER = batch_header.HEADER
_I8, _I16, _I32 = primitives.INT8, primitives.INT16, primitives.INT32
_I64, _U32 = primitives.INT64, primitives.UINT32

_INT32_MAX = 2**31 - 1
# A record is at least: length varint, attributes, timestampDelta, offsetDelta,
# keyLength, valueLength, headerCount — one byte each.
_MIN_RECORD_BODY = 6
_MIN_RECORD_SIZE = 1 + _MIN_RECORD_BODY
# A header is at least a key length and a value length.
_MIN_HEADER_SIZE = 2

DEFAULT_MAX_UNCOMPRESSED = 64 * 1024 * 1024


@attrs.frozen
class Header:
    """A record header. Keys are UTF-8 on the wire; bytes that are not valid
    UTF-8 survive a decode/encode round trip as surrogate escapes."""

    key: str
    value: bytes | None


@attrs.frozen
class Record:
    """One record of a batch, with offset and timestamp relative to the batch."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


class RecordBatchView:
    """A zero-copy view of one record batch (bytes ``0 .. batch_length + 12``).

    Property reads unpack single fields from :attr:`buf`; the setters write in
    place and need a writable buffer (a view of a ``bytearray``).
    """

    __slots__ = ("buf",)

    buf: memoryview

    def __init__(self, buf: Buffer) -> None:
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        if len(mv) < HEADER_SIZE:
            raise TruncatedError(f"record batch of {len(mv)} bytes is shorter than its header")
        self.buf = mv

    def __repr__(self) -> str:
        return (
            f"<RecordBatchView base_offset={self.base_offset} count={self.record_count} "
            f"size={self.size_in_bytes} attributes={self.attributes:#x}>"
        )

    # ------------------------------------------------------------------ header fields

    @property
    def base_offset(self) -> int:
        return int(_I64.unpack_from(self.buf, 0)[0])

    @property
    def batch_length(self) -> int:
        return int(_I32.unpack_from(self.buf, BATCH_LENGTH_AT)[0])

    @property
    def partition_leader_epoch(self) -> int:
        return int(_I32.unpack_from(self.buf, LEADER_EPOCH_AT)[0])

    @property
    def magic(self) -> int:
        return int(_I8.unpack_from(self.buf, MAGIC_AT)[0])

    @property
    def crc(self) -> int:
        return int(_U32.unpack_from(self.buf, CRC_AT)[0])

    @property
    def attributes(self) -> int:
        return int(_I16.unpack_from(self.buf, ATTRIBUTES_AT)[0])

    @property
    def last_offset_delta(self) -> int:
        return int(_I32.unpack_from(self.buf, LAST_OFFSET_DELTA_AT)[0])

    @property
    def base_timestamp(self) -> int:
        return int(_I64.unpack_from(self.buf, BASE_TIMESTAMP_AT)[0])

    @property
    def max_timestamp(self) -> int:
        return int(_I64.unpack_from(self.buf, MAX_TIMESTAMP_AT)[0])

    @property
    def producer_id(self) -> int:
        return int(_I64.unpack_from(self.buf, PRODUCER_ID_AT)[0])

    @property
    def producer_epoch(self) -> int:
        return int(_I16.unpack_from(self.buf, PRODUCER_EPOCH_AT)[0])

    @property
    def base_sequence(self) -> int:
        return int(_I32.unpack_from(self.buf, BASE_SEQUENCE_AT)[0])

    @property
    def record_count(self) -> int:
        return int(_I32.unpack_from(self.buf, RECORD_COUNT_AT)[0])

    # --------------------------------------------------------------- derived fields

    @property
    def compression(self) -> Compression:
        codec = self.attributes & CODEC_MASK
        try:
            return Compression(codec)
        except ValueError:
            raise UnsupportedCompressionError(f"unknown compression codec {codec}") from None

    @property
    def timestamp_type(self) -> int:
        """:data:`CREATE_TIME` (0) or :data:`LOG_APPEND_TIME` (1)."""
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_BIT else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; sequences wrap from Int32 max to 0, as in Kafka."""
        base = self.base_sequence
        if base == -1:
            return -1
        last = base + self.last_offset_delta
        return last - 2**31 if last > _INT32_MAX else last

    def offset_of(self, record: Record) -> int:
        return self.base_offset + record.offset_delta

    def timestamp_of(self, record: Record) -> int:
        # With LogAppendTime the broker's time, stored as maxTimestamp, applies to every record.
        if self.attributes & TIMESTAMP_TYPE_BIT:
            return self.max_timestamp
        return self.base_timestamp + record.timestamp_delta

    # ------------------------------------------------------------------- validation

    def crc_is_valid(self) -> bool:
        end = self.size_in_bytes
        if end < HEADER_SIZE:  # a nonsense length would make a negative slice bound
            return False
        return _crc32c.crc32c(self.buf[ATTRIBUTES_AT:end]) == self.crc

    def validate(self) -> None:
        """Check what a broker checks before appending, without decoding records.

        Raises :class:`CorruptRecordError` for a bad CRC or inconsistent size,
        :class:`InvalidRecordError` for a wrong magic or record count, and
        :class:`UnsupportedCompressionError` for an unknown codec.
        """
        length = self.batch_length
        if length < MIN_BATCH_LENGTH or length + LOG_OVERHEAD != len(self.buf):
            raise CorruptRecordError(
                f"batch length {length} does not match the {len(self.buf)} bytes of the batch"
            )
        if self.magic != MAGIC:
            raise InvalidRecordError(f"unsupported record batch magic {self.magic}")
        if not self.crc_is_valid():
            raise CorruptRecordError("record batch CRC mismatch")
        if self.attributes & CODEC_MASK > Compression.ZSTD:
            raise UnsupportedCompressionError(
                f"unknown compression codec {self.attributes & CODEC_MASK}"
            )
        count = self.record_count
        if count <= 0 or count != self.last_offset_delta + 1:
            raise InvalidRecordError(
                f"record count {count} does not match last offset delta {self.last_offset_delta}"
            )

    # -------------------------------------------------------------------- rewriting

    def _writable(self) -> memoryview:
        if self.buf.readonly:
            raise ValueError("record batch buffer is read-only; copy it into a bytearray")
        return self.buf

    def set_base_offset(self, offset: int) -> None:
        batch_header.set_base_offset(self._writable(), offset)

    def set_partition_leader_epoch(self, epoch: int) -> None:
        # Also outside the CRC.
        _I32.pack_into(self._writable(), LEADER_EPOCH_AT, epoch)

    def set_producer(self, producer_id: int, producer_epoch: int) -> None:
        """Give the batch another producer id and epoch (``replay`` maps them from the
        captured cluster to the target's); the CRC covers them, so it is recomputed."""
        buf = self._writable()
        _I64.pack_into(buf, PRODUCER_ID_AT, producer_id)
        _I16.pack_into(buf, PRODUCER_EPOCH_AT, producer_epoch)
        _U32.pack_into(buf, CRC_AT, _crc32c.crc32c(buf[ATTRIBUTES_AT : self.size_in_bytes]))

    def set_log_append_time(self, timestamp_ms: int) -> None:
        """Mark the batch LogAppendTime with the broker's clock, as Kafka does."""
        batch_header.set_log_append_time(self._writable(), timestamp_ms, self.size_in_bytes)

    # ---------------------------------------------------------------------- records

    def records(self, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> list[Record]:
        """Decompress (at most *max_uncompressed* bytes) and decode every record."""
        if self.magic != MAGIC:
            raise InvalidRecordError(f"unsupported record batch magic {self.magic}")
        end = self.size_in_bytes
        if end < HEADER_SIZE or end > len(self.buf):
            raise CorruptRecordError(f"batch length {self.batch_length} is inconsistent")
        count = self.record_count
        if count < 0:
            raise InvalidRecordError(f"negative record count {count}")
        body = self.buf[HEADER_SIZE:end]
        codec = self.compression
        # Decoding from bytes is faster than from a memoryview, and slices are the
        # bytes objects Record wants: one memcpy buys both.
        data = (
            bytes(body) if codec is Compression.NONE else decompress(codec, body, max_uncompressed)
        )
        return _decode_records(data, count)

    def check_records(self, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> None:
        """Check that exactly ``record_count`` records, each of a plausible length,
        fill the batch (decompressed, at most *max_uncompressed* bytes).

        Kafka's broker walks the records of every produced batch, so a batch whose
        header and CRC are sound but whose records do not add up is refused rather
        than stored for consumers to choke on. Only the length chain is walked
        (one varint per record, ~10x cheaper than decoding the fields); a record
        whose own fields are inconsistent inside a correct length is not caught.
        """
        count = self.record_count
        if count < 0:
            raise InvalidRecordError(f"negative record count {count}")
        body = self.buf[HEADER_SIZE : self.size_in_bytes]
        codec = self.compression
        # Uncompressed records are walked in place: nothing is copied.
        data = body if codec is Compression.NONE else decompress(codec, body, max_uncompressed)
        _check_record_lengths(data, count)


# ------------------------------------------------------------------------- splitting


def _as_view(buf: Buffer) -> memoryview:
    return buf if isinstance(buf, memoryview) else memoryview(buf)


def _batch_size_at(mv: memoryview, offset: int) -> int | None:
    """Size of the batch at *offset*, or None if the buffer ends before it does."""
    remaining = len(mv) - offset
    if remaining < LOG_OVERHEAD:
        return None
    length = _I32.unpack_from(mv, offset + BATCH_LENGTH_AT)[0]
    if length < MIN_BATCH_LENGTH:
        # Old message formats (magic 0/1) have smaller minimum sizes; name them.
        if remaining > MAGIC_AT and mv[offset + MAGIC_AT] != MAGIC:
            raise InvalidRecordError(f"unsupported record batch magic {mv[offset + MAGIC_AT]}")
        raise CorruptRecordError(f"batch length {length} is below the minimum {MIN_BATCH_LENGTH}")
    size = int(length) + LOG_OVERHEAD
    return size if size <= remaining else None


def parse_header(buf: Buffer, offset: int = 0) -> RecordBatchView:
    """A view of the batch starting at *offset*, checking only its size fields."""
    mv = _as_view(buf)
    if offset < 0 or offset > len(mv):
        raise ValueError(f"offset {offset} outside a buffer of {len(mv)} bytes")
    size = _batch_size_at(mv, offset)
    if size is None:
        raise TruncatedError(f"record batch at byte {offset} runs past the end of the buffer")
    return RecordBatchView(mv[offset : offset + size])


def iter_batches(buf: Buffer) -> Iterator[RecordBatchView]:
    """Yield views of the consecutive batches in a records blob, without copying it.

    A trailing partial batch raises :class:`TruncatedError` (use
    :func:`split_batches` where one is expected, as in Fetch responses).
    """
    mv = _as_view(buf)
    pos = 0
    end = len(mv)
    while pos < end:
        view = parse_header(mv, pos)
        pos += len(view.buf)
        yield view


def split_batches(
    buf: Buffer, allow_partial_tail: bool = True
) -> tuple[list[RecordBatchView], memoryview]:
    """Split a blob into complete batches and the (zero-copy) leftover tail.

    Fetch responses may end with a batch cut at max_bytes; that tail is
    returned rather than raised unless *allow_partial_tail* is false.
    """
    mv = _as_view(buf)
    views: list[RecordBatchView] = []
    pos = 0
    end = len(mv)
    while pos < end:
        size = _batch_size_at(mv, pos)
        if size is None:
            if not allow_partial_tail:
                raise TruncatedError(f"record batch at byte {pos} runs past the end of the buffer")
            break
        views.append(RecordBatchView(mv[pos : pos + size]))
        pos += size
    return views, mv[pos:]


# -------------------------------------------------------------------------- varints


def _uvarint_tail(data: Buffer, pos: int, first: int, max_bytes: int) -> tuple[int, int]:
    """Finish an unsigned varint whose first byte (with the continuation bit) was *first*."""
    result = first & 0x7F
    shift = 7
    limit = 7 * max_bytes
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= limit:
            raise CorruptRecordError("varint longer than its type allows")
    # The last byte of a 5-byte varint may carry bits beyond 32 (10-byte: 64).
    if result >> (32 if max_bytes == 5 else 64):
        raise CorruptRecordError("varint overflows its type")
    return result, pos


def _write_uvarint(out: bytearray, u: int) -> None:
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


def _write_varint(out: bytearray, n: int) -> None:
    if not -(2**31) <= n < 2**31:
        raise ValueError(f"{n} does not fit a varint (int32)")
    _write_uvarint(out, (n << 1) ^ (n >> 31))


def _write_varlong(out: bytearray, n: int) -> None:
    if not -(2**63) <= n < 2**63:
        raise ValueError(f"{n} does not fit a varlong (int64)")
    _write_uvarint(out, (n << 1) ^ (n >> 63))


def _write_bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out.append(1)  # zigzag(-1)
    else:
        _write_varint(out, len(b))
        out += b


# ------------------------------------------------------------------ record decoding


def _check_record_lengths(data: Buffer, count: int) -> None:
    """Exactly *count* length-prefixed records of at least the minimal size fill *data*."""
    end = len(data)
    if count > end // _MIN_RECORD_SIZE:
        raise InvalidRecordError(f"{count} records cannot fit in {end} bytes")
    pos = 0
    try:
        for _ in range(count):
            u = data[pos]
            pos += 1
            if u & 0x80:  # records of 64 B .. 8 KiB have two-byte lengths: inlined
                second = data[pos]
                if second & 0x80:
                    u, pos = _uvarint_tail(data, pos, u, 5)
                else:
                    u = (u & 0x7F) | (second << 7)
                    pos += 1
            length = (u >> 1) ^ -(u & 1)
            if length < _MIN_RECORD_BODY or length > end - pos:
                raise InvalidRecordError(f"invalid record length {length}")
            pos += length
    except (IndexError, CorruptRecordError):
        raise InvalidRecordError("record length runs past the end of the batch") from None
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes after the last of {count} records")


def _decode_records(data: bytes, count: int) -> list[Record]:
    """Decode exactly *count* records filling all of *data*.

    Every length is checked against the bytes that remain before anything is
    sliced or looped over, so hostile counts cannot drive allocation.
    The varint fast path (one byte, the common case) is inlined for speed.
    """
    end = len(data)
    if count > end // _MIN_RECORD_SIZE:
        raise CorruptRecordError(f"{count} records cannot fit in {end} bytes")
    out: list[Record] = []
    append = out.append
    tail = _uvarint_tail
    pos = 0
    try:
        for _ in range(count):
            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 5)
            length = (u >> 1) ^ -(u & 1)
            if length < _MIN_RECORD_BODY or length > end - pos:
                raise CorruptRecordError(f"invalid record length {length}")
            rec_end = pos + length

            attributes = data[pos]
            pos += 1
            if attributes > 127:  # int8 on the wire
                attributes -= 256

            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 10)
            timestamp_delta = (u >> 1) ^ -(u & 1)

            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 5)
            offset_delta = (u >> 1) ^ -(u & 1)

            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 5)
            n = (u >> 1) ^ -(u & 1)
            key: bytes | None
            if n < 0:
                if n != -1:
                    raise CorruptRecordError(f"invalid key length {n}")
                key = None
            else:
                if n > rec_end - pos:
                    raise CorruptRecordError(f"key length {n} exceeds the record")
                key = data[pos : pos + n]
                pos += n

            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 5)
            n = (u >> 1) ^ -(u & 1)
            value: bytes | None
            if n < 0:
                if n != -1:
                    raise CorruptRecordError(f"invalid value length {n}")
                value = None
            else:
                if n > rec_end - pos:
                    raise CorruptRecordError(f"value length {n} exceeds the record")
                value = data[pos : pos + n]
                pos += n

            u = data[pos]
            pos += 1
            if u & 0x80:
                u, pos = tail(data, pos, u, 5)
            header_count = (u >> 1) ^ -(u & 1)
            headers: tuple[Header, ...] = ()
            if header_count:
                if header_count < 0 or header_count * _MIN_HEADER_SIZE > rec_end - pos:
                    raise CorruptRecordError(f"invalid header count {header_count}")
                headers, pos = _decode_headers(data, pos, rec_end, header_count)

            if pos != rec_end:
                raise CorruptRecordError("record length does not match its fields")
            append(Record(offset_delta, timestamp_delta, key, value, headers, attributes))
    except IndexError:
        raise CorruptRecordError("record runs past the end of the batch") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the last record")
    return out


def _decode_headers(
    data: bytes, pos: int, rec_end: int, count: int
) -> tuple[tuple[Header, ...], int]:
    headers: list[Header] = []
    for _ in range(count):
        u = data[pos]
        pos += 1
        if u & 0x80:
            u, pos = _uvarint_tail(data, pos, u, 5)
        n = (u >> 1) ^ -(u & 1)
        # Header keys may not be null.
        if n < 0 or n > rec_end - pos:
            raise CorruptRecordError(f"invalid header key length {n}")
        # Java decodes keys leniently; surrogateescape keeps odd bytes round-trippable.
        key = data[pos : pos + n].decode("utf-8", "surrogateescape")
        pos += n

        u = data[pos]
        pos += 1
        if u & 0x80:
            u, pos = _uvarint_tail(data, pos, u, 5)
        n = (u >> 1) ^ -(u & 1)
        value: bytes | None
        if n < 0:
            if n != -1:
                raise CorruptRecordError(f"invalid header value length {n}")
            value = None
        else:
            if n > rec_end - pos:
                raise CorruptRecordError(f"header value length {n} exceeds the record")
            value = data[pos : pos + n]
            pos += n
        headers.append(Header(key, value))
    return tuple(headers), pos


# ------------------------------------------------------------------ batch building


def _encode_record(out: bytearray, r: Record) -> None:
    body = bytearray()
    body.append(r.attributes & 0xFF)
    _write_varlong(body, r.timestamp_delta)
    _write_varint(body, r.offset_delta)
    _write_bytes(body, r.key)
    _write_bytes(body, r.value)
    _write_varint(body, len(r.headers))
    for h in r.headers:
        _write_bytes(body, h.key.encode("utf-8", "surrogateescape"))
        _write_bytes(body, h.value)
    _write_varint(out, len(body))
    out += body


def build_batch(
    records: Sequence[Record] | Sequence[tuple[bytes | None, bytes | None]],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_timestamp: int | None = None,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = CREATE_TIME,
    snappy_xerial: bool = False,
) -> bytearray:
    """Encode a complete magic-2 batch with a correct CRC.

    *records* are :class:`Record` objects, or ``(key, value)`` pairs which get
    offset deltas 0, 1, 2... and timestamp delta 0. *base_timestamp* defaults
    to now; maxTimestamp is derived from the records. The codec is always
    applied, even when it does not shrink the data. The result is a fresh
    bytearray, writable as ``PartitionLog.append`` needs (it rewrites the header).
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    items: Sequence[Record | tuple[bytes | None, bytes | None]] = records
    recs = [r if isinstance(r, Record) else Record(i, 0, r[0], r[1]) for i, r in enumerate(items)]
    body = bytearray()
    for r in recs:
        _encode_record(body, r)
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    max_timestamp = base_timestamp + max(r.timestamp_delta for r in recs)
    codec = Compression(compression)
    payload = (
        body if codec is Compression.NONE else compress(codec, body, snappy_xerial=snappy_xerial)
    )
    attributes = int(codec)
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_BIT
    if is_transactional:
        attributes |= TRANSACTIONAL_BIT
    if is_control:
        attributes |= CONTROL_BIT
    buf = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        buf,
        0,
        base_offset,
        MIN_BATCH_LENGTH + len(payload),
        partition_leader_epoch,
        MAGIC,
        0,  # CRC, filled below
        attributes,
        recs[-1].offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(recs),
    )
    buf += payload
    _U32.pack_into(buf, CRC_AT, batch_header.compute_crc(buf))
    return buf


# ------------------------------------------------------------------ control records
#: A control record's key is (version int16, type int16); type 0 ends a transaction by
#: aborting it, 1 by committing it. Its value is (version int16, coordinator epoch int32).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


@attrs.frozen
class ControlMarker:
    """What one transaction marker (the single record of a control batch) says."""

    committed: bool
    coordinator_epoch: int


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    *,
    committed: bool,
    coordinator_epoch: int,
    timestamp: int,
    partition_leader_epoch: int = -1,
) -> bytearray:
    """A transaction marker batch as the coordinator writes it into a partition.

    Transactional and control bits set, no sequence (markers are not sequenced), one
    record whose key says commit or abort; offsets are assigned by the log on append.
    """
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if committed else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_timestamp=timestamp,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
    )


def read_control_marker(batch: RecordBatchView) -> ControlMarker:
    """The marker of a control batch; InvalidRecordError if it is not one Kafka would write."""
    if not batch.is_control:
        raise InvalidRecordError("not a control batch")
    records = list(batch.records())
    if len(records) != 1 or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise InvalidRecordError("a control batch holds one record with a 4-byte key")
    _version, kind = _CONTROL_KEY.unpack_from(records[0].key)
    if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise InvalidRecordError(f"unknown control record type {kind}")
    value = records[0].value or b""
    epoch = _CONTROL_VALUE.unpack_from(value)[1] if len(value) >= _CONTROL_VALUE.size else -1
    return ControlMarker(committed=kind == CONTROL_COMMIT, coordinator_epoch=epoch)
