"""A partition log's state and the plumbing every part of it shares.

:class:`~trio_broker.storage.log.PartitionLog` is built from parts, one module per
concern, each a class over this state: ``open``, appends and closing
(``log.py``), loading and reloading (``log_reload.py``), reads (``log_reads.py``),
flushes (``log_flush.py``) and the producer state snapshots they write
(``log_snapshots.py``), truncation (``log_truncation.py``), retention and
DeleteRecords (``log_retention.py``), and the cleaner's swap (``log_cleaning.py``).
What they all use is here: the fields and their locks, the writable check, going
offline on a disk error (which takes the log's whole dir offline: ``log_dir_state.py``),
and the log-start and leader-epoch checkpoints.

This module never imports trio.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from trio_broker.storage.durable import write_file_atomically
from trio_broker.storage.epoch_cache import EpochEntry, LeaderEpochCache, format_checkpoint
from trio_broker.storage.errors import StorageError
from trio_broker.storage.loader import LEADER_EPOCH_CHECKPOINT, LOG_START_CHECKPOINT, RecoveryReport
from trio_broker.storage.log_dir_state import LogDirState
from trio_broker.storage.log_types import LogConfig
from trio_broker.storage.segment import Segment


class LogState:
    """The fields of one partition's on-disk log, and the helpers its parts share."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        now_ms: Callable[[], int],
        segments: list[Segment],
        log_start_offset: int,
        recovery: RecoveryReport,
    ) -> None:
        self.directory = directory
        self.config = config
        self._now_ms = now_ms
        #: oldest first; the last one is active. Replaced wholesale under _lock.
        self._segments = segments
        self.log_start_offset = log_start_offset
        #: next offset to assign.
        self.log_end_offset = segments[-1].next_offset
        #: every offset below this is on stable storage.
        self.durable_end_offset = self.log_end_offset
        #: The health of the log dir this log is in, shared with the other logs there
        #: (:meth:`join_dir`); until then one of its own. Its ``offline`` is this log's.
        self.dir_state = LogDirState(directory.parent)
        self.dir_state.join(self)
        self.recovery = recovery
        self._closed = False
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        #: held by the cleaner while it swaps segments (storage/cleaner.py), and by
        #: retention and truncation, which also change the oldest segments.
        self.cleaning_lock = threading.Lock()
        #: base offset below which every segment is fully synced, as last persisted.
        self._recovery_point = segments[0].base_offset
        self._persisted_log_start = log_start_offset
        #: (close-after-ms, segment) for segments retention removed.
        self._retired: list[tuple[int, Segment]] = []
        #: first offset of each leader epoch in this log (persisted, see _persist_epochs).
        self.epoch_cache = LeaderEpochCache()
        #: the entries the checkpoint file holds; None: no file (or a damaged one).
        self._persisted_epochs: tuple[EpochEntry, ...] | None = None
        #: holes from the leader's log are legal below this offset (as persisted).
        self._replica_gaps_below = 0
        #: (offset, bytes) of a producer state snapshot the next flush that makes every
        #: offset below it durable writes (log_snapshots.py). Under _lock.
        self._staged_snapshots: list[tuple[int, bytes]] = []

    @property
    def offline(self) -> bool:
        """A disk error in this log or another in its dir stopped it (until the dir is
        probed back whole: server/flusher.py)."""
        return self.dir_state.offline

    def join_dir(self, state: LogDirState) -> None:
        """This log is in the log dir ``state`` describes: it goes offline with it."""
        self.dir_state.leave(self)
        self.dir_state = state
        state.join(self)

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")
        if self.offline:
            raise StorageError(f"log {self.directory} is offline after a disk error")

    def _go_offline(self, what: str, exc: OSError) -> StorageError:
        error = StorageError(f"{what} failed in {self.directory}: {exc}")
        self.dir_state.fail(str(error))
        return error

    def _record_epoch(self, epoch: int, start_offset: int) -> bool:
        # Checkpoint first, batch after: the file then names every epoch the log holds.
        with self._lock:
            changed = self.epoch_cache.assign(epoch, start_offset)
        if changed:
            self._persist_epochs()
        return changed

    def _persist_epochs(self) -> None:
        """Rewrite ``leader-epoch-checkpoint`` if the cache changed since it was written."""
        with self._checkpoint_lock:
            entries = self.epoch_cache.entries
            if entries == self._persisted_epochs:
                return
            try:
                write_file_atomically(
                    self.directory / LEADER_EPOCH_CHECKPOINT, format_checkpoint(entries)
                )
            except OSError as exc:
                raise self._go_offline("leader epoch checkpoint", exc) from exc
            self._persisted_epochs = entries

    def _trim_epochs_to_start(self) -> None:
        """The log start moved: the epoch holding it now starts there (Kafka's rule)."""
        cache = self.epoch_cache
        if not cache.entries or cache.entries[0].start_offset >= self.log_start_offset:
            return
        with self._lock:
            changed = cache.truncate_from_start(self.log_start_offset)
        if changed:
            self._persist_epochs()

    def _persist_log_start(self) -> None:
        with self._checkpoint_lock:
            value = self.log_start_offset
            if value == self._persisted_log_start:
                return
            try:
                write_file_atomically(self.directory / LOG_START_CHECKPOINT, b"%d\n" % value)
            except OSError as exc:
                raise self._go_offline("log start checkpoint", exc) from exc
            self._persisted_log_start = value

    def _close_retired(self, now_ms: int | None) -> None:
        with self._lock:
            keep: list[tuple[int, Segment]] = []
            done: list[tuple[int, Segment]] = []
            for deadline, segment in self._retired:
                (done if now_ms is None or deadline <= now_ms else keep).append((deadline, segment))
            self._retired = keep
        for _, segment in done:
            with contextlib.suppress(OSError):
                segment.close()


def base_of(segment: Segment) -> int:
    return segment.base_offset
