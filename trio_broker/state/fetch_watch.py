"""Which waiting fetches a change to a partition concerns: a purgatory keyed by partition.

A long-polling fetch watches exactly the partitions it reads, until it answers.
Whatever can give it an answer changes one partition: an append (a client's produce, a
coordinator's write, a transaction marker, a follower's replicated batches), a high
watermark or last stable offset that moved, or the partition's leadership ending here
(another leader, a deleted topic). :meth:`PartitionWatch.touch` marks the partition
changed for its own waiters and no others, as Kafka's delayed-operation purgatory
checks only the operations watching the key that changed, and names the waiters that
had nothing pending (the ones to wake).

A waiter stays registered while it looks at what changed (:meth:`PartitionWatch.take`):
a change that comes meanwhile is kept for its next look, never lost. Sans-I/O: the Trio
shell owns the events these waiters stand for (server/fetch_waits.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Set
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
    #: Since the start: registrations, partitions touched, wake-ups (a waiter with
    #: nothing pending got a change).
    registered: int
    touches: int
    woken: int
    #: Looks that found changes, by how many partitions had changed: bucket b (a power
    #: of two) counts looks at more than b/2 and at most b partitions; and the
    #: partitions all those looks found changed.
    changed_per_look: dict[int, int]
    changed_seen: int


class PartitionWatch(Generic[K, W]):
    """Waiters by the partitions (keys) they watch, and what changed for each."""

    def __init__(self) -> None:
        self._by_key: dict[K, set[W]] = {}
        self._keys_of: dict[W, frozenset[K]] = {}
        self._pending: dict[W, set[K]] = {}
        self._registered = 0
        self._touches = 0
        self._woken = 0
        self._changed_per_look: dict[int, int] = {}
        self._changed_seen = 0

    def watch(self, waiter: W, keys: Iterable[K]) -> None:
        """``waiter`` waits for changes to ``keys`` (replacing what it watched)."""
        self.forget(waiter)
        watched = frozenset(keys)
        self._keys_of[waiter] = watched
        self._pending[waiter] = set()
        by_key = self._by_key
        for key in watched:
            waiters = by_key.get(key)
            if waiters is None:  # (setdefault would make a set per key per registration)
                by_key[key] = {waiter}
            else:
                waiters.add(waiter)
        self._registered += 1

    def forget(self, waiter: W) -> None:
        """``waiter`` stops waiting (answered, timed out, cancelled)."""
        self._pending.pop(waiter, None)
        for key in self._keys_of.pop(waiter, ()):
            waiters = self._by_key[key]
            waiters.discard(waiter)
            if not waiters:
                del self._by_key[key]

    def touch(self, key: K) -> list[W]:
        """``key`` changed: noted for each waiter watching it; returns those that had
        nothing pending before (the ones to wake: the others are awake already)."""
        self._touches += 1
        woken = []
        for waiter in self._by_key.get(key, ()):
            pending = self._pending[waiter]
            if not pending:
                woken.append(waiter)
            pending.add(key)
        self._woken += len(woken)
        return woken

    def touch_all(self) -> list[W]:
        """Everything changed (the broker shuts down): every waiter, all its keys."""
        woken = [w for w, pending in self._pending.items() if not pending]
        for waiter, keys in self._keys_of.items():
            self._pending[waiter].update(keys)
        self._woken += len(woken)
        return woken

    def take(self, waiter: W) -> Set[K]:
        """The partitions that changed for ``waiter`` since its last look (then none)."""
        pending = self._pending.get(waiter)
        if not pending:
            return frozenset()
        self._pending[waiter] = set()  # the taken set is the caller's now
        changed = len(pending)
        bucket = 1 << (changed - 1).bit_length()
        self._changed_per_look[bucket] = self._changed_per_look.get(bucket, 0) + 1
        self._changed_seen += changed
        return pending

    def watching(self, waiter: W) -> frozenset[K]:
        return self._keys_of.get(waiter, frozenset())

    def __len__(self) -> int:
        return len(self._keys_of)

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(
            waiters=len(self._keys_of), partitions=len(self._by_key),
            registered=self._registered, touches=self._touches, woken=self._woken,
            changed_per_look=dict(self._changed_per_look), changed_seen=self._changed_seen,
        )  # fmt: skip
