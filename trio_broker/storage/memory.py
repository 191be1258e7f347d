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
from trio_broker.storage.epoch_cache import LeaderEpochCache, set_batch_leader_epoch
from trio_broker.storage.errors import OffsetOutOfRange, StorageError
from trio_broker.storage.index import MAX_RELATIVE_OFFSET
from trio_broker.storage.log_types import (
    AppendResult,
    LogConfig,
    check_append_buffer,
    check_replicated_batch,
    split_fetched_batches,
    wall_clock_ms,
)
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
        #: first offset of each leader epoch (kept in memory only, like the records).
        self.epoch_cache = LeaderEpochCache()

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
        self,
        batch: bytearray | memoryview,
        *,
        now_ms: int,
        log_append_time: bool = False,
        leader_epoch: int | None = None,
    ) -> AppendResult:
        if self._closed:
            raise StorageError("log is closed")
        view, size, delta = check_append_buffer(batch)
        base = self.log_end_offset
        if leader_epoch is not None:
            self.epoch_cache.assign(leader_epoch, base)
            set_batch_leader_epoch(view, leader_epoch)
        batch_header.set_base_offset(view, base)
        if log_append_time:
            batch_header.set_log_append_time(view, now_ms)
        return self._store(view, base, size, delta, now_ms, now_ms if log_append_time else -1)

    def append_replicated(
        self, batch: bytes | bytearray | memoryview, *, now_ms: int
    ) -> AppendResult:
        """Store a leader's batch unchanged (PartitionLog.append_replicated's rules)."""
        if self._closed:
            raise StorageError("log is closed")
        view, base, size, delta, _, epoch = check_replicated_batch(
            batch, self.log_end_offset, self.epoch_cache
        )
        if epoch >= 0:
            self.epoch_cache.assign(epoch, base)
        return self._store(view, base, size, delta, now_ms, -1)

    def append_replicated_batches(
        self, records: bytes | bytearray | memoryview, *, now_ms: int
    ) -> list[AppendResult]:
        """Every whole batch of a fetch response's records, all checked before any is stored."""
        if self._closed:
            raise StorageError("log is closed")
        batches = split_fetched_batches(records)
        expected = self.log_end_offset
        epochs = LeaderEpochCache(list(self.epoch_cache.entries))
        for batch in batches:
            _, base, _, delta, _, epoch = check_replicated_batch(batch, expected, epochs)
            if epoch >= 0:
                epochs.assign(epoch, base)
            expected = base + delta + 1
        return [self.append_replicated(batch, now_ms=now_ms) for batch in batches]

    def begin_epoch(self, epoch: int) -> bool:
        """A leader's term begins at the log end (PartitionLog.begin_epoch)."""
        return self.epoch_cache.assign(epoch, self.log_end_offset)

    def _store(
        self, view: memoryview, base: int, size: int, delta: int, now_ms: int, log_append_time: int
    ) -> AppendResult:
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
            segment = self._roll(now_ms, base)
        max_ts = batch_header.max_timestamp(view)
        position = segment.size
        segment.batches.append(_Batch(base, last, bytes(view), max_ts))
        segment.size += size
        if segment.first_batch_timestamp is None:
            segment.first_batch_timestamp = max_ts if max_ts >= 0 else now_ms
        segment.max_timestamp = max(segment.max_timestamp, max_ts)
        segment.last_modified_ms = now_ms
        self.log_end_offset = last + 1
        return AppendResult(base, last, log_append_time, position, size)

    def _roll(self, now_ms: int, base_offset: int | None = None) -> _Segment:
        base = self.log_end_offset if base_offset is None else base_offset
        segment = _Segment(base, last_modified_ms=now_ms)
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
    def apply_retention(self, now_ms: int, high_watermark: int | None = None) -> int:
        segments = self._segments
        count = segments_to_delete(
            [s.size for s in segments],
            [s.next_offset for s in segments],
            [s.retention_timestamp() for s in segments],
            log_start_offset=self.log_start_offset,
            now_ms=now_ms,
            retention_ms=self.config.retention_ms,
            retention_bytes=self.config.retention_bytes,
            high_watermark=high_watermark,
        )
        if count:
            del segments[:count]
            self.log_start_offset = max(self.log_start_offset, segments[0].base_offset)
            self.epoch_cache.truncate_from_start(self.log_start_offset)
        return count

    def delete_records(self, before_offset: int) -> int:
        if not 0 <= before_offset <= self.log_end_offset:
            raise OffsetOutOfRange(before_offset, self.log_start_offset, self.log_end_offset)
        self.log_start_offset = max(self.log_start_offset, before_offset)
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        return self.log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and start it at ``offset``, past its end, as PartitionLog's."""
        if offset <= self.log_end_offset:
            raise ValueError(f"start at {offset}: not past the log end {self.log_end_offset}")
        self._segments = [_Segment(offset, last_modified_ms=self._now_ms())]
        self.log_start_offset = self.log_end_offset = self.durable_end_offset = offset
        self.epoch_cache.clear()

    def truncate_to(self, offset: int) -> int:
        """Cut the log to end at ``offset``, as PartitionLog.truncate_to: the batch holding
        it goes whole (in an offset hole, ``offset`` is the new end); returns the new end.
        A no-op at or past the end; OffsetOutOfRange below the log start (or where the
        batch holding the start would go)."""
        start, end = self.log_start_offset, self.log_end_offset
        if offset >= end:
            return end
        if offset < start:
            raise OffsetOutOfRange(offset, start, end)
        for k, segment in enumerate(self._segments):
            for i, batch in enumerate(segment.batches):
                if batch.last_offset < offset:
                    continue
                if batch.base_offset < start:
                    raise OffsetOutOfRange(offset, start, end)
                new_end = min(offset, batch.base_offset)
                keep = segment.batches[:i]
                if not keep and k > 0 and segment.base_offset > new_end:
                    del self._segments[k:]  # the hole ends where this segment begins
                else:
                    segment.batches = keep
                    segment.size = sum(len(b.data) for b in keep)
                    segment.max_timestamp = max((b.max_timestamp for b in keep), default=-1)
                    if not keep:
                        segment.first_batch_timestamp = None
                    del self._segments[k + 1 :]
                self.log_end_offset = new_end
                self.durable_end_offset = min(self.durable_end_offset, new_end)
                self.epoch_cache.truncate_from_end(new_end)
                return new_end
        # In a hole after the last batch: the log ends at ``offset``.
        self.log_end_offset = offset
        self.durable_end_offset = min(self.durable_end_offset, offset)
        self.epoch_cache.truncate_from_end(offset)
        return offset

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
