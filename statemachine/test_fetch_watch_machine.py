"""The long-poll registry (trio_broker/state/fetch_watch.py) against a plain model.

A waiting fetch watches the partitions it reads; a change to one is noted for its
waiters and wakes those with nothing pending; a woken waiter looks (``take``) and goes
back to waiting or answers (``forget``). The model keeps, per waiter, what it watches
and what changed since its last look, and states the rules directly:

1. a touch wakes exactly the waiters that watch the partition and had nothing pending;
2. a look returns exactly the partitions touched (or all, at shutdown) since the
   previous one, and then nothing is pending: the next touch wakes the waiter again;
3. a waiter is never told of, nor woken by, a partition it does not watch, and a
   waiter that was forgotten is neither.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.state.fetch_watch import PartitionWatch

KEYS = ("a", "b", "c", "d")
WAITERS = (1, 2, 3)


class FetchWatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.watch: PartitionWatch[str, int] = PartitionWatch()
        self.watching: dict[int, frozenset[str]] = {}
        self.pending: dict[int, set[str]] = {}

    @rule(waiter=st.sampled_from(WAITERS), keys=st.frozensets(st.sampled_from(KEYS)))
    def fetch_waits(self, waiter: int, keys: frozenset[str]) -> None:
        self.watch.watch(waiter, keys)
        self.watching[waiter], self.pending[waiter] = keys, set()

    @rule(waiter=st.sampled_from(WAITERS))
    def fetch_answers(self, waiter: int) -> None:
        self.watch.forget(waiter)
        self.watching.pop(waiter, None)
        self.pending.pop(waiter, None)

    @rule(key=st.sampled_from(KEYS))
    def partition_changes(self, key: str) -> None:
        woken = self.watch.touch(key)
        expected = {w for w, keys in self.watching.items() if key in keys and not self.pending[w]}
        assert sorted(woken) == sorted(expected), (key, woken, expected)
        for waiter, keys in self.watching.items():
            if key in keys:
                self.pending[waiter].add(key)

    @rule()
    def broker_shuts_down(self) -> None:
        woken = self.watch.touch_all()
        assert sorted(woken) == sorted(w for w in self.watching if not self.pending[w])
        for waiter, keys in self.watching.items():
            self.pending[waiter].update(keys)

    @rule(waiter=st.sampled_from(WAITERS))
    def fetch_looks(self, waiter: int) -> None:
        got = set(self.watch.take(waiter))
        assert got == self.pending.get(waiter, set()), (waiter, got, self.pending.get(waiter))
        if waiter in self.pending:
            self.pending[waiter] = set()

    @invariant()
    def registered_as_the_model(self) -> None:
        assert len(self.watch) == len(self.watching)
        for waiter, keys in self.watching.items():
            assert self.watch.watching(waiter) == keys


TestFetchWatchMachine = FetchWatchMachine.TestCase
TestFetchWatchMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
