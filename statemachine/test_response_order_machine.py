"""ResponseSequencer against the reference model in spec/response_order_model.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.state.response_order import IllegalCompletion, ResponseSequencer

# spec/ is a folder of the repository, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.response_order_model import ResponseOrderModel

correlation_ids = st.integers(-(2**31), 2**31 - 1)


class ResponseOrderMachine(RuleBasedStateMachine):
    def __init__(self, sequencer: ResponseSequencer[str] | None = None) -> None:
        super().__init__()
        self.sequencer = sequencer if sequencer is not None else ResponseSequencer[str]()
        self.model = ResponseOrderModel()
        self.correlation_ids: list[int] = []  # by slot
        self.responses: dict[int, str | None] = {}  # what each completed slot was given
        self.released: list[int] = []

    def waiting(self) -> list[int]:
        return [slot for slot, done, _ in self.model.entries if not done]

    @rule(correlation_id=correlation_ids)
    def register(self, correlation_id: int) -> None:
        slot = self.sequencer.register(correlation_id)
        note(f"register({correlation_id}) -> slot {slot}")
        assert slot == self.model.register()
        self.correlation_ids.append(correlation_id)

    @precondition(lambda self: self.waiting())
    @rule(data=st.data(), no_response=st.booleans())
    def complete(self, data: st.DataObject, no_response: bool) -> None:
        slot = data.draw(st.sampled_from(self.waiting()), label="slot")
        # acks=0 Produce: no response, but the slot still has to be released in turn.
        response = None if no_response else f"response to {self.correlation_ids[slot]}"
        note(f"complete({slot}, {response!r})")
        self.sequencer.complete(slot, response)
        self.model.complete(slot, response)
        self.responses[slot] = response

    @rule(data=st.data())
    def complete_illegal(self, data: st.DataObject) -> None:
        done = [slot for slot in range(self.model.next_slot) if slot not in self.waiting()]
        unknown = st.integers(self.model.next_slot, self.model.next_slot + 3) | st.integers(-3, -1)
        slot = data.draw(st.sampled_from(done) | unknown if done else unknown, label="slot")
        assert not self.model.can_complete(slot)
        before = self.sequencer.statistics()
        with pytest.raises(IllegalCompletion):
            self.sequencer.complete(slot, "late")
        assert self.sequencer.statistics() == before

    @rule()
    def pop_ready(self) -> None:
        ready = self.sequencer.pop_ready()
        note(f"pop_ready() -> {ready}")
        assert ready == self.model.pop_ready()
        for slot, response in ready:
            assert response == self.responses[slot]
        self.released.extend(slot for slot, _ in ready)

    @invariant()
    def released_in_request_order_without_gaps(self) -> None:
        # Each slot released once, and only after every earlier one.
        assert self.released == list(range(len(self.released)))

    @invariant()
    def counts_match(self) -> None:
        stats = self.sequencer.statistics()
        assert self.sequencer.in_flight == stats.in_flight == self.model.in_flight
        assert stats.completed_waiting == sum(done for _, done, _ in self.model.entries)
        head = self.model.entries[0][0] if self.model.entries else None
        assert stats.head_correlation_id == (None if head is None else self.correlation_ids[head])

    def teardown(self) -> None:
        # Finish everything, newest first (the worst order), then nothing may be lost.
        for slot in reversed(self.waiting()):
            self.sequencer.complete(slot, None)
            self.model.complete(slot, None)
        ready = self.sequencer.pop_ready()
        assert ready == self.model.pop_ready()
        self.released.extend(slot for slot, _ in ready)
        assert self.released == list(range(len(self.correlation_ids)))
        assert self.sequencer.in_flight == 0


TestResponseOrderMachine = ResponseOrderMachine.TestCase
TestResponseOrderMachine.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
