"""Loading a log from its directory, and bringing an offline log back.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``).
:meth:`Reloading._load` builds the log from what :mod:`~trio_broker.storage.loader`
found (recovering after a crash) and reads its leader-epoch checkpoint back; after a
disk error (``take_offline``, which takes the log's whole dir offline), ``reload`` probes
the disk and loads the directory again, and ``adopt`` puts the result in place of the
offline log; the flusher does both for every log of the dir, then restores the dir.

This module never imports trio.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Self

import attrs

from trio_broker.storage.epoch_cache import LeaderEpochCache, batch_leader_epoch, parse_checkpoint
from trio_broker.storage.errors import StorageError
from trio_broker.storage.loader import LEADER_EPOCH_CHECKPOINT, LogLoader
from trio_broker.storage.log_flush import Flushing
from trio_broker.storage.log_reads import Reading
from trio_broker.storage.log_types import LogConfig
from trio_broker.storage.swap import read_replica_gaps_checkpoint

#: Written, fsynced and removed by :meth:`PartitionLog.reload` to test the disk (".tmp":
#: the loader deletes a leftover one).
DISK_PROBE = ".disk-probe.tmp"
DISK_PROBE_BYTES = 64 * 1024


def probe_disk(directory: Path) -> None:
    """Write and fsync a small file in ``directory``, then remove it: OSError if the disk
    is still full or failing. Blocking."""
    probe = directory / DISK_PROBE
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        data = bytes(DISK_PROBE_BYTES)
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, "disk probe: short write")
        os.fsync(fd)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


class Reloading(Reading, Flushing):
    """``_load`` (opening), ``take_offline``, ``reload`` and ``adopt``."""

    def take_offline(self, reason: str = "a disk error seen outside the log") -> None:
        """A disk error seen outside the log (the flusher's fsync): it and every log in
        its dir stop serving."""
        self.dir_state.fail(f"{self.directory}: {reason}")

    def reload(self) -> Self:
        """For an offline log: probe the disk, then open the directory again through recovery.

        Blocking (run it in a worker thread). The probe writes and fsyncs a small
        file, so a disk that is still full or failing raises OSError here; recovery
        then cuts any torn tail and syncs what it keeps. Returns a separate log
        over the same files, for :meth:`adopt`.
        """
        if not self.offline or self._closed:
            raise StorageError(f"log {self.directory} is not offline")
        probe_disk(self.directory)
        return self._load(self.directory, self.config, self._now_ms)

    @classmethod
    def _load(cls, directory: Path, config: LogConfig, now_ms: Callable[[], int]) -> Self:
        """Read the directory back (:mod:`~trio_broker.storage.loader`) and build the log."""
        loaded = LogLoader(directory, config.index_interval_bytes, now_ms).load()
        log = cls(
            directory, config, now_ms, loaded.segments, loaded.log_start_offset, loaded.recovery
        )
        log._persisted_log_start = loaded.persisted_log_start
        log._replica_gaps_below = read_replica_gaps_checkpoint(directory)
        log._recovery_point = loaded.recovery_point
        log._persist_log_start()
        if log._load_epochs():
            log.recovery = attrs.evolve(log.recovery, epoch_cache_rebuilt=True)
        if not loaded.recovery.clean:
            # The scanned data may still be only in the page cache: sync it (and
            # the rebuilt indexes) before calling it durable.
            log._sync_segments(loaded.segments)
        return log

    def adopt(self, fresh: Self) -> None:
        """Take over ``fresh`` (from :meth:`reload`) in place; back online with its dir.

        In place, so every holder of this object sees the recovered log. The old
        segments' descriptors stay open for ``file.delete.delay.ms``: a sendfile
        in flight may still read from them.
        """
        now = self._now_ms()
        with self._lock:
            delay = now + self.config.file_delete_delay_ms
            self._retired.extend((delay, segment) for segment in self._segments)
            self._retired.extend(fresh._retired)
            self._segments = fresh._segments
            self.log_start_offset = fresh.log_start_offset
            self.log_end_offset = fresh.log_end_offset
            self.durable_end_offset = fresh.durable_end_offset
            self._recovery_point = fresh._recovery_point
            self._persisted_log_start = fresh._persisted_log_start
            self.recovery = fresh.recovery
            self.epoch_cache = fresh.epoch_cache
            self._persisted_epochs = fresh._persisted_epochs
            self._replica_gaps_below = fresh._replica_gaps_below
        # The files now belong to this log; the shell object must never close them.
        fresh._segments, fresh._retired, fresh._closed = [], [], True
        fresh.dir_state.leave(fresh)
        # Still offline: the dir comes back whole, once every log in it is adopted
        # (the flusher restores it, ``LogDirState.restore``).

    def _load_epochs(self) -> bool:
        """Read the checkpoint, trimmed to the recovered log; True if it had to be rebuilt.

        A damaged file is not guessed at: the cache is rebuilt from the batch headers.
        """
        path = self.directory / LEADER_EPOCH_CHECKPOINT
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            cache: LeaderEpochCache | None = LeaderEpochCache()
        else:
            cache = parse_checkpoint(data)
            if cache is not None:
                self._persisted_epochs = cache.entries
        rebuilt = cache is None
        if cache is None:
            cache = LeaderEpochCache()
            for base, header in self.iter_batch_headers():
                cache.assign_from_log(batch_leader_epoch(header), base)
        cache.truncate_from_start(self.log_start_offset)
        cache.truncate_from_end(self.log_end_offset)
        self.epoch_cache = cache
        if rebuilt or self._persisted_epochs is not None or cache.entries:
            self._persist_epochs()  # a damaged file is replaced even by an empty cache
        return rebuilt
