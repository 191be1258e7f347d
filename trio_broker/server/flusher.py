"""The flusher task: fsyncs dirty partition logs in a worker thread (group commit).

Produce handlers append on the event loop, call :meth:`Flusher.mark_dirty`, and
for acks=all ``await flusher.wait_durable(log, last_offset)``. The flusher loop
syncs every log that is due in one worker-thread call (``sync_thread.py``:
it reports back through a pipe, faster than ``trio.to_thread``) and then wakes
the waiters it satisfied. There is no artificial delay: appends that
arrive while an fsync runs are covered together by the next one, so the number
of appends per fsync grows with load by itself.

Logs are dealt to :data:`FLUSH_THREADS` lanes; the flusher starts a sync of a lane's
due logs in a worker thread whenever that lane is free, without waiting for the other
lanes' syncs: a slow fsync holds back the logs of its lane only, not every partition's
next sync (with one round for all, each round lasted as long as its slowest thread's
syncs; issue 33's W5, 50 partitions).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

from trio_broker.server.histogram import FSYNC_BOUNDS, LatencyHistogram
from trio_broker.server.sync_thread import InlineCalls, PipeReportingThreads
from trio_broker.storage.errors import StorageError
from trio_broker.storage.group_commit import DurabilityTracker, FlushPolicy, FlushStatistics
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_dir_state import LogDirState
from trio_broker.storage.log_reload import probe_disk

_logger = logging.getLogger("trio_broker.flusher")

#: An offline log dir is probed again at most this often (on a request, see recover_soon).
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


class DurableWatch:
    """One write's wait for its covering fsync without a task (:meth:`Flusher.watch_durable`):
    the flusher calls ``wake`` when it releases the write (synced, or failed), and
    :meth:`check` says which."""

    __slots__ = ("_entry", "_flusher", "_log", "_offset", "_wake", "released")

    def __init__(
        self, flusher: Flusher, entry: _Entry | None, log: FlushableLog, offset: int,
        wake: Callable[[], None],
    ) -> None:  # fmt: skip
        self._flusher = flusher
        self._entry = entry
        self._log = log
        self._offset = offset
        self._wake = wake
        #: No longer among the tracker's waiters (released, or never added).
        self.released = entry is None

    def set(self) -> None:
        """The tracker released it (the same call as a waiting task's event)."""
        self.released = True
        self._wake()

    def check(self) -> bool:
        """True once durable; False while waiting; StorageError if its flush failed."""
        if self._log.durable_end_offset > self._offset:
            return True
        if self._entry is None:
            return True  # durable when watched
        if not self.released:
            return False
        self._flusher._raise_if_failed(self._entry)
        raise StorageError("flusher released a waiter that is not durable")  # pragma: no cover

    def cancel(self) -> None:
        """Stop waiting (the answer went, or timed out)."""
        # Let go of the callback: it holds the waiting answer, which holds this watch
        # (a reference cycle would keep the request's buffers until a GC pass).
        self._wake = _no_wake
        if not self.released and self._entry is not None:
            self.released = True
            self._entry.tracker.discard_waiter(self)


def _no_wake() -> None:
    pass


@attrs.define(eq=False)
class _Entry:
    log: FlushableLog
    tracker: DurabilityTracker[trio.Event | DurableWatch]
    #: The lane (Flusher._lane_busy) that syncs this log; fixed for the log's life.
    lane: int = 0
    #: set when a flush of this log failed; the log is offline from then on.
    error: StorageError | None = None


#: Scheduler passes a woken flusher lets other tasks have before it starts a sync.
#: A handler takes a connection's queued requests one per pass (its queue's receive
#: yields), so the sync started right after the first append would leave the other
#: four of a 5-in-flight producer to the next one; yielding while each pass brings
#: more appends lets one sync cover them. Bounded in passes and in time (a pass of a
#: busy loop may hold many connections' work), so a loop that never idles still syncs.
LET_RUNNABLE_PASSES = 8
LET_RUNNABLE_S = 0.0005

#: Lanes: logs synced at once, each lane's in its own worker thread. fdatasync releases
#: the GIL and the filesystem merges concurrent syncs into one journal commit, so
#: 50 partitions made dirty by one burst cost about one fsync's time, not 50.
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
    """Run with ``await nursery.start(flusher.run)``; one per broker."""

    def __init__(
        self,
        policy: FlushPolicy | None = None,
        *,
        clock_ms: Callable[[], int] = _trio_clock_ms,
        threads: int = FLUSH_THREADS,
        inline: bool = False,
    ) -> None:
        """``inline``: syncs run on the event loop, not in worker threads (the simulator
        and mock-clock tests: what Trio does not schedule must not decide when a sync ends)."""
        self.policy = policy or FlushPolicy()
        self.threads = max(1, threads)
        self._clock_ms = clock_ms
        self._entries: dict[int, _Entry] = {}
        self._wakeup = trio.Event()
        #: Per lane: a sync of its logs is running (in a worker thread).
        self._lane_busy = [False] * self.threads
        #: Per lane: the logs its worker task is to sync next, and the event that wakes
        #: it (a long-lived task per lane: a task spawned per sync cost CPU per fsync).
        self._lane_work: list[list[_Entry]] = [[] for _ in range(self.threads)]
        self._lane_wakeups = [trio.Event() for _ in range(self.threads)]
        #: The lane the next new log joins (round-robin: partitions spread evenly).
        self._next_lane = 0
        #: mark_dirty calls so far: whether a yield let more appends in.
        self._marks = 0
        self._stopped: StorageError | None = None
        #: How a log is made durable, in the worker thread. Tests replace it to
        #: inject slow or failing fsyncs (tests/reliability/test_fsync_faults.py).
        self.sync: Callable[[FlushableLog], int] = flush_log
        #: id(LogDirState) -> trio time of the next recovery probe of an offline log dir.
        self._next_probe: dict[int, float] = {}
        #: Where recovery probes run (the broker's root nursery; set by Broker.run).
        self.background: trio.Nursery | None = None
        #: Seconds of each successful log sync (/metrics trio_broker_fsync_duration_seconds).
        self.fsync_durations = LatencyHistogram(FSYNC_BOUNDS)
        self._threads: PipeReportingThreads | InlineCalls = (
            InlineCalls() if inline else PipeReportingThreads()
        )
        #: Told of each log a sync made durable further (appends covered): a partition's
        #: high watermark may be its durable end (the broker's replication,
        #: ``log_synced``, wakes its long polls). None: nobody is told.
        self.on_synced: Callable[[FlushableLog], None] | None = None

    def _entry(self, log: FlushableLog) -> _Entry:
        entry = self._entries.get(id(log))
        if entry is None:
            entry = _Entry(log, DurabilityTracker(self.policy), self._next_lane)
            self._next_lane = (self._next_lane + 1) % self.threads
            self._entries[id(log)] = entry
        return entry

    def mark_dirty(self, log: FlushableLog, messages: int = 1) -> None:
        """Note an append to ``log`` (``messages`` records, for flush.messages)."""
        self._entry(log).tracker.note_append(self._clock_ms(), messages)
        self._marks += 1
        self._wakeup.set()

    async def _let_appends_in(self) -> None:
        """Yield while scheduler passes bring more appends (LET_RUNNABLE_PASSES at most).

        A pass runs its tasks in random order, so one pass may show nothing of a handler
        that runs after the flusher in it; what the marks did over the last two passes
        decides (a whole pass lies between those two looks)."""
        # The loop's clock: a simulation's mock clock stands still, so there only the
        # pass count bounds it and the run stays deterministic.
        until = trio.current_time() + LET_RUNNABLE_S
        two_back, one_back = -1, self._marks
        for _ in range(LET_RUNNABLE_PASSES):
            await trio.lowlevel.cancel_shielded_checkpoint()
            marks = self._marks
            if marks == two_back or trio.current_time() >= until:
                return
            two_back, one_back = one_back, marks

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
        self._wakeup.set()
        try:
            await event.wait()
        except BaseException:
            entry.tracker.discard_waiter(event)
            raise
        if log.durable_end_offset > offset:
            return
        self._raise_if_failed(entry)
        raise StorageError("flusher released a waiter that is not durable")  # pragma: no cover

    def watch_durable(
        self, log: FlushableLog, offset: int, wake: Callable[[], None]
    ) -> DurableWatch:
        """:meth:`wait_durable` without a task: ``wake()`` once the flusher released the
        write (made it durable, or failed); then ``check()`` answers (or raises)."""
        if log.durable_end_offset > offset:
            return DurableWatch(self, None, log, offset, wake)
        if offset >= log.log_end_offset:
            raise ValueError(f"offset {offset} has not been appended (end {log.log_end_offset})")
        entry = self._entry(log)
        watch = DurableWatch(self, entry, log, offset, wake)
        try:
            self._raise_if_failed(entry)
        except StorageError:
            watch.released = True  # check() raises it
            return watch
        entry.tracker.add_waiter(offset, watch)
        self._wakeup.set()
        return watch

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
            for event in entry.tracker.fail():
                event.set()

    def recover_soon(self, log: FlushableLog) -> None:
        """Try to bring an offline log's dir back (disk space returned), at most once per
        back-off per dir.

        In the background: the produce that noticed still gets its storage error. Only a
        disk log goes offline (a memory log's flush cannot fail). The dir comes back
        whole or not at all (storage/log_dir_state.py): every log in it is reloaded
        through recovery and synced, and only if all of them are is any adopted.
        """
        if not log.offline or not isinstance(log, PartitionLog):
            return
        state = log.dir_state
        now = trio.current_time()
        if now < self._next_probe.get(id(state), -math.inf):
            return
        self._next_probe[id(state)] = now + RECOVERY_BACKOFF_S
        assert self.background is not None, "recover_soon before the broker runs"
        self.background.start_soon(self._recover, state)

    async def _recover(self, state: LogDirState) -> None:
        logs = [m for m in state.members.values() if isinstance(m, PartitionLog)]

        def probe() -> list[PartitionLog]:
            fresh: list[PartitionLog] = []
            if not logs:  # its logs closed meanwhile: the dir itself must take a write
                probe_disk(state.path)
            try:
                for log in logs:
                    fresh.append(log.reload())
                    self.sync(fresh[-1])  # the same durability path as every flush
            except BaseException:
                for done in fresh:
                    done.abort()
                raise
            return fresh

        try:
            fresh = await trio.to_thread.run_sync(probe)
        except (OSError, StorageError) as exc:
            _logger.info("log dir %s still offline: %s", state.path, exc)
            return
        if not state.offline:  # recovered meanwhile
            for done in fresh:
                done.abort()
            return
        for log, done in zip(logs, fresh, strict=True):
            if log.closed:  # deleted or moved meanwhile: the reload is not needed
                done.abort()
            else:
                log.adopt(done)
            # A fresh tracker: the failed one released its waiters and keeps its error.
            self._entries.pop(id(log), None)
        state.restore()
        self._next_probe.pop(id(state), None)
        _logger.warning("log dir %s is back online (%d partition logs)", state.path, len(logs))

    def statistics(self, log: FlushableLog | None = None) -> FlushStatistics:
        if log is not None:
            return self._entry(log).tracker.statistics()
        return FlushStatistics.combine([e.tracker.statistics() for e in self._entries.values()])

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._stopped = None
        self._threads.reopen()
        # A run cancelled earlier may have left work handed to a lane that never took it
        # (its appends are still pending in their trackers: they are dispatched again).
        self._lane_busy = [False] * self.threads
        self._lane_work = [[] for _ in range(self.threads)]
        self._lane_wakeups = [trio.Event() for _ in range(self.threads)]
        try:
            async with trio.open_nursery() as lanes:
                for lane in range(self.threads):
                    lanes.start_soon(self._lane_worker, lane, name=f"flusher-lane-{lane}")
                task_status.started()
                await self._dispatch()
                lanes.cancel_scope.cancel()
        finally:
            self._stopped = StorageError("flusher stopped")
            self._threads.close()
            for entry in self._entries.values():
                for event in entry.tracker.fail():
                    event.set()

    async def _dispatch(self) -> None:
        """Start a sync of each free lane's due logs, whenever there are any."""
        while True:
            # A fresh event before looking for work, so a mark_dirty (or a lane
            # finishing) that lands after the look still wakes the wait below.
            self._wakeup = trio.Event()
            now = self._clock_ms()
            if self._due(now):
                await self._let_appends_in()
                # Again: more appends came in, a log may have been forgotten.
                due = self._due(now)
                if not due:
                    continue
                by_lane: dict[int, list[_Entry]] = {}
                for entry in due:
                    by_lane.setdefault(entry.lane, []).append(entry)
                for lane, part in by_lane.items():
                    self._lane_busy[lane] = True
                    self._lane_work[lane] = part
                    self._lane_wakeups[lane].set()
                continue
            # A busy lane wakes this loop when its sync ends: only free lanes' deadlines.
            busy = self._lane_busy
            deadlines = [
                d
                for e in self._entries.values()
                if not busy[e.lane] and (d := e.tracker.deadline_ms()) is not None
            ]
            if not deadlines:  # no flush.ms pending (the default): no timeout's cancel scope
                await self._wakeup.wait()
                continue
            with trio.move_on_at(trio.current_time() + max(0, min(deadlines) - now) / 1000):
                await self._wakeup.wait()

    def _due(self, now: int) -> list[_Entry]:
        """Logs that need a sync, of lanes with no sync running."""
        busy = self._lane_busy
        return [
            e for e in self._entries.values() if not busy[e.lane] and e.tracker.needs_flush(now)
        ]

    async def _lane_worker(self, lane: int) -> None:
        """Sync what the dispatcher hands this lane, one worker-thread call at a time."""
        while True:
            await self._lane_wakeups[lane].wait()
            self._lane_wakeups[lane] = trio.Event()
            due, self._lane_work[lane] = self._lane_work[lane], []
            try:
                # Not cancellable once begun (its one wait, the worker call's, is
                # shielded): the waiters of a flush that ran must hear about it.
                await self._flush(due)
            finally:
                self._lane_busy[lane] = False
                # The dispatcher looks again only if the lane has work it held back
                # (appends or waiters that came during the sync, a flush.ms deadline to
                # time): a sync that covered everything, as a pipelined producer's whole
                # burst, wakes nobody (it was one task step more per group commit).
                if self._lane_has_work(lane):
                    self._wakeup.set()

    def _lane_has_work(self, lane: int) -> bool:
        return any(
            e.lane == lane and (e.tracker.dirty or e.tracker.waiters)
            for e in self._entries.values()
        )

    async def flush_all(self) -> None:
        """Sync every dirty log now (shutdown, tests), independent of the lanes."""
        due = [e for e in self._entries.values() if e.tracker.dirty or e.tracker.waiters]
        if due:
            with trio.CancelScope(shield=True):
                await self._flush_parallel(due)

    async def _flush_parallel(self, due: list[_Entry]) -> None:
        """Split ``due`` over up to ``threads`` worker threads; each part wakes its own waiters."""
        if len(due) == 1 or self.threads == 1:
            await self._flush(due)
            return
        parts = [due[i :: self.threads] for i in range(min(self.threads, len(due)))]
        async with trio.open_nursery() as nursery:
            for part in parts:
                nursery.start_soon(self._flush, part)

    async def _flush(self, due: list[_Entry]) -> None:
        # Its only wait is the worker call's, which cancellation does not interrupt
        # (``run_sync`` of either kind of ``_threads``): appends counted as covered by a
        # flush are always settled by it, synced or failed.
        covered = [e.tracker.begin_flush() for e in due]
        durations: list[float] = []
        results = await self._threads.run_sync(
            _flush_all, [e.log for e in due], self.sync, durations
        )
        on_synced = self.on_synced
        for entry, count, result, seconds in zip(due, covered, results, durations, strict=True):
            if isinstance(result, BaseException):
                if isinstance(entry.log, PartitionLog):
                    # After a failed fsync nothing unsynced can be trusted: the log,
                    # and with it its whole log dir, goes offline.
                    entry.log.take_offline(f"flush failed: {result}")
                error = (
                    result
                    if isinstance(result, StorageError)
                    else StorageError(f"flush failed: {result!r}")
                )
                entry.error = error
                released = entry.tracker.fail()
            else:
                released = entry.tracker.end_flush(result, count)
                self.fsync_durations.observe(0, seconds)
                if on_synced is not None and count:
                    on_synced(entry.log)
            for event in released:
                event.set()
