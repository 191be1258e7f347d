"""Which waiting fetches a change to a partition concerns: a purgatory keyed by partition.

A long-polling fetch watches exactly the partitions it reads. Whatever can give it an
answer changes one partition: an append (a client's produce, a coordinator's write, a
transaction marker, a follower's replicated batches), a high watermark or last stable
offset that moved, or the partition's leadership ending here (another leader, a
deleted topic). :meth:`PartitionWatch.touch` returns the waiters of that one partition
and no others, as Kafka's delayed-operation purgatory checks only the operations
watching the key that changed.

A waiter is woken once: touching one of its partitions removes it from all of them,
and the shell registers it again before it reads the logs once more (so a change
between its read and its wait is never missed). Sans-I/O: the Trio shell owns the
events these waiters stand for (server/fetch_waits.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

import attrs

__all__ = ["PartitionWatch", "WatchStatistics"]

K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=Hashable)


@attrs.frozen
class WatchStatistics:
    #: Waiters registered now, and the partitions they watch.
    waiters: int
    partitions: int
    #: Since the start: registrations, partitions touched, waiters woken by a touch.
    registered: int
    touches: int
    woken: int


class PartitionWatch(Generic[K, W]):
    """Waiters by the partitions (keys) they watch; a touched key wakes only its own."""

    def __init__(self) -> None:
        self._by_key: dict[K, set[W]] = {}
        self._keys_of: dict[W, frozenset[K]] = {}
        self._registered = 0
        self._touches = 0
        self._woken = 0

    def watch(self, waiter: W, keys: Iterable[K]) -> None:
        """``waiter`` waits for a change to any of ``keys`` (replacing what it watched)."""
        self.forget(waiter)
        watched = frozenset(keys)
        self._keys_of[waiter] = watched
        for key in watched:
            self._by_key.setdefault(key, set()).add(waiter)
        self._registered += 1

    def forget(self, waiter: W) -> None:
        """``waiter`` stops waiting (answered, timed out, cancelled); a no-op if woken."""
        for key in self._keys_of.pop(waiter, ()):
            waiters = self._by_key.get(key)
            if waiters is None:
                continue  # the key being touched: already out of the index
            waiters.discard(waiter)
            if not waiters:
                del self._by_key[key]

    def touch(self, key: K) -> list[W]:
        """``key`` changed: the waiters watching it, now no longer registered."""
        self._touches += 1
        waiters = self._by_key.pop(key, None)
        if not waiters:
            return []
        woken = list(waiters)
        for waiter in woken:
            self.forget(waiter)
        self._woken += len(woken)
        return woken

    def touch_all(self) -> list[W]:
        """Everything changed (the broker shuts down): every waiter."""
        woken = list(self._keys_of)
        self._by_key.clear()
        self._keys_of.clear()
        self._woken += len(woken)
        return woken

    def watching(self, waiter: W) -> frozenset[K]:
        return self._keys_of.get(waiter, frozenset())

    def __len__(self) -> int:
        return len(self._keys_of)

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(
            waiters=len(self._keys_of), partitions=len(self._by_key),
            registered=self._registered, touches=self._touches, woken=self._woken,
        )  # fmt: skip
