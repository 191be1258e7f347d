"""wait_any over Signals parks the waiting task in each of them: no task per event
(issue 33), the first set() wakes it, a cancelled wait leaves no waiter behind, and a
plain trio.Event beside Signals still works (a helper task for it alone)."""

from __future__ import annotations

import trio
import trio.testing

from trio_broker.cluster.waiting import Signal, wait_any


class Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def test_wait_any_over_signals_spawns_no_task_and_wakes_on_the_first_set() -> None:
    signals = [Signal() for _ in range(5)]
    woke: list[bool] = []
    spawns = Spawns()
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            await wait_any(*signals)
            woke.append(True)

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(spawns)
        assert [s.statistics().tasks_waiting for s in signals] == [1] * 5
        signals[3].set()
    trio.lowlevel.remove_instrument(spawns)
    assert woke == [True] and spawns.count == 0
    # Woken by one, it left every other signal's waiters.
    assert [s.statistics().tasks_waiting for s in signals] == [0] * 5


async def test_a_cancelled_wait_any_leaves_no_waiter_and_a_later_set_is_harmless() -> None:
    a, b = Signal(), Signal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_any, a, b)
        await trio.testing.wait_all_tasks_blocked()
        assert a.statistics().tasks_waiting == 1
        nursery.cancel_scope.cancel()
    assert a.statistics().tasks_waiting == b.statistics().tasks_waiting == 0
    a.set()
    await a.wait()  # set: returns at once
    await wait_any(a, b)


async def test_a_plain_event_beside_signals_wakes_wait_any() -> None:
    signal, event = Signal(), trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_any, signal, event)
        await trio.testing.wait_all_tasks_blocked()
        event.set()
    assert not signal.is_set()
