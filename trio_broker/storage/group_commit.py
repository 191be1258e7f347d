"""Group-commit bookkeeping for one log, free of I/O (the Flusher does the I/O).

Group commit: while one fsync runs, new appends pile up; the next fsync covers
all of them. Nothing is delayed on purpose - the batching comes from the fsync's
own latency. This module tracks who waits for which offset, decides when a log
without waiters is due (``flush.ms`` / ``flush.messages``), and counts how many
appends each fsync covered.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

import attrs

T = TypeVar("T")


@attrs.frozen
class FlushPolicy:
    """When data nobody waits for gets fsynced.

    ``flush_messages`` / ``flush_ms`` (Kafka's flush.messages / flush.ms) bound
    how much acks=0/1 data may sit unsynced; with neither set, dirty logs are
    synced as soon as the flusher is free. ``sync_acks_all``: acks=all produce
    responses wait for the fsync (Kafka itself relies on replication instead).
    """

    flush_messages: int | None = None
    flush_ms: int | None = None
    sync_acks_all: bool = True

    @property
    def syncs_every_append(self) -> bool:
        """Whether every append is synced as soon as the flusher is free (neither
        flush.messages nor flush.ms makes the syncs lazy): then a node alone's high
        watermark may be its durable end at the price of one fsync's latency."""
        return self.flush_messages is None and self.flush_ms is None

    def requires_sync(self, acks: int) -> bool:
        """Whether a produce with this acks value must wait for durability."""
        return self.sync_acks_all and acks == -1


@attrs.frozen
class FlushStatistics:
    fsyncs: int
    failures: int
    #: appends covered by completed flushes.
    appends: int
    #: appends not yet covered by a flush that started.
    pending_appends: int
    waiters: int
    #: bucket -> number of flushes; bucket b counts flushes covering [b, 2b) appends.
    appends_per_fsync: dict[int, int]
    max_appends_per_fsync: int

    @property
    def mean_appends_per_fsync(self) -> float:
        return self.appends / self.fsyncs if self.fsyncs else 0.0

    @classmethod
    def combine(cls, parts: list[FlushStatistics]) -> FlushStatistics:
        histogram: dict[int, int] = {}
        for part in parts:
            for bucket, count in part.appends_per_fsync.items():
                histogram[bucket] = histogram.get(bucket, 0) + count
        return cls(
            fsyncs=sum(p.fsyncs for p in parts),
            failures=sum(p.failures for p in parts),
            appends=sum(p.appends for p in parts),
            pending_appends=sum(p.pending_appends for p in parts),
            waiters=sum(p.waiters for p in parts),
            appends_per_fsync=dict(sorted(histogram.items())),
            max_appends_per_fsync=max((p.max_appends_per_fsync for p in parts), default=0),
        )


def histogram_bucket(count: int) -> int:
    """Power-of-two bucket: 0, 1, 2, 4, 8, ...

    pre: count >= 0
    post: __return__ <= count < 2 * __return__ or __return__ == count == 0
    """
    return 0 if count <= 0 else 1 << (count.bit_length() - 1)


class DurabilityTracker(Generic[T]):
    """Waiters and unflushed-append counters of one log.

    ``T`` is whatever the I/O layer wakes a waiter with (a trio.Event in the
    Flusher); the tracker only hands the tokens back.
    """

    def __init__(self, policy: FlushPolicy | None = None) -> None:
        self.policy = policy or FlushPolicy()
        self._waiters: list[tuple[int, int, T]] = []  # heap by offset
        self._seq = itertools.count()
        self._pending_appends = 0
        self._pending_messages = 0
        self._oldest_pending_ms: int | None = None
        self._fsyncs = 0
        self._failures = 0
        self._appends = 0
        self._histogram: dict[int, int] = {}
        self._max = 0

    # -- appends and waiters
    def note_append(self, now_ms: int, messages: int = 1) -> None:
        self._pending_appends += 1
        self._pending_messages += messages
        if self._oldest_pending_ms is None:
            self._oldest_pending_ms = now_ms

    def add_waiter(self, offset: int, token: T) -> None:
        """``token`` is released once durable_end_offset > ``offset``."""
        heapq.heappush(self._waiters, (offset, next(self._seq), token))

    def discard_waiter(self, token: T) -> None:
        """Forget a waiter that gave up (cancelled). O(n); cancellation is rare."""
        kept = [w for w in self._waiters if w[2] is not token]
        if len(kept) != len(self._waiters):
            heapq.heapify(kept)
            self._waiters = kept

    @property
    def waiters(self) -> int:
        return len(self._waiters)

    @property
    def dirty(self) -> bool:
        return self._pending_appends > 0

    # -- scheduling
    def needs_flush(self, now_ms: int) -> bool:
        if self._waiters:
            return True
        if not self.dirty:
            return False
        policy = self.policy
        if policy.flush_messages is None and policy.flush_ms is None:
            return True
        if policy.flush_messages is not None and self._pending_messages >= policy.flush_messages:
            return True
        return self._due_by_time(now_ms)

    def _due_by_time(self, now_ms: int) -> bool:
        deadline = self.deadline_ms()
        return deadline is not None and now_ms >= deadline

    def deadline_ms(self) -> int | None:
        """When flush.ms makes the pending appends due (None: no time limit pending)."""
        if self.policy.flush_ms is None or self._oldest_pending_ms is None:
            return None
        return self._oldest_pending_ms + self.policy.flush_ms

    # -- a flush's life
    def begin_flush(self) -> int:
        """A flush starts: it covers the appends noted so far. Returns their count."""
        covered = self._pending_appends
        self._pending_appends = 0
        self._pending_messages = 0
        self._oldest_pending_ms = None
        return covered

    def end_flush(self, durable_end_offset: int, covered: int) -> list[T]:
        """The flush succeeded: return the waiters it satisfied."""
        self._fsyncs += 1
        self._appends += covered
        bucket = histogram_bucket(covered)
        self._histogram[bucket] = self._histogram.get(bucket, 0) + 1
        self._max = max(self._max, covered)
        released = []
        while self._waiters and self._waiters[0][0] < durable_end_offset:
            released.append(heapq.heappop(self._waiters)[2])
        return released

    def fail(self) -> list[T]:
        """The flush failed: every waiter is released (to find the log offline)."""
        self._failures += 1
        released = [w[2] for w in self._waiters]
        self._waiters = []
        return released

    def statistics(self) -> FlushStatistics:
        return FlushStatistics(
            fsyncs=self._fsyncs,
            failures=self._failures,
            appends=self._appends,
            pending_appends=self._pending_appends,
            waiters=len(self._waiters),
            appends_per_fsync=dict(sorted(self._histogram.items())),
            max_appends_per_fsync=self._max,
        )
