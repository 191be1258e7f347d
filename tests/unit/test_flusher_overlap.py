"""Flusher: syncs overlap the appends (started from mark_dirty, chained in the worker).

A ScriptedLog's flush records where it starts and then blocks until the test
hands it a verdict, so each test decides exactly which appends land during
which sync. Blocking waits on the loop thread are deliberate where a test shows
that a sync starts without the event loop taking a turn.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import pytest
import trio
import trio.testing

from trio_broker.server.flusher import Flusher
from trio_broker.storage.errors import StorageError
from trio_broker.storage.group_commit import FlushPolicy

TIMEOUT = 10  # seconds any single blocking wait may take before the test fails


class ScriptedLog:
    """A log whose every flush reports its start, then waits for "ok" or "fail"."""

    def __init__(self, name: str = "log", starts: queue.Queue[tuple[str, int]] | None = None):
        self.name = name
        self.log_end_offset = 0
        self.durable_end_offset = 0
        self.offline = False
        #: (name, log end read at the start) of each flush, in start order.
        self.starts: queue.Queue[tuple[str, int]] = starts or queue.Queue()
        self.verdicts: queue.Queue[str] = queue.Queue()

    def append(self) -> int:
        self.log_end_offset += 1
        return self.log_end_offset - 1

    def take_offline(self) -> None:
        self.offline = True

    def flush(self) -> int:
        end = self.log_end_offset  # like PartitionLog: snapshot the end, then sync
        self.starts.put((self.name, end))
        if self.verdicts.get(timeout=TIMEOUT) == "fail":
            self.offline = True
            raise StorageError(f"{self.name}: injected EIO")
        self.durable_end_offset = max(self.durable_end_offset, end)
        return self.durable_end_offset

    def next_start(self) -> int:
        """Block until the next flush starts; the log end it covers.

        Blocks the event loop too: only for a flush that needs no loop turn to start.
        """
        name, end = self.starts.get(timeout=TIMEOUT)
        assert name == self.name
        return end


async def next_start(starts: queue.Queue[tuple[str, int]]) -> tuple[str, int]:
    """The next flush start, letting the event loop run meanwhile."""
    return await trio.to_thread.run_sync(lambda: starts.get(timeout=TIMEOUT))


class Waiters:
    """acks=all waiters as tasks; ``outcomes[offset]`` is "ok" or the error.

    Offsets of a log not named "log" get its name as a prefix.
    """

    def __init__(self, flusher: Flusher, nursery: trio.Nursery) -> None:
        self.flusher = flusher
        self.nursery = nursery
        self.outcomes: dict[int | str, str] = {}
        self.changed = trio.Event()

    def append(self, log: ScriptedLog) -> int:
        offset = log.append()
        self.flusher.mark_dirty(log)
        self.nursery.start_soon(self._wait, log, offset)
        return offset

    async def _wait(self, log: ScriptedLog, offset: int) -> None:
        key: int | str = offset if log.name == "log" else f"{log.name}:{offset}"
        try:
            await self.flusher.wait_durable(log, offset)
            self.outcomes[key] = "ok"
        except StorageError as exc:
            self.outcomes[key] = str(exc)
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, done: Callable[[], bool]) -> None:
        with trio.fail_after(TIMEOUT):
            while not done():
                await self.changed.wait()


async def test_the_sync_starts_from_mark_dirty_and_chains_in_the_worker() -> None:
    log = ScriptedLog()
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)
        # No checkpoint since mark_dirty: the loop never took a turn, yet the sync runs.
        assert log.next_start() == 1
        waiters.append(log)  # lands during the first sync
        waiters.append(log)
        log.verdicts.put("ok")
        # Still no checkpoint: the worker itself starts the sync of offsets 1-2.
        assert log.next_start() == 3
        await waiters.until(lambda: 0 in waiters.outcomes)
        # The first sync released offset 0 only: 1 and 2 were written after it began.
        assert waiters.outcomes == {0: "ok"} and log.durable_end_offset == 1
        log.verdicts.put("ok")
        await waiters.until(lambda: len(waiters.outcomes) == 3)
        assert waiters.outcomes == {0: "ok", 1: "ok", 2: "ok"}
        stats = flusher.statistics(log)
        assert (stats.fsyncs, stats.appends, stats.appends_per_fsync) == (2, 3, {1: 1, 2: 1})
        nursery.cancel_scope.cancel()
    assert log.starts.empty()


async def test_a_failed_sync_fails_its_waiters_and_later_ones_not_earlier_ones() -> None:
    log = ScriptedLog()
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)
        assert log.next_start() == 1
        waiters.append(log)  # covered by the second sync, which fails
        log.verdicts.put("ok")
        assert log.next_start() == 2
        await waiters.until(lambda: 0 in waiters.outcomes)
        waiters.append(log)  # written during the failing sync: never durable either
        log.verdicts.put("fail")
        await waiters.until(lambda: len(waiters.outcomes) == 3)
        assert waiters.outcomes[0] == "ok"
        assert "injected EIO" in waiters.outcomes[1]
        # Its waiter saw the failure, or (when its task ran later) the offline log.
        assert waiters.outcomes[2] in ("log: injected EIO", "log is offline after a disk error")
        assert log.offline and log.durable_end_offset == 1
        stats = flusher.statistics(log)
        assert (stats.fsyncs, stats.failures, stats.waiters) == (1, 1, 0)
        with pytest.raises(StorageError):
            await flusher.wait_durable(log, 2)
        nursery.cancel_scope.cancel()
    assert log.starts.empty()  # no sync of an offline log


async def test_stopping_waits_for_the_running_sync_and_starts_no_other() -> None:
    log = ScriptedLog()
    flusher = Flusher()
    flusher_scope = trio.CancelScope()
    stopped = trio.Event()

    async def run_flusher(task_status: trio.TaskStatus[None]) -> None:
        with flusher_scope:
            await flusher.run(task_status=task_status)
        stopped.set()

    async with trio.open_nursery() as nursery:
        waiters = Waiters(flusher, nursery)
        await nursery.start(run_flusher)
        waiters.append(log)
        assert log.next_start() == 1
        waiters.append(log)
        await trio.testing.wait_all_tasks_blocked()
        flusher_scope.cancel()  # the broker shuts down mid-sync
        await trio.testing.wait_all_tasks_blocked()
        assert waiters.outcomes == {} and not stopped.is_set()  # run() waits for the sync
        log.verdicts.put("ok")
        with trio.fail_after(TIMEOUT):
            await stopped.wait()
        # The sync's waiter was released, the other failed: nothing syncs it any more.
        await waiters.until(lambda: len(waiters.outcomes) == 2)
        assert waiters.outcomes == {0: "ok", 1: "flusher stopped"}
    assert log.starts.empty() and log.durable_end_offset == 1


async def test_the_chain_yields_the_thread_to_a_log_waiting_for_one() -> None:
    starts: queue.Queue[tuple[str, int]] = queue.Queue()
    hot, cold = ScriptedLog("hot", starts), ScriptedLog("cold", starts)
    flusher = Flusher(threads=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(hot)
        assert starts.get(timeout=TIMEOUT) == ("hot", 1)
        waiters.append(cold)  # queued: the only thread is busy
        waiters.append(hot)  # more hot data during its sync
        hot.verdicts.put("ok")
        # The hot log does not keep the thread: the cold one is next.
        assert await next_start(starts) == ("cold", 1)
        cold.verdicts.put("ok")
        assert await next_start(starts) == ("hot", 2)
        hot.verdicts.put("ok")
        await waiters.until(lambda: len(waiters.outcomes) == 3)
        assert waiters.outcomes == {"hot:0": "ok", "hot:1": "ok", "cold:0": "ok"}
        nursery.cancel_scope.cancel()
    assert starts.empty()


async def test_acks1_appends_during_a_sync_still_wait_for_flush_ms() -> None:
    log = ScriptedLog()
    flusher = Flusher(FlushPolicy(flush_ms=60_000))
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)  # acks=all: synced once its waiter is there
        assert await next_start(log.starts) == ("log", 1)
        log.append()  # acks=1 during the sync: nobody waits, flush.ms is far away
        flusher.mark_dirty(log)
        log.verdicts.put("ok")
        await waiters.until(lambda: waiters.outcomes == {0: "ok"})
        await trio.testing.wait_all_tasks_blocked()
        assert flusher.statistics(log).pending_appends == 1
        with pytest.raises(queue.Empty):
            log.starts.get(timeout=0.2)  # no chained sync was started for it
        nursery.cancel_scope.cancel()


async def test_flush_all_covers_appends_made_during_a_running_sync() -> None:
    log = ScriptedLog()
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)
        assert log.next_start() == 1
        log.append()  # acks=1
        flusher.mark_dirty(log)
        async with trio.open_nursery() as inner:
            inner.start_soon(flusher.flush_all)
            # flush_all does not wait behind the running sync: it starts its own.
            assert await next_start(log.starts) == ("log", 2)
            # Two syncs run; if the first ends first, it chains a third (offset 1 is new).
            for _ in range(3):
                log.verdicts.put("ok")
        assert log.durable_end_offset == 2
        await waiters.until(lambda: waiters.outcomes == {0: "ok"})
        nursery.cancel_scope.cancel()


async def test_acks1_appends_during_a_sync_are_synced_by_flush_ms_after_it() -> None:
    # The sync's end, not mark_dirty (which ran while it was in flight), arms the timer.
    log = ScriptedLog()
    flusher = Flusher(FlushPolicy(flush_ms=100))
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)
        assert await next_start(log.starts) == ("log", 1)
        await trio.sleep(0.2)  # any flush.ms timer armed before the sync has run out
        log.append()  # acks=1 during the sync
        flusher.mark_dirty(log)
        log.verdicts.put("ok")
        assert await next_start(log.starts) == ("log", 2)  # after flush.ms
        log.verdicts.put("ok")
        await waiters.until(lambda: waiters.outcomes == {0: "ok"})
        nursery.cancel_scope.cancel()
    assert log.durable_end_offset == 2


async def test_writers_a_sync_releases_get_their_next_appends_into_one_sync() -> None:
    # Strict acks=all writers append again as soon as they are released: the next
    # sync starts after all of them had their turn, not with the first one's append.
    log = ScriptedLog()
    flusher = Flusher()
    rounds_done: list[int] = []
    all_done = trio.Event()

    async def writer(rounds: int) -> None:
        for _ in range(rounds):
            offset = log.append()
            flusher.mark_dirty(log)
            await flusher.wait_durable(log, offset)
        rounds_done.append(rounds)
        if len(rounds_done) == 3:
            all_done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for _ in range(3):
            nursery.start_soon(writer, 2)
        assert await next_start(log.starts) in (("log", 1), ("log", 3))
        if log.log_end_offset == 1:  # the sync started before the others appended
            log.verdicts.put("ok")
            assert await next_start(log.starts) == ("log", 3)
        log.verdicts.put("ok")
        # Offsets 0-2 are durable; the three released writers append 3-5, together.
        assert await next_start(log.starts) == ("log", 6)
        log.verdicts.put("ok")
        with trio.fail_after(TIMEOUT):
            await all_done.wait()
        nursery.cancel_scope.cancel()
    assert log.durable_end_offset == 6 and log.starts.empty()


class _WorkerDied(BaseException):
    """Escapes _flush_all's per-log ``except Exception``: the worker itself fails."""


async def test_a_worker_that_dies_fails_its_waiters() -> None:
    log = ScriptedLog()
    flusher = Flusher()

    def die(log: object) -> int:
        raise _WorkerDied()

    flusher.sync = die
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        waiters = Waiters(flusher, nursery)
        waiters.append(log)
        await waiters.until(lambda: len(waiters.outcomes) == 1)
        assert waiters.outcomes[0].startswith("flush failed: _WorkerDied")
        assert log.offline and flusher.statistics(log).failures == 1
        nursery.cancel_scope.cancel()
