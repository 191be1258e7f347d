"""Reference model of connection mute: a plain set of reasons and four sentences.

1. Each event but CLOSE owns one reason: it either sets it or clears it.
2. Setting a reason that is already set, or clearing one that is not, is illegal.
3. CLOSE is always legal and leaves only CLOSING; after it, only CLOSE is legal.
4. The connection is readable iff no reason is set.
5. The serial model takes a request only from a readable connection.
6. A connection runs one model: no in-flight cap while a serial response is pending.

``trio_broker.state.mute`` is checked against this: by the Hypothesis machine in
``statemachine/test_mute_machine.py`` and by CrossHair through :func:`refines`.
"""

from __future__ import annotations

from trio_broker.state.mute import (
    IllegalMuteTransition,
    KafkaChannelState,
    MuteEvent,
    MuteReason,
    next_reasons,
)

E, R = MuteEvent, MuteReason

SETS = {
    E.REQUEST_RECEIVED_SERIAL: R.RESPONSE_PENDING,
    E.IN_FLIGHT_FULL: R.IN_FLIGHT_LIMIT,
    E.MEMORY_EXHAUSTED: R.MEMORY_PRESSURE,
    E.THROTTLE_STARTED: R.THROTTLED,
    E.SASL_REQUEST_READ: R.AUTHENTICATING,
}
CLEARS = {
    E.RESPONSE_SENT: R.RESPONSE_PENDING,
    E.IN_FLIGHT_AVAILABLE: R.IN_FLIGHT_LIMIT,
    E.MEMORY_AVAILABLE: R.MEMORY_PRESSURE,
    E.THROTTLE_ENDED: R.THROTTLED,
    E.SASL_REQUEST_HANDLED: R.AUTHENTICATING,
}


def model_step(reasons: frozenset[MuteReason], event: MuteEvent) -> frozenset[MuteReason] | None:
    """The reasons after ``event``, or None if the event is illegal."""
    if R.CLOSING in reasons:
        return frozenset({R.CLOSING}) if event is E.CLOSE else None
    if event is E.CLOSE:
        return frozenset({R.CLOSING})
    if event is E.REQUEST_RECEIVED_SERIAL and reasons:
        return None
    if event is E.IN_FLIGHT_FULL and R.RESPONSE_PENDING in reasons:
        return None
    if event in SETS:
        reason = SETS[event]
        return None if reason in reasons else reasons | {reason}
    reason = CLEARS[event]
    return reasons - {reason} if reason in reasons else None


def model_kafka_state(reasons: frozenset[MuteReason]) -> KafkaChannelState:
    """Kafka's name, spelled as a lookup on (response pending, throttled)."""
    if not reasons:
        return KafkaChannelState.NOT_MUTED
    return {
        (False, False): KafkaChannelState.MUTED,
        (True, False): KafkaChannelState.MUTED_AND_RESPONSE_PENDING,
        (False, True): KafkaChannelState.MUTED_AND_THROTTLED,
        (True, True): KafkaChannelState.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING,
    }[R.RESPONSE_PENDING in reasons, R.THROTTLED in reasons]


def refines(reasons: frozenset[MuteReason], event: MuteEvent) -> bool:
    """The implementation does exactly what the model does, for every input.

    post: __return__
    """
    try:
        actual: frozenset[MuteReason] | None = next_reasons(reasons, event)
    except IllegalMuteTransition:
        actual = None
    return actual == model_step(reasons, event)
