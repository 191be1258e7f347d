"""Retention: whole old segments go by age, size or the log start offset; DeleteRecords.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``). Files
removed keep their descriptors for ``file.delete.delay.ms`` (in-flight sendfiles).

This module never imports trio.
"""

from __future__ import annotations

from trio_broker.storage.errors import OffsetOutOfRange, StorageError
from trio_broker.storage.log_snapshots import ProducerSnapshots
from trio_broker.storage.segment import segments_to_delete


class Retention(ProducerSnapshots):
    """``apply_retention`` and ``delete_records``."""

    def apply_retention(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Delete whole old segments by retention.ms / retention.bytes / log start offset.

        Never deletes the active segment, nor one reaching above ``high_watermark``
        (a replica's; None: everything is committed). Returns how many segments went.
        """
        self._close_retired(now_ms)
        if self._closed:
            return 0
        # Not blocking: a swap in progress only postpones retention to its next round.
        if not self.cleaning_lock.acquire(blocking=False):
            return 0
        try:
            return self._apply_retention(now_ms, high_watermark)
        finally:
            self.cleaning_lock.release()

    def _apply_retention(self, now_ms: int, high_watermark: int | None) -> int:
        with self._lock:
            segments = self._segments
            # Age and size retention belong to the "delete" policy; a compact-only
            # log loses segments only below its log start offset.
            by_policy = self.config.delete
            count = segments_to_delete(
                [s.size for s in segments],
                [s.next_offset for s in segments],
                [s.retention_timestamp() for s in segments],
                log_start_offset=self.log_start_offset,
                now_ms=now_ms,
                retention_ms=self.config.retention_ms if by_policy else None,
                retention_bytes=self.config.retention_bytes if by_policy else None,
                high_watermark=high_watermark,
            )
            if count == 0:
                return 0
            doomed = segments[:count]
            self._segments = segments[count:]
            self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            self._retired.extend((now_ms + self.config.file_delete_delay_ms, s) for s in doomed)
        # The checkpoint goes first: a crash between the two steps then leaves
        # only segments below the log start offset, which the next pass removes.
        self._persist_log_start()
        self._trim_epochs_to_start()
        for segment in doomed:
            try:
                segment.unlink()
            except OSError as exc:
                raise self._go_offline("delete segment", exc) from exc
        self.prune_producer_snapshots()  # their producer snapshots go with them
        return count

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset (DeleteRecords); returns the new log start offset.

        Persists the offset before returning. Segments wholly below it go at the
        next ``apply_retention``.
        """
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")
        with self._lock:
            if not 0 <= before_offset <= self.log_end_offset:
                raise OffsetOutOfRange(before_offset, self.log_start_offset, self.log_end_offset)
            if before_offset <= self.log_start_offset:
                return self.log_start_offset
            self.log_start_offset = before_offset
        self._persist_log_start()
        self._trim_epochs_to_start()
        return self.log_start_offset
