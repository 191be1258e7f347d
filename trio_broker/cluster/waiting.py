"""Small waiting helpers the cluster tasks share.

:class:`Signal` is a one-shot event, as ``trio.Event``, that :func:`wait_any` can wait on
beside others without a task per event: the waiting task parks itself in each signal it
waits on, and the first ``set()`` reschedules it. The parties a cluster task waits on
(ZooKeeper watches, a session's loss, the cluster view's and the roles' changes) hand
out Signals; a ``trio.Event`` still works in ``wait_any``, at the cost of a task.
"""

from __future__ import annotations

import trio

__all__ = ["RETRY_S", "Signal", "Watch", "wait_any"]

#: How long to wait before trying again after ZooKeeper refused or was unreachable.
RETRY_S = 0.5


class _Waiter:
    """One task parked in one or more Signals; woken once, by the first to be set."""

    __slots__ = ("task", "woken")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.woken = False

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            trio.lowlevel.reschedule(self.task)


class Signal:
    """A one-shot event (``set``, ``is_set``, ``wait``, as ``trio.Event``) that one task
    can wait on together with other Signals (:func:`wait_any`) without a task each."""

    __slots__ = ("_flag", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        #: Parked waiters, in arrival order (a dict: deterministic wake order, which a
        #: simulation's replay needs; a set of objects would iterate by address).
        self._waiters: dict[_Waiter, None] = {}

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every task waiting on it (idempotent)."""
        if self._flag:
            return
        self._flag = True
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            waiter.wake()

    async def wait(self) -> None:
        """Return once set (at once, after a checkpoint, if it is)."""
        if self._flag:
            await trio.lowlevel.checkpoint()
            return
        await _park((self,))

    def statistics(self) -> trio.EventStatistics:
        return trio.EventStatistics(tasks_waiting=len(self._waiters))


#: What a cluster task may wait on: a Signal, or a plain trio.Event (a task of its own
#: in wait_any).
Watch = Signal | trio.Event


async def _park(signals: tuple[Signal, ...] | list[Signal]) -> None:
    """Block the current task until one of ``signals`` (none set yet) is set."""
    waiter = _Waiter(trio.lowlevel.current_task())
    for signal in signals:
        signal._waiters[waiter] = None

    def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        waiter.woken = True  # a later set() must not reschedule a task that went on
        return trio.lowlevel.Abort.SUCCEEDED

    try:
        await trio.lowlevel.wait_task_rescheduled(abort)
    finally:
        for signal in signals:
            signal._waiters.pop(waiter, None)


async def wait_any(*events: Watch) -> None:
    """Return as soon as one of ``events`` is set.

    Signals cost no task: the caller parks in each of them. Each plain ``trio.Event``
    costs a helper task that sets a Signal of this call when its event is set."""
    if any(event.is_set() for event in events):
        await trio.lowlevel.checkpoint()
        return
    signals = [e for e in events if isinstance(e, Signal)]
    plain = [e for e in events if not isinstance(e, Signal)]
    if not plain:
        await _park(signals)
        return
    if not signals and len(plain) == 1:
        await plain[0].wait()
        return
    any_plain = Signal()
    async with trio.open_nursery() as nursery:
        for event in plain:

            async def wait_then_set(e: trio.Event = event) -> None:
                await e.wait()
                any_plain.set()

            nursery.start_soon(wait_then_set)
        await _park([*signals, any_plain])
        nursery.cancel_scope.cancel()
