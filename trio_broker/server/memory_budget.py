"""A broker-wide budget of bytes held in queued requests.

When the bytes of requests received but not yet handled exceed the budget,
connections that just read a request mute with MEMORY_PRESSURE; they are
unmuted as handlers finish requests and the total drops below the budget
again. Bytes are released when a request is handled, not when its response is
sent, so a client that never reads its responses cannot hold the budget (it is
closed by the stalled-send timeout instead).
"""

from __future__ import annotations

from typing import Protocol


class _Waiter(Protocol):
    def memory_available(self) -> None: ...


class MemoryBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self.peak = 0
        self._waiters: dict[int, _Waiter] = {}

    def acquire(self, size: int) -> bool:
        """Account ``size`` bytes; True if the budget is now exhausted."""
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return self.in_use >= self.limit

    def notify_when_available(self, waiter: _Waiter) -> None:
        """Call ``waiter.memory_available()`` once bytes are released (no waiting here)."""
        self._waiters[id(waiter)] = waiter

    def forget(self, waiter: _Waiter) -> None:
        self._waiters.pop(id(waiter), None)

    def release(self, size: int) -> None:
        self.in_use -= size
        if self._waiters and self.in_use < self.limit:
            waiters, self._waiters = list(self._waiters.values()), {}
            for waiter in waiters:
                waiter.memory_available()
