"""Vectorized frame decoding: one Arrow record batch of capture rows to fact batches.

The same facts as :func:`trio_broker.verify.decode.decode_rows` (the reference,
one Python dict per fact), computed with numpy over the frame column's Arrow
buffers. Rows are grouped by (direction, API key, version), so within a group the
layout is fixed; all frames of a group are then walked in lock-step, each with
its own integer cursor into the data buffer. A field is read for every frame at
once by gathering its bytes with fancy indexing; a nested array (topics ->
partitions -> record batches) is walked k = 0, 1, ... over the entries that
still have a k-th element.

Covered: Produce requests and responses (v3-v13), Fetch responses (v4-v18) and Fetch
requests' isolation level (v4-v18). Every other row that yields facts (EndTxn,
OffsetCommit, OffsetFetch, FindCoordinator, SyncGroup, Metadata, versions
outside those ranges), and every frame the fast path does not fully accept
(truncated or malformed, non-zero tagged-field counts, varints over 5 bytes,
non-ASCII strings, empty topic names, Produce responses with record errors,
values that overflow a fact column), goes to the reference
``decode_rows`` for just those rows: same facts, same ``undecodable`` notes.
The fast path only ever accepts a frame that the reference decodes, so the
fact multisets are equal; the row order is not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trio_broker.protocol.batch_header import HEADER_SIZE, LOG_OVERHEAD, MIN_BATCH_LENGTH
from trio_broker.protocol.schema import uses_topic_ids
from trio_broker.verify.decode import (
    FACT_FIELDS,
    FETCH,
    FETCH_FIRST_FLEXIBLE_REQUEST,
    FETCH_ISOLATION_VERSION,
    FETCH_NO_REPLICA_ID_VERSION,
    NEEDED_COLUMNS,
    PRODUCE,
    decode_rows,
    fact_schema,
)

__all__ = ["decode_batch", "decode_batches"]

Array = np.ndarray[Any, Any]

#: Versions whose layouts are walked here (the codec's ranges for these APIs).
PRODUCE_VERSIONS = range(3, 14)
FETCH_RESPONSE_VERSIONS = range(4, 19)
#: Fetch requests: only the isolation level is read (decode.fetch_isolation), v4 on.
FETCH_REQUEST_VERSIONS = range(FETCH_ISOLATION_VERSION, 19)
#: API keys whose rows may yield facts (see decode._facts_for_row).
FACT_REQUEST_KEYS = (0, 1, 2, 8, 9, 10, 14, 20, 26)
FACT_RESPONSE_KEYS = (0, 1, 2, 3, 8, 9, 10, 14, 26)

# The layouts the walkers below assume, as numbers: tests/unit/verify/test_fastdecode.py
# (test_layouts_match_the_schema_table) checks each against the schema table for
# every version in the ranges above.
PRODUCE_FIRST_FLEXIBLE = 9
FETCH_FIRST_FLEXIBLE = 12
#: Produce request: acks and timeout, between the transactional id and the topics.
PRODUCE_REQUEST_FIXED = 6
#: Produce v8+ partition responses end with record errors and an error message.
PRODUCE_RECORD_ERRORS_VERSION = 8
#: Fetch response: one aborted transaction (producer id, first offset).
ABORTED_TRANSACTION_SIZE = 16
#: After the topics of a Produce response: the throttle time.
PRODUCE_RESPONSE_TRAILER = 4


def produce_ack_width(version: int) -> int:
    """Index, error, base offset, append time and (v5+) log start offset."""
    return 30 if version >= 5 else 22


def fetch_header_width(version: int) -> int:
    """Throttle time and (v7+) error code and session id, before the topics."""
    return 10 if version >= 7 else 4


def fetch_partition_width(version: int) -> int:
    """Index, error, high watermark, last stable offset and (v5+) log start offset."""
    return 30 if version >= 5 else 22


def fetch_after_aborted_width(version: int) -> int:
    """The preferred read replica (v11+), between aborted transactions and records."""
    return 4 if version >= 11 else 0


MAX_VARINT_BYTES = 5
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_ARROW_TYPES = {name: getattr(pa, typ)() for name, typ, _ in FACT_FIELDS}
_NUMPY_TYPES = {"int64": np.int64, "int32": np.int32}


def _be(block: Array, dtype: str) -> Array:
    """Big-endian integers from an (n, width) uint8 block, as int64."""
    return np.ascontiguousarray(block).view(dtype).reshape(-1).astype(np.int64)


class _Reader:
    """Reads fields at many cursors at once; a frame that fails is marked in ``bad``."""

    def __init__(self, data: Array, rows: int) -> None:
        # Padding keeps the reads of failed cursors (moved to 0) inside the buffer.
        if data.size < 64:
            data = np.concatenate([data, np.zeros(64, np.uint8)])
        self.data = data
        self.bad = np.zeros(rows, bool)
        self._windows: dict[int, Array] = {}

    def at(self, pos: Array, width: int) -> Array:
        """The ``width`` bytes at each of ``pos`` (all in bounds), (n, width) uint8.

        Rows of a strided window view: no (n, width) index array is built."""
        windows = self._windows.get(width)
        if windows is None:
            windows = np.lib.stride_tricks.sliding_window_view(self.data, width)
            self._windows[width] = windows
        return windows[pos]

    def fail(self, rows: Array, mask: Array) -> None:
        if mask.any():
            self.bad[rows[mask]] = True

    def good(self, rows: Array) -> Array:
        return ~self.bad[rows]

    def block(self, rows: Array, pos: Array, end: Array, width: int) -> Array:
        """The ``width`` bytes at each cursor, (n, width) uint8."""
        short = pos + width > end
        self.fail(rows, short)
        return self.at(np.where(short, 0, pos), width)

    def int(self, rows: Array, pos: Array, end: Array, dtype: str) -> tuple[Array, Array]:
        width = np.dtype(dtype).itemsize
        return _be(self.block(rows, pos, end, width), dtype), pos + width

    def uvarint(self, rows: Array, pos: Array, end: Array) -> tuple[Array, Array]:
        value = np.zeros(pos.size, np.int64)
        size = np.zeros(pos.size, np.int64)
        more = np.ones(pos.size, bool)
        for i in range(MAX_VARINT_BYTES):
            idx = np.flatnonzero(more)
            if not idx.size:
                break
            at = pos[idx] + i
            short = at >= end[idx]
            self.fail(rows[idx], short)
            byte = self.data[np.where(short, 0, at)].astype(np.int64)
            value[idx] |= (byte & 0x7F) << (7 * i)
            size[idx] = i + 1
            more[idx] = (byte >= 0x80) & ~short
        self.fail(rows, more)  # longer than the codec accepts
        return value, pos + size

    def no_tags(self, rows: Array, pos: Array, end: Array) -> Array:
        """A flexible struct's tagged fields: only an empty set (one 0 byte) is accepted."""
        self.fail(rows, self.block(rows, pos, end, 1)[:, 0] != 0)
        return pos + 1

    def length(
        self, rows: Array, pos: Array, end: Array, flex: bool, classic: str
    ) -> tuple[Array, Array]:
        """A length or count: compact (uvarint N+1) or classic; negative means null."""
        if flex:
            n, pos = self.uvarint(rows, pos, end)
            return n - 1, pos
        return self.int(rows, pos, end, classic)

    def count(
        self, rows: Array, pos: Array, end: Array, flex: bool, nullable: bool = False
    ) -> tuple[Array, Array]:
        """An array's element count (0 for a null array), checked as the codec does."""
        n, pos = self.length(rows, pos, end, flex, ">i4")
        if not nullable:
            self.fail(rows, n < 0)
        n = np.maximum(n, 0)
        self.fail(rows, n > end - pos)
        return n, pos

    def string(
        self, rows: Array, pos: Array, end: Array, flex: bool, nullable: bool
    ) -> tuple[Array, Array, Array]:
        """(start, size or -1 for null, next position); only ASCII text is accepted."""
        size, pos = self.length(rows, pos, end, flex, ">i2")
        null = size < 0
        if not nullable:
            self.fail(rows, null)
        size = np.where(null, -1, size)
        kept = np.maximum(size, 0)
        self.fail(rows, pos + kept > end)
        self.check_ascii(rows, pos, kept)
        return pos, size, pos + kept

    def gather(self, starts: Array, sizes: Array) -> tuple[Array, Array]:
        """The bytes of many segments back to back, and their offsets."""
        offsets = np.zeros(sizes.size + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        index = np.arange(offsets[-1]) + np.repeat(starts - offsets[:-1], sizes)
        return self.data[index], offsets

    def check_ascii(self, rows: Array, starts: Array, sizes: Array) -> None:
        ok = self.good(rows)
        sizes = np.where(ok, sizes, 0)
        if not sizes.any():
            return
        text, offsets = self.gather(starts, sizes)
        high = np.flatnonzero(text >= 0x80)
        if high.size:  # maybe valid UTF-8: the reference decodes it
            self.bad[rows[np.searchsorted(offsets, high, side="right") - 1]] = True


class _Facts:
    """Fact columns as numpy chunks per kind; topics as indexes into a topic table."""

    def __init__(self) -> None:
        self.parts: dict[str, list[dict[str, Array]]] = defaultdict(list)
        self.topics: list[Any] = []  # pa.StringArray chunks
        self.topic_count = 0

    def add(self, kind: str, **columns: Array) -> None:
        if columns["row"].size:
            self.parts[kind].append(columns)

    def add_topics(self, keys: Any) -> Array:
        """Register topic keys (a pa.StringArray); returns their ids."""
        ids = np.arange(self.topic_count, self.topic_count + len(keys))
        self.topics.append(keys)
        self.topic_count += len(keys)
        return ids


class _Topics:
    """The topic entries of one group: a name's bytes, or a topic id's position."""

    def __init__(self, by_id: bool) -> None:
        self.by_id = by_id
        self.rows: list[Array] = []
        self.starts: list[Array] = []
        self.sizes: list[Array] = []
        self.count = 0

    def read(
        self, reader: _Reader, rows: Array, pos: Array, end: Array, flex: bool
    ) -> tuple[Array, Array]:
        """Read each cursor's topic name (or id); returns (entry ids, next positions)."""
        if self.by_id:
            start, size = pos, np.full(pos.size, 16)
            reader.block(rows, pos, end, 16)
            nxt = pos + 16
        else:
            start, size, nxt = reader.string(rows, pos, end, flex, nullable=False)
            reader.fail(rows, size == 0)  # the key would be "id:<zero uuid>": left to the reference
        ids = np.arange(self.count, self.count + rows.size)
        self.count += rows.size
        self.rows.append(rows)
        self.starts.append(start)
        self.sizes.append(size)
        return ids, nxt

    def keys(self, reader: _Reader) -> Any:
        """The topic key of every entry (``name`` or ``id:<uuid>``); garbage for bad rows."""
        if not self.count:
            return pa.array([], pa.string())
        rows = np.concatenate(self.rows)
        good = reader.good(rows)
        starts = np.where(good, np.concatenate(self.starts), 0)
        sizes = np.where(good, np.concatenate(self.sizes), 0)
        if self.by_id:
            raw = reader.at(starts, 16)
            digits = np.empty((raw.shape[0], 32), np.uint8)
            digits[:, 0::2] = _HEX[raw >> 4]
            digits[:, 1::2] = _HEX[raw & 15]
            text = np.empty((raw.shape[0], 39), np.uint8)
            text[:, :3] = np.frombuffer(b"id:", np.uint8)
            text[:, [11, 16, 21, 26]] = ord("-")
            text[:, 3:11], text[:, 12:16], text[:, 17:21] = (
                digits[:, 0:8], digits[:, 8:12], digits[:, 12:16]
            )  # fmt: skip
            text[:, 22:26], text[:, 27:39] = digits[:, 16:20], digits[:, 20:32]
            offsets = np.arange(0, 39 * (raw.shape[0] + 1), 39, dtype=np.int32)
            body = text.reshape(-1)
        else:
            body, offsets64 = reader.gather(starts, sizes)
            offsets = offsets64.astype(np.int32)
        return pa.Array.from_buffers(
            pa.string(), offsets.size - 1, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
        )


def _each(reader: _Reader, rows: Array, counts: Array) -> Any:
    """Lock-step iteration over arrays: for k = 0, 1, ... yields the indexes of the
    entries that have a k-th element (and whose frame has not failed)."""
    k = 0
    active = np.flatnonzero(counts > 0)
    while active.size:
        active = active[reader.good(rows[active])]
        if _long_tail(reader, rows[active], k):
            return
        yield active
        k += 1
        active = active[counts[active] > k]


#: A lock-step step costs tens of numpy calls whatever the number of entries it walks;
#: past LONG_TAIL_STEPS, fewer than LONG_TAIL_ENTRIES entries are cheaper in the reference.
LONG_TAIL_STEPS = 16
LONG_TAIL_ENTRIES = 8


def _long_tail(reader: _Reader, rows: Array, k: int) -> bool:
    """True when nothing is left to walk; a few frames with very long arrays (say, one
    Fetch response of 2 000 partitions) are handed to the reference instead."""
    if k >= LONG_TAIL_STEPS and rows.size < LONG_TAIL_ENTRIES:
        reader.bad[rows] = True
    return not reader.good(rows).any()


# ------------------------------------------------------------------ record batches


def _batches(
    reader: _Reader, facts: _Facts, kind: str, rows: Array, topic: Array, part: Array,
    start: Array, size: Array,
) -> None:  # fmt: skip
    """Split record blobs into batches as ``split_batches`` does (a partial tail is left).

    The walk only follows the length chain; the headers are read afterwards, all at once.
    """
    cur = start.copy()
    stop = start + size
    active = np.flatnonzero(reader.good(rows) & (stop - cur >= LOG_OVERHEAD))
    found: list[tuple[Array, Array, int]] = []  # (entries, batch positions, index)
    k = 0
    while active.size:
        r, at = rows[active], cur[active]
        length = _be(reader.at(at + 8, 4), ">i4")
        reader.fail(r, length < MIN_BATCH_LENGTH)  # the reference raises
        whole = (length >= MIN_BATCH_LENGTH) & (length + LOG_OVERHEAD <= stop[active] - at)
        active, at, length = active[whole], at[whole], length[whole]
        found.append((active, at, k))
        cur[active] = at + length + LOG_OVERHEAD
        active = active[stop[active] - cur[active] >= LOG_OVERHEAD]
        active = active[reader.good(rows[active])]
        k += 1
        if _long_tail(reader, rows[active], k):
            break
    if not found:
        return
    entry = np.concatenate([e for e, _, _ in found])
    at = np.concatenate([a for _, a, _ in found])
    idx = np.concatenate([np.full(e.size, i) for e, _, i in found])
    head = reader.at(at, HEADER_SIZE)
    r = rows[entry]
    lod = _be(head[:, 23:27], ">i4")
    cols = {
        "row": r, "topic": topic[entry], "partition": part[entry], "idx": idx,
        "crc": _be(head[:, 17:21], ">u4"), "producer_id": _be(head[:, 43:51], ">i8"),
        "producer_epoch": _be(head[:, 51:53], ">i2"), "base_sequence": _be(head[:, 53:57], ">i4"),
        "attributes": _be(head[:, 21:23], ">i2"),
    }  # fmt: skip
    if kind == "produce_batch":
        reader.fail(r, lod == INT32_MAX)  # lastOffsetDelta + 1 overflows int32
        cols["record_count"] = lod + 1
    else:
        base = _be(head[:, 0:8], ">i8")
        overflow = ((lod > 0) & (base > INT64_MAX - lod)) | ((lod < 0) & (base < INT64_MIN - lod))
        reader.fail(r, overflow)  # the last offset would not fit int64
        cols["offset"] = base
        cols["last_offset"] = base + lod
        cols["record_count"] = _be(head[:, 57:61], ">i4")
        cols["leader_epoch"] = _be(head[:, 12:16], ">i4")
    facts.add(kind, **cols)


# ------------------------------------------------------------------ the three layouts


def _produce_requests(
    reader: _Reader, facts: _Facts, corr: Array, rows: Array, pos: Array, end: Array, version: int
) -> None:
    flex = version >= PRODUCE_FIRST_FLEXIBLE
    head = reader.block(rows, pos, end, 8)
    key, frame_version = _be(head[:, 0:2], ">i2"), _be(head[:, 2:4], ">i2")
    # decode_request trusts the frame's own header: anything else is the reference's.
    reader.fail(rows, (key != PRODUCE) | (frame_version != version))
    corr[rows] = _be(head[:, 4:8], ">i4")
    size, pos = reader.int(rows, pos + 8, end, ">i2")  # client id: classic nullable string
    reader.fail(rows, size < -1)
    size = np.maximum(size, 0)
    reader.fail(rows, pos + size > end)
    reader.check_ascii(rows, pos, size)
    pos = pos + size
    if flex:
        pos = reader.no_tags(rows, pos, end)
    _, _, pos = reader.string(rows, pos, end, flex, nullable=True)  # transactional id
    pos = pos + PRODUCE_REQUEST_FIXED  # acks, timeout
    topics, pos = reader.count(rows, pos, end, flex)
    table = _Topics(by_id=uses_topic_ids(PRODUCE, version))
    segments: list[tuple[Array, ...]] = []
    for t in _each(reader, rows, topics):
        r, p, e = rows[t], pos[t], end[t]
        tid, p = table.read(reader, r, p, e, flex)
        parts, p = reader.count(r, p, e, flex)
        for j in _each(reader, r, parts):
            rj, pj, ej = r[j], p[j], e[j]
            index, pj = reader.int(rj, pj, ej, ">i4")
            present, start, size, pj = _records_field(reader, rj, pj, ej, flex)
            segments.append(
                (rj[present], tid[j][present], index[present], start[present], size[present])
            )
            if flex:
                pj = reader.no_tags(rj, pj, ej)
            p[j] = pj
        if flex:
            p = reader.no_tags(r, p, e)
        pos[t] = p
    if flex:
        pos = reader.no_tags(rows, pos, end)
    # Trailing bytes after the body are allowed in requests (decode_request).
    ids = facts.add_topics(table.keys(reader))
    if segments:
        r, tid, index, start, size = (np.concatenate(c) for c in zip(*segments, strict=True))
        _batches(reader, facts, "produce_batch", r, ids[tid], index, start, size)


def _fetch_requests(
    reader: _Reader, facts: _Facts, corr: Array, rows: Array, pos: Array, end: Array, version: int
) -> None:
    """The fixed prefix :func:`~trio_broker.verify.decode.fetch_isolation` reads, no more."""
    head = reader.block(rows, pos, end, 8)
    key, frame_version = _be(head[:, 0:2], ">i2"), _be(head[:, 2:4], ">i2")
    reader.fail(rows, (key != FETCH) | (frame_version != version))
    corr[rows] = _be(head[:, 4:8], ">i4")
    size, pos = reader.int(rows, pos + 8, end, ">i2")  # client id: skipped, not decoded
    pos = pos + np.maximum(size, 0)
    if version >= FETCH_FIRST_FLEXIBLE_REQUEST:
        pos = reader.no_tags(rows, pos, end)
    pos = pos + (12 if version >= FETCH_NO_REPLICA_ID_VERSION else 16)
    level, _ = reader.int(rows, pos, end, ">i1")
    facts.add("fetch_isolation", row=rows, isolation_level=level)


def _records_field(
    reader: _Reader, rows: Array, pos: Array, end: Array, flex: bool
) -> tuple[Array, Array, Array, Array]:
    """A partition's nullable records bytes: (present, start, size, position after)."""
    size, pos = reader.length(rows, pos, end, flex, ">i4")
    present = size >= 0
    size = np.maximum(size, 0)
    reader.fail(rows, pos + size > end)
    return present, pos, size, pos + size


def _produce_responses(
    reader: _Reader, facts: _Facts, corr: Array, rows: Array, pos: Array, end: Array, version: int
) -> None:
    flex = version >= PRODUCE_FIRST_FLEXIBLE
    value, pos = reader.int(rows, pos, end, ">i4")
    corr[rows] = value
    if flex:
        pos = reader.no_tags(rows, pos, end)
    topics, pos = reader.count(rows, pos, end, flex)
    table = _Topics(by_id=uses_topic_ids(PRODUCE, version))
    acks: list[tuple[Array, ...]] = []
    fixed = produce_ack_width(version)
    for t in _each(reader, rows, topics):
        r, p, e = rows[t], pos[t], end[t]
        tid, p = table.read(reader, r, p, e, flex)
        parts, p = reader.count(r, p, e, flex)
        for j in _each(reader, r, parts):
            rj, pj, ej = r[j], p[j], e[j]
            head = reader.block(rj, pj, ej, fixed)
            acks.append((rj, tid[j], _be(head[:, 0:4], ">i4"), _be(head[:, 4:6], ">i2"),
                         _be(head[:, 6:14], ">i8")))  # fmt: skip
            pj = pj + fixed
            if version >= PRODUCE_RECORD_ERRORS_VERSION:
                errors, pj = reader.count(rj, pj, ej, flex)
                reader.fail(rj, errors != 0)  # per-record errors: left to the reference
                _, _, pj = reader.string(rj, pj, ej, flex, nullable=True)  # error message
            if flex:
                pj = reader.no_tags(rj, pj, ej)
            p[j] = pj
        if flex:
            p = reader.no_tags(r, p, e)
        pos[t] = p
    pos = pos + PRODUCE_RESPONSE_TRAILER  # throttle time
    if flex:
        pos = reader.no_tags(rows, pos, end)
    reader.fail(rows, pos != end)  # responses allow no trailing bytes
    ids = facts.add_topics(table.keys(reader))
    if acks:
        r, tid, index, error, base = (np.concatenate(c) for c in zip(*acks, strict=True))
        facts.add("produce_ack", row=r, topic=ids[tid], partition=index, error=error, offset=base)


def _fetch_responses(
    reader: _Reader, facts: _Facts, corr: Array, rows: Array, pos: Array, end: Array, version: int
) -> None:
    flex = version >= FETCH_FIRST_FLEXIBLE
    value, pos = reader.int(rows, pos, end, ">i4")
    corr[rows] = value
    if flex:
        pos = reader.no_tags(rows, pos, end)
    pos = pos + fetch_header_width(version)
    topics, pos = reader.count(rows, pos, end, flex)
    table = _Topics(by_id=uses_topic_ids(FETCH, version))
    heads: list[tuple[Array, ...]] = []
    segments: list[tuple[Array, ...]] = []
    aborts: list[tuple[Array, ...]] = []
    fixed = fetch_partition_width(version)
    aborted_size = ABORTED_TRANSACTION_SIZE + 1 if flex else ABORTED_TRANSACTION_SIZE
    for t in _each(reader, rows, topics):
        r, p, e = rows[t], pos[t], end[t]
        tid, p = table.read(reader, r, p, e, flex)
        parts, p = reader.count(r, p, e, flex)
        for j in _each(reader, r, parts):
            rj, pj, ej = r[j], p[j], e[j]
            head = reader.block(rj, pj, ej, fixed)
            index, error = _be(head[:, 0:4], ">i4"), _be(head[:, 4:6], ">i2")
            hw, lso = _be(head[:, 6:14], ">i8"), _be(head[:, 14:22], ">i8")
            heads.append((rj, tid[j], index, error, hw, lso))
            pj = pj + fixed
            aborted, pj = reader.count(rj, pj, ej, flex, nullable=True)
            aborted = np.where(reader.good(rj), aborted, 0)
            skip = aborted * aborted_size
            reader.fail(rj, pj + skip > ej)
            if aborted.any():  # one fact per (producer id, first offset) entry
                n = np.where(reader.good(rj), aborted, 0)
                nth = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
                at = np.repeat(pj, n) + nth * aborted_size
                owner = np.repeat(np.arange(rj.size), n)
                entry = reader.at(at, ABORTED_TRANSACTION_SIZE)
                aborts.append((rj[owner], tid[j][owner], index[owner],
                               _be(entry[:, 0:8], ">i8"), _be(entry[:, 8:16], ">i8")))  # fmt: skip
                if flex:  # each entry ends with its (empty) tagged fields
                    tags = reader.data[at + ABORTED_TRANSACTION_SIZE]
                    reader.fail(rj, np.bincount(owner[tags != 0], minlength=rj.size) > 0)
            pj = pj + skip
            pj = pj + fetch_after_aborted_width(version)
            present, start, size, pj = _records_field(reader, rj, pj, ej, flex)
            take = present & (error == 0)
            segments.append((rj[take], tid[j][take], index[take], start[take], size[take]))
            if flex:
                pj = reader.no_tags(rj, pj, ej)
            p[j] = pj
        if flex:
            p = reader.no_tags(r, p, e)
        pos[t] = p
    if flex:
        pos = reader.no_tags(rows, pos, end)
    reader.fail(rows, pos != end)
    ids = facts.add_topics(table.keys(reader))
    if heads:
        r, tid, index, error, hw, lso = (np.concatenate(c) for c in zip(*heads, strict=True))
        facts.add(
            "fetch_part", row=r, topic=ids[tid], partition=index, error=error, offset=hw,
            last_offset=lso,
        )  # fmt: skip
    if aborts:
        r, tid, index, pid, first = (np.concatenate(c) for c in zip(*aborts, strict=True))
        facts.add(
            "fetch_aborted", row=r, topic=ids[tid], partition=index, producer_id=pid,
            offset=first,
        )  # fmt: skip
    if segments:
        r, tid, index, start, size = (np.concatenate(c) for c in zip(*segments, strict=True))
        _batches(reader, facts, "fetch_batch", r, ids[tid], index, start, size)


# ------------------------------------------------------------------ one Arrow batch


def _column(batch: Any, name: str) -> Any:
    column = batch.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _frames(frame: Any) -> tuple[Array, Array, Array]:
    """(data, starts, ends) of a binary or large_binary Arrow array."""
    _, offsets_buf, data_buf = frame.buffers()
    width = np.int64 if pa.types.is_large_binary(frame.type) else np.int32
    n = len(frame)
    offsets = np.frombuffer(offsets_buf, width)[frame.offset : frame.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offsets[:-1], offsets[1:]


def decode_batch(batch: Any, stats: dict[str, int] | None = None) -> list[Any]:
    """Fact record batches (:func:`~trio_broker.verify.decode.fact_schema`) for one
    record batch of capture rows (the :data:`~trio_broker.verify.decode.NEEDED_COLUMNS`).

    ``stats``, if given, counts ``rows``, ``fast`` (rows decoded here), ``reference``
    (rows left to the reference) and ``copied`` (of those, rows whose facts were copied
    from an identical frame's).
    """
    schema = fact_schema()
    n = batch.num_rows
    if n == 0:
        return []
    frame = _column(batch, "frame")
    if not (pa.types.is_binary(frame.type) or pa.types.is_large_binary(frame.type)):
        frame = frame.cast(pa.large_binary())
    data, starts, ends = _frames(frame)
    direction = _column(batch, "direction")
    request = pc.fill_null(pc.equal(direction, "request"), False).to_numpy(zero_copy_only=False)
    api_key = pc.fill_null(_column(batch, "api_key"), -1).to_numpy(zero_copy_only=False)
    version = pc.fill_null(_column(batch, "api_version"), -1).to_numpy(zero_copy_only=False)
    present = ~frame.is_null().to_numpy(zero_copy_only=False)
    # Rows that yield facts; of these the fast path takes Produce and Fetch responses.
    wanted = present & np.where(
        request, np.isin(api_key, FACT_REQUEST_KEYS), np.isin(api_key, FACT_RESPONSE_KEYS)
    )
    fast_ok = wanted.copy()
    for name in NEEDED_COLUMNS:  # a null anywhere: the reference decides
        column = _column(batch, name)
        if name != "frame" and column.null_count:
            fast_ok &= ~column.is_null().to_numpy(zero_copy_only=False)
    reader = _Reader(data, n)
    facts = _Facts()
    corr = np.zeros(n, np.int64)
    fast = np.zeros(n, bool)
    kinds = (
        (True, PRODUCE, PRODUCE_VERSIONS, _produce_requests),
        (True, FETCH, FETCH_REQUEST_VERSIONS, _fetch_requests),
        (False, PRODUCE, PRODUCE_VERSIONS, _produce_responses),
        (False, FETCH, FETCH_RESPONSE_VERSIONS, _fetch_responses),
    )
    for is_request, key, versions, walk in kinds:
        mine = fast_ok & (request == is_request) & (api_key == key)
        for v in np.unique(version[mine]):
            if int(v) not in versions:
                continue
            rows = np.flatnonzero(mine & (version == v))
            fast[rows] = True
            walk(reader, facts, corr, rows, starts[rows].copy(), ends[rows], int(v))
    out = [b for b in _fact_batches(batch, facts, corr, reader.bad, schema) if b.num_rows]
    slow = np.flatnonzero(wanted & (~fast | reader.bad))
    if stats is not None:
        stats["rows"] = stats.get("rows", 0) + n
        stats["fast"] = stats.get("fast", 0) + int((fast & ~reader.bad).sum())
        stats["reference"] = stats.get("reference", 0) + int(slow.size)
    if slow.size:
        out.append(_reference_facts(batch.take(pa.array(slow)), schema, stats))
    return out


def _reference_facts(subset: Any, schema: Any, stats: dict[str, int] | None) -> Any:
    """``decode_rows`` on rows the fast path left, once per distinct frame.

    Frames that differ only in their correlation id (a client's periodic Metadata
    refreshes, say) give the same facts but for ``run``, ``conn``, ``ts`` and ``corr``:
    the reference decodes one of them and its facts are copied for the others, with
    their own ``corr`` (the frame's, or the row's for an ``undecodable`` fact, as in
    ``decode_rows``). The copies are exact: nothing the codec reports depends on the
    correlation id's value.
    """
    columns = {name: _column(subset, name).to_pylist() for name in NEEDED_COLUMNS}
    if stats is not None:
        stats.setdefault("copied", 0)
    if any(_column(subset, name).null_count for name in NEEDED_COLUMNS):  # not copied
        return pa.RecordBatch.from_pydict(decode_rows(columns), schema=schema)
    n = subset.num_rows
    first: dict[Any, int] = {}
    source = np.arange(n)  # the row whose decoded facts each row takes
    frame_corr = np.zeros(n, np.int64)
    for i, frame in enumerate(columns["frame"]):
        at = 4 if columns["direction"][i] == "request" else 0
        if len(frame) < at + 4:
            continue
        key = (
            columns["direction"][i], columns["api_key"][i], columns["api_version"][i],
            len(frame) < columns["frame_length"][i], frame[:at], frame[at + 4 :],
        )  # fmt: skip
        source[i] = first.setdefault(key, i)
        frame_corr[i] = int.from_bytes(frame[at : at + 4], "big", signed=True)
    copies = np.flatnonzero(source != np.arange(n))
    if stats is not None:
        stats["copied"] = stats.get("copied", 0) + int(copies.size)
    if not copies.size:
        return pa.RecordBatch.from_pydict(decode_rows(columns), schema=schema)
    decoded = np.flatnonzero(source == np.arange(n))
    # The decoded rows' position as their connection id, to tell whose facts are whose.
    picked = {name: [columns[name][i] for i in decoded] for name in NEEDED_COLUMNS}
    picked["connection_id"] = decoded.tolist()
    facts = pa.RecordBatch.from_pydict(decode_rows(picked), schema=schema)
    owner = facts.column("conn").to_numpy()
    order = np.argsort(owner, kind="stable")
    per_row = np.bincount(owner, minlength=n)
    starts = np.zeros(n, np.int64)
    np.cumsum(per_row[:-1], out=starts[1:])
    counts = per_row[source]
    row = np.repeat(np.arange(n), counts)
    nth = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    facts = facts.take(pa.array(order[np.repeat(starts[source], counts) + nth]))
    own = source[row] == row
    undecodable = pc.equal(facts.column("kind"), "undecodable").to_numpy(zero_copy_only=False)
    row_corr = np.asarray(columns["correlation_id"], np.int64)[row]
    corr = np.where(own, facts.column("corr").to_numpy(zero_copy_only=False), frame_corr[row])
    corr = np.where(undecodable & ~own, row_corr, corr)
    replaced = {
        "run": _column(subset, "run").take(pa.array(row)).cast(pa.string()),
        "conn": pa.array(np.asarray(columns["connection_id"], np.int64)[row]),
        "ts": pa.array(np.asarray(columns["monotonic_ns"], np.int64)[row]),
        "corr": pa.array(corr.astype(np.int32)),
    }
    return pa.RecordBatch.from_arrays(
        [replaced.get(f.name, facts.column(f.name)) for f in schema], schema=schema
    )


def _fact_batches(batch: Any, facts: _Facts, corr: Array, bad: Array, schema: Any) -> Any:
    topics = pa.concat_arrays(facts.topics) if facts.topics else pa.array([], pa.string())
    run = _column(batch, "run")
    conn = _column(batch, "connection_id").to_numpy(zero_copy_only=False)
    ts = _column(batch, "monotonic_ns").to_numpy(zero_copy_only=False)
    for kind, chunks in facts.parts.items():
        cols = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
        keep = ~bad[cols["row"]]
        if not keep.all():  # facts of frames that failed after them
            cols = {name: values[keep] for name, values in cols.items()}
        rows = cols.pop("row")
        n = rows.size
        arrays: dict[str, Any] = {
            "run": run.take(pa.array(rows)).cast(pa.string()),
            "conn": pa.array(conn[rows].astype(np.int64)),
            "corr": pa.array(corr[rows].astype(np.int32)),
            "ts": pa.array(ts[rows].astype(np.int64)),
            "kind": pa.array([kind]).take(pa.array(np.zeros(n, np.int64))),
        }
        if "topic" in cols:  # a Fetch request's isolation level names no topic
            arrays["topic"] = topics.take(pa.array(cols.pop("topic")))
        for name, values in cols.items():
            arrow_type = _ARROW_TYPES[name]
            arrays[name] = pa.array(values.astype(_NUMPY_TYPES[str(arrow_type)]), arrow_type)
        yield pa.RecordBatch.from_arrays(
            [arrays.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema
        )


def decode_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` function: Arrow record batches of capture rows to fact batches.

    Decodes with the vectorized :mod:`trio_broker.verify.fastdecode` (the same fact
    multiset as :func:`decode_rows`, the reference, which it calls for the rows it
    leaves); a batch may give several fact batches, or none.
    """
    for batch in batches:
        yield from decode_batch(batch)
