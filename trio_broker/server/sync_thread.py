"""Run a blocking call in a worker thread and hear back through a pipe.

``trio.to_thread.run_sync`` reports a finished call through the run loop's
entry queue: a system task runs the report, which reschedules the caller, one
scheduler pass later. Measured on the 2-core CI machine, a call that slept
0.5 ms in its thread resumed its caller 93-120 us after the thread finished. A
thread from Trio's own cache that writes one byte to a pipe the caller waits on
with ``wait_readable`` resumed it after 42-45 us (`bench/storage.py` prints the
effect on group commit).

That gap matters on the acks=all path: a strict writer's cycle is "append, fsync,
ack", about 1 ms on this disk, and the flusher makes that round trip once per
fsync. Everything else in the broker keeps ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

T = TypeVar("T")


class PipeReportingThreads:
    """Runs calls in Trio's worker threads; each call's result comes back over a pipe.

    A pipe serves one call at a time; idle pipes are kept for the next call and
    closed by :meth:`close` (calls after that close their pipe when done).
    """

    def __init__(self) -> None:
        self._idle: list[tuple[int, int]] = []
        self._closed = False

    async def run_sync(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a worker thread; not cancellable (the thread can't be stopped)."""
        read_fd, write_fd = self._idle.pop() if self._idle else _nonblocking_pipe()
        results: list[outcome.Outcome[T]] = []

        def report(result: outcome.Outcome[T]) -> None:
            # In the worker thread: the byte is written after the result is stored.
            results.append(result)
            os.write(write_fd, b"\0")

        trio.lowlevel.start_thread_soon(functools.partial(fn, *args), report)
        # Shielded: the pipe may only be reused once this call's byte is read.
        with trio.CancelScope(shield=True):
            while True:
                try:
                    os.read(read_fd, 1)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(read_fd)
        if self._closed:
            os.close(read_fd)
            os.close(write_fd)
        else:
            self._idle.append((read_fd, write_fd))
        return results[0].unwrap()

    def reopen(self) -> None:
        self._closed = False

    def close(self) -> None:
        """Close the idle pipes; calls still running close theirs when they return."""
        self._closed = True
        while self._idle:
            read_fd, write_fd = self._idle.pop()
            os.close(read_fd)
            os.close(write_fd)


def _nonblocking_pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


class InlineCalls:
    """Stands in for :class:`PipeReportingThreads` where a run must be decided by Trio
    alone: the call runs on the event loop, after a checkpoint. The simulator and tests on
    a mock clock use it; with real threads an autojumping clock may jump while a sync is
    still running in its thread (a loaded machine makes that thread slow), and a timer of
    the code under test fires early."""

    async def run_sync(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` after a scheduler pass; not cancellable, as a worker call is not."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        return fn(*args)

    def reopen(self) -> None:
        """Nothing to reopen: no pipe is held."""

    def close(self) -> None:
        """Nothing to close: no pipe is held."""
