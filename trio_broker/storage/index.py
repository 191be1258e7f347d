"""Sparse per-segment indexes: offset -> file position, and timestamp -> offset.

Both are arrays of fixed-size big-endian entries, relative to the segment's base
offset so an entry fits in a few bytes:

* offset index (``.index``): relative offset uint32, position uint32 - 8 bytes.
  An entry points at the *start* of a batch whose baseOffset is that offset.
* time index (``.timeindex``): timestamp int64, relative offset uint32 - 12 bytes.
  An entry (T, o) says: every batch up to the current position has
  maxTimestamp <= T, and the batch at offset o is the one that reached T.

An index is *sparse*: an entry is added only after ``index_interval_bytes`` of
batches, so a lookup lands a little before its target and the reader walks the
batch headers from there. Both are strictly increasing in both fields.

The active segment's indexes live in a growing ``bytearray`` (appending an entry
is an amortised O(1) ``+=``, no syscall); they reach the disk when the segment is
sealed or the log is closed, and are rebuilt by recovery after a crash. Sealed
indexes are served from a read-only ``mmap`` so a big log doesn't hold its
indexes on the heap.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from typing import overload

import attrs

from trio_broker.protocol.batch_header import HEADER_SIZE

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
MAX_RELATIVE_OFFSET = 0xFFFFFFFF
MAX_POSITION = 0xFFFFFFFF
#: No two index entries are closer than one batch header (61 bytes).
INDEX_ENTRY_MIN_BYTES = HEADER_SIZE

Buffer = bytes | bytearray | mmap.mmap


def floor_entry(keys: Sequence[int], target: int) -> int:
    """Index of the greatest key <= ``target`` in a sorted sequence, or -1 if none.

    With equal keys the last of them is returned. O(log n) probes of ``keys``.

    pre: all(keys[i] <= keys[i + 1] for i in range(len(keys) - 1))
    post: -1 <= __return__ < len(keys)
    post: __return__ == -1 or keys[__return__] <= target
    post: __return__ == len(keys) - 1 or keys[__return__ + 1] > target
    """
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


class _FieldView(Sequence[int]):
    """One field of every entry of an index buffer, as a read-only sequence of ints.

    Lets ``floor_entry`` search the raw buffer without decoding it into a list.
    """

    __slots__ = ("_buf", "_count", "_field", "_width")

    def __init__(self, buf: Buffer, count: int, width: int, field: struct.Struct, at: int) -> None:
        self._buf = buf
        self._count = count
        self._width = width
        self._field = (field, at)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        field, at = self._field
        return int(field.unpack_from(self._buf, i * self._width + at)[0])


_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class _SparseIndex:
    entry: struct.Struct

    def __init__(self, buf: Buffer | None = None) -> None:
        # Mutable while the segment is active (bytearray), immutable once sealed
        # (bytes or mmap). Readers take a local reference first, so swapping the
        # buffer from the flush thread never tears a lookup.
        self._buf: Buffer = bytearray() if buf is None else buf
        self._mmap: mmap.mmap | None = None

    def __len__(self) -> int:
        return len(self._buf) // self.entry.size

    @property
    def size_bytes(self) -> int:
        return len(self._buf)

    def raw(self) -> bytes:
        return bytes(self._buf)

    def entries(self) -> list[tuple[int, ...]]:
        """Every entry decoded (tests and sanity checks; O(n))."""
        buf = self._buf
        return [tuple(t) for t in self.entry.iter_unpack(buf[: len(self) * self.entry.size])]

    def _append(self, *fields: int) -> None:
        buf = self._buf
        if not isinstance(buf, bytearray):
            raise ValueError("index is sealed")
        buf += self.entry.pack(*fields)

    def freeze(self) -> None:
        """Seal: no more appends (the buffer becomes immutable bytes)."""
        if isinstance(self._buf, bytearray):
            self._buf = bytes(self._buf)

    def attach_file(self, fd: int) -> None:
        """Serve lookups from a read-only mapping of the (synced) index file.

        Frees the in-memory copy; the page cache holds the entries from now on.
        """
        size = os.fstat(fd).st_size
        if size == 0 or size != len(self._buf):
            return
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        self._mmap = m
        self._buf = m

    def close(self) -> None:
        m, self._mmap = self._mmap, None
        if m is not None:
            self._buf = b""
            m.close()

    @classmethod
    def load(cls, fd: int, *, mutable: bool) -> _SparseIndex:
        """Read an index file; a trailing partial entry is dropped."""
        size = os.fstat(fd).st_size
        size -= size % cls.entry.size
        index = cls()
        if mutable:
            index._buf = bytearray(_pread_all(fd, size))
        elif size:
            m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            index._mmap = m
            index._buf = m
        else:
            index._buf = b""
        return index


class OffsetIndex(_SparseIndex):
    entry = OFFSET_ENTRY

    def append(self, relative_offset: int, position: int) -> None:
        self._append(relative_offset, position)

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or before ``relative_offset``.

        (0, 0) - the segment start - when no entry qualifies.
        """
        buf = self._buf
        count = len(buf) // 8
        i = floor_entry(_FieldView(buf, count, 8, _U32, 0), relative_offset)
        if i < 0:
            return 0, 0
        rel, pos = OFFSET_ENTRY.unpack_from(buf, i * 8)
        return int(rel), int(pos)

    def lookup_position(self, position: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry whose position is <= ``position``."""
        buf = self._buf
        count = len(buf) // 8
        i = floor_entry(_FieldView(buf, count, 8, _U32, 4), position)
        if i < 0:
            return 0, 0
        rel, pos = OFFSET_ENTRY.unpack_from(buf, i * 8)
        return int(rel), int(pos)

    def last_entry(self) -> tuple[int, int] | None:
        n = len(self)
        if n == 0:
            return None
        rel, pos = OFFSET_ENTRY.unpack_from(self._buf, (n - 1) * 8)
        return int(rel), int(pos)

    def positions(self) -> Sequence[int]:
        buf = self._buf
        return _FieldView(buf, len(buf) // 8, 8, _U32, 4)


class TimeIndex(_SparseIndex):
    entry = TIME_ENTRY

    def append(self, timestamp: int, relative_offset: int) -> None:
        self._append(timestamp, relative_offset)

    def last_entry(self) -> tuple[int, int] | None:
        n = len(self)
        if n == 0:
            return None
        ts, rel = TIME_ENTRY.unpack_from(self._buf, (n - 1) * 12)
        return int(ts), int(rel)

    def lookup_before(self, timestamp: int) -> int:
        """Relative offset to scan from for the first batch with maxTimestamp >= ``timestamp``.

        The last entry whose timestamp is < ``timestamp`` proves no batch before
        its offset qualifies; 0 (segment start) when there is no such entry.
        """
        buf = self._buf
        count = len(buf) // 12
        i = floor_entry(_FieldView(buf, count, 12, _I64, 0), timestamp - 1)
        if i < 0:
            return 0
        return int(_U32.unpack_from(buf, i * 12 + 8)[0])


@attrs.define(eq=False)
class SegmentIndexer:
    """Adds index entries as batches are appended (or re-read by recovery).

    Append and recovery share this so a rebuilt index is byte-identical to the
    one the appends would have written.
    """

    interval_bytes: int
    offset_index: OffsetIndex = attrs.field(factory=OffsetIndex)
    time_index: TimeIndex = attrs.field(factory=TimeIndex)
    #: bytes appended since the last offset-index entry (or the segment start).
    bytes_since_entry: int = 0
    #: largest maxTimestamp in the segment so far (-1: none).
    max_timestamp: int = -1
    #: relative offset of the batch holding ``max_timestamp``.
    offset_of_max_timestamp: int = 0

    def on_batch(self, relative_offset: int, position: int, size: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = relative_offset
        # Position 0 needs no entry: a missed lookup already lands there.
        if position > 0 and self.bytes_since_entry >= self.interval_bytes:
            self.offset_index.append(relative_offset, position)
            self._add_time_entry()
            self.bytes_since_entry = 0
        self.bytes_since_entry += size

    def _add_time_entry(self) -> None:
        last = self.time_index.last_entry()
        if self.max_timestamp >= 0 and (last is None or self.max_timestamp > last[0]):
            self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)

    def seal(self) -> None:
        """Record the segment's max timestamp as the last time entry, then freeze.

        A reopened log reads a sealed segment's max timestamp from that last
        entry instead of scanning the segment.
        """
        self._add_time_entry()
        self.offset_index.freeze()
        self.time_index.freeze()

    def checkpoint(self) -> None:
        """Like ``seal`` but keeps the indexes appendable (clean close of the active segment)."""
        self._add_time_entry()

    @property
    def entry_count(self) -> int:
        return len(self.offset_index)

    @classmethod
    def resume(
        cls, interval_bytes: int, offset_index: OffsetIndex, time_index: TimeIndex, size: int
    ) -> SegmentIndexer:
        """Rebuild the indexer state of a segment whose index files are trusted."""
        last = offset_index.last_entry()
        last_time = time_index.last_entry()
        max_ts, off_of_max = (-1, 0) if last_time is None else last_time
        return cls(
            interval_bytes,
            offset_index,
            time_index,
            bytes_since_entry=size - (0 if last is None else last[1]),
            max_timestamp=max_ts,
            offset_of_max_timestamp=off_of_max,
        )


def offset_index_is_sane(entries: Sequence[tuple[int, int]], segment_size: int, span: int) -> bool:
    """Whether offset-index entries can belong to a segment of this size and offset span.

    Entries must be strictly increasing in both fields, point inside the segment
    (position > 0 and < size) and at an offset below ``span`` (next offset - base).

    post: (not __return__) or all(0 < p < segment_size and 0 < o < span for o, p in entries)
    post: (not __return__) or all(a[0] < b[0] and a[1] < b[1] for a, b in zip(entries, entries[1:]))
    """
    prev_o, prev_p = 0, 0
    for o, p in entries:
        if not (prev_o < o < span and prev_p < p < segment_size):
            return False
        prev_o, prev_p = o, p
    return True


def quick_check(
    index: OffsetIndex, time_index: TimeIndex, file_size: int, span: int | None
) -> bool:
    """O(1) sanity check of a trusted segment's index files at open.

    Like Kafka's: the last entries must point inside the segment.
    """
    last = index.last_entry()
    if last is not None:
        rel, pos = last
        if not 0 < pos < file_size or (span is not None and rel >= span):
            return False
    last_time = time_index.last_entry()
    return not (last_time is not None and span is not None and last_time[1] >= span)


def _pread_all(fd: int, size: int, position: int = 0) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, position)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        position += len(chunk)
    return b"".join(chunks)
