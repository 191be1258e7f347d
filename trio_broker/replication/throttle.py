"""A byte budget that refills at a fixed rate: the leader's replication throttle.

``leader.replication.throttled.rate`` bytes per second, shared by every partition this
broker leads, for the replicas a reassignment is adding (as Kafka's leader quota). A
fetch reads at most :meth:`ByteBudget.available` bytes of a throttled partition and
reports what it read (:meth:`ByteBudget.take`); the budget may go below zero once (a
fetch returns at least one whole batch), and the next fetches then wait for it to
refill. Holds at most one second's worth, so an idle stretch does not store up a burst.
Pure: the caller passes the time.
"""

from __future__ import annotations

import attrs

__all__ = ["ByteBudget"]


@attrs.define
class ByteBudget:
    rate: int  # bytes per second, > 0
    _available: float = attrs.field(init=False, default=0.0)
    _at_ms: int | None = attrs.field(init=False, default=None)

    def _refill(self, now_ms: int) -> None:
        if self._at_ms is None:
            self._available = float(self.rate)
        elif now_ms > self._at_ms:
            self._available += (now_ms - self._at_ms) * self.rate / 1000
        self._available = min(self._available, float(self.rate))
        self._at_ms = now_ms if self._at_ms is None else max(self._at_ms, now_ms)

    def available(self, now_ms: int) -> int:
        """Whole bytes that may be read now (0 while the budget is spent)."""
        self._refill(now_ms)
        return max(0, int(self._available))

    def take(self, nbytes: int, now_ms: int) -> None:
        self._refill(now_ms)
        self._available -= nbytes
