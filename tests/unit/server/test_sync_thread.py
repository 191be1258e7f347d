"""PipeReportingThreads: results, errors and pipes of the flusher's worker calls."""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio

from trio_broker.server.sync_thread import PipeReportingThreads


async def test_returns_the_result_computed_in_another_thread() -> None:
    threads = PipeReportingThreads()
    ident = await threads.run_sync(threading.get_ident)
    assert ident != threading.get_ident()
    assert await threads.run_sync(lambda a, b: a + b, 2, 3) == 5
    threads.close()


async def test_an_exception_in_the_thread_is_raised_in_the_caller() -> None:
    threads = PipeReportingThreads()

    def fail() -> None:
        raise OSError(5, "EIO")

    with pytest.raises(OSError, match="EIO"):
        await threads.run_sync(fail)
    # The pipe is still usable after a failure.
    assert await threads.run_sync(lambda: "ok") == "ok"
    threads.close()


def _open_fds() -> int:
    """The process's open pipes: the reporting threads' kind of fd. Other fds (sockets,
    files) may come and go meanwhile, e.g. in threads an earlier test in this worker left."""
    pipes = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            pipes += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        except OSError:
            pass  # closed since the listing (the listing's own fd among them)
    return pipes


async def test_pipes_are_reused_and_closed() -> None:
    threads = PipeReportingThreads()
    before = _open_fds()
    for _ in range(20):
        await threads.run_sync(lambda: None)
    assert _open_fds() == before + 2  # one pipe, reused by every sequential call
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(threads.run_sync, time.sleep, 0.05)
    assert _open_fds() == before + 6  # three concurrent calls needed three pipes
    threads.close()
    assert _open_fds() == before
    await threads.run_sync(lambda: None)  # after close: a call closes its own pipe
    assert _open_fds() == before
    threads.reopen()
    await threads.run_sync(lambda: None)
    assert _open_fds() == before + 2
    threads.close()


async def test_a_cancelled_caller_still_waits_for_its_thread() -> None:
    threads = PipeReportingThreads()
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "done"

    with trio.move_on_after(0.01) as scope:
        result = await threads.run_sync(slow)
    # The call is shielded: the thread can't be stopped, so its caller returns its result.
    assert finished.is_set()
    assert result == "done"
    assert not scope.cancelled_caught
    threads.close()
