"""A partition's log: a directory of segments, appended with one write per batch.

Layout of ``<data_dir>/<topic>-<partition>/``::

    00000000000000000000.log         whole record batches, exactly as appended
    00000000000000000000.index       sparse offset -> position index
    00000000000000000000.timeindex   sparse timestamp -> offset index
    00000000000000041230.log ...     the next segment, named by its base offset
    log-start-offset.checkpoint      the log start offset (DeleteRecords, retention)
    recovery-point.checkpoint        segments below this base offset are fully fsynced
    leader-epoch-checkpoint          the leader-epoch cache (Kafka's text format)
    .clean-shutdown                  present only between a clean close and the next open

Threads: ``append``/``read`` belong to one thread (the event loop). ``flush`` runs
in a worker thread while appends continue: it snapshots the end offset *before*
syncing and only declares that much durable. ``apply_retention`` and
``delete_records`` may run in either; structural changes (the segment list, the
log start offset) happen under a short lock, and files retention removes keep
their descriptors open for ``file_delete_delay_ms`` so an in-flight sendfile or
fsync never hits a closed or recycled descriptor.

Followers store what they fetch unchanged (:meth:`PartitionLog.append_replicated`) and
cut their log back after a leader change (:meth:`PartitionLog.truncate_to`); every log
keeps its leader-epoch cache (:attr:`PartitionLog.epoch_cache`) on disk. See "Follower
storage" in docs/storage.md.

Opening a directory (the clean path, or recovery after a crash: truncating torn tails,
rebuilding indexes) is :mod:`trio_broker.storage.loader`'s; :meth:`PartitionLog.open`
builds the log from what it found.

This module holds ``open``, appends and closing; the other parts of the class are one
module each over the state of :mod:`~trio_broker.storage.log_state`: loading and an
offline log's reload (``log_reload.py``), reads (``log_reads.py``), flushes
(``log_flush.py``), truncation (``log_truncation.py``), retention
(``log_retention.py``) and the cleaner's swap (``log_cleaning.py``).

This module never imports trio; it blocks only in plain ``os`` calls.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from trio_broker.protocol import batch_header
from trio_broker.storage.durable import make_dirs_durable, write_file_atomically
from trio_broker.storage.epoch_cache import (
    LeaderEpochCache,
    set_batch_leader_epoch,
)
from trio_broker.storage.errors import StorageError
from trio_broker.storage.loader import (
    CLEAN_SHUTDOWN_MARKER,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from trio_broker.storage.log_cleaning import Cleaning
from trio_broker.storage.log_dir_state import LogDirState
from trio_broker.storage.log_reload import DISK_PROBE, Reloading
from trio_broker.storage.log_retention import Retention
from trio_broker.storage.log_truncation import Truncation
from trio_broker.storage.log_types import (
    AppendResult,
    FileRegion,
    LogConfig,
    check_append,
    check_append_buffer,
    check_replicated_batch,
    split_fetched_batches,
    wall_clock_ms,
)
from trio_broker.storage.segment import Segment
from trio_broker.storage.swap import (
    write_replica_gaps_checkpoint,
)

# What callers have always imported from here, wherever it is defined now.
__all__ = [
    "CLEAN_SHUTDOWN_MARKER",
    "DISK_PROBE",
    "LEADER_EPOCH_CHECKPOINT",
    "LOG_START_CHECKPOINT",
    "RECOVERY_POINT_CHECKPOINT",
    "AppendResult",
    "FileRegion",
    "LogConfig",
    "PartitionLog",
    "check_append_buffer",
    "check_replicated_batch",
    "split_fetched_batches",
    "wall_clock_ms",
]


class PartitionLog(Reloading, Truncation, Retention, Cleaning):
    """The on-disk log of one partition. Create with :meth:`open`."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig | None = None,
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
        dir_state: LogDirState | None = None,
    ) -> PartitionLog:
        """Open (recovering if needed) or create the log in ``directory``; ``dir_state``:
        the health of its log dir, shared with the other logs there (storage/log_dir_state.py).
        A log opened in an offline dir is offline from the start."""
        config = config or LogConfig()
        directory = Path(directory)
        try:
            make_dirs_durable(directory)
            log = cls._load(directory, config, now_ms)
        except OSError as exc:
            error = StorageError(f"cannot open log {directory}: {exc}")
            if dir_state is not None:  # as Kafka: a log that cannot be made fails its dir
                dir_state.fail(str(error))
            raise error from exc
        # The unlinks of a prune are not synced: a crash can bring back an older
        # snapshot than the newest PRODUCER_SNAPSHOTS_KEPT, so prune again at open.
        log.prune_producer_snapshots()
        if dir_state is not None:
            log.join_dir(dir_state)
        return log

    # ------------------------------------------------------------------ appends

    def append(
        self,
        batch: bytearray | memoryview,
        *,
        now_ms: int,
        log_append_time: bool = False,
        leader_epoch: int | None = None,
    ) -> AppendResult:
        """Assign offsets to ``batch`` (rewriting its baseOffset in place) and write it.

        One ``os.write`` of the caller's buffer, no copy. Not durable until a
        ``flush`` returns a ``durable_end_offset`` beyond ``last_offset``.
        ``leader_epoch`` (a replicated partition's leader) is stamped into the
        batch's partitionLeaderEpoch and recorded in :attr:`epoch_cache`; None
        leaves the field as the producer sent it and the cache alone.
        """
        self._check_writable()
        view, size, delta, max_timestamp = check_append(batch)
        base = self.log_end_offset
        last = base + delta
        if leader_epoch is not None:
            # Before anything else changes: an epoch going back is refused here.
            if leader_epoch != self.epoch_cache.latest_epoch:
                self._record_epoch(leader_epoch, base)
            set_batch_leader_epoch(view, leader_epoch)
        segment = self._segments[-1]
        if self._must_roll(segment, size, last, now_ms):
            segment = self._roll(now_ms)
        batch_header.set_base_offset(view, base)
        if log_append_time:
            batch_header.set_log_append_time(view, now_ms)
            max_timestamp = now_ms
        try:
            position = segment.append(view, base, last, max_timestamp, now_ms)
        except OSError as exc:
            raise self._go_offline("append", exc) from exc
        self.log_end_offset = last + 1
        return AppendResult(base, last, now_ms if log_append_time else -1, position, size)

    def _must_roll(self, segment: Segment, size: int, last: int, now_ms: int) -> bool:
        """Whether a batch of ``size`` bytes ending at ``last`` starts a new segment."""
        config = self.config
        return segment.is_full(size, last, config.segment_bytes, config.max_index_entries) or (
            segment.size > 0
            and segment.first_batch_timestamp is not None
            and now_ms - segment.first_batch_timestamp > config.segment_ms
        )

    def append_replicated(
        self, batch: bytes | bytearray | memoryview, *, now_ms: int
    ) -> AppendResult:
        """Store a batch fetched from the partition leader exactly as it is.

        Its baseOffset must be at least this log's end offset (else
        UnexpectedAppendOffset, naming both; a later one leaves the offset hole the
        leader's cleaner left) and its CRC must match (else InvalidReplicatedBatch);
        nothing in it is rewritten, so any buffer will do. A leader epoch new to this
        log is recorded in :attr:`epoch_cache` (and its checkpoint) before the batch is
        written, and so is a hole (``replica-gaps.checkpoint``: recovery then accepts
        it). Segments roll and indexes grow as for :meth:`append`.
        """
        self._check_writable()
        fields = check_replicated_batch(batch, self.log_end_offset, self.epoch_cache)
        self._allow_gaps_below(fields[1] if fields[1] > self.log_end_offset else 0)
        return self._append_checked(*fields, now_ms)

    def append_replicated_batches(
        self, records: bytes | bytearray | memoryview, *, now_ms: int
    ) -> list[AppendResult]:
        """:meth:`append_replicated` for each whole batch of a fetch response's records.

        Every batch is checked before the first is written, so a bad one (which
        raises) leaves the log as it was; a partial batch at the end is ignored.
        """
        self._check_writable()
        batches = split_fetched_batches(records)
        expected = self.log_end_offset
        epochs = LeaderEpochCache(list(self.epoch_cache.entries))
        checked = []
        gaps_below = 0
        for batch in batches:
            fields = check_replicated_batch(batch, expected, epochs)
            base = fields[1]
            if base > expected:
                gaps_below = base
            if fields[5] >= 0:
                epochs.assign(fields[5], base)
            expected = base + fields[3] + 1
            checked.append(fields)
        self._allow_gaps_below(gaps_below)  # once per fetch answer: one checkpoint write
        return [self._append_checked(*fields, now_ms) for fields in checked]

    def _allow_gaps_below(self, offset: int) -> None:
        """Persist that offset holes are legal below ``offset`` before one is written."""
        if offset <= self._replica_gaps_below:
            return
        with self._checkpoint_lock:
            try:
                write_replica_gaps_checkpoint(self.directory, offset)
            except OSError as exc:
                raise self._go_offline("replica gaps checkpoint", exc) from exc
            self._replica_gaps_below = offset

    def _append_checked(
        self,
        view: memoryview,
        base: int,
        size: int,
        delta: int,
        max_timestamp: int,
        epoch: int,
        now_ms: int,
    ) -> AppendResult:
        last = base + delta
        if epoch >= 0 and epoch != self.epoch_cache.latest_epoch:
            self._record_epoch(epoch, base)
        segment = self._segments[-1]
        if self._must_roll(segment, size, last, now_ms):
            # Named after the batch (Kafka's rule): after a hole the log end may be too
            # far below it for the segment's 32-bit relative offsets.
            segment = self._roll(now_ms, base)
        try:
            position = segment.append(view, base, last, max_timestamp, now_ms)
        except OSError as exc:
            raise self._go_offline("append", exc) from exc
        self.log_end_offset = last + 1
        return AppendResult(base, last, -1, position, size)

    def begin_epoch(self, epoch: int) -> bool:
        """A leader's term begins: ``epoch`` starts at the log end. True if that is news.

        Persisted (the checkpoint rewritten) before returning. Blocking: one atomic
        file write with its fsyncs.
        """
        self._check_writable()
        return self._record_epoch(epoch, self.log_end_offset)

    # ------------------------------------------------------------------ segments

    def _roll(self, now_ms: int, base_offset: int | None = None) -> Segment:
        old = self._segments[-1]
        old.seal()
        base = self.log_end_offset if base_offset is None else base_offset
        try:
            new = Segment.create(self.directory, base, self.config.index_interval_bytes, now_ms)
        except OSError as exc:
            raise self._go_offline("roll", exc) from exc
        with self._lock:
            self._segments = [*self._segments, new]
        return new

    def roll(self, now_ms: int | None = None) -> None:
        """Start a new segment now (if the active one holds anything)."""
        self._check_writable()
        if self._segments[-1].size > 0:
            self._roll(self._now_ms() if now_ms is None else now_ms)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and start it at ``offset``, past its end (Kafka's
        truncateFullyAndStartAt): a follower whose log ends below its leader's log start
        holds nothing the leader still has, and fetches from that start.

        Nothing is cut: the log moves past its end. A hole up to ``offset`` is declared
        legal first, then a segment starts at ``offset`` and the log start moves there,
        each persisted in that order, so a crash in between leaves the old log (the
        follower meets out of range again and comes back here) or the old records below
        a hole, under a log start that hides them once persisted. The old segments are
        below the log start: retention removes them. The epoch cache is emptied (the
        leader's batches bring their epochs). Blocking, durable when it returns; call it
        from the thread that appends.
        """
        self._check_writable()
        if offset <= self.log_end_offset:
            raise ValueError(f"start at {offset}: not past the log end {self.log_end_offset}")
        with self.cleaning_lock:
            self._allow_gaps_below(offset)
            self._roll(self._now_ms(), offset)
            with self._lock:
                self.log_end_offset = offset
                self.log_start_offset = offset
                self.epoch_cache.clear()
        self.flush()
        self._persist_log_start()
        self._persist_epochs()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush, write the indexes and the clean-shutdown marker, release files."""
        if self._closed:
            return
        # A cleaner's swap in progress (storage/cleaner.py) ends first; the cleaner
        # checks ``closed`` before its next one.
        with self.cleaning_lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        try:
            if not self.offline:
                self.flush()
                active = self._segments[-1]
                try:
                    active.indexer.checkpoint()
                    active.write_index_files(sync=True)
                    self._persist_log_start()
                    marker = {
                        "log_end_offset": self.log_end_offset,
                        "active_segment": active.base_offset,
                        "active_size": active.size,
                    }
                    write_file_atomically(
                        self.directory / CLEAN_SHUTDOWN_MARKER, json.dumps(marker).encode()
                    )
                except OSError as exc:
                    raise self._go_offline("close", exc) from exc
        finally:
            self.abort()

    def abort(self) -> None:
        """Release every file without flushing or marking a clean shutdown.

        The next ``open`` then recovers, exactly as after a crash.
        """
        self._closed = True
        self.dir_state.leave(self)
        self._close_retired(None)
        for segment in self._segments:
            with contextlib.suppress(OSError):
                segment.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ introspection

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._segments]

    def __repr__(self) -> str:
        return (
            f"<PartitionLog {self.directory} [{self.log_start_offset}, {self.log_end_offset})"
            f" durable<{self.durable_end_offset} segments={len(self._segments)}>"
        )
