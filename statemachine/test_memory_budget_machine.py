"""The broker's memory budget (server/memory_budget.py) against a plain model.

``queued.max.request.bytes``: a connection that reads a request while the bytes of
requests read and not yet handled reach the budget mutes (MEMORY_PRESSURE) and asks to
be told when memory frees; handled requests release their bytes. The whole-broker
machine's ``TightMemoryBroker`` runs the wiring with a budget of one byte; this machine
runs the budget's own rules with any sizes, several connections and requests of each
in flight:

1. an acquisition reports the budget exhausted exactly when the bytes in use reach it;
2. a connection waiting is told exactly once, at the first release that leaves the
   bytes in use below the budget, and never while they are at or above it;
3. a connection that stopped waiting (closed, or unmuted another way) is never told;
4. the bytes in use are what was acquired and not released; the peak is their maximum.
"""

from __future__ import annotations

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.server.memory_budget import MemoryBudget

CONNECTIONS = (0, 1, 2)


class Waiter:
    def __init__(self) -> None:
        self.told = 0

    def memory_available(self) -> None:
        self.told += 1


class MemoryBudgetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limit = 10
        self.budget = MemoryBudget(self.limit)
        self.waiters = {c: Waiter() for c in CONNECTIONS}
        #: The model: requests read and not handled (sizes), who waits, the peak.
        self.queued: list[int] = []
        self.waiting: set[int] = set()
        self.told = dict.fromkeys(CONNECTIONS, 0)
        self.peak = 0

    @rule(size=st.integers(0, 12))
    def request_read(self, size: int) -> None:
        exhausted = self.budget.acquire(size)
        self.queued.append(size)
        self.peak = max(self.peak, sum(self.queued))
        note(f"read {size}: in use {sum(self.queued)} -> exhausted={exhausted}")
        assert exhausted == (sum(self.queued) >= self.limit)

    @rule(c=st.sampled_from(CONNECTIONS))
    def connection_mutes(self, c: int) -> None:
        self.budget.notify_when_available(self.waiters[c])
        self.waiting.add(c)

    @rule(c=st.sampled_from(CONNECTIONS))
    def connection_stops_waiting(self, c: int) -> None:
        self.budget.forget(self.waiters[c])
        self.waiting.discard(c)

    @precondition(lambda self: bool(self.queued))
    @rule(which=st.integers(0, 20))
    def request_handled(self, which: int) -> None:
        size = self.queued.pop(which % len(self.queued))
        self.budget.release(size)
        note(f"handled {size}: in use {sum(self.queued)}")
        if self.waiting and sum(self.queued) < self.limit:
            for c in self.waiting:
                self.told[c] += 1
            self.waiting.clear()

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.budget.in_use == sum(self.queued)
        assert self.budget.peak == self.peak
        assert {c: w.told for c, w in self.waiters.items()} == self.told


TestMemoryBudget = MemoryBudgetMachine.TestCase
TestMemoryBudget.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
