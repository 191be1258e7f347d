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
        # Running totals: appends (and their messages) noted, and how many of them
        # the latest flush to start covers. The difference is what is pending.
        self._noted = 0
        self._noted_messages = 0
        self._started = 0
        self._started_messages = 0
        self._oldest_pending_ms: int | None = None
        #: the highest offset any waiter asked for (cancelled ones included).
        self.max_waited_offset = -1
        self._fsyncs = 0
        self._failures = 0
        self._appends = 0
        self._histogram: dict[int, int] = {}
        self._max = 0

    # -- appends and waiters
    def note_append(self, now_ms: int, messages: int = 1) -> None:
        if self._oldest_pending_ms is None:
            self._oldest_pending_ms = now_ms
        self._noted += 1
        self._noted_messages += messages

    @property
    def noted(self) -> tuple[int, int]:
        """(appends, messages) noted so far: what a flush starting now covers."""
        return self._noted, self._noted_messages

    def add_waiter(self, offset: int, token: T) -> None:
        """``token`` is released once durable_end_offset > ``offset``."""
        heapq.heappush(self._waiters, (offset, next(self._seq), token))
        self.max_waited_offset = max(self.max_waited_offset, offset)

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
        return self._noted > self._started

    @property
    def pending_appends(self) -> int:
        return self._noted - self._started

    # -- scheduling
    def needs_flush(self, now_ms: int) -> bool:
        if self._waiters:
            return True
        if not self.dirty:
            return False
        policy = self.policy
        if policy.flush_messages is None and policy.flush_ms is None:
            return True
        pending_messages = self._noted_messages - self._started_messages
        if policy.flush_messages is not None and pending_messages >= policy.flush_messages:
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
        return self.flush_started(self.noted)

    def flush_started(self, noted: tuple[int, int]) -> int:
        """A flush started that covers the appends counted in ``noted`` (a value of
        :attr:`noted` read when it started, possibly by its worker thread: reading
        two ints is safe there). Returns how many appends it adds."""
        appends, messages = noted
        covered = max(0, appends - self._started)
        self._started = max(self._started, appends)
        self._started_messages = max(self._started_messages, messages)
        if self._started >= self._noted:
            self._oldest_pending_ms = None
        # else: appends noted after ``noted`` stay pending; the oldest timestamp
        # kept is at least as old as theirs, so flush.ms can only come early.
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
            pending_appends=self.pending_appends,
            waiters=len(self._waiters),
            appends_per_fsync=dict(sorted(self._histogram.items())),
            max_appends_per_fsync=self._max,
        )
