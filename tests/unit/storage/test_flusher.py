"""Flusher: group commit, durability waits, flush policy, failures."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.waits import eventually
from trio_broker.protocol.records import build_batch
from trio_broker.server import flusher as flusher_module
from trio_broker.server.flusher import Flusher
from trio_broker.storage.errors import StorageError
from trio_broker.storage.group_commit import DurabilityTracker, FlushPolicy, histogram_bucket
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.log_dir_state import LogDirs
from trio_broker.storage.memory import MemoryLog


class SlowLog:
    """A log whose flush blocks until released, to watch appends pile up."""

    def __init__(self) -> None:
        self.log_end_offset = 0
        self.durable_end_offset = 0
        self.offline = False
        self.flushes = 0
        self.fail_next = False
        self.gate = threading.Semaphore(0)
        self.auto = True
        #: set once a flush has taken its snapshot and is "syncing".
        self.syncing = threading.Event()

    def append(self) -> int:
        self.log_end_offset += 1
        return self.log_end_offset - 1

    def flush(self) -> int:
        end = self.log_end_offset  # like PartitionLog: snapshot, then sync
        if not self.auto:
            self.syncing.set()
            self.gate.acquire()
            self.syncing.clear()
        self.flushes += 1
        if self.fail_next:
            self.offline = True
            raise StorageError("EIO")
        self.durable_end_offset = end
        return end


# ------------------------------------------------------------------ sans-I/O tracker


def test_tracker_releases_waiters_below_the_durable_end() -> None:
    tracker: DurabilityTracker[str] = DurabilityTracker()
    for offset, token in [(5, "a"), (1, "b"), (9, "c")]:
        tracker.note_append(0)
        tracker.add_waiter(offset, token)
    covered = tracker.begin_flush()
    assert covered == 3 and not tracker.dirty
    assert tracker.end_flush(6, covered) == ["b", "a"]
    assert tracker.waiters == 1
    assert tracker.fail() == ["c"]
    stats = tracker.statistics()
    assert (stats.fsyncs, stats.failures, stats.appends) == (1, 1, 3)
    assert stats.appends_per_fsync == {2: 1} and stats.max_appends_per_fsync == 3


def test_tracker_policy() -> None:
    eager: DurabilityTracker[object] = DurabilityTracker(FlushPolicy())
    assert not eager.needs_flush(0)
    eager.note_append(0)
    assert eager.needs_flush(0)  # no limits configured: flush when free

    timed: DurabilityTracker[object] = DurabilityTracker(FlushPolicy(flush_ms=100))
    timed.note_append(1000)
    timed.note_append(1050)
    assert timed.deadline_ms() == 1100
    assert not timed.needs_flush(1099) and timed.needs_flush(1100)
    timed.add_waiter(0, object())
    assert timed.needs_flush(1000)  # acks=all waiters never wait for flush.ms

    counted: DurabilityTracker[object] = DurabilityTracker(FlushPolicy(flush_messages=10))
    counted.note_append(0, messages=6)
    assert not counted.needs_flush(0)
    counted.note_append(0, messages=4)
    assert counted.needs_flush(0)

    assert FlushPolicy().requires_sync(-1) and not FlushPolicy().requires_sync(1)
    assert not FlushPolicy(sync_acks_all=False).requires_sync(-1)


def test_histogram_buckets() -> None:
    assert [histogram_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 100)] == [0, 1, 2, 2, 4, 4, 8, 64]


# ------------------------------------------------------------------ the trio task


async def test_wait_durable_returns_after_the_fsync(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        result = log.append(build_batch([(None, b"a"), (None, b"b")], base_timestamp=0), now_ms=0)
        flusher.mark_dirty(log, messages=2)
        assert log.durable_end_offset == 0
        await flusher.wait_durable(log, result.last_offset)
        assert log.durable_end_offset == 2
        await flusher.wait_durable(log, 1)  # already durable: immediate
        with pytest.raises(ValueError):
            await flusher.wait_durable(log, 2)  # never appended
        nursery.cancel_scope.cancel()
    log.close()


async def test_group_commit_covers_appends_made_during_an_fsync() -> None:
    log = SlowLog()
    log.auto = False
    flusher = Flusher()
    done: list[int] = []
    first_done, all_done = trio.Event(), trio.Event()

    async def writer(offset: int) -> None:
        await flusher.wait_durable(log, offset)
        done.append(offset)
        first_done.set()
        if len(done) == 21:
            all_done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        first = log.append()
        flusher.mark_dirty(log)
        nursery.start_soon(writer, first)
        try:
            await trio.to_thread.run_sync(log.syncing.wait)  # the first fsync is running
            for _ in range(20):
                offset = log.append()
                flusher.mark_dirty(log)
                nursery.start_soon(writer, offset)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []
            log.gate.release()  # first fsync: covers only offset 0
            await first_done.wait()
            await trio.to_thread.run_sync(log.syncing.wait)
            assert done == [0]
            log.gate.release()  # second fsync: covers all 20 that piled up
            await all_done.wait()
            assert log.flushes == 2
            stats = flusher.statistics(log)
            assert stats.fsyncs == 2 and stats.appends == 21 and stats.max_appends_per_fsync == 20
            assert stats.appends_per_fsync == {1: 1, 16: 1}
        finally:
            log.auto = True
            log.gate.release()
            nursery.cancel_scope.cancel()


async def test_requests_queued_behind_the_first_share_its_fsync(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Requests taken one per scheduler pass (the queue's receive yields; the handler
    pool's worker does so after 8 taken back to back), as five in flight from one
    producer arrive: the sync started after the first append covers all five, not the
    first alone. (The mock clock stands still
    while tasks run, so only the flusher's pass bound applies, whatever the machine's load.)"""
    log = SlowLog()
    flusher = Flusher(inline=True)  # on the mock clock: Trio alone decides when a sync ends
    send, receive = trio.open_memory_channel[int](5)
    for request in range(5):
        send.send_nowait(request)
    send.close()
    offsets: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        async for _request in receive:  # like the handler pool's worker
            offsets.append(log.append())
            flusher.mark_dirty(log)
        for offset in offsets:
            await flusher.wait_durable(log, offset)
        nursery.cancel_scope.cancel()
    assert log.flushes == 1
    assert flusher.statistics(log).max_appends_per_fsync == 5


async def test_a_failed_flush_fails_the_waiters_and_later_calls() -> None:
    log = SlowLog()
    log.fail_next = True
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        offset = log.append()
        flusher.mark_dirty(log)
        with pytest.raises(StorageError):
            await flusher.wait_durable(log, offset)
        log.append()
        with pytest.raises(StorageError):
            await flusher.wait_durable(log, offset + 1)
        assert flusher.statistics().failures == 1
        nursery.cancel_scope.cancel()


def _flush_started(flusher: Flusher, log: SlowLog) -> bool:
    # The (synchronous) start of the flush, not its completion. With worker threads the
    # autojumping clock raced ahead of the thread; these tests sync inline now, and
    # still look at the start: it is what flush.ms and flush.messages decide.
    return flusher.statistics(log).pending_appends == 0


async def test_flush_ms_bounds_unsynced_acks1_data(autojump_clock: trio.abc.Clock) -> None:
    log = SlowLog()
    flusher = Flusher(FlushPolicy(flush_ms=500), inline=True)  # see _flush_started
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        log.append()
        flusher.mark_dirty(log)
        await trio.sleep(0.499)
        assert not _flush_started(flusher, log)  # acks=1 data waits for flush.ms
        await trio.sleep(0.002)
        assert _flush_started(flusher, log)
        # an acks=all waiter is synced at once, whatever flush.ms says
        offset = log.append()
        flusher.mark_dirty(log)
        before = trio.current_time()
        await flusher.wait_durable(log, offset)
        assert trio.current_time() - before < 0.1
        nursery.cancel_scope.cancel()


async def test_flush_messages(autojump_clock: trio.abc.Clock) -> None:
    log = SlowLog()
    flusher = Flusher(FlushPolicy(flush_messages=5, flush_ms=10_000), inline=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for _ in range(4):
            log.append()
            flusher.mark_dirty(log)
        await trio.sleep(1)
        assert not _flush_started(flusher, log)
        log.append()
        flusher.mark_dirty(log)
        await trio.testing.wait_all_tasks_blocked()
        assert _flush_started(flusher, log)
        nursery.cancel_scope.cancel()


async def test_cancelled_waiter_is_forgotten() -> None:
    log = SlowLog()
    log.auto = False
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        offset = log.append()
        with trio.move_on_after(0.01):
            await flusher.wait_durable(log, offset)
        assert flusher.statistics(log).waiters == 0
        log.gate.release()
        nursery.cancel_scope.cancel()


async def test_forget_releases_waiters() -> None:
    log = SlowLog()
    log.auto = False
    flusher = Flusher()
    offset = log.append()
    errors: list[StorageError] = []

    async def waiter() -> None:
        try:
            await flusher.wait_durable(log, offset)
        except StorageError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        flusher.forget(log)  # the log was closed while a produce waited on it
        await trio.testing.wait_all_tasks_blocked()
        assert len(errors) == 1
        log.gate.release()
        nursery.cancel_scope.cancel()


async def test_real_disk_error_through_the_flusher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        ok = log.append(build_batch([(None, b"a")], base_timestamp=0), now_ms=0)
        flusher.mark_dirty(log)
        await flusher.wait_durable(log, ok.last_offset)
        bad = log.append(build_batch([(None, b"b")], base_timestamp=0), now_ms=0)
        real = os.fdatasync

        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(os, "fdatasync", eio)
        flusher.mark_dirty(log)
        with pytest.raises(StorageError):
            await flusher.wait_durable(log, bad.last_offset)
        monkeypatch.setattr(os, "fdatasync", real)
        assert log.offline and log.durable_end_offset == 1
        nursery.cancel_scope.cancel()
    log.close()


async def test_memory_log_through_the_flusher() -> None:
    log = MemoryLog()
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        results = []
        for _ in range(10):
            results.append(log.append(build_batch([(None, b"x")], base_timestamp=0), now_ms=0))
            flusher.mark_dirty(log)
        await flusher.wait_durable(log, results[-1].last_offset)
        assert log.durable_end_offset == 10
        await flusher.flush_all()
        nursery.cancel_scope.cancel()


async def test_many_concurrent_writers_share_fsyncs(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    flusher = Flusher()

    async def writer(n: int) -> None:
        for _ in range(n):
            result = log.append(build_batch([(None, b"v" * 1000)], base_timestamp=0), now_ms=0)
            flusher.mark_dirty(log)
            await flusher.wait_durable(log, result.last_offset)

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        async with trio.open_nursery() as writers:
            for _ in range(8):
                writers.start_soon(writer, 25)
        nursery.cancel_scope.cancel()
    stats = flusher.statistics()
    assert stats.appends == 200
    assert stats.fsyncs < 200  # group commit happened
    assert log.durable_end_offset == 200
    log.close()


async def test_a_log_aborted_with_waiters_fails_them_instead_of_spinning(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        result = log.append(build_batch([(None, b"a")], base_timestamp=0), now_ms=0)
        log.abort()  # e.g. the disk was pulled; nothing was synced
        flusher.mark_dirty(log)
        with pytest.raises(StorageError):
            await flusher.wait_durable(log, result.last_offset)
        nursery.cancel_scope.cancel()


class RendezvousLog(SlowLog):
    """A log whose flush waits (in its worker thread) until ``parties`` flushes run at once."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def flush(self) -> int:
        self.barrier.wait(timeout=10)  # BrokenBarrierError unless the syncs overlap
        return super().flush()


@pytest.mark.parametrize("threads", [2, 4])
async def test_many_dirty_logs_are_synced_in_parallel_threads(threads: int) -> None:
    # Eight logs dirty at once, split over `threads` worker threads: each thread's
    # first flush only returns once `threads` flushes are running concurrently.
    barrier = threading.Barrier(threads)
    logs = [RendezvousLog(barrier) for _ in range(threads)]
    flusher = Flusher(threads=threads)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        offsets = [log.append() for log in logs]
        for log in logs:
            flusher.mark_dirty(log)
        with trio.fail_after(30):
            for log, offset in zip(logs, offsets, strict=True):
                await flusher.wait_durable(log, offset)
        nursery.cancel_scope.cancel()
    assert all(log.durable_end_offset == 1 for log in logs)
    assert not barrier.broken


async def test_a_slow_sync_holds_back_only_the_logs_of_its_lane() -> None:
    """Two logs in two lanes: while one log's sync hangs, the other is synced again and
    again (a round for all logs would hold its second sync until the hung one returned)."""
    stuck, free = SlowLog(), SlowLog()
    stuck.auto = False
    flusher = Flusher(threads=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        try:
            stuck.append()
            flusher.mark_dirty(stuck)
            await trio.to_thread.run_sync(stuck.syncing.wait)  # its lane's sync is running
            with trio.fail_after(30):
                for _ in range(3):
                    offset = free.append()
                    flusher.mark_dirty(free)
                    await flusher.wait_durable(free, offset)
            assert free.flushes == 3 and stuck.flushes == 0
            stuck.gate.release()
            with trio.fail_after(30):
                await flusher.wait_durable(stuck, 0)
        finally:
            stuck.auto = True
            stuck.gate.release()
            nursery.cancel_scope.cancel()


async def test_an_offline_dir_comes_back_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe reloads and syncs every log of the dir; one failing keeps all offline."""
    monkeypatch.setattr(flusher_module, "RECOVERY_BACKOFF_S", 0.0)
    dirs = LogDirs([tmp_path])
    state = dirs.state(tmp_path)
    first, second = (
        PartitionLog.open(tmp_path / name, LogConfig(), dir_state=state) for name in ("t-0", "t-1")
    )
    for log in (first, second):
        log.append(build_batch([(None, b"kept")], base_timestamp=0), now_ms=0)
        log.flush()
    flusher = Flusher()
    failing = [True]
    refused: list[Path] = []

    def sync(log: Any) -> int:
        if failing[0] and log.directory == second.directory:
            refused.append(log.directory)
            raise OSError(errno.EIO, "injected EIO")
        return int(log.flush())

    flusher.sync = sync
    async with trio.open_nursery() as nursery:
        flusher.background = nursery
        await nursery.start(flusher.run)
        second.take_offline("injected")
        assert first.offline  # the same dir
        flusher.recover_soon(first)  # the first's probe syncs the second too: refused
        await eventually(lambda: refused, "the refused probe")
        assert first.offline and second.offline and state.offline
        failing[0] = False
        flusher.recover_soon(first)
        await eventually(lambda: not state.offline, "the dir back online")
        assert not first.offline and not second.offline
        for log in (first, second):
            appended = log.append(build_batch([(None, b"after")], base_timestamp=0), now_ms=0)
            flusher.mark_dirty(log)
            await flusher.wait_durable(log, appended.last_offset)
            assert appended.base_offset == 1
        nursery.cancel_scope.cancel()
    first.close()
    second.close()
