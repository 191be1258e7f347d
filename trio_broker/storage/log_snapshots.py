"""Producer state snapshots beside a log's segments: ``<offset>.snapshot``, as Kafka names them.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``). The
bytes are the producer state's (trio_broker.state.producer, by way of
trio_broker.services.producers); the log only keeps the files. A snapshot named
``N`` describes every batch below offset ``N``.

A snapshot taken at a segment roll is *staged* on the event loop and written by the
next :meth:`~trio_broker.storage.log_flush.Flushing.flush` (a worker thread) once that
flush made every offset below ``N`` durable, so a snapshot on disk never describes
batches a crash can still take away (Kafka's LogLoader has to delete such snapshots
after an unclean shutdown; here they never exist). Snapshots below the log start go
with the segments (Kafka's deleteProducerSnapshots), and at most
:data:`PRODUCER_SNAPSHOTS_KEPT` are kept.

This module never imports trio.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from trio_broker.storage.durable import write_file_atomically
from trio_broker.storage.log_state import LogState

__all__ = ["PRODUCER_SNAPSHOTS_KEPT", "SNAPSHOT_SUFFIX", "ProducerSnapshots", "snapshot_path"]

_log = logging.getLogger("trio_broker.storage")

SNAPSHOT_SUFFIX = ".snapshot"
#: Recovery reads the newest; older ones serve a truncation below it (a follower's).
PRODUCER_SNAPSHOTS_KEPT = 3


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            stem = name[: -len(SNAPSHOT_SUFFIX)]
            if name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
                found.append(int(stem))
    return sorted(found)


class ProducerSnapshots(LogState):
    """Staging, writing, listing and deleting the producer state snapshots of one log."""

    def stage_producer_snapshot(self, offset: int, data: bytes) -> None:
        """Have the flush that makes every offset below ``offset`` durable write ``data``
        as the snapshot ``offset`` (a newer staged one replaces an older)."""
        with self._lock:
            self._staged_snapshots = [(offset, data)]

    def producer_snapshot_offsets(self) -> list[int]:
        """The snapshots on disk, oldest first."""
        return snapshot_offsets(self.directory)

    def read_producer_snapshot(self, offset: int) -> bytes:
        return snapshot_path(self.directory, offset).read_bytes()

    def delete_producer_snapshots(self, above: int = -1) -> None:
        """Delete the snapshots (staged ones too) named above ``above``: all by default
        (the state they describe was rewritten), or those a truncation made stale."""
        with self._lock:
            self._staged_snapshots = [s for s in self._staged_snapshots if s[0] <= above]
        for offset in self.producer_snapshot_offsets():
            if offset > above:
                snapshot_path(self.directory, offset).unlink(missing_ok=True)

    def _write_staged_snapshots(self, durable_end: int) -> None:
        """In the flush's thread: write the staged snapshot if ``durable_end`` covers it."""
        with self._lock:
            ready = [s for s in self._staged_snapshots if s[0] <= durable_end]
            self._staged_snapshots = [s for s in self._staged_snapshots if s[0] > durable_end]
        for offset, data in ready:
            try:
                write_file_atomically(snapshot_path(self.directory, offset), data)
            except OSError as exc:
                # The log's data is safe; only a crash now loses what the snapshot held.
                _log.warning("cannot write producer snapshot %d in %s: %s", offset,
                             self.directory, exc)  # fmt: skip
        if ready:
            self.prune_producer_snapshots()

    def prune_producer_snapshots(self) -> None:
        """Drop snapshots below the log start (they are never loaded) and all but the
        newest :data:`PRODUCER_SNAPSHOTS_KEPT`."""
        offsets = self.producer_snapshot_offsets()
        keep = set(offsets[-PRODUCER_SNAPSHOTS_KEPT:])
        for offset in offsets:
            if offset < self.log_start_offset or offset not in keep:
                with contextlib.suppress(OSError):
                    snapshot_path(self.directory, offset).unlink()
