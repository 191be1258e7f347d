"""Group commit's bookkeeping (trio_broker/storage/group_commit.py) against a plain model.

The flusher (server/flusher.py) batches fsyncs: an acks=all produce waits until the
log's durable end passes its last offset, and one fsync releases every waiter it
covers. ``DurabilityTracker`` decides whom a flush releases; this machine appends,
adds and cancels waiters, and runs flushes that succeed (the durable end moving to any
point up to the log end) or fail, and states the rules directly:

1. a successful flush releases exactly the waiters whose offset is below the new
   durable end (a record at offset o is durable once the durable end is above o), and
   every one of them;
2. a failed flush releases every waiter (each then finds the log offline);
3. a waiter that gave up is never released; a flush is needed while anyone waits or
   an append is not yet covered (the default policy: no flush.messages/flush.ms);
4. the flusher's own ``wait_durable`` (server/flusher.py), asked for an offset at the
   durable end or one either side: it returns at once exactly when the durable end is
   past the offset (its fast path), and otherwise waits (no flush runs here: a mock
   second later it is still waiting).
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.server.flusher import Flusher
from trio_broker.storage.group_commit import DurabilityTracker


@attrs.define
class LogEnds:
    """What the flusher reads of a log before it waits."""

    durable_end_offset: int
    log_end_offset: int
    offline: bool = False

    def flush(self) -> int:  # pragma: no cover - no flush runs in rule 4
        raise AssertionError("rule 4 runs no flush")


class Token:
    """What the flusher wakes a waiter with (a trio.Event there)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __repr__(self) -> str:
        return f"Token({self.offset})"


class GroupCommitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tracker: DurabilityTracker[Token] = DurabilityTracker()
        self.log_end = 0
        self.durable_end = 0
        self.waiting: list[Token] = []
        self.uncovered = 0  # appends no flush has begun to cover
        self.covered: int | None = None  # a flush in progress: how many it covers

    @rule(records=st.integers(1, 3), wait=st.booleans())
    def append(self, records: int, wait: bool) -> None:
        """A produce appends; with acks=all it waits for its last offset."""
        self.log_end += records
        self.tracker.note_append(0, records)
        self.uncovered += 1
        if wait:
            token = Token(self.log_end - 1)
            self.tracker.add_waiter(token.offset, token)
            self.waiting.append(token)

    @rule(which=st.integers(0, 10))
    def waiter_gives_up(self, which: int) -> None:
        if not self.waiting:
            return
        token = self.waiting.pop(which % len(self.waiting))
        self.tracker.discard_waiter(token)

    @rule()
    def flush_begins(self) -> None:
        if self.covered is not None:
            return
        self.covered = self.tracker.begin_flush()
        assert self.covered == self.uncovered
        self.uncovered = 0

    @rule(where=st.floats(0, 1), at_waiter=st.none() | st.sampled_from([-1, 0, 1]))
    def flush_ends(self, where: float, at_waiter: int | None) -> None:
        """The fsync returns; the durable end moves somewhere up to the log end (a flush
        covers what was written before it began, and maybe more). ``at_waiter``: onto
        the oldest waiter's offset (or one either side) instead, rule 1's boundary."""
        if self.covered is None:
            return
        new_end = self.durable_end + round(where * (self.log_end - self.durable_end))
        if at_waiter is not None and self.waiting:
            oldest = min(t.offset for t in self.waiting) + at_waiter
            new_end = min(max(oldest, self.durable_end), self.log_end)
        released = self.tracker.end_flush(new_end, self.covered)
        self.covered, self.durable_end = None, new_end
        expected = [t for t in self.waiting if t.offset < new_end]
        note(f"durable end {new_end}: released {released}, expected {expected}")
        assert sorted(map(id, released)) == sorted(map(id, expected)), (released, expected)
        self.waiting = [t for t in self.waiting if t.offset >= new_end]

    @rule(delta=st.sampled_from([-1, 0, 1]))
    def flusher_asked(self, delta: int) -> None:
        """Rule 4: ``Flusher.wait_durable`` for the durable end + ``delta``."""
        offset = self.durable_end + delta
        if not 0 <= offset < self.log_end:
            return
        log = LogEnds(self.durable_end, self.log_end)
        flusher = Flusher(clock_ms=lambda: 0, inline=True)
        returned = []

        async def ask() -> None:
            with trio.move_on_after(1):
                await flusher.wait_durable(log, offset)
                returned.append(offset)

        trio.run(ask, clock=trio.testing.MockClock(autojump_threshold=0))
        assert bool(returned) == (offset < self.durable_end), (
            f"wait_durable({offset}) with the durable end at {self.durable_end}: "
            f"{'returned' if returned else 'still waiting'}"
        )

    @rule()
    def flush_fails(self) -> None:
        if self.covered is None:
            return
        released = self.tracker.fail()
        assert sorted(map(id, released)) == sorted(map(id, self.waiting))
        self.waiting, self.covered = [], None

    @invariant()
    def waiting_and_flush_needed(self) -> None:
        assert self.tracker.waiters == len(self.waiting)
        assert self.tracker.needs_flush(0) == bool(self.waiting or self.uncovered)


#: pytest-timeout's guard against a hang, not a budget: planted slips at load 15-18
#: were stopped by the 300 s default while the failure shrank (the sixteenth round).
pytestmark = pytest.mark.timeout(1200)
TestGroupCommitMachine = GroupCommitMachine.TestCase
TestGroupCommitMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
