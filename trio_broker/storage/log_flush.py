"""Durability: fsync what was written, move the recovery point, report what is durable.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``). ``flush``
runs in a worker thread while appends go on: it snapshots the end offset before
syncing and declares only that much durable.

This module never imports trio.
"""

from __future__ import annotations

import contextlib

from trio_broker.storage.durable import fsync_dir, write_file_atomically
from trio_broker.storage.errors import StorageError
from trio_broker.storage.loader import (
    CLEAN_SHUTDOWN_MARKER,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from trio_broker.storage.log_snapshots import ProducerSnapshots, snapshot_path
from trio_broker.storage.segment import LOG_SUFFIX, Segment
from trio_broker.storage.swap import REPLICA_GAPS_CHECKPOINT


class Flushing(ProducerSnapshots):
    """``flush``, the segment syncs behind it, and ``durable_state`` (crash tests)."""

    def flush(self) -> int:
        """fsync everything written so far; returns the new ``durable_end_offset``.

        Blocking: run it in a worker thread. Appends may continue meanwhile; they
        are covered by the next flush.
        """
        with self._flush_lock:
            if self._closed:
                # Not a silent no-op: a waiter for an offset that an abort left
                # unsynced would otherwise make the flusher retry forever.
                raise StorageError(f"log {self.directory} is closed")
            if self.offline:
                raise StorageError(f"log {self.directory} is offline after a disk error")
            # Snapshot the end first: every byte of offsets below it is already written.
            end = self.log_end_offset
            segments = self._segments
            try:
                self._sync_segments(segments)
            except OSError as exc:
                # After a failed fsync the kernel may have dropped the dirty pages:
                # nothing past the durable end can be trusted any more.
                raise self._go_offline("fsync", exc) from exc
            if end > self.durable_end_offset:
                self.durable_end_offset = end
            self._write_staged_snapshots(self.durable_end_offset)
            return self.durable_end_offset

    def _sync_segments(self, segments: list[Segment]) -> None:
        dir_dirty = False
        newly_sealed: list[Segment] = []
        for segment in segments:
            if segment.fully_synced or segment.deleted:
                continue
            sealed = segment.sealed  # read before syncing: then every write is in
            size = segment.size
            if size > segment.synced_size:
                segment.sync_data()
                segment.synced_size = size
            if sealed:
                segment.write_index_files(sync=True)
                newly_sealed.append(segment)
                dir_dirty = True
            if not segment.dir_synced:
                dir_dirty = True
        if dir_dirty:
            fsync_dir(self.directory)
            for segment in segments:
                segment.dir_synced = True
            for segment in newly_sealed:
                segment.fully_synced = True
        point = next((s.base_offset for s in segments if not s.fully_synced), None)
        if point is not None and point > self._recovery_point:
            with self._checkpoint_lock:
                if point > self._recovery_point:
                    write_file_atomically(
                        self.directory / RECOVERY_POINT_CHECKPOINT, b"%d\n" % point
                    )
                    self._recovery_point = point

    def durable_state(self) -> dict[str, int]:
        """File name -> bytes of it known to be on stable storage.

        For crash simulation: a file missing here may vanish in a crash (its
        directory entry is not durable yet); bytes past the given length may be
        lost or garbled.
        """
        state: dict[str, int] = {}
        for segment in self._segments:
            if not segment.dir_synced:
                continue
            state[segment.name + LOG_SUFFIX] = segment.synced_size
            for path in (segment.index_path, segment.timeindex_path):
                with contextlib.suppress(FileNotFoundError):
                    state[path.name] = path.stat().st_size if segment.fully_synced else 0
        for name in (
            LOG_START_CHECKPOINT,
            RECOVERY_POINT_CHECKPOINT,
            LEADER_EPOCH_CHECKPOINT,
            REPLICA_GAPS_CHECKPOINT,
            CLEAN_SHUTDOWN_MARKER,
        ):
            with contextlib.suppress(FileNotFoundError):
                state[name] = (self.directory / name).stat().st_size
        for offset in self.producer_snapshot_offsets():  # written atomically, fsynced
            path = snapshot_path(self.directory, offset)
            with contextlib.suppress(FileNotFoundError):
                state[path.name] = path.stat().st_size
        return state
