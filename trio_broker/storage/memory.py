"""``MemoryLog``: the partition log kept in memory, with PartitionLog's API.

Two jobs: the reference model the storage tests compare PartitionLog against,
and the backend of ``--storage memory``. It keeps the same *virtual* segments
(same roll rules) so retention removes exactly what the disk log would.
Written for obviousness, not speed: lists and linear scans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import attrs

from trio_broker.protocol import batch_header
from trio_broker.storage.errors import OffsetOutOfRange, StorageError
from trio_broker.storage.index import MAX_RELATIVE_OFFSET
from trio_broker.storage.log import AppendResult, LogConfig, check_append_buffer, wall_clock_ms
from trio_broker.storage.segment import segments_to_delete


@attrs.frozen
class MemoryRegion:
    """A stored batch for the network layer to send as bytes (no sendfile)."""

    data: memoryview

    @property
    def length(self) -> int:
        return len(self.data)

    def read_bytes(self) -> bytes:
        return bytes(self.data)


class _Batch(NamedTuple):
    base_offset: int
    last_offset: int
    data: bytes
    max_timestamp: int


@attrs.define(eq=False)
class _Segment:
    base_offset: int
    batches: list[_Batch] = attrs.field(factory=list)
    size: int = 0
    first_batch_timestamp: int | None = None
    max_timestamp: int = -1
    last_modified_ms: int = 0

    @property
    def next_offset(self) -> int:
        return self.batches[-1].last_offset + 1 if self.batches else self.base_offset

    def retention_timestamp(self) -> int:
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_modified_ms


class MemoryLog:
    """In-memory twin of :class:`~trio_broker.storage.log.PartitionLog`."""

    def __init__(
        self, config: LogConfig | None = None, *, now_ms: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.config = config or LogConfig()
        self._now_ms = now_ms
        self._segments: list[_Segment] = [_Segment(0, last_modified_ms=now_ms())]
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.durable_end_offset = 0
        self.offline = False
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: Path | None = None,
        config: LogConfig | None = None,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> MemoryLog:
        """A new empty log; ``directory`` is accepted for API parity and ignored."""
        return cls(config, now_ms=now_ms)

    # -- appends
    def append(
        self, batch: bytearray | memoryview, *, now_ms: int, log_append_time: bool = False
    ) -> AppendResult:
        if self._closed:
            raise StorageError("log is closed")
        view, size, delta = check_append_buffer(batch)
        base = self.log_end_offset
        last = base + delta
        segment = self._segments[-1]
        if segment.size > 0 and (
            segment.size + size > self.config.segment_bytes
            or last - segment.base_offset > MAX_RELATIVE_OFFSET
            or (
                segment.first_batch_timestamp is not None
                and now_ms - segment.first_batch_timestamp > self.config.segment_ms
            )
        ):
            segment = self._roll(now_ms)
        batch_header.set_base_offset(view, base)
        if log_append_time:
            batch_header.set_log_append_time(view, now_ms)
        max_ts = batch_header.max_timestamp(view)
        position = segment.size
        segment.batches.append(_Batch(base, last, bytes(view), max_ts))
        segment.size += size
        if segment.first_batch_timestamp is None:
            segment.first_batch_timestamp = max_ts if max_ts >= 0 else now_ms
        segment.max_timestamp = max(segment.max_timestamp, max_ts)
        segment.last_modified_ms = now_ms
        self.log_end_offset = last + 1
        return AppendResult(base, last, now_ms if log_append_time else -1, position, size)

    def _roll(self, now_ms: int) -> _Segment:
        segment = _Segment(self.log_end_offset, last_modified_ms=now_ms)
        self._segments.append(segment)
        return segment

    def roll(self, now_ms: int | None = None) -> None:
        if self._segments[-1].size > 0:
            self._roll(self._now_ms() if now_ms is None else now_ms)

    # -- reads
    def _batches(self) -> Iterator[_Batch]:
        for segment in self._segments:
            yield from segment.batches

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int, *, min_one: bool = True
    ) -> list[MemoryRegion]:
        if not self.log_start_offset <= start_offset <= self.log_end_offset:
            raise OffsetOutOfRange(start_offset, self.log_start_offset, self.log_end_offset)
        regions: list[MemoryRegion] = []
        if start_offset >= max_offset:
            return regions  # nothing at or after the start is below the bound
        budget = max_bytes
        for batch in self._batches():
            if batch.last_offset < start_offset:
                continue
            if batch.base_offset >= max_offset:
                break
            if len(batch.data) > budget and not (min_one and not regions):
                break
            regions.append(MemoryRegion(memoryview(batch.data)))
            budget -= len(batch.data)
        return regions

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        for batch in self._batches():
            if batch.last_offset >= self.log_start_offset and batch.max_timestamp >= timestamp_ms:
                return max(batch.base_offset, self.log_start_offset), batch.max_timestamp
        return None

    def iter_batch_headers(
        self, from_offset: int | None = None
    ) -> Iterator[tuple[int, memoryview]]:
        start = self.log_start_offset if from_offset is None else from_offset
        for batch in self._batches():
            if batch.last_offset >= start:
                yield batch.base_offset, memoryview(batch.data)[: batch_header.HEADER_SIZE]

    def last_batches(self, n: int) -> list[tuple[int, bytes]]:
        kept = [
            (b.base_offset, b.data[: batch_header.HEADER_SIZE])
            for b in self._batches()
            if b.last_offset >= self.log_start_offset
        ]
        return kept[-n:] if n > 0 else []

    # -- durability: nothing to wait for, but the offset moves only on flush so
    # callers exercise the same acknowledgement path as with the disk log.
    def flush(self) -> int:
        self.durable_end_offset = self.log_end_offset
        return self.durable_end_offset

    # -- retention
    def apply_retention(self, now_ms: int) -> int:
        segments = self._segments
        count = segments_to_delete(
            [s.size for s in segments],
            [s.next_offset for s in segments],
            [s.retention_timestamp() for s in segments],
            log_start_offset=self.log_start_offset,
            now_ms=now_ms,
            retention_ms=self.config.retention_ms,
            retention_bytes=self.config.retention_bytes,
        )
        if count:
            del segments[:count]
            self.log_start_offset = max(self.log_start_offset, segments[0].base_offset)
        return count

    def delete_records(self, before_offset: int) -> int:
        if not 0 <= before_offset <= self.log_end_offset:
            raise OffsetOutOfRange(before_offset, self.log_start_offset, self.log_end_offset)
        self.log_start_offset = max(self.log_start_offset, before_offset)
        return self.log_start_offset

    def truncate_to(self, end_offset: int, now_ms: int = 0) -> None:
        """Forget batches from ``end_offset`` on, as crash recovery does to a disk log.

        ``end_offset`` must be a batch boundary. Trailing segments left empty go,
        and if the log start is beyond the new end the log restarts empty there.
        """
        for segment in self._segments:
            keep = [b for b in segment.batches if b.base_offset < end_offset]
            if len(keep) != len(segment.batches):
                if keep and keep[-1].last_offset + 1 != end_offset:
                    raise ValueError(f"{end_offset} is inside a batch")
                segment.batches = keep
                segment.size = sum(len(b.data) for b in keep)
                segment.max_timestamp = max((b.max_timestamp for b in keep), default=-1)
                if not keep:
                    segment.first_batch_timestamp = None
        while len(self._segments) > 1 and not self._segments[-1].batches:
            self._segments.pop()
        self.log_end_offset = self._segments[-1].next_offset
        if self.log_start_offset > self.log_end_offset:
            self._segments = [_Segment(self.log_start_offset, last_modified_ms=now_ms)]
            self.log_end_offset = self.log_start_offset
        self.durable_end_offset = min(self.durable_end_offset, self.log_end_offset)

    # -- lifecycle
    def close(self) -> None:
        self.flush()
        self._closed = True

    def abort(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._segments]

    def batches(self) -> list[tuple[int, int, bytes]]:
        """(base, last, bytes) of every batch still in the log (tests)."""
        return [(b.base_offset, b.last_offset, b.data) for b in self._batches()]
