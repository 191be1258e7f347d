"""The handler pool's completer (HandlerPool._completer): a Polled answer is polled when
the handler returns and again each time it is woken, answered once, and answered
``on_timeout()`` at its deadline, with no task of its own; the heap of deadlines does
not keep answered requests for their whole timeout."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from trio_broker.config import load_config
from trio_broker.handlers.base import NOT_READY, NotReady, Polled
from trio_broker.protocol.messages import RequestHeader
from trio_broker.server.handler_pool import HandlerPool
from trio_broker.services.stats import BrokerStats


class Conn:
    def __init__(self) -> None:
        self.pending: dict[int, Any] = {}
        self.completed: list[tuple[int, Any]] = []
        self.client_address = "127.0.0.1:5000"

    def complete(self, slot: int, answer: Any) -> None:
        self.completed.append((slot, answer))

    def close(self, reason: str) -> None:
        raise AssertionError(reason)


class Answer:
    """A Polled answer made ready by the test: ``ready()`` then its wake."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_ready = False
        self.polls = 0
        self.unwatched = 0
        self.wake: Callable[[], None] | None = None

    def polled(self, timeout_s: float | None = 10.0) -> Polled:
        def poll() -> Any:
            self.polls += 1
            return self.name if self.is_ready else NOT_READY

        def watch(wake: Callable[[], None]) -> Callable[[], None]:
            self.wake = wake

            def unwatch() -> None:
                self.unwatched += 1

            return unwatch

        return Polled(poll, watch, timeout_s=timeout_s, on_timeout=lambda: f"{self.name} late")

    def ready(self) -> None:
        self.is_ready = True
        assert self.wake is not None
        self.wake()


def pool() -> HandlerPool:
    broker: Any = SimpleNamespace(config=load_config(), stats=BrokerStats())
    return HandlerPool(broker, 1)


def ctx() -> Any:
    return SimpleNamespace(header=RequestHeader(1, 12, 1, "c"), principal="User:ANONYMOUS")


async def test_a_woken_answer_is_answered_once_and_a_quiet_one_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handlers, conn = pool(), Conn()
    soon, never = Answer("soon"), Answer("never")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handlers._completer)
        started = trio.current_time()
        handlers._start_polled(conn, 0, ctx(), soon.polled(), (0.0, 0.0))  # type: ignore[arg-type]
        handlers._start_polled(conn, 1, ctx(), never.polled(), (0.0, 0.0))  # type: ignore[arg-type]
        assert soon.polls == never.polls == 1 and not conn.completed
        await trio.sleep(1)
        soon.ready()
        soon.wake()  # woken twice before the completer runs: polled once
        await trio.testing.wait_all_tasks_blocked()
        assert conn.completed == [(0, "soon")] and soon.polls == 2 and soon.unwatched == 1
        soon.wake()  # after its answer: nothing
        await trio.testing.wait_all_tasks_blocked()
        assert soon.polls == 2
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert conn.completed == [(0, "soon"), (1, "never late")]
    assert never.unwatched == 1 and never.polls == 1
    # The deadline is the handler's return plus timeout_s, not the completer's next look.
    assert started + 10 <= trio.current_time()


async def test_an_answer_ready_at_once_is_answered_on_the_handler_task() -> None:
    handlers, conn = pool(), Conn()
    ready = Answer("now")
    ready.is_ready = True
    handlers._start_polled(conn, 3, ctx(), ready.polled(), (0.0, 0.0))  # type: ignore[arg-type]
    assert conn.completed == [(3, "now")] and ready.unwatched == 1
    assert handlers._deadlines == []  # never waited: no deadline kept


async def test_answered_requests_do_not_stay_in_the_heap_of_deadlines(
    autojump_clock: trio.testing.MockClock,
) -> None:
    handlers, conn = pool(), Conn()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handlers._completer)
        for n in range(1000):
            answer = Answer(str(n))
            handlers._start_polled(conn, n, ctx(), answer.polled(60.0), (0.0, 0.0))  # type: ignore[arg-type]
            answer.ready()
            await trio.testing.wait_all_tasks_blocked()
        assert len(conn.completed) == 1000
        assert len(handlers._deadlines) <= 200
        nursery.cancel_scope.cancel()


def test_not_ready_is_its_own_value() -> None:
    assert isinstance(NOT_READY, NotReady) and repr(NOT_READY) == "NOT_READY"
