"""Validating a segment's batches after an unclean shutdown.

A crash can leave the tail of a file torn (a batch cut short), zero-filled (the
file grew but the data never landed) or holding garbage. We keep the longest
prefix of batches that are each whole, magic 2, CRC32C-correct and contiguous in
offsets, and cut the file there. Contiguity matters because baseOffset is not
covered by the CRC: a corrupted offset would otherwise be served.

The one header field neither the CRC nor contiguity protects is
partitionLeaderEpoch (bytes 12-15); a flipped bit there goes unnoticed, as it
would in Kafka.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import crc32c

from trio_broker.protocol import batch_header
from trio_broker.storage.index import SegmentIndexer

#: Read this much at a time while validating; a bigger batch is read whole.
_CHUNK = 1 << 20

BatchCallback = Callable[[int, int, int, int], None]


@attrs.frozen
class ScanResult:
    #: bytes of valid batches from the start of the segment.
    valid_size: int
    #: offset after the last valid batch (the segment's base offset when none).
    next_offset: int
    batches: int
    #: maxTimestamp of the first batch, if any (for segment.ms).
    first_batch_timestamp: int | None
    #: why scanning stopped before the end of the file, None when it didn't.
    stop_reason: str | None


def check_batch(
    buf: bytes | memoryview,
    pos: int,
    available: int,
    expected_offset: int | None,
    *,
    gap_allowed: bool = False,
) -> str | None:
    """Why the batch at ``buf[pos:]`` is unusable, or None if it is sound.

    ``available`` is how many bytes from ``pos`` exist in the file; the caller
    makes sure ``buf`` holds the whole batch once its size is known to fit.
    """
    if available < batch_header.HEADER_SIZE:
        return "torn header"
    base, size = batch_header.base_offset_and_size(buf, pos)
    if size < batch_header.HEADER_SIZE:
        return f"batch length {size - batch_header.LOG_OVERHEAD} too small"
    if size > available:
        return "torn batch"
    if batch_header.magic(buf, pos) != batch_header.MAGIC:
        return "bad magic"
    if expected_offset is not None and (
        base < expected_offset or (base != expected_offset and not gap_allowed)
    ):
        return f"offset {base} where {expected_offset} was expected"
    if batch_header.last_offset_delta(buf, pos) < 0:
        return "negative lastOffsetDelta"
    view = memoryview(buf)[pos + batch_header.ATTRIBUTES_AT : pos + size]
    if crc32c.crc32c(view) != batch_header.stored_crc(buf, pos):
        return "crc mismatch"
    return None


def valid_prefix(data: bytes, base_offset: int) -> tuple[int, int]:
    """(bytes, next offset) of the longest valid prefix of an in-memory segment image.

    The pure twin of ``scan_segment`` used by the spec and by tests.
    """
    pos, expected = 0, base_offset
    while pos < len(data):
        if check_batch(data, pos, len(data) - pos, expected) is not None:
            break
        base, size = batch_header.base_offset_and_size(data, pos)
        expected = base + batch_header.last_offset_delta(data, pos) + 1
        pos += size
    return pos, expected


def scan_segment(
    fd: int,
    file_size: int,
    base_offset: int,
    indexer: SegmentIndexer | None = None,
    *,
    gaps_below: int = 0,
) -> ScanResult:
    """Validate every batch of a segment file, feeding ``indexer`` as it goes.

    Below ``gaps_below`` (the cleaner checkpoint) a batch may start after the offset
    the previous one ended at: compaction removes whole batches (storage/cleaner.py).

    Reads in 1 MiB chunks; a batch that straddles a chunk is re-read whole.
    """
    pos = 0
    expected = base_offset
    batches = 0
    first_ts: int | None = None
    buf = b""
    buf_pos = 0
    reason: str | None = None
    while pos < file_size:
        available = file_size - pos
        rel = pos - buf_pos
        if rel + batch_header.HEADER_SIZE > len(buf):
            buf = _read(fd, min(_CHUNK, available), pos)
            buf_pos, rel = pos, 0
            available = min(available, len(buf))
        if available >= batch_header.HEADER_SIZE:
            _, size = batch_header.base_offset_and_size(buf, rel)
            if batch_header.HEADER_SIZE <= size <= available and rel + size > len(buf):
                buf = _read(fd, size, pos)
                buf_pos, rel = pos, 0
                available = min(available, len(buf))
        reason = check_batch(
            buf, rel, min(available, len(buf) - rel), expected, gap_allowed=expected < gaps_below
        )
        if reason is not None:
            break
        base, size = batch_header.base_offset_and_size(buf, rel)
        max_ts = batch_header.max_timestamp(buf, rel)
        if first_ts is None:
            first_ts = max_ts
        if indexer is not None:
            indexer.on_batch(base - base_offset, pos, size, max_ts)
        expected = base + batch_header.last_offset_delta(buf, rel) + 1
        batches += 1
        pos += size
    return ScanResult(pos, expected, batches, first_ts, reason)


def _read(fd: int, size: int, position: int) -> bytes:
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, position)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
        position += len(chunk)
    return b"".join(parts)
