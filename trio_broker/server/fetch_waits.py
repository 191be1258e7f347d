"""The Trio side of the fetch purgatory: one event per waiting fetch, woken by partition.

``Broker.appends`` is a :class:`FetchWaits`. A long-polling fetch watches the partitions
it reads from its first read until it answers (:meth:`FetchWaits.watch`); whatever
changes a partition calls :meth:`FetchWaits.notify` for it, which wakes that
partition's waiters only, and :meth:`FetchWait.changed` tells a woken fetch which of its
partitions changed (state/fetch_watch.py keeps who watches what, and what changed for
whom).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from types import TracebackType

import trio

from trio_broker.state.fetch_watch import PartitionWatch, WatchStatistics

Key = tuple[str, int]


class FetchWait:
    """One long poll's registration, from :meth:`FetchWaits.watch` (made right after the
    fetch's first read, so that no later change is missed) to the end of its ``with``."""

    def __init__(self, watch: PartitionWatch[Key, FetchWait], keys: Iterable[Key]) -> None:
        self._watch = watch
        self._event = trio.Event()
        #: Called on each wake (a Polled long poll's shell callback, :meth:`subscribe`).
        self._on_wake: Callable[[], None] | None = None
        watch.watch(self, keys)

    def __enter__(self) -> FetchWait:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._watch.forget(self)

    def wake(self) -> None:
        self._event.set()
        if self._on_wake is not None:
            self._on_wake()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever a watched partition changes, until the returned
        function is called, which also ends the registration (as leaving ``with``)."""
        self._on_wake = wake

        def leave() -> None:
            self._on_wake = None
            self._watch.forget(self)

        return leave

    def take(self) -> Set[Key]:
        """The watched partitions that changed since the last look (empty: none)."""
        return self._watch.take(self)

    async def changed(self) -> Set[Key]:
        """Wait until one of the watched partitions changed; return those that did."""
        keys = self._watch.take(self)
        while not keys:
            await self._event.wait()
            self._event = trio.Event()
            keys = self._watch.take(self)
        return keys


class FetchWaits:
    def __init__(self) -> None:
        self._watch: PartitionWatch[Key, FetchWait] = PartitionWatch()

    def watch(self, partitions: Iterable[Key]) -> FetchWait:
        """Watch ``partitions`` from now; leave with the answer: ``with waiter: ...``."""
        return FetchWait(self._watch, partitions)

    def notify(self, topic: str, partition: int) -> None:
        """Partition ``topic``-``partition`` changed: wake the fetches watching it."""
        for waiter in self._watch.touch((topic, partition)):
            waiter.wake()

    def notify_all(self) -> None:
        """Wake every waiting fetch (the broker shuts down)."""
        for waiter in self._watch.touch_all():
            waiter.wake()

    def statistics(self) -> WatchStatistics:
        return self._watch.statistics()
