"""Truncation: a follower cuts its log back after a leader change (``truncate_to``).

The steps are ordered so that a crash anywhere leaves a prefix of the old log at
least as long as the new end ("Follower storage" in docs/storage.md). Part of
:class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``).

This module never imports trio.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os

from trio_broker.storage.durable import TMP_SUFFIX, rename_durably, write_all, write_file_atomically
from trio_broker.storage.errors import OffsetOutOfRange
from trio_broker.storage.index import SegmentIndexer
from trio_broker.storage.loader import RECOVERY_POINT_CHECKPOINT
from trio_broker.storage.log_snapshots import ProducerSnapshots
from trio_broker.storage.log_state import base_of
from trio_broker.storage.recovery import scan_segment
from trio_broker.storage.segment import Segment
from trio_broker.storage.swap import (
    read_cleaner_checkpoint,
    read_gaps_below,
    write_cleaner_checkpoint,
)


class Truncation(ProducerSnapshots):
    """``truncate_to`` and the file work behind it."""

    def truncate_to(self, offset: int) -> int:
        """Cut the log so that it ends at ``offset`` (a follower after a leader change).

        Kafka's rule: the batch holding ``offset`` goes whole, so the new end is the
        base offset of that batch (at most ``offset``); an ``offset`` in an offset hole
        (compaction's) is the new end itself, every batch after it goes. Returns the
        new log end offset. A no-op when ``offset`` >= the log end. Below the log start offset
        (or where the cut would remove the batch holding it) it raises
        OffsetOutOfRange: there is no "truncate fully and start at" here.

        Durable when it returns: a crash at any point leaves a prefix of the old log
        at least as long as the new end (as far as it was durable before). Segments
        past the cut are deleted; the kept part of the segment holding the cut is
        copied into a new file that replaces it, so in-flight reads of the old
        bytes go on from the old descriptors (kept ``file.delete.delay.ms``).
        Blocking (fsyncs); call it from the thread that appends, with no append
        in between. The epoch cache is cut at the new end too, and producer state
        snapshots named past it are deleted.
        """
        self._check_writable()
        with self.cleaning_lock, self._flush_lock:
            end, start = self.log_end_offset, self.log_start_offset
            if offset >= end:
                return end
            if offset < start:
                raise OffsetOutOfRange(offset, start, end)
            segments = self._segments
            k = max(0, bisect.bisect_right(segments, offset, key=base_of) - 1)
            info = segments[k].position_of(offset)
            if info is None:
                # In a hole after this segment's last batch: the segment stays whole.
                position, new_end = segments[k].size, offset
            else:
                if info.base_offset < start:
                    raise OffsetOutOfRange(offset, start, end)
                position, new_end = info.position, min(offset, info.base_offset)
                if position == 0 and k > 0 and segments[k].base_offset > new_end:
                    # The hole ends where segment k begins: segment k goes, and the one
                    # before becomes the active segment (new appends may land in the hole).
                    k -= 1
                    position = segments[k].size
            try:
                # Producer snapshots past the cut describe batches that go: they go first
                # (Kafka's truncateAndReload), or a log grown back past them could load one.
                self.delete_producer_snapshots(above=new_end)
                self._cut(k, position, new_end)
                # The cleaner trusts everything below its checkpoint to hold one record
                # per key; appends after the cut are dirty (Kafka lowers it the same way).
                if read_cleaner_checkpoint(self.directory) > new_end:
                    write_cleaner_checkpoint(self.directory, new_end)
            except OSError as exc:
                raise self._go_offline("truncate", exc) from exc
        with self._lock:
            changed = self.epoch_cache.truncate_from_end(self.log_end_offset)
        if changed:
            self._persist_epochs()
        return self.log_end_offset

    def _cut(self, k: int, position: int, new_end: int) -> None:
        """Keep segments[:k] and the first ``position`` bytes of segments[k]; the order of
        the steps is what makes a crash anywhere leave a prefix (docs/storage.md)."""
        segments = self._segments
        old = segments[k]
        doomed = segments[k + 1 :]
        # 1. Recovery must scan the cut segment and everything after it: a trusted
        #    segment would vouch for bytes the cut may have removed.
        if self._recovery_point > old.base_offset:
            with self._checkpoint_lock:
                write_file_atomically(
                    self.directory / RECOVERY_POINT_CHECKPOINT, b"%d\n" % old.base_offset
                )
                self._recovery_point = old.base_offset
        # 2. The kept bytes into a new file, synced (the old inode stays intact for
        #    readers holding its descriptor).
        tmp = old.log_path.with_name(old.log_path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _copy_prefix(old.fd, fd, position)
            os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        # 3. Names: later segments and the cut segment's stale indexes go, the new
        #    file takes the old name; one directory fsync makes it all durable.
        for segment in doomed:
            segment.unlink()
        for path in (old.index_path, old.timeindex_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        rename_durably([(tmp, old.log_path)])
        fresh = self._reopen_cut(old, position, new_end)
        now = self._now_ms()
        with self._lock:
            self._segments = [*segments[:k], fresh]
            self.log_end_offset = new_end
            self.durable_end_offset = min(self.durable_end_offset, new_end)
            delay = now + self.config.file_delete_delay_ms
            # The old segment object keeps the old inode's descriptor: never unlink it
            # by name again (the name is the new file's now), only close it later.
            self._retired.extend((delay, segment) for segment in [old, *doomed])

    def _reopen_cut(self, old: Segment, size: int, new_end: int) -> Segment:
        """The active segment over the shortened file, indexes rebuilt as recovery would."""
        fd = Segment.open_file(self.directory, old.base_offset)
        try:
            indexer = SegmentIndexer(self.config.index_interval_bytes)
            scanned = scan_segment(
                fd,
                size,
                old.base_offset,
                indexer,
                gaps_below=read_gaps_below(self.directory),
            )
            # A cut into an offset hole ends after the last kept batch.
            if scanned.valid_size != size or scanned.next_offset > new_end:
                raise OSError(
                    errno.EIO,
                    f"segment {old.base_offset} reads back damaged after a truncation:"
                    f" {scanned.stop_reason}",
                )
        except BaseException:
            os.close(fd)
            raise
        first_ts = scanned.first_batch_timestamp
        fresh = Segment(
            self.directory,
            old.base_offset,
            fd,
            size=size,
            next_offset=new_end,
            indexer=indexer,
            # From the scan: a segment loaded sealed never kept it (segment.ms counts
            # from it again now that the segment is active).
            first_batch_timestamp=(
                first_ts if first_ts is None or first_ts >= 0 else old.last_modified_ms
            ),
        )
        fresh.last_modified_ms = old.last_modified_ms
        fresh.synced_size = size
        fresh.dir_synced = True
        return fresh


_COPY_CHUNK = 1 << 20


def _copy_prefix(source: int, target: int, length: int) -> None:
    """Copy the first ``length`` bytes of ``source`` to ``target`` (both at offset 0).

    In the kernel when it can (copy_file_range), else through a buffer.
    """
    copied = 0
    while copied < length:
        try:
            n = os.copy_file_range(source, target, length - copied, copied, copied)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            break
        if n == 0:
            raise OSError(errno.EIO, f"segment shorter than the {length} bytes to keep")
        copied += n
    while copied < length:
        chunk = os.pread(source, min(_COPY_CHUNK, length - copied), copied)
        if not chunk:
            raise OSError(errno.EIO, f"segment shorter than the {length} bytes to keep")
        os.lseek(target, copied, os.SEEK_SET)
        write_all(target, chunk)
        copied += len(chunk)
