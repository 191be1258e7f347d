"""The flusher: fsyncs dirty partition logs in worker threads (group commit).

Produce handlers append on the event loop, call :meth:`Flusher.mark_dirty`, and
for acks=all ``await flusher.wait_durable(log, last_offset)``. A log's sync
starts in a worker thread (``trio.lowlevel.start_thread_soon``; results come
back through the trio token) as soon as the log is due and no sync of it is
running - straight from ``mark_dirty`` or ``wait_durable`` - so the disk syncs
while the event loop goes on appending. Appends that land while a sync runs are
covered by the next one, so appends per fsync grow with load by themselves:

* if at least as many landed as the sync covered, the worker starts the next
  sync itself, with no round trip to the event loop (the disk stays busy);
* otherwise, if the sync released waiters, the next sync starts once the
  woken tasks have run - a writer that waits for each ack appends again at once,
  and one fsync costs nearly as much for 64 KiB as for 1 MiB, so it pays to
  cover those appends too rather than start a small fsync without them.

Durability: ``log.flush()`` reads the log end *before* syncing and returns it as
the new durable end, and a waiter is released only once its offset is below a
durable end some sync returned - so only by a sync that began after its append
was written.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import outcome
import trio

from trio_broker.server.metrics import FSYNC_BOUNDS, LatencyHistogram
from trio_broker.storage.errors import StorageError
from trio_broker.storage.group_commit import DurabilityTracker, FlushPolicy, FlushStatistics

_logger = logging.getLogger("trio_broker.flusher")

#: An offline log is probed again at most this often (on produce, see recover_soon).
RECOVERY_BACKOFF_S = 1.0


class FlushableLog(Protocol):
    """What the flusher needs from PartitionLog / MemoryLog."""

    @property
    def durable_end_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def offline(self) -> bool: ...
    def flush(self) -> int: ...


@attrs.define(eq=False)
class _Entry:
    log: FlushableLog
    tracker: DurabilityTracker[trio.Event]
    #: set when a flush of this log failed; the log is offline from then on.
    error: StorageError | None = None
    #: syncs of this log running in worker threads (at most one, except flush_all's).
    in_flight: int = 0
    #: waiting in the queue for a free worker thread.
    queued: bool = False
    #: dropped by ``forget``: a running sync chain stops.
    forgotten: bool = False
    #: its next sync waits until the tasks the last one woke have run (see _settle).
    deferred: bool = False

    @property
    def pending_start(self) -> bool:
        """A sync is running, queued or deferred: its end or start sees to new appends."""
        return self.in_flight > 0 or self.queued or self.deferred


@attrs.define(eq=False)
class _Job:
    """One worker thread's sync of one or more logs."""

    entries: list[_Entry]
    #: appends each log had noted when the job started, for the first sync (statistics).
    covered: list[int]
    #: set once the results are processed (flush_all waits on it).
    done: trio.Event | None = None


#: Worker threads syncing at once. fdatasync releases the GIL and the filesystem
#: merges concurrent syncs into one journal commit, so 50 partitions made dirty
#: by one burst cost about one fsync's time, not 50.
FLUSH_THREADS = 8


def _trio_clock_ms() -> int:
    return int(trio.current_time() * 1000)


def flush_log(log: FlushableLog) -> int:
    """The default way to make a log durable (``Flusher.sync``)."""
    return log.flush()


def _flush_all(
    logs: Sequence[FlushableLog],
    sync: Callable[[FlushableLog], int],
    durations: list[float] | None = None,
) -> list[int | BaseException]:
    # Runs in a worker thread. One failing log must not hide the others' results.
    # ``durations`` gets each sync's seconds, timed here so no event-loop delay counts.
    results: list[int | BaseException] = []
    for log in logs:
        started = time.perf_counter()
        try:
            results.append(sync(log))
        except Exception as exc:
            results.append(exc)
        if durations is not None:
            durations.append(time.perf_counter() - started)
    return results


class Flusher:
    """Run with ``await nursery.start(flusher.run)``; one per broker.

    Syncs start only while ``run`` runs (it also handles flush.ms deadlines and,
    when cancelled, waits for the syncs in flight); ``flush_all`` works anyway.
    """

    def __init__(
        self,
        policy: FlushPolicy | None = None,
        *,
        clock_ms: Callable[[], int] = _trio_clock_ms,
        threads: int = FLUSH_THREADS,
    ) -> None:
        self.policy = policy or FlushPolicy()
        self.threads = max(1, threads)
        self._clock_ms = clock_ms
        self._entries: dict[int, _Entry] = {}
        #: wakes ``run`` to recompute the flush.ms deadline.
        self._wakeup = trio.Event()
        self._stopped: StorageError | None = None
        self._token: trio.lowlevel.TrioToken | None = None  # set while run() runs
        #: due logs waiting for a free worker thread, oldest first.
        self._queue: collections.deque[_Entry] = collections.deque()
        self._busy = 0  # jobs in worker threads
        #: trio time run() sleeps until: the earliest flush.ms deadline it knows of.
        self._wake_at = math.inf
        #: logs whose next sync run() starts after one scheduling round (see _settle).
        self._deferred: list[_Entry] = []
        self._idle = trio.Event()  # set whenever _busy == 0
        self._idle.set()
        #: How a log is made durable, in the worker thread. Tests replace it to
        #: inject slow or failing fsyncs (tests/reliability/test_fsync_faults.py).
        self.sync: Callable[[FlushableLog], int] = flush_log
        #: id(log) -> trio time of the next recovery probe of an offline log.
        self._next_probe: dict[int, float] = {}
        #: Seconds of each successful log sync (/metrics trio_broker_fsync_duration_seconds).
        self.fsync_durations = LatencyHistogram(FSYNC_BOUNDS)

    def _entry(self, log: FlushableLog) -> _Entry:
        entry = self._entries.get(id(log))
        if entry is None:
            entry = _Entry(log, DurabilityTracker(self.policy))
            self._entries[id(log)] = entry
        return entry

    def mark_dirty(self, log: FlushableLog, messages: int = 1) -> None:
        """Note an append to ``log`` (``messages`` records, for flush.messages)."""
        entry = self._entry(log)
        entry.tracker.note_append(self._clock_ms(), messages)
        if not entry.pending_start:
            self._schedule(entry)

    async def wait_durable(self, log: FlushableLog, offset: int) -> None:
        """Return once ``log.durable_end_offset > offset``; StorageError if a flush failed."""
        if log.durable_end_offset > offset:
            await trio.lowlevel.checkpoint()
            return
        if offset >= log.log_end_offset:
            raise ValueError(f"offset {offset} has not been appended (end {log.log_end_offset})")
        entry = self._entry(log)
        self._raise_if_failed(entry)
        event = trio.Event()
        entry.tracker.add_waiter(offset, event)
        if not entry.pending_start:
            self._kick(entry)
        try:
            await event.wait()
        except BaseException:
            entry.tracker.discard_waiter(event)
            raise
        if log.durable_end_offset > offset:
            return
        self._raise_if_failed(entry)
        raise StorageError("flusher released a waiter that is not durable")  # pragma: no cover

    def _raise_if_failed(self, entry: _Entry) -> None:
        if entry.error is not None:
            raise entry.error
        if entry.log.offline:
            raise StorageError("log is offline after a disk error")
        if self._stopped is not None:
            raise self._stopped

    def forget(self, log: FlushableLog) -> None:
        """Stop tracking ``log`` (closed or deleted); its waiters get StorageError."""
        entry = self._entries.pop(id(log), None)
        if entry is not None:
            entry.error = entry.error or StorageError("log was closed")
            entry.forgotten = True
            if entry.queued:
                self._queue.remove(entry)
                entry.queued = False
            for event in entry.tracker.fail():
                event.set()

    def recover_soon(self, log: Any, nursery: trio.Nursery) -> None:
        """Try to bring an offline log back (disk space returned), at most once per back-off.

        In the background: the produce that noticed still gets its storage error.
        """
        if not log.offline or getattr(log, "reload", None) is None:
            return
        now = trio.current_time()
        if now < self._next_probe.get(id(log), -math.inf):
            return
        self._next_probe[id(log)] = now + RECOVERY_BACKOFF_S
        nursery.start_soon(self._recover, log)

    async def _recover(self, log: Any) -> None:
        def probe() -> Any:
            fresh = log.reload()
            try:
                self.sync(fresh)  # the same durability path as every flush
            except BaseException:
                fresh.abort()
                raise
            return fresh

        try:
            fresh = await trio.to_thread.run_sync(probe)
        except (OSError, StorageError) as exc:
            _logger.info("%s still offline: %s", getattr(log, "directory", log), exc)
            return
        if not log.offline or log.closed:  # recovered or deleted meanwhile
            fresh.abort()
            return
        log.adopt(fresh)
        # A fresh tracker: the failed one released its waiters and keeps its error.
        self._entries.pop(id(log), None)
        self._next_probe.pop(id(log), None)
        _logger.warning(
            "%s is back online at offset %d", getattr(log, "directory", log), log.log_end_offset
        )

    def statistics(self, log: FlushableLog | None = None) -> FlushStatistics:
        if log is not None:
            return self._entry(log).tracker.statistics()
        return FlushStatistics.combine([e.tracker.statistics() for e in self._entries.values()])

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, entry: _Entry) -> None:
        """Start ``entry``'s sync if due; else make run() wake by its flush.ms deadline."""
        if self._kick(entry) or entry.error is not None or self._token is None:
            return
        deadline = entry.tracker.deadline_ms()
        if deadline is not None:
            at = trio.current_time() + max(0, deadline - self._clock_ms()) / 1000
            if at < self._wake_at:  # only an earlier deadline needs run() to wake
                self._wake_at = at
                self._wakeup.set()

    def _kick(self, entry: _Entry) -> bool:
        """Queue ``entry``'s next sync if it is due and idle; True if queued or started."""
        if (
            self._token is None
            or entry.pending_start
            or entry.error is not None
            or self._entries.get(id(entry.log)) is not entry  # forgotten or replaced
            or not entry.tracker.needs_flush(self._clock_ms())
        ):
            return False
        entry.queued = True
        self._queue.append(entry)
        self._pump()
        return True

    def _pump(self) -> None:
        """Start queued syncs while worker threads are free."""
        queue = self._queue
        while queue and self._busy < self.threads:
            # A share of the queue per thread, so a burst of dirty logs still
            # spreads over every thread that frees up.
            take = -(-len(queue) // self.threads)
            part = [queue.popleft() for _ in range(take)]
            for entry in part:
                entry.queued = False
            self._start(part)

    def _start(self, entries: list[_Entry], done: trio.Event | None = None) -> None:
        """Sync ``entries`` in a worker thread; results come back through :meth:`_settle`.

        A job of one log keeps syncing it while new appends arrive during each
        sync (see :meth:`_chain`), so the disk never waits for a round trip to
        the event loop; each sync's result is still delivered as soon as it is in.
        """
        token = self._token or trio.lowlevel.current_trio_token()
        job = _Job(entries, [e.tracker.begin_flush() for e in entries], done)
        for entry in entries:
            entry.in_flight += 1
        if self._busy == 0:
            self._idle = trio.Event()
        self._busy += 1
        logs = [e.log for e in entries]

        tracker = entries[0].tracker
        noted_at_start = tracker.noted[0]

        def work() -> None:  # in the worker thread
            noted: tuple[int, int] | None = None  # the first sync was counted above
            covered, before = job.covered[0], noted_at_start
            while True:
                durations: list[float] = []
                results = _flush_all(logs, self.sync, durations)
                more = len(entries) == 1 and self._chain(entries[0], results[0], covered, before)
                token.run_sync_soon(self._settle, job, noted, results, durations, not more)
                if not more:
                    return
                # Read before the sync, so it counts no append the sync may miss.
                noted = tracker.noted
                covered, before = noted[0] - before, noted[0]

        def deliver(result: outcome.Outcome[None]) -> None:
            if isinstance(result, outcome.Error) and not isinstance(
                result.error,
                trio.RunFinishedError,  # the loop is gone, and its waiters
            ):
                failed: list[int | BaseException] = [result.error] * len(entries)
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._settle, job, None, failed, [0.0] * len(entries), True)

        trio.lowlevel.start_thread_soon(work, deliver)

    def _chain(self, entry: _Entry, result: int | BaseException, covered: int, before: int) -> bool:
        """In the worker thread: sync ``entry`` again right away?

        Yes when at least as many appends landed during the sync just done as it
        covered (``covered`` appends, ``before`` noted when it began) and someone
        wants them synced (an acks=all waiter beyond it, or no flush.ms /
        flush.messages) - unless other logs wait for a thread or the flusher
        stops. Fewer: the loop starts the next sync once the writers this one
        releases have appended too (see :meth:`_settle`), because an fsync costs
        nearly as much for 64 KiB as for 1 MiB. Only reads attributes, which is
        safe from this thread.
        """
        policy = self.policy
        return (
            isinstance(result, int)
            and entry.tracker.noted[0] - before >= max(1, covered)
            and self._token is not None
            and not self._queue
            and not entry.forgotten
            and entry.log.log_end_offset > result
            and (
                entry.tracker.max_waited_offset >= result
                or (policy.flush_messages is None and policy.flush_ms is None)
            )
        )

    def _settle(
        self,
        job: _Job,
        noted: tuple[int, int] | None,
        results: list[int | BaseException],
        durations: list[float],
        last: bool,
    ) -> None:
        """On the loop (a run_sync_soon callback): one sync of ``job`` is done.

        ``noted``: what the worker read before a chained sync (None: the job's
        first sync, counted when it started). ``last``: the job's thread is done.
        """
        # An exception here would crash the whole run: fail the waiters instead.
        released = 0
        try:
            released = self._release(job, noted, results, durations)
        except Exception:  # pragma: no cover - a bug
            _logger.exception("flusher bookkeeping failed")
            for entry in job.entries:
                entry.error = entry.error or StorageError("flusher bookkeeping failed")
                for event in entry.tracker.fail():
                    event.set()
        if not last:
            return
        for entry in job.entries:
            entry.in_flight -= 1
        self._busy -= 1
        if self._busy == 0:
            self._idle.set()
        if job.done is not None:
            job.done.set()
        if self._token is None:
            return
        if released:
            # The tasks just woken may append at once (a writer that waits for each
            # ack): run() starts the next sync after they had their turn, so it covers
            # their appends too instead of leaving them to one more fsync.
            for entry in job.entries:
                entry.deferred = True
            self._deferred.extend(job.entries)
            self._wakeup.set()
            return
        for entry in job.entries:
            self._schedule(entry)  # appends made during the last sync: next sync or timer
        self._pump()

    def _release(
        self,
        job: _Job,
        noted: tuple[int, int] | None,
        results: list[int | BaseException],
        durations: list[float],
    ) -> int:
        """Account for the syncs' results and wake their waiters; how many woke."""
        released: list[trio.Event] = []
        for i, (entry, result, seconds) in enumerate(
            zip(job.entries, results, durations, strict=True)
        ):
            covered = job.covered[i] if noted is None else entry.tracker.flush_started(noted)
            if isinstance(result, BaseException):
                take_offline = getattr(entry.log, "take_offline", None)
                if take_offline is not None:
                    take_offline()  # after a failed fsync nothing unsynced can be trusted
                entry.error = entry.error or (
                    result
                    if isinstance(result, StorageError)
                    else StorageError(f"flush failed: {result!r}")
                )
                released += entry.tracker.fail()
            else:
                released += entry.tracker.end_flush(result, covered)
                self.fsync_durations.observe(0, seconds)
        for event in released:
            event.set()
        return len(released)

    # ------------------------------------------------------------------ the task

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Enable syncing; sleep until the next flush.ms deadline; on exit, drain."""
        self._stopped = None
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        scan = True  # look at every log: at start and when a deadline is reached
        try:
            while True:
                # A fresh event before looking for work, so a mark_dirty that
                # lands after the look still wakes the wait below.
                self._wakeup = trio.Event()
                if self._deferred:
                    # Woken with the tasks a sync released: let them run first.
                    await trio.lowlevel.checkpoint()
                    deferred, self._deferred = self._deferred, []
                    for entry in deferred:
                        entry.deferred = False
                    for entry in deferred:
                        self._schedule(entry)
                if scan or trio.current_time() >= self._wake_at:
                    scan = False
                    self._wake_at = self._scan()
                with trio.move_on_at(self._wake_at):
                    await self._wakeup.wait()
        finally:
            self._token = None  # no new syncs
            self._wake_at = math.inf
            self._stopped = StorageError("flusher stopped")
            for entry in self._queue:
                entry.queued = False
            self._queue.clear()
            for entry in self._deferred:
                entry.deferred = False
            self._deferred.clear()
            # The threads can't be interrupted anyway, and the waiters of a
            # sync that ran must hear about it.
            with trio.CancelScope(shield=True):
                await self._idle.wait()
            for entry in self._entries.values():
                for event in entry.tracker.fail():
                    event.set()

    def _scan(self) -> float:
        """Start every due log's sync; the trio time of the next flush.ms deadline.

        O(logs): run only at start and when a deadline passes, not per sync.
        """
        for entry in list(self._entries.values()):
            self._kick(entry)
        deadlines = [
            d
            for e in self._entries.values()
            if not (e.pending_start or e.error) and (d := e.tracker.deadline_ms()) is not None
        ]
        if not deadlines:
            return math.inf
        return trio.current_time() + max(0, min(deadlines) - self._clock_ms()) / 1000

    async def flush_all(self) -> None:
        """Sync every dirty log now (shutdown, tests), independent of the run loop."""
        due = [e for e in self._entries.values() if e.tracker.dirty or e.tracker.waiters]
        if not due:
            return
        parts = [due[i :: self.threads] for i in range(min(self.threads, len(due)))]
        events = [trio.Event() for _ in parts]
        for part, done in zip(parts, events, strict=True):
            self._start(part, done)
        with trio.CancelScope(shield=True):
            for done in events:
                await done.wait()
