"""Whether each log dir is online: a disk error in one log takes its whole dir offline.

Kafka's rule (its ``LogDirFailureChannel``): an I/O error in any log of a dir marks the
dir offline, and with it every partition whose log lives there; the broker's other
dirs keep serving. Here each dir has one :class:`LogDirState`, shared by every log in
it (``PartitionLog.dir_state``), so a log's ``offline`` *is* its dir's: one failure
stops all of them at once, with no list to walk and nothing to miss.

The rules, each in one place:

* a dir goes offline on the first error of any of its logs (:meth:`LogDirState.fail`;
  the first reason is kept, later ones add nothing);
* it comes back only whole (:meth:`LogDirState.restore`): the flusher's probe reloads
  every log in it and only then restores the dir (server/flusher.py), so no partition
  of a failed dir serves before all of them were checked;
* a new partition goes to the online dir holding the fewest partitions, the first on a
  tie (:meth:`LogDirs.choose`); with no dir online the broker cannot host one
  (StorageError: KAFKA_STORAGE_ERROR);
* DescribeLogDirs answers an offline dir with KAFKA_STORAGE_ERROR and no partitions,
  AlterReplicaLogDirs refuses to move a partition into one (the handlers ask
  :meth:`LogDirs.is_online`);
* whoever must know (a cluster's broker tells its controller: cluster/log_dir_events.py)
  hears of every change of a dir's health (:meth:`LogDirs.listen`), from whichever
  thread saw it.

A log opened without a shared state (a log alone in its directory, as the tests open
them) gets one of its own: it goes offline and comes back by itself.

Plain data, no I/O and no trio.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import attrs

from trio_broker.storage.errors import StorageError

__all__ = ["LogDirState", "LogDirs", "NoOnlineLogDir"]

_log = logging.getLogger("trio_broker.storage")


class _Member(Protocol):
    """A log in a dir, as the dir sees it (a PartitionLog)."""

    @property
    def directory(self) -> Path: ...


class NoOnlineLogDir(StorageError):
    """Every log dir is offline: a new partition has nowhere to go."""


@attrs.define(eq=False)
class LogDirState:
    """One log dir's health, shared by the logs in it."""

    path: Path
    #: True from the first disk error in any of its logs until :meth:`restore`.
    offline: bool = False
    #: What took it offline (the first error), for logs and DescribeLogDirs' reason.
    reason: str | None = None
    #: The open logs in this dir, by id (joined at open, left at close): what a probe
    #: of the dir reloads.
    members: dict[int, _Member] = attrs.field(factory=dict, repr=False)
    #: Called after the dir goes offline or comes back (its :class:`LogDirs` hands the
    #: change to its listeners), in the thread that saw it.
    on_change: Callable[[], None] = attrs.field(default=lambda: None, repr=False)

    def fail(self, reason: str) -> bool:
        """A disk error in one of its logs: the dir goes offline. True the first time."""
        if self.offline:
            return False
        self.offline, self.reason = True, reason
        _log.error(
            "log dir %s is offline (%s): its %d partition log(s) stop serving until it "
            "is probed back",
            self.path, reason, len(self.members),
        )  # fmt: skip
        self.on_change()
        return True

    def restore(self) -> None:
        """Every log in the dir was reloaded and synced: the dir serves again."""
        was_offline = self.offline
        self.offline, self.reason = False, None
        if was_offline:
            self.on_change()

    def join(self, log: _Member) -> None:
        self.members[id(log)] = log

    def leave(self, log: _Member) -> None:
        self.members.pop(id(log), None)


class LogDirs:
    """The broker's log dirs (``log.dirs``, absolute, in config order) and their states."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.states: dict[Path, LogDirState] = {}
        self._listeners: list[Callable[[], None]] = []
        for path in paths:
            self.state(path)

    def state(self, path: Path) -> LogDirState:
        """The state of dir ``path`` (made online on first sight: a dir a test adds)."""
        state = self.states.get(Path(path))
        if state is None:
            state = self.states[Path(path)] = LogDirState(Path(path), on_change=self._changed)
        return state

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after any dir goes offline or comes back, in the thread that
        saw it (it must only hand the news over); the returned function stops that."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def is_online(self, path: Path) -> bool:
        state = self.states.get(Path(path))
        return state is not None and not state.offline

    def online(self) -> list[Path]:
        return [p for p, s in self.states.items() if not s.offline]

    def offline(self) -> list[Path]:
        return [p for p, s in self.states.items() if s.offline]

    def choose(self, counts: Mapping[Path, int]) -> Path:
        """The dir for a new partition: the online one with the fewest partitions, the
        first on a tie (Kafka's rule, over its live dirs). NoOnlineLogDir if none is."""
        online = self.online()
        if not online:
            raise NoOnlineLogDir(
                "every log dir is offline after a disk error: no partition can be created"
            )
        return min(online, key=lambda d: counts.get(d, 0))
