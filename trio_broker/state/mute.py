"""Connection mute: whether the broker may read the next request from a connection.

A connection is *readable* only while no mute reason is set. Each reason is set and
cleared by its own pair of events, so independent causes (a pending response, the
in-flight cap, the broker-wide memory budget, a quota throttle, a login step) never unmute each
other by accident. ``CLOSING`` is terminal.

The rules are data (:data:`RULES`, one per event); :func:`next_reasons` applies one and
:data:`TRANSITIONS` is the full table over every reachable reason set, which
``tools/draw_mute_diagram.py`` draws into ``docs/mute.md``. Pure and sync: no trio here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

__all__ = [
    "ALL_REASONS",
    "REACHABLE_REASON_SETS",
    "RULES",
    "TRANSITIONS",
    "ChannelMute",
    "IllegalMuteTransition",
    "KafkaChannelState",
    "MuteEvent",
    "MuteReason",
    "MuteRule",
    "MuteStatistics",
    "StateMachineError",
    "kafka_channel_state",
    "next_reasons",
]


class StateMachineError(Exception):
    """A state machine was asked for a transition its rules do not allow.

    Always a broker bug (the I/O shell drove a machine wrongly), never a client's fault.
    """


class MuteReason(enum.Enum):
    """Why a connection is not read. Any one of them mutes it."""

    #: Serial model: a request was read and its response is not yet written.
    RESPONSE_PENDING = "response_pending"
    #: Pipelined model: the per-connection cap of unanswered requests is reached.
    IN_FLIGHT_LIMIT = "in_flight_limit"
    #: The broker-wide budget of queued request bytes is used up.
    MEMORY_PRESSURE = "memory_pressure"
    #: A quota was exceeded; the response told the client how long to back off (KIP-219).
    THROTTLED = "throttled"
    #: A SASL request (SaslHandshake, SaslAuthenticate) is being handled: the next
    #: request is read only once the login step is done, so it is authorized as
    #: whoever the step made the connection (Kafka's authenticator reads one at a time).
    AUTHENTICATING = "authenticating"
    #: The connection is being torn down; terminal.
    CLOSING = "closing"


class MuteEvent(enum.Enum):
    """What the connection's I/O shell reports. Each sets or clears one reason."""

    REQUEST_RECEIVED_SERIAL = "request_received_serial"
    RESPONSE_SENT = "response_sent"
    IN_FLIGHT_FULL = "in_flight_full"
    IN_FLIGHT_AVAILABLE = "in_flight_available"
    MEMORY_EXHAUSTED = "memory_exhausted"
    MEMORY_AVAILABLE = "memory_available"
    THROTTLE_STARTED = "throttle_started"
    THROTTLE_ENDED = "throttle_ended"
    SASL_REQUEST_READ = "sasl_request_read"
    SASL_REQUEST_HANDLED = "sasl_request_handled"
    CLOSE = "close"


class KafkaChannelState(enum.Enum):
    """Kafka's own names for a channel's mute state, for logs and for readers of Kafka."""

    NOT_MUTED = "NOT_MUTED"
    MUTED = "MUTED"
    MUTED_AND_RESPONSE_PENDING = "MUTED_AND_RESPONSE_PENDING"
    MUTED_AND_THROTTLED = "MUTED_AND_THROTTLED"
    MUTED_AND_THROTTLED_AND_RESPONSE_PENDING = "MUTED_AND_THROTTLED_AND_RESPONSE_PENDING"


ALL_REASONS: frozenset[MuteReason] = frozenset(MuteReason)
_NO_REASONS: frozenset[MuteReason] = frozenset()
_CLOSED: frozenset[MuteReason] = frozenset({MuteReason.CLOSING})


class IllegalMuteTransition(StateMachineError):
    """``event`` is not allowed while ``reasons`` are set."""

    def __init__(self, reasons: frozenset[MuteReason], event: MuteEvent) -> None:
        names = sorted(r.name for r in reasons) or ["none"]
        super().__init__(f"{event.name} is illegal with mute reasons {', '.join(names)}")
        self.reasons = reasons
        self.event = event


@attrs.frozen
class MuteRule:
    """What one event needs and does: ``(reasons - clears) | sets`` if legal."""

    #: Reasons that must already be set (you can only clear what is there).
    requires: frozenset[MuteReason]
    #: Reasons that must not be set (setting twice means two owners think they own it).
    forbids: frozenset[MuteReason]
    clears: frozenset[MuteReason]
    sets: frozenset[MuteReason]


def _setting(reason: MuteReason, *, unless: frozenset[MuteReason] = _NO_REASONS) -> MuteRule:
    return MuteRule(
        requires=_NO_REASONS,
        forbids=frozenset({reason, MuteReason.CLOSING}) | unless,
        clears=_NO_REASONS,
        sets=frozenset({reason}),
    )


def _clearing(reason: MuteReason) -> MuteRule:
    return MuteRule(
        requires=frozenset({reason}),
        forbids=_CLOSED,
        clears=frozenset({reason}),
        sets=_NO_REASONS,
    )


#: The whole machine: every rule that affects mute lives here.
RULES: Mapping[MuteEvent, MuteRule] = MappingProxyType(
    {
        # Serial model (Kafka's default): a request is taken only from a readable
        # connection and mutes it until its response is written, so a connection never
        # has two requests outstanding.
        MuteEvent.REQUEST_RECEIVED_SERIAL: _setting(
            MuteReason.RESPONSE_PENDING, unless=ALL_REASONS
        ),
        MuteEvent.RESPONSE_SENT: _clearing(MuteReason.RESPONSE_PENDING),
        # Pipelined model: keep reading until the per-connection in-flight cap. A pending
        # serial response already is a cap of one; a cap on top of it would mean the
        # shell drives one connection with both models.
        MuteEvent.IN_FLIGHT_FULL: _setting(
            MuteReason.IN_FLIGHT_LIMIT, unless=frozenset({MuteReason.RESPONSE_PENDING})
        ),
        MuteEvent.IN_FLIGHT_AVAILABLE: _clearing(MuteReason.IN_FLIGHT_LIMIT),
        MuteEvent.MEMORY_EXHAUSTED: _setting(MuteReason.MEMORY_PRESSURE),
        MuteEvent.MEMORY_AVAILABLE: _clearing(MuteReason.MEMORY_PRESSURE),
        MuteEvent.THROTTLE_STARTED: _setting(MuteReason.THROTTLED),
        MuteEvent.THROTTLE_ENDED: _clearing(MuteReason.THROTTLED),
        MuteEvent.SASL_REQUEST_READ: _setting(MuteReason.AUTHENTICATING),
        MuteEvent.SASL_REQUEST_HANDLED: _clearing(MuteReason.AUTHENTICATING),
        # Closing wins over everything and forgets the other reasons: nothing will
        # clear them any more, and a single terminal state keeps the table small.
        MuteEvent.CLOSE: MuteRule(
            requires=_NO_REASONS, forbids=_NO_REASONS, clears=ALL_REASONS, sets=_CLOSED
        ),
    }
)


def next_reasons(reasons: frozenset[MuteReason], event: MuteEvent) -> frozenset[MuteReason]:
    """The mute reasons after ``event``, or :class:`IllegalMuteTransition`.

    Total over all 2**6 reason sets, reachable or not, so it can be checked exhaustively.
    The contracts (few, because CrossHair spends its whole timeout on each one):
    CLOSING is entered only by CLOSE, never left, and never shares the set; every
    other event moves exactly one reason; the serial model takes a request only from
    a readable connection, so never a second one while a response is pending.

    post: (MuteReason.CLOSING in __return__) == (event is MuteEvent.CLOSE or MuteReason.CLOSING in reasons) and (MuteReason.CLOSING not in __return__ or len(__return__) == 1)
    post: event is MuteEvent.CLOSE or (len(__return__ ^ reasons) == 1 and (event is not MuteEvent.REQUEST_RECEIVED_SERIAL or len(reasons) == 0))
    raises: IllegalMuteTransition
    """
    rule = RULES[event]
    if not rule.requires <= reasons or rule.forbids & reasons:
        raise IllegalMuteTransition(reasons, event)
    return (reasons - rule.clears) | rule.sets


def kafka_channel_state(reasons: frozenset[MuteReason]) -> KafkaChannelState:
    """Kafka's name for a reason set.

    Kafka only distinguishes a pending response and a throttle; the causes it has no
    name for (in-flight cap, memory pressure, closing) all read as plain ``MUTED``.

    pre: MuteReason.CLOSING not in reasons or len(reasons) == 1
    post: (__return__ is KafkaChannelState.NOT_MUTED) == (len(reasons) == 0) and ("RESPONSE_PENDING" in __return__.name) == (MuteReason.RESPONSE_PENDING in reasons) and ("THROTTLED" in __return__.name) == (MuteReason.THROTTLED in reasons)
    """
    if not reasons:
        return KafkaChannelState.NOT_MUTED
    pending = MuteReason.RESPONSE_PENDING in reasons
    if MuteReason.THROTTLED in reasons:
        if pending:
            return KafkaChannelState.MUTED_AND_THROTTLED_AND_RESPONSE_PENDING
        return KafkaChannelState.MUTED_AND_THROTTLED
    if pending:
        return KafkaChannelState.MUTED_AND_RESPONSE_PENDING
    return KafkaChannelState.MUTED


def _walk() -> tuple[
    tuple[frozenset[MuteReason], ...],
    dict[tuple[frozenset[MuteReason], MuteEvent], frozenset[MuteReason]],
]:
    # Breadth first from a fresh connection, events in declaration order, so the
    # generated diagram comes out the same every time.
    seen = [_NO_REASONS]
    table: dict[tuple[frozenset[MuteReason], MuteEvent], frozenset[MuteReason]] = {}
    for reasons in seen:  # grows while iterating
        for event in MuteEvent:
            try:
                after = next_reasons(reasons, event)
            except IllegalMuteTransition:
                continue
            table[reasons, event] = after
            if after not in seen:
                seen.append(after)
    return tuple(seen), table


_reachable, _table = _walk()

#: Every reason set a connection can be in, starting from readable.
REACHABLE_REASON_SETS: tuple[frozenset[MuteReason], ...] = _reachable

#: ``(reasons, event) -> reasons`` over reachable sets; a missing key is illegal.
TRANSITIONS: Mapping[tuple[frozenset[MuteReason], MuteEvent], frozenset[MuteReason]] = (
    MappingProxyType(_table)
)
del _reachable, _table


@attrs.frozen
class MuteStatistics:
    reasons: frozenset[MuteReason]
    readable: bool
    kafka_state: KafkaChannelState
    #: Legal events handled since the connection opened.
    events_handled: int
    #: How often each reason was set: which cause stalls this connection most.
    times_set: Mapping[MuteReason, int]


def _check_reachable(
    _instance: object, _attribute: attrs.Attribute[frozenset[MuteReason]], value: object
) -> None:
    if value not in REACHABLE_REASON_SETS:
        raise ValueError(f"{value!r} is not a reachable set of mute reasons")


def _as_reasons(value: Iterable[MuteReason]) -> frozenset[MuteReason]:
    # A typed converter: attrs' ``converter=frozenset`` left the constructor's argument
    # a generic Iterable mypy could not match.
    return frozenset(value)


@attrs.define(eq=False)
class ChannelMute:
    """One connection's mute state. Drive it with :meth:`handle`; read :attr:`readable`."""

    # Private so that every change goes through handle() and its rules.
    _reasons: frozenset[MuteReason] = attrs.field(
        default=_NO_REASONS, converter=_as_reasons, validator=_check_reachable
    )
    _events_handled: int = attrs.field(default=0, init=False)
    _times_set: dict[MuteReason, int] = attrs.field(
        factory=lambda: dict.fromkeys(MuteReason, 0), init=False
    )

    @property
    def reasons(self) -> frozenset[MuteReason]:
        return self._reasons

    @property
    def readable(self) -> bool:
        """May the broker read the next request? True iff no reason is set."""
        return not self._reasons

    @property
    def closing(self) -> bool:
        return MuteReason.CLOSING in self._reasons

    @property
    def kafka_state(self) -> KafkaChannelState:
        return kafka_channel_state(self._reasons)

    def handle(self, event: MuteEvent) -> None:
        """Apply ``event``; raise :class:`IllegalMuteTransition` and change nothing if illegal."""
        after = next_reasons(self._reasons, event)
        for reason in after - self._reasons:
            self._times_set[reason] += 1
        self._reasons = after
        self._events_handled += 1

    def statistics(self) -> MuteStatistics:
        return MuteStatistics(
            reasons=self._reasons,
            readable=self.readable,
            kafka_state=self.kafka_state,
            events_handled=self._events_handled,
            times_set=MappingProxyType(dict(self._times_set)),
        )
