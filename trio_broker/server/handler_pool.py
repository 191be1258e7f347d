"""N handler tasks, each with its own bounded queue (AutoMQ's multi-queue request channel).

A connection's requests always go to queue ``connection_id % N``, so one
handler serves them in arrival order: validation and offset assignment of a
producer's batches happen in sequence even though the connection is pipelined.
A handler that must wait (fsync, long poll) returns a Deferred, which runs in
the broker's delayed-operations nursery while the handler takes the next request.
A :class:`Polled` Deferred (a long poll, a node alone's acks=all produce) takes no task: the handler task polls it
once, and the pool's one completer task polls it again each time what it waits on
wakes it, and answers ``on_timeout()`` at its deadline (a heap of deadlines, one
sleep for all of them).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trio_broker.handlers.base import (
    NOT_READY,
    CloseConnection,
    Deferred,
    HandlerSpec,
    Polled,
    RequestContext,
)
from trio_broker.protocol.messages import API_KEY_NAMES, RequestHeader
from trio_broker.protocol.schema import Message
from trio_broker.server.histogram import LatencyHistogram, RequestStages
from trio_broker.server.logging_setup import log_slow_request

if TYPE_CHECKING:
    from trio_broker.server.connection import Connection
    from trio_broker.server.host import PoolHost

log = logging.getLogger("trio_broker.handlers")

#: Queued requests a handler task takes one after another before it lets the loop run
#: other tasks (HandlerPool._worker).
BACK_TO_BACK = 8

#: Slow-request lines logged per second at most; past that they are counted, not logged.
#: An overloaded broker finds every request slow: a line for each (formatting and
#: writing it on the event loop) was a tenth of its CPU in W5 under load, slowing it more.
SLOW_LOG_LINES_PER_S = 20

#: (connection, response slot, header, body, principal decided when it was read)
WorkItem = tuple["Connection", int, RequestHeader, Any, str]


class HandlerRun:
    """One handler call, for the loop watchdog to name who held the loop."""

    __slots__ = ("api_key", "api_version", "client", "client_id", "correlation_id",
                 "finished", "started")  # fmt: skip

    def __init__(self, header: RequestHeader, client: str, started: float) -> None:
        self.api_key = header.api_key
        self.api_version = header.api_version
        self.correlation_id = header.correlation_id
        self.client_id = header.client_id or ""
        self.client = client
        self.started = started
        #: perf_counter when the handler returned; None while it runs.
        self.finished: float | None = None

    def ran_for(self, now: float) -> float:
        return (now if self.finished is None else self.finished) - self.started


class _Waiting:
    """A Polled answer the completer task looks after until it is answered."""

    __slots__ = ("conn", "ctx", "deferred", "done", "slot", "ticket", "times", "unwatch")

    def __init__(
        self, conn: Connection, slot: int, ctx: RequestContext, deferred: Polled,
        times: tuple[float, float],
    ) -> None:  # fmt: skip
        self.conn = conn
        self.slot = slot
        self.ctx = ctx
        self.deferred = deferred
        self.times = times
        self.done = False
        #: Its entry's handle in the completer's heap of deadlines, emptied when it is
        #: answered (the heap then holds nothing of the request), or None: no deadline.
        self.ticket: list[_Waiting | None] | None = None
        self.unwatch: Callable[[], None] | None = None

    def finished(self) -> None:
        """Answered (or failed): let go of the heap's handle and of the wait."""
        self.done = True
        if self.ticket is not None:
            self.ticket[0] = None
            self.ticket = None


class HandlerPool:
    def __init__(self, broker: PoolHost, count: int, queue_size: int = 1024) -> None:
        self.broker = broker
        #: Polled answers woken since the completer last looked (a dict: in wake order).
        self._ready: dict[_Waiting, None] = {}
        #: (trio time, sequence, [waiting]): each Polled answer's timeout; an answered
        #: one's handle is emptied, and its entry stays until its time comes (skipped
        #: then) or until such entries are half the heap, which is then rebuilt.
        self._deadlines: list[tuple[float, int, list[_Waiting | None]]] = []
        self._answered_in_deadlines = 0
        self._sequence = itertools.count()
        #: Wakes the completer (a wake, or a deadline before the one it sleeps until).
        self._completer_wakeup = trio.Event()
        self._completer_until = math.inf
        channels = [trio.open_memory_channel[WorkItem](queue_size) for _ in range(count)]
        self._senders = [send for send, _ in channels]
        self._receivers = [receive for _, receive in channels]
        self.handled = [0] * count
        #: Per API key: time from dequeue to handler return (the /metrics endpoint).
        self.latency = LatencyHistogram()
        #: Per API key: queue, handler, wait, response-send and total times (/metrics),
        #: recorded by the connection once a response is written.
        self.stages = RequestStages()
        #: request.log.slow.ms in seconds; infinite when 0 (off).
        slow_ms = broker.config.request_log_slow_ms
        self.slow_s = slow_ms / 1000 if slow_ms > 0 else math.inf
        #: Slow requests counted but not logged (SLOW_LOG_LINES_PER_S), in all and in
        #: the current one-second window, which began at _slow_window (perf_counter).
        self.slow_unlogged = 0
        self._slow_window = -math.inf
        self._slow_window_lines = 0
        self._slow_window_unlogged = 0
        #: Per handler task, its last two calls (the watchdog may wake only after the
        #: task that stalled it has taken its next request).
        self._runs: list[tuple[HandlerRun | None, HandlerRun | None]] = [(None, None)] * count

    def requests_during(self, start: float, end: float) -> list[HandlerRun]:
        """The handler calls that ran at some point between ``start`` and ``end``
        (perf_counter seconds)."""
        return [
            run
            for pair in self._runs
            for run in pair
            if run is not None
            and run.started <= end
            and (run.finished is None or run.finished >= start)
        ]

    def queue_depths(self) -> list[int]:
        return [s.statistics().current_buffer_used for s in self._senders]

    async def submit(
        self, conn: Connection, slot: int, header: RequestHeader, body: Any, principal: str
    ) -> None:
        """Queue a request; it runs as ``principal``, decided by the reader when it was read."""
        queue = self._senders[conn.id % len(self._senders)]
        await queue.send((conn, slot, header, body, principal))

    def try_submit(
        self, conn: Connection, slot: int, header: RequestHeader, body: Any, principal: str
    ) -> bool:
        """:meth:`submit` without waiting: False when the queue is full (then await submit).

        The reader's fast path: no cancel scope and no scheduler pass per request.
        """
        queue = self._senders[conn.id % len(self._senders)]
        try:
            queue.send_nowait((conn, slot, header, body, principal))
        except trio.WouldBlock:
            return False
        return True

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for index, receiver in enumerate(self._receivers):
                nursery.start_soon(self._worker, index, receiver, name=f"handler-{index}")
            nursery.start_soon(self._completer, name="deferred-answers")
            task_status.started()

    async def _worker(self, index: int, receiver: trio.MemoryReceiveChannel[WorkItem]) -> None:
        broker = self.broker
        # Up to BACK_TO_BACK queued requests are taken without a scheduler pass between
        # them (receive() makes one per item): a pipelined producer's requests queued
        # together are appended together, before the flusher's sync starts, and each
        # costs no pass of its own. A count, not a clock, bounds it, so a simulation's
        # run stays deterministic.
        back_to_back = 0
        while True:
            try:
                if back_to_back >= BACK_TO_BACK:
                    raise trio.WouldBlock
                item = receiver.receive_nowait()
                back_to_back += 1
            except trio.WouldBlock:
                try:
                    item = await receiver.receive()
                except trio.EndOfChannel:
                    return
                back_to_back = 1
            except trio.EndOfChannel:
                return
            conn, slot, header, body, principal = item
            self.handled[index] += 1
            # Every request read in full is handled even if its client has gone, as
            # Kafka does; only the answer is dropped (Connection.complete on a closed
            # connection). A client counts a request as made once it is on the wire:
            # an acks=0 producer closes right after its last Produce, a consumer right
            # after its last OffsetCommit, an admin tool after CreateTopics.
            spec: HandlerSpec = broker.router[header.api_key]
            ctx = RequestContext(
                header=header, services=broker, client=conn.client, principal=principal,
                sasl=conn.sasl,
            )  # fmt: skip
            started = time.perf_counter()
            run = HandlerRun(header, conn.client_address, started)
            self._runs[index] = (self._runs[index][1], run)
            try:
                result = await spec.fn(ctx, body)
            except Exception:
                run.finished = time.perf_counter()
                self.latency.observe(header.api_key, run.finished - started)
                log.exception("handler for API %d v%d failed", header.api_key, header.api_version)
                conn.close("internal error in handler")
                continue
            except BaseException:
                run.finished = time.perf_counter()
                raise
            done = run.finished = time.perf_counter()
            self.latency.observe(header.api_key, done - started)
            pending = conn.pending.get(slot)
            if pending is not None:
                pending.started = started
                pending.handled = done
            if isinstance(result, Polled):
                self._start_polled(conn, slot, ctx, result, (started, done))
            elif isinstance(result, Deferred):
                broker.root_nursery.start_soon(
                    self._finish, conn, slot, ctx, result, (started, done)
                )
            elif isinstance(result, CloseConnection):
                conn.close(result.reason)
            else:
                conn.complete(slot, result)
                if pending is not None and done - pending.received >= self.slow_s:
                    self._slow(conn, ctx, pending.received, started, done, done, result)

    async def _finish(
        self,
        conn: Connection,
        slot: int,
        ctx: RequestContext,
        deferred: Deferred,
        times: tuple[float, float],
    ) -> None:
        try:
            response = await _run_deferred(deferred)
        except Exception:
            log.exception("deferred response for API %d failed", ctx.header.api_key)
            conn.close("internal error completing a response")
            return
        self._complete_late(conn, slot, ctx, times, response)

    def _complete_late(
        self, conn: Connection, slot: int, ctx: RequestContext, times: tuple[float, float],
        response: Any,
    ) -> None:  # fmt: skip
        """Queue a deferred answer (awaited or polled), logging it if it came slowly."""
        pending = conn.pending.get(slot)
        conn.complete(slot, response)
        if pending is not None:
            now = time.perf_counter()
            if now - pending.received >= self.slow_s:
                self._slow(conn, ctx, pending.received, *times, now, response)

    def _start_polled(
        self, conn: Connection, slot: int, ctx: RequestContext, deferred: Polled,
        times: tuple[float, float],
    ) -> None:  # fmt: skip
        """Poll once now; if it must wait, the completer polls it again when woken."""
        waiting = _Waiting(conn, slot, ctx, deferred, times)
        try:
            waiting.unwatch = deferred.watch(lambda: self._wake(waiting))
        except Exception:
            self._failed(waiting)
            return
        self._poll(waiting)
        if waiting.done or deferred.timeout_s is None:
            return
        deadline = trio.current_time() + deferred.timeout_s
        if self._answered_in_deadlines > max(64, len(self._deadlines) // 2):
            self._deadlines[:] = [d for d in self._deadlines if d[2][0] is not None]
            heapq.heapify(self._deadlines)
            self._answered_in_deadlines = 0
        waiting.ticket = [waiting]
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), waiting.ticket))
        if deadline < self._completer_until:
            self._completer_wakeup.set()

    def _wake(self, waiting: _Waiting) -> None:
        if not waiting.done and waiting not in self._ready:
            self._ready[waiting] = None
            self._completer_wakeup.set()

    def _poll(self, waiting: _Waiting) -> None:
        try:
            answer = waiting.deferred.poll()
        except Exception:
            self._failed(waiting)
            return
        if answer is not NOT_READY:
            self._answer(waiting, answer)

    def _answer(self, waiting: _Waiting, answer: Any) -> None:
        self._answered_in_deadlines += waiting.ticket is not None
        waiting.finished()
        self._ready.pop(waiting, None)
        self._unwatch(waiting)
        self._complete_late(waiting.conn, waiting.slot, waiting.ctx, waiting.times, answer)

    def _failed(self, waiting: _Waiting) -> None:
        self._answered_in_deadlines += waiting.ticket is not None
        waiting.finished()
        self._ready.pop(waiting, None)
        log.exception("deferred response for API %d failed", waiting.ctx.header.api_key)
        self._unwatch(waiting)
        waiting.conn.close("internal error completing a response")

    @staticmethod
    def _unwatch(waiting: _Waiting) -> None:
        # The completer task must outlive any one answer's failure.
        unwatch, waiting.unwatch = waiting.unwatch, None
        if unwatch is not None:
            try:
                unwatch()
            except Exception:
                log.exception("ending a deferred response's wait failed")

    async def _completer(self) -> None:
        """Poll the woken Polled answers; answer those whose timeout came."""
        # The work is in plain methods: no local of this frame holds an answered
        # request (and its buffers) while the task sleeps.
        deadlines = self._deadlines
        while True:
            # One cancel scope for many sleeps: its deadline moves to the earliest
            # answer's (a scope per sleep was one more per group commit); once it
            # fires, the next sleep takes a new scope.
            with trio.CancelScope() as sleep:
                while True:
                    self._poll_ready()
                    self._time_out(trio.current_time())
                    if self._ready:
                        continue
                    self._completer_wakeup = trio.Event()
                    self._completer_until = deadlines[0][0] if deadlines else math.inf
                    if sleep.deadline != self._completer_until:
                        sleep.deadline = self._completer_until
                    await self._completer_wakeup.wait()
                    self._completer_until = -math.inf  # awake: a new deadline need not wake it
            self._completer_until = -math.inf

    def _poll_ready(self) -> None:
        while self._ready:
            ready, self._ready = self._ready, {}
            for waiting in ready:
                if not waiting.done:
                    self._poll(waiting)

    def _time_out(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            waiting = heapq.heappop(deadlines)[2][0]
            if waiting is None:
                self._answered_in_deadlines -= 1
                continue
            waiting.ticket = None  # popped: its answer empties no handle
            assert waiting.deferred.on_timeout is not None, "a timeout needs on_timeout"
            try:
                answer = waiting.deferred.on_timeout()
            except Exception:
                self._failed(waiting)
                continue
            self._answer(waiting, answer)

    def _slow(
        self,
        conn: Connection,
        ctx: RequestContext,
        received: float,
        started: float,
        handled: float,
        completed: float,
        response: Any,
    ) -> None:
        """Log a request that took request.log.slow.ms or longer, frame read to response queued
        (SLOW_LOG_LINES_PER_S lines a second at most; the rest are counted).

        queue_ms: read to handler dequeue; handler_ms: the handler call; wait_ms: a
        deferred response's wait (fsync, long poll); total_ms covers all three.
        """
        self.broker.stats.slow_requests += 1
        if completed - self._slow_window >= 1.0:
            if self._slow_window_unlogged:
                log.warning(
                    "%d slow requests not logged in the last %.1f s (at most %d lines a second)",
                    self._slow_window_unlogged, completed - self._slow_window,
                    SLOW_LOG_LINES_PER_S,
                )  # fmt: skip
            self._slow_window = completed
            self._slow_window_lines = self._slow_window_unlogged = 0
        if self._slow_window_lines >= SLOW_LOG_LINES_PER_S:
            self.slow_unlogged += 1
            self._slow_window_unlogged += 1
            return
        self._slow_window_lines += 1
        header = ctx.header
        throttle = getattr(response, "throttle_time_ms", 0) if isinstance(response, Message) else 0
        log_slow_request(
            {
                "api": API_KEY_NAMES.get(header.api_key, f"api_{header.api_key}").lower(),
                "api_key": header.api_key,
                "version": header.api_version,
                "correlation_id": header.correlation_id,
                "client_id": header.client_id or "",
                "client": conn.client_address,
                "principal": ctx.principal,
                "total_ms": _ms(completed - received),
                "queue_ms": _ms(started - received),
                "handler_ms": _ms(handled - started),
                "wait_ms": _ms(completed - handled),
                "throttle_ms": throttle or 0,
            }
        )


async def _run_deferred(deferred: Deferred) -> Any:
    """Perform a handler's wait; past its ``timeout_s`` answer its ``on_timeout()``.

    A Polled answer is polled on this task (tests; the pool runs them on its completer)."""
    if isinstance(deferred, Polled):
        return await _run_polled(deferred)
    if deferred.timeout_s is None:
        return await deferred.finish()
    with trio.move_on_after(deferred.timeout_s):
        return await deferred.finish()
    assert deferred.on_timeout is not None, "a Deferred with a timeout needs on_timeout"
    return deferred.on_timeout()


async def _run_polled(deferred: Polled) -> Any:
    woken = [trio.Event()]
    unwatch = deferred.watch(lambda: woken[0].set())
    try:
        timeout = math.inf if deferred.timeout_s is None else deferred.timeout_s
        with trio.move_on_after(timeout):
            while True:
                answer = deferred.poll()
                if answer is not NOT_READY:
                    await trio.lowlevel.checkpoint()
                    return answer
                await woken[0].wait()
                woken[0] = trio.Event()
    finally:
        unwatch()
    assert deferred.on_timeout is not None, "a Deferred with a timeout needs on_timeout"
    return deferred.on_timeout()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
