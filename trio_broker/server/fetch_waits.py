"""The Trio side of the fetch purgatory: one event per waiting fetch, woken by partition.

``Broker.appends`` is a :class:`FetchWaits`. A long-polling fetch watches the partitions
it reads (:meth:`FetchWaits.watch`); whatever changes a partition calls
:meth:`FetchWaits.notify` for it, which sets the events of that partition's waiters
only (state/fetch_watch.py keeps who watches what).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

import trio

from trio_broker.state.fetch_watch import PartitionWatch, WatchStatistics

Key = tuple[str, int]


class FetchWait:
    """One long poll's registration: enter before reading, ``wait`` after."""

    def __init__(self, watch: PartitionWatch[Key, trio.Event], keys: frozenset[Key]) -> None:
        self._watch = watch
        self._keys = keys
        self._event = trio.Event()

    def __enter__(self) -> FetchWait:
        self._watch.watch(self._event, self._keys)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._watch.forget(self._event)

    async def wait(self) -> None:
        await self._event.wait()


class FetchWaits:
    def __init__(self) -> None:
        self._watch: PartitionWatch[Key, trio.Event] = PartitionWatch()

    def watch(self, partitions: Iterable[Key]) -> FetchWait:
        return FetchWait(self._watch, frozenset(partitions))

    def notify(self, topic: str, partition: int) -> None:
        """Partition ``topic``-``partition`` changed: wake the fetches watching it."""
        for event in self._watch.touch((topic, partition)):
            event.set()

    def notify_all(self) -> None:
        """Wake every waiting fetch (the broker shuts down)."""
        for event in self._watch.touch_all():
            event.set()

    def statistics(self) -> WatchStatistics:
        return self._watch.statistics()
