"""ChannelMute against the reference model in spec/mute_model.py."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.state.mute import (
    REACHABLE_REASON_SETS,
    TRANSITIONS,
    ChannelMute,
    IllegalMuteTransition,
    MuteEvent,
    MuteReason,
    kafka_channel_state,
    next_reasons,
)

# spec/ is a folder of the repository, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.mute_model import model_kafka_state, model_step

E, R = MuteEvent, MuteReason
ALL_SUBSETS = [
    frozenset(combo) for n in range(len(R) + 1) for combo in itertools.combinations(R, n)
]


def _names(reasons: frozenset[MuteReason]) -> str:
    return "{" + ", ".join(r.name for r in R if r in reasons) + "}"


class MuteMachine(RuleBasedStateMachine):
    def __init__(self, mute: ChannelMute | None = None) -> None:
        super().__init__()
        self.mute = mute if mute is not None else ChannelMute()
        self.model: frozenset[MuteReason] = frozenset()
        self.legal_events = 0
        # Serial model bookkeeping: requests read whose response is not yet written.
        self.outstanding = 0
        self.closed = False

    @rule(event=st.sampled_from(MuteEvent))
    def handle(self, event: MuteEvent) -> None:
        expected = model_step(self.model, event)
        note(f"{_names(self.model)} --{event.name}--> {expected and _names(expected)}")
        assert TRANSITIONS.get((self.model, event)) == expected
        if expected is None:
            self.illegal(event)
            return
        self.mute.handle(event)
        self.model = expected
        self.legal_events += 1
        if event is E.REQUEST_RECEIVED_SERIAL:
            self.outstanding += 1
        elif event is E.RESPONSE_SENT:
            self.outstanding -= 1
        elif event is E.CLOSE:
            self.closed, self.outstanding = True, 0

    def illegal(self, event: MuteEvent) -> None:
        before = self.mute.statistics()
        with pytest.raises(IllegalMuteTransition) as info:
            self.mute.handle(event)
        assert (info.value.reasons, info.value.event) == (self.model, event)
        assert self.mute.statistics() == before

    @precondition(lambda self: self.outstanding == 1)
    @rule()
    def second_serial_request_is_refused(self) -> None:
        self.illegal(E.REQUEST_RECEIVED_SERIAL)

    @precondition(lambda self: self.closed)
    @rule(event=st.sampled_from([e for e in MuteEvent if e is not E.CLOSE]))
    def closed_refuses_everything_but_close(self, event: MuteEvent) -> None:
        self.illegal(event)

    @invariant()
    def matches_model(self) -> None:
        assert self.mute.reasons == self.model
        assert self.mute.reasons in REACHABLE_REASON_SETS
        assert self.mute.statistics().events_handled == self.legal_events

    @invariant()
    def readable_iff_no_reason(self) -> None:
        assert self.mute.readable == (not self.model)

    @invariant()
    def kafka_state_matches(self) -> None:
        assert self.mute.kafka_state is model_kafka_state(self.model)

    @invariant()
    def closing_is_absorbing(self) -> None:
        assert self.closed == (R.CLOSING in self.mute.reasons)
        if self.closed:
            assert self.mute.reasons == {R.CLOSING}

    @invariant()
    def serial_never_two_outstanding(self) -> None:
        assert self.outstanding in (0, 1)
        assert (self.outstanding == 1) == (R.RESPONSE_PENDING in self.mute.reasons)
        assert not {R.RESPONSE_PENDING, R.IN_FLIGHT_LIMIT} <= self.mute.reasons


TestMuteMachine = MuteMachine.TestCase
TestMuteMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("reasons", ALL_SUBSETS, ids=_names)
def test_every_reason_set_and_event_matches_model(reasons: frozenset[MuteReason]) -> None:
    for event in MuteEvent:
        expected = model_step(reasons, event)
        if expected is None:
            with pytest.raises(IllegalMuteTransition):
                next_reasons(reasons, event)
        else:
            assert next_reasons(reasons, event) == expected
        if reasons in REACHABLE_REASON_SETS:
            assert TRANSITIONS.get((reasons, event)) == expected
            mute = ChannelMute(reasons)
            if expected is None:
                with pytest.raises(IllegalMuteTransition):
                    mute.handle(event)
                assert mute.reasons == reasons
            else:
                mute.handle(event)
                assert mute.reasons == expected
    assert kafka_channel_state(reasons) is model_kafka_state(reasons)


def test_reachable_sets_are_what_the_model_reaches() -> None:
    start: frozenset[MuteReason] = frozenset()
    seen, frontier = {start}, [start]
    while frontier:
        reasons = frontier.pop()
        for event in MuteEvent:
            after = model_step(reasons, event)
            if after is not None and after not in seen:
                seen.add(after)
                frontier.append(after)
    assert set(REACHABLE_REASON_SETS) == seen
    # Open states: any mix of the five non-terminal reasons except both models at once.
    assert len(seen) == 32 - 8 + 1
