"""Worked examples for ChannelMute and ResponseSequencer, and the docs' diagram."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from trio_broker.state.mute import (
    ChannelMute,
    IllegalMuteTransition,
    KafkaChannelState,
    MuteEvent,
    MuteReason,
    StateMachineError,
)
from trio_broker.state.response_order import IllegalCompletion, ResponseSequencer

E, R, K = MuteEvent, MuteReason, KafkaChannelState
ROOT = Path(__file__).resolve().parents[3]


def _states(mute: ChannelMute, events: list[MuteEvent]) -> list[KafkaChannelState]:
    seen = []
    for event in events:
        mute.handle(event)
        seen.append(mute.kafka_state)
    return seen


def test_serial_request_with_throttle_walks_kafkas_states() -> None:
    # Kafka's order: the throttle starts while the response is pending.
    mute = ChannelMute()
    assert mute.readable and mute.kafka_state is K.NOT_MUTED
    events = [E.REQUEST_RECEIVED_SERIAL, E.THROTTLE_STARTED, E.RESPONSE_SENT, E.THROTTLE_ENDED]
    assert _states(mute, events) == [
        K.MUTED_AND_RESPONSE_PENDING,
        K.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
        K.MUTED_AND_THROTTLED,
        K.NOT_MUTED,
    ]
    assert mute.readable


def test_serial_model_refuses_second_request_and_muted_reads() -> None:
    mute = ChannelMute()
    mute.handle(E.REQUEST_RECEIVED_SERIAL)
    with pytest.raises(IllegalMuteTransition, match="REQUEST_RECEIVED_SERIAL"):
        mute.handle(E.REQUEST_RECEIVED_SERIAL)
    mute.handle(E.RESPONSE_SENT)
    mute.handle(E.MEMORY_EXHAUSTED)
    with pytest.raises(IllegalMuteTransition):
        mute.handle(E.REQUEST_RECEIVED_SERIAL)  # only a readable connection is read


def test_reasons_are_independent() -> None:
    mute = ChannelMute()
    for event in (E.IN_FLIGHT_FULL, E.MEMORY_EXHAUSTED, E.THROTTLE_STARTED):
        mute.handle(event)
    assert mute.kafka_state is K.MUTED_AND_THROTTLED
    mute.handle(E.THROTTLE_ENDED)
    mute.handle(E.IN_FLIGHT_AVAILABLE)
    assert not mute.readable and mute.reasons == {R.MEMORY_PRESSURE}
    assert mute.kafka_state is K.MUTED
    mute.handle(E.MEMORY_AVAILABLE)
    assert mute.readable


def test_models_do_not_mix() -> None:
    mute = ChannelMute()
    mute.handle(E.REQUEST_RECEIVED_SERIAL)
    with pytest.raises(IllegalMuteTransition):
        mute.handle(E.IN_FLIGHT_FULL)
    with pytest.raises(IllegalMuteTransition):
        ChannelMute().handle(E.RESPONSE_SENT)  # nothing pending


@pytest.mark.parametrize("first", [E.IN_FLIGHT_FULL, E.REQUEST_RECEIVED_SERIAL, E.CLOSE])
def test_close_is_terminal_and_idempotent(first: MuteEvent) -> None:
    mute = ChannelMute()
    mute.handle(first)
    mute.handle(E.CLOSE)
    mute.handle(E.CLOSE)
    assert mute.reasons == {R.CLOSING} and mute.closing
    assert mute.kafka_state is K.MUTED
    for event in MuteEvent:
        if event is not E.CLOSE:
            with pytest.raises(IllegalMuteTransition):
                mute.handle(event)
    assert mute.reasons == {R.CLOSING}


def test_illegal_transition_is_a_state_machine_error_and_says_why() -> None:
    mute = ChannelMute()
    with pytest.raises(StateMachineError) as info:
        mute.handle(E.THROTTLE_ENDED)
    assert isinstance(info.value, IllegalMuteTransition)
    assert info.value.event is E.THROTTLE_ENDED and info.value.reasons == frozenset()
    assert str(info.value) == "THROTTLE_ENDED is illegal with mute reasons none"


def test_statistics_count_legal_events_and_each_reason() -> None:
    mute = ChannelMute()
    for _ in range(3):
        mute.handle(E.MEMORY_EXHAUSTED)
        mute.handle(E.MEMORY_AVAILABLE)
    with pytest.raises(IllegalMuteTransition):
        mute.handle(E.MEMORY_AVAILABLE)
    stats = mute.statistics()
    assert stats.events_handled == 6
    assert stats.times_set[R.MEMORY_PRESSURE] == 3 and stats.times_set[R.THROTTLED] == 0
    assert stats.readable and stats.kafka_state is K.NOT_MUTED and stats.reasons == frozenset()


def test_construction_accepts_only_reachable_states() -> None:
    assert ChannelMute({R.THROTTLED, R.MEMORY_PRESSURE}).reasons == {R.THROTTLED, R.MEMORY_PRESSURE}
    for unreachable in ({R.CLOSING, R.THROTTLED}, {R.RESPONSE_PENDING, R.IN_FLIGHT_LIMIT}):
        with pytest.raises(ValueError, match="not a reachable"):
            ChannelMute(frozenset(unreachable))


def test_sequencer_releases_in_request_order() -> None:
    seq = ResponseSequencer[bytes]()
    slots = [seq.register(cid) for cid in (7, 8, 9)]
    assert slots == [0, 1, 2] and seq.in_flight == 3
    seq.complete(2, b"c")
    seq.complete(1, b"b")
    assert seq.pop_ready() == []  # slot 0 holds both back
    assert seq.statistics().head_correlation_id == 7
    assert seq.statistics().completed_waiting == 2
    seq.complete(0, b"a")
    assert seq.pop_ready() == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert seq.in_flight == 0 and seq.statistics().head_correlation_id is None


def test_sequencer_no_response_request_does_not_block() -> None:
    seq = ResponseSequencer[str]()
    produce_acks0 = seq.register(1)
    seq.complete(produce_acks0, None)
    metadata = seq.register(2)
    seq.complete(metadata, "metadata")
    assert seq.pop_ready() == [(produce_acks0, None), (metadata, "metadata")]


def test_sequencer_rejects_double_unknown_and_released_slots() -> None:
    seq = ResponseSequencer[str]()
    slot = seq.register(42)
    seq.complete(slot, "x")
    with pytest.raises(IllegalCompletion, match="correlation id 42"):
        seq.complete(slot, "y")
    with pytest.raises(IllegalCompletion):
        seq.complete(slot + 1, "never registered")
    assert seq.pop_ready() == [(slot, "x")]
    with pytest.raises(IllegalCompletion):
        seq.complete(slot, "released already")
    assert isinstance(IllegalCompletion("x"), StateMachineError)


def _load_tool() -> ModuleType:
    path = ROOT / "tools" / "draw_mute_diagram.py"
    spec = importlib.util.spec_from_file_location("draw_mute_diagram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_show_the_current_diagram() -> None:
    tool = _load_tool()
    diagram = tool.render()
    assert diagram in (ROOT / "docs" / "mute.md").read_text(), (
        "docs/mute.md is stale: run python tools/draw_mute_diagram.py --write"
    )
    # The drawing covers the whole table: one edge per legal (state, event).
    from trio_broker.state.mute import TRANSITIONS

    assert diagram.count(" --> ") == len(TRANSITIONS) + 1  # + the initial [*] arrow
