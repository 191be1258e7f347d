"""Reads: whole batches as file regions for sendfile, timestamp lookups, batch headers.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``). Reads
belong to the event loop's thread, like appends; they take no lock (the segment list
is replaced whole, never changed in place).

This module never imports trio.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from trio_broker.protocol import batch_header
from trio_broker.storage.errors import OffsetOutOfRange
from trio_broker.storage.log_state import LogState, base_of
from trio_broker.storage.log_types import FileRegion
from trio_broker.storage.segment import iter_batches, iter_headers


class Reading(LogState):
    """``read``, ``offset_for_timestamp``, ``iter_batch_headers`` and ``last_batches``."""

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int, *, min_one: bool = True
    ) -> list[FileRegion]:
        """File regions holding whole batches from the one containing ``start_offset``.

        Batches with base offset >= ``max_offset`` (the high watermark) are left
        out, and the total stays within ``max_bytes`` except that with
        ``min_one`` the first batch is returned whatever its size (KIP-74).
        The first batch may start before ``start_offset``; clients skip those records.
        """
        log_start, log_end = self.log_start_offset, self.log_end_offset
        if not log_start <= start_offset <= log_end:
            raise OffsetOutOfRange(start_offset, log_start, log_end)
        limit = min(max_offset, log_end)
        if start_offset >= limit:
            return []
        segments = self._segments
        first = max(0, bisect.bisect_right(segments, start_offset, key=base_of) - 1)
        regions: list[FileRegion] = []
        budget = max_bytes
        taken = False
        for segment in segments[first:]:
            if segment.base_offset >= limit:
                break
            seg_end = segment.size
            if not taken:
                info = segment.position_of(start_offset)
                if info is None:
                    continue  # start is past this segment's batches
                if info.base_offset >= limit or (info.size > budget and not min_one):
                    break
                start = info.position
                end = start + info.size
                budget -= info.size
                taken = True
            else:
                start = end = 0
            # Jump through the index over batches known to satisfy both bounds.
            if limit < segment.next_offset:
                offset_bound = segment.boundary_for_offset(limit)
            else:
                offset_bound = seg_end
            if budget > 0:
                jump = min(segment.boundary_at_or_before(end + budget, end), offset_bound)
                if jump > end:
                    budget -= jump - end
                    end = jump
            stopped = False
            for info in iter_batches(segment.fd, end, seg_end):
                if info.base_offset >= limit or info.size > budget:
                    stopped = True
                    break
                budget -= info.size
                end += info.size
            if end > start:
                regions.append(FileRegion(segment.fd, start, end - start))
            if stopped or end < seg_end:
                break
        return regions

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, maxTimestamp) of the first batch whose maxTimestamp >= ``timestamp_ms``.

        Batch granularity: the offset is the batch's base offset (or the log start
        offset if that is later); a caller wanting the exact record decodes it.
        """
        log_start = self.log_start_offset
        for segment in self._segments:
            if segment.next_offset <= log_start or segment.max_timestamp < timestamp_ms:
                continue
            rel = segment.time_index.lookup_before(timestamp_ms)
            info = segment.position_of(max(segment.base_offset + rel, log_start))
            if info is None:
                continue
            for batch in iter_batches(segment.fd, info.position, segment.size):
                if batch.max_timestamp >= timestamp_ms and batch.last_offset >= log_start:
                    return max(batch.base_offset, log_start), batch.max_timestamp
        return None

    def iter_batch_headers(
        self, from_offset: int | None = None
    ) -> Iterator[tuple[int, memoryview]]:
        """(base offset, 61-byte header) of each batch from the one holding ``from_offset``.

        Reads only headers (a few KiB per pread), for rebuilding producer state.
        """
        start = self.log_start_offset if from_offset is None else from_offset
        segments = self._segments
        first = max(0, bisect.bisect_right(segments, start, key=base_of) - 1)
        for segment in segments[first:]:
            info = segment.position_of(start)
            if info is None:
                continue
            for _, header in iter_headers(segment.fd, info.position, segment.size):
                yield batch_header.base_offset_and_size(header)[0], header
            start = segment.next_offset

    def last_batches(self, n: int) -> list[tuple[int, bytes]]:
        """(base offset, header) of the last ``n`` batches, oldest first.

        Walks backwards one index interval at a time, so the cost is about
        ``n`` headers, not the segment.
        """
        found: list[tuple[int, bytes]] = []
        log_start = self.log_start_offset
        for segment in reversed(self._segments):
            if len(found) >= n or segment.next_offset <= log_start:
                break
            stop = segment.size
            positions = segment.offset_index.positions()
            k = len(positions)
            while len(found) < n and stop > 0:
                k -= 1
                start = positions[k] if k >= 0 else 0
                if start >= stop:
                    continue
                found[:0] = [
                    (batch_header.base_offset_and_size(h)[0], bytes(h))
                    for _, h in iter_headers(segment.fd, start, stop)
                ]
                stop = start
        kept = [b for b in found if b[0] + batch_header.last_offset_delta(b[1]) >= log_start]
        return kept[-n:] if n > 0 else []
