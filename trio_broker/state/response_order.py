"""Per-connection response sequencer for the pipelined model.

Kafka clients match responses to requests by order on the connection, not only by
correlation id, so a broker that handles requests concurrently must still write the
responses in request order. The sequencer hands out a slot per request as it is read,
accepts completions in any order, and releases only the longest completed prefix.

A request that gets no response (Produce with acks=0) is registered and completed with
``None`` like any other: it keeps its place, releases as ``None`` (nothing to write),
and so never holds back the responses behind it. Pure and sync: no trio here.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs

from trio_broker.state.mute import StateMachineError

__all__ = ["IllegalCompletion", "ResponseSequencer", "SequencerStatistics"]

ResponseT = TypeVar("ResponseT")


class IllegalCompletion(StateMachineError):
    """A slot was completed twice, or was never handed out, or was already released."""


@attrs.frozen
class SequencerStatistics:
    #: Registered and not yet released (completed or not): what the in-flight cap counts.
    in_flight: int
    #: Completed but waiting behind an earlier, unfinished request (head-of-line blocked).
    completed_waiting: int
    #: Correlation id of the oldest unreleased request: the one everything waits for.
    head_correlation_id: int | None


@attrs.define(eq=False)
class ResponseSequencer(Generic[ResponseT]):
    """Release responses in request order, whatever order they complete in.

    Slots are consecutive integers from 0; slot ``n`` is the ``n``-th request read.
    """

    # Invariant: _next_release <= every key of _correlation_ids and _completed < _next_slot.
    _next_slot: int = attrs.field(default=0, init=False)
    _next_release: int = attrs.field(default=0, init=False)
    # Only unreleased slots are kept, so memory follows in_flight, not connection age.
    _correlation_ids: dict[int, int] = attrs.field(factory=dict, init=False)
    _completed: dict[int, ResponseT | None] = attrs.field(factory=dict, init=False)

    @property
    def in_flight(self) -> int:
        return self._next_slot - self._next_release

    def register(self, correlation_id: int) -> int:
        """Take the next slot for a request just read; call in the order requests arrive."""
        slot = self._next_slot
        self._correlation_ids[slot] = correlation_id
        self._next_slot += 1
        return slot

    def complete(self, slot: int, response: ResponseT | None) -> None:
        """Record ``slot``'s response (``None``: the request has none). Any order."""
        if slot not in self._correlation_ids:
            raise IllegalCompletion(f"slot {slot} is not awaiting a response")
        if slot in self._completed:
            cid = self._correlation_ids[slot]
            raise IllegalCompletion(f"slot {slot} (correlation id {cid}) completed twice")
        self._completed[slot] = response

    def pop_ready(self) -> list[tuple[int, ResponseT | None]]:
        """Release the longest completed prefix, in request order; may be empty."""
        ready = []
        while self._next_release in self._completed:
            slot = self._next_release
            ready.append((slot, self._completed.pop(slot)))
            del self._correlation_ids[slot]
            self._next_release += 1
        return ready

    def statistics(self) -> SequencerStatistics:
        return SequencerStatistics(
            in_flight=self.in_flight,
            completed_waiting=len(self._completed),
            head_correlation_id=self._correlation_ids.get(self._next_release),
        )
