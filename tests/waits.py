"""Waiting for a condition with a deadline (docs/testing-waits.md).

A test waits for what proves the broker got there, never for a fixed time. Anything a
loaded machine can delay gets at least a minute: the deadline only bounds a test that
would otherwise hang, and costs time only when the test fails anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

#: The default deadline: at load 20, 20 s for a new controller fails a correct broker.
WAIT_S = 60.0


def wait_until(
    condition: Callable[[], T], what: str, timeout_s: float = WAIT_S, step_s: float = 0.01
) -> T:
    """From a thread (clients, broker processes): call ``condition`` until it returns
    something true, and return that; fail after ``timeout_s``. ``step_s`` is the pause
    between calls, so a condition that does not block itself does not spin a core the
    broker under test needs."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(step_s)
    return value


async def poll(
    condition: Callable[[], T], timeout_s: float = WAIT_S, step_s: float = 0.01
) -> T | None:
    """In Trio (an in-process broker, the cluster harness, the simulator's virtual
    clock): call ``condition`` every ``step_s`` of Trio's clock until it returns
    something true, and return that; None at the deadline (the caller says what
    failed). For plain data the broker's tasks change without setting an event."""
    with trio.move_on_after(timeout_s):
        while not (value := condition()):  # noqa: ASYNC110 - plain data, no event to await
            await trio.sleep(step_s)
        return value
    return None


async def eventually(
    condition: Callable[[], T], what: str, timeout_s: float = WAIT_S, step_s: float = 0.01
) -> T:
    """:func:`poll`, failing the test at the deadline."""
    value = await poll(condition, timeout_s, step_s)
    if value is None:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
    return value
