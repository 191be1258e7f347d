"""One log segment: a ``.log`` file of whole batches plus its two sparse indexes.

Plain ``os`` file calls only. A segment is appended to by one thread (the event
loop) while the flush thread may ``fdatasync`` it; the fields the flush thread
writes (``synced_size``, ``fully_synced``, ``dir_synced``) are only ever raised,
so a racing reader sees an old value at worst, which is always safe.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from trio_broker.protocol import batch_header
from trio_broker.storage.durable import write_all
from trio_broker.storage.index import (
    MAX_RELATIVE_OFFSET,
    OffsetIndex,
    SegmentIndexer,
    TimeIndex,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"

#: Header reads are batched: one pread serves every header inside this window.
_SCAN_CHUNK = 16 * 1024


def segment_name(base_offset: int) -> str:
    """Zero-padded so that lexical order is offset order (Kafka's naming)."""
    return f"{base_offset:020d}"


def parse_segment_name(name: str) -> int | None:
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


# --- reads ------------------------------------------------------------------------------


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read up to ``size`` bytes at ``position`` (fewer only at end of file)."""
    first = os.pread(fd, size, position)
    if len(first) == size or not first:
        return first
    parts = [first]
    got = len(first)
    while got < size:
        chunk = os.pread(fd, size - got, position + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# --- batch walking ----------------------------------------------------------------------


class BatchInfo(NamedTuple):
    position: int
    base_offset: int
    size: int
    last_offset: int
    max_timestamp: int


def iter_batches(fd: int, start: int, end: int) -> Iterator[BatchInfo]:
    """Walk the batch headers in ``[start, end)`` of a segment file.

    ``start`` must be a batch boundary and ``end`` the end of whole batches (the
    segment's size): this trusts the data, recovery is what validates it.
    One pread covers many small batches; big batches cost one small pread each.
    """
    buf = b""
    buf_pos = 0
    pos = start
    chunk = _SCAN_CHUNK
    while pos < end:
        rel = pos - buf_pos
        if rel < 0 or rel + batch_header.HEADER_SIZE > len(buf):
            want = min(max(chunk, batch_header.HEADER_SIZE), end - pos)
            buf = pread_exact(fd, want, pos)
            buf_pos, rel = pos, 0
            if len(buf) < batch_header.HEADER_SIZE:
                return
        base, size = batch_header.base_offset_and_size(buf, rel)
        yield BatchInfo(
            pos,
            base,
            size,
            base + batch_header.last_offset_delta(buf, rel),
            batch_header.max_timestamp(buf, rel),
        )
        # After a big batch the next header is far away: fetch just a header.
        chunk = batch_header.HEADER_SIZE if size >= _SCAN_CHUNK else _SCAN_CHUNK
        pos += size


def iter_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, memoryview]]:
    """(position, 61-byte header view) for each batch in ``[start, end)``."""
    buf = memoryview(b"")
    buf_pos = 0
    pos = start
    while pos < end:
        rel = pos - buf_pos
        if rel < 0 or rel + batch_header.HEADER_SIZE > len(buf):
            buf = memoryview(pread_exact(fd, min(_SCAN_CHUNK, end - pos), pos))
            buf_pos, rel = pos, 0
            if len(buf) < batch_header.HEADER_SIZE:
                return
        _, size = batch_header.base_offset_and_size(buf, rel)
        yield pos, buf[rel : rel + batch_header.HEADER_SIZE]
        pos += size


# --- the segment ------------------------------------------------------------------------


class Segment:
    """A ``.log`` file (O_APPEND) with its indexes and bookkeeping."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        *,
        size: int,
        next_offset: int,
        indexer: SegmentIndexer,
        first_batch_timestamp: int | None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.fd = fd
        #: bytes of whole, valid batches; the file is never longer once appends settle.
        self.size = size
        #: offset after the last batch (== base_offset while empty).
        self.next_offset = next_offset
        self.indexer = indexer
        #: maxTimestamp of the first batch: segment.ms counts from it (as Kafka does).
        self.first_batch_timestamp = first_batch_timestamp
        #: bytes known to be on stable storage.
        self.synced_size = 0
        #: no more appends; set by roll before the segment is published as sealed.
        self.sealed = False
        #: sealed, data and index files fsynced: recovery may trust it.
        self.fully_synced = False
        #: the directory entry of the .log file is durable.
        self.dir_synced = False
        #: removed by retention; the fd stays open a while for in-flight sendfiles.
        self.deleted = False
        #: wall-clock of the last append, for time retention of timestamp-less data.
        self.last_modified_ms = 0

    # -- paths
    @property
    def name(self) -> str:
        return segment_name(self.base_offset)

    @property
    def log_path(self) -> Path:
        return self.directory / (self.name + LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.directory / (self.name + INDEX_SUFFIX)

    @property
    def timeindex_path(self) -> Path:
        return self.directory / (self.name + TIMEINDEX_SUFFIX)

    @property
    def offset_index(self) -> OffsetIndex:
        return self.indexer.offset_index

    @property
    def time_index(self) -> TimeIndex:
        return self.indexer.time_index

    @property
    def max_timestamp(self) -> int:
        return self.indexer.max_timestamp

    def retention_timestamp(self) -> int:
        """Kafka's rule: the largest record timestamp, or the file's mtime without one."""
        if self.indexer.max_timestamp >= 0:
            return self.indexer.max_timestamp
        return self.last_modified_ms

    # -- lifecycle
    @classmethod
    def create(cls, directory: Path, base_offset: int, interval_bytes: int, now_ms: int) -> Segment:
        path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        # O_EXCL: a leftover file with this name would mean two segments claim
        # the same offsets; refuse rather than append after stale bytes.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        seg = cls(
            directory,
            base_offset,
            fd,
            size=0,
            next_offset=base_offset,
            indexer=SegmentIndexer(interval_bytes),
            first_batch_timestamp=None,
        )
        seg.last_modified_ms = now_ms
        return seg

    @classmethod
    def open_file(cls, directory: Path, base_offset: int) -> int:
        path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def unlink(self) -> None:
        """Remove the files; the fd stays usable until ``close`` (open-file semantics)."""
        self.deleted = True
        for path in (self.log_path, self.index_path, self.timeindex_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- appends
    def append(
        self, batch: memoryview, base_offset: int, last_offset: int, max_timestamp: int, now_ms: int
    ) -> int:
        """Write one batch at the end with a single write; returns its position.

        On any failure the file is cut back to its previous size so no partial
        batch stays behind, then the OSError propagates.
        """
        position = self.size
        try:
            n = os.write(self.fd, batch)
            if n != len(batch):
                # A short write on a regular file means the disk filled up part way;
                # finishing it would fail too, and a half batch must not remain.
                raise OSError(errno.ENOSPC, f"short write ({n} of {len(batch)} bytes)")
        except BaseException:
            try:
                os.ftruncate(self.fd, position)
            except OSError:
                # Recovery will cut the torn tail at the next open.
                pass
            raise
        self.size = position + len(batch)
        self.next_offset = last_offset + 1
        if self.first_batch_timestamp is None:
            # Without a timestamp (-1) the age counts from the first append.
            self.first_batch_timestamp = max_timestamp if max_timestamp >= 0 else now_ms
        self.last_modified_ms = now_ms
        self.indexer.on_batch(base_offset - self.base_offset, position, len(batch), max_timestamp)
        return position

    def is_full(
        self, batch_size: int, last_offset: int, segment_bytes: int, max_entries: int
    ) -> bool:
        return self.size > 0 and (
            self.size + batch_size > segment_bytes
            or last_offset - self.base_offset > MAX_RELATIVE_OFFSET
            or self.indexer.entry_count >= max_entries
        )

    def seal(self) -> None:
        self.indexer.seal()
        self.sealed = True

    # -- lookups
    def position_of(self, offset: int) -> BatchInfo | None:
        """The batch containing ``offset`` or, in a gap, the first batch after it."""
        rel = max(0, offset - self.base_offset)
        _, start = self.offset_index.lookup(min(rel, MAX_RELATIVE_OFFSET))
        for info in iter_batches(self.fd, start, self.size):
            if info.last_offset >= offset:
                return info
        return None

    def boundary_at_or_before(self, position: int, not_before: int) -> int:
        """A batch boundary <= ``position`` found through the index (>= ``not_before``)."""
        _, pos = self.offset_index.lookup_position(position)
        return max(pos, not_before)

    def boundary_for_offset(self, offset: int) -> int:
        """A batch boundary such that every batch before it has baseOffset < ``offset``."""
        rel = offset - self.base_offset
        if rel <= 0:
            return 0
        _, pos = self.offset_index.lookup(min(rel, MAX_RELATIVE_OFFSET))
        return pos

    # -- durability
    def sync_data(self) -> None:
        os.fdatasync(self.fd)

    def write_index_files(self, *, sync: bool) -> None:
        """Write both indexes to their files (replacing them), optionally fsynced."""
        for path, index in (
            (self.index_path, self.offset_index),
            (self.timeindex_path, self.time_index),
        ):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                write_all(fd, index.raw())
                if sync:
                    os.fsync(fd)
                if self.sealed:
                    index.attach_file(fd)
            finally:
                os.close(fd)


def segments_to_delete(
    sizes: Sequence[int],
    next_offsets: Sequence[int],
    timestamps: Sequence[int],
    *,
    log_start_offset: int,
    now_ms: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    high_watermark: int | None = None,
) -> int:
    """How many of the oldest segments retention removes (never the last, active one).

    From the oldest, while any rule allows it (docs/storage.md): the segment lies
    wholly below the log start offset, its newest timestamp is older than
    ``retention_ms``, or the log without it still holds at least ``retention_bytes``.
    The rules are checked together, segment by segment: timestamps need not grow
    from one segment to the next, so a segment the time rule allows may follow one
    only the size rule allows. Whatever the rules say, a segment goes only once it
    lies wholly below ``high_watermark`` (Kafka's ``deletableSegments``): a leader never
    deletes records its followers may not have yet. None: the whole log is committed
    (a node alone).

    pre: len(sizes) == len(next_offsets) == len(timestamps)
    post: 0 <= __return__ <= max(0, len(sizes) - 1)
    post: high_watermark is None or __return__ == 0 or next_offsets[__return__ - 1] <= high_watermark
    """
    candidates = len(sizes) - 1
    remaining = sum(sizes)  # of the segments from ``count`` on
    count = 0
    while count < candidates:
        without = remaining - sizes[count]
        if high_watermark is not None and next_offsets[count] > high_watermark:
            break  # not yet committed: kept whatever the rules say
        if not (
            next_offsets[count] <= log_start_offset
            or (retention_ms is not None and now_ms - timestamps[count] > retention_ms)
            or (retention_bytes is not None and without >= retention_bytes)
        ):
            break
        remaining = without
        count += 1
    return count
