"""Timed wakes without cancel scopes, for the simulation's own waits.

In Trio a timed wait is a cancel scope with a deadline: entered and left around every
wait, and when the deadline comes a ``Cancelled`` is raised into the task and caught
again. The simulation makes hundreds of timed waits a schedule of its own (the
network's deliveries, the simulated clients' pauses, the checker's rounds), so its
clock (sim/cluster.py ``virtual_clock``) keeps a heap of wake-ups beside Trio's
deadlines: it jumps to the earlier of the two, and wakes the tasks parked here
(``reschedule``) with those whose deadlines came, in the same batch. Under any other
clock (a test's ``MockClock``) these waits fall back to Trio's.

The broker's own waits stay Trio's: what the simulation runs of the broker is its
real code.
"""

from __future__ import annotations

import heapq
import itertools
import math

import trio
import trio._core._run as trio_run
import trio.testing

__all__ = [
    "WakeTimers", "current_timers", "park", "sleep", "sleep_until", "virtual_clock", "wake",
]  # fmt: skip

#: A parked task, or None once it was woken or cancelled: a heap entry holding a
#: cleared one is stale and skipped.
Parked = list[trio.lowlevel.Task | None]


class WakeTimers:
    """Wake-ups: (due time, sequence, parked task) in a heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Parked]] = []
        self._sequence = itertools.count()

    def add(self, due: float, parked: Parked) -> None:
        heapq.heappush(self._heap, (due, next(self._sequence), parked))

    def next_due(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def fire(self, now: float) -> None:
        """Wake the tasks whose time came (by ``now``)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            wake(heapq.heappop(heap)[2])


def current_timers() -> WakeTimers | None:
    """The running simulation clock's wake-ups; None under another clock."""
    timers: WakeTimers | None = getattr(trio.lowlevel.current_clock(), "wake_timers", None)
    return timers


def wake(parked: Parked) -> None:
    """Wake the task parked in ``parked``, if it still waits."""
    task = parked[0]
    if task is not None:
        parked[0] = None
        trio.lowlevel.reschedule(task)


async def park(timers: WakeTimers, until: float, parked: Parked) -> None:
    """Wait until ``until`` (inf: no time) or :func:`wake` (cancellable, as any wait).
    ``parked`` holds the current task; others may add earlier wake-ups for it."""
    if until < math.inf:
        timers.add(until, parked)

    def abort(_: object) -> trio.lowlevel.Abort:
        parked[0] = None
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


async def sleep_until(deadline: float) -> None:
    """``trio.sleep_until``, on the simulation clock's wake-ups where it runs."""
    timers = current_timers()
    if timers is None:
        await trio.sleep_until(deadline)
    elif deadline <= trio.current_time():
        await trio.lowlevel.checkpoint()
    else:
        await park(timers, deadline, [trio.lowlevel.current_task()])


async def sleep(seconds: float) -> None:
    """``trio.sleep``, on the simulation clock's wake-ups where it runs."""
    await sleep_until(trio.current_time() + seconds)


def virtual_clock() -> trio.testing.MockClock:
    """``MockClock(autojump_threshold=0)`` made cheaper to read. The simulation never
    lets it follow the wall clock (rate 0), so its time is its virtual base, without the
    ``perf_counter`` call and arithmetic (trio reads the time about 10,000 times a
    schedule); its autojump takes the next deadline from the run's deadlines instead of
    assembling ``current_statistics()``, and expires the deadlines it reached at once.
    It also keeps the simulation's own wake-ups (``clock.wake_timers``, above): it
    jumps to the earlier of Trio's next deadline and the next wake-up, and wakes the
    tasks parked there with those whose deadlines came; a parked wait and a Trio
    deadline for the same instant wake in the same batch, so the runs are the ones
    Trio's own sleeps made (seeds 0-29: every task step at the same virtual time).
    (MockClock cannot be subclassed: the instance's methods are replaced.)"""
    clock = trio.testing.MockClock(autojump_threshold=0)
    timers = WakeTimers()

    def current_time() -> float:
        return clock._virtual_base

    def deadline_to_sleep_time(deadline: float) -> float:
        return 0 if deadline <= clock._virtual_base else 999999999

    def autojump() -> None:
        # Called by the run loop when every task waits. Besides jumping, it expires the
        # deadlines the jump reached, so their tasks run in this pass of the loop; trio
        # would expire them at the start of the next pass, which does nothing else here
        # (no I/O): one scheduler pass less per virtual instant. The parked tasks whose
        # wake-ups came run in the same batch (its order is the seeded shuffle's).
        runner = trio_run.GLOBAL_RUN_CONTEXT.runner
        target = min(runner.deadlines.next_deadline(), timers.next_due())
        if target == math.inf:
            return
        if target > clock._virtual_base:
            clock._virtual_base = target
            runner.deadlines.expire(target)
        timers.fire(clock._virtual_base)

    clock.current_time = current_time  # type: ignore[method-assign]
    clock.deadline_to_sleep_time = deadline_to_sleep_time  # type: ignore[method-assign]
    clock._autojump = autojump  # type: ignore[method-assign]
    clock.wake_timers = timers  # type: ignore[attr-defined]
    return clock
