"""Opening a partition log's directory: the clean path, or recovery after a crash.

With a clean-shutdown marker that matches the files, every segment and its indexes are
trusted as they are. Without one, segments below the recovery point (fully synced
before the crash) are trusted if their indexes pass a sanity check, and the rest are
scanned batch by batch: the indexes are rebuilt, a torn tail is cut off, and whatever
follows the first bad batch or an offset gap is dropped. Files an interrupted atomic
write or a deleted segment left behind are removed first.

The layout (the segment files are :mod:`~trio_broker.storage.segment`'s) is described
in :mod:`trio_broker.storage.log`, which builds the log from what :class:`LogLoader`
returns. This module never imports trio; it blocks only in plain ``os`` calls.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import attrs

from trio_broker.protocol import batch_header
from trio_broker.storage.durable import TMP_SUFFIX, fsync_dir, write_file_atomically
from trio_broker.storage.index import OffsetIndex, SegmentIndexer, TimeIndex, quick_check
from trio_broker.storage.recovery import scan_segment
from trio_broker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    Segment,
    parse_segment_name,
    pread_exact,
)
from trio_broker.storage.swap import finish_interrupted_swaps, read_gaps_below

__all__ = [
    "CLEAN_SHUTDOWN_MARKER",
    "LEADER_EPOCH_CHECKPOINT",
    "LOG_START_CHECKPOINT",
    "RECOVERY_POINT_CHECKPOINT",
    "LoadedLog",
    "LogLoader",
    "RecoveryReport",
]

LOG_START_CHECKPOINT = "log-start-offset.checkpoint"
#: The leader-epoch cache (PartitionLog reads and writes it; the loader only names it).
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point.checkpoint"
CLEAN_SHUTDOWN_MARKER = ".clean-shutdown"


@attrs.frozen
class RecoveryReport:
    """What ``open`` found; kept on the log for logs, metrics and tests."""

    clean: bool
    segments_scanned: int = 0
    bytes_truncated: int = 0
    segments_dropped: int = 0
    stop_reason: str | None = None
    #: the leader-epoch checkpoint was damaged and the cache rebuilt from batch headers.
    epoch_cache_rebuilt: bool = False


@attrs.frozen
class LoadedLog:
    """What :meth:`LogLoader.load` found: the pieces a PartitionLog is built from."""

    #: Oldest first; the last one is active.
    segments: list[Segment]
    log_start_offset: int
    recovery: RecoveryReport
    #: The log start offset the checkpoint file holds (or stands for, when absent).
    persisted_log_start: int
    #: Base offset below which every segment is fully synced, as persisted.
    recovery_point: int


class LogLoader:
    """Reads a log directory back: the clean path or crash recovery.

    :meth:`load` leaves the directory consistent (leftovers removed, torn tails cut,
    indexes rebuilt, the directory synced) and returns the pieces of the log; the
    caller (:meth:`PartitionLog.open <trio_broker.storage.log.PartitionLog.open>`)
    builds the log from them, then persists the log start offset and, after a
    recovery, syncs the scanned data.
    """

    def __init__(
        self, directory: Path, index_interval_bytes: int, now_ms: Callable[[], int]
    ) -> None:
        self.directory = directory
        self.index_interval_bytes = index_interval_bytes
        self.now_ms = now_ms
        self.dir_dirty = False
        self.gaps_below = 0

    def load(self) -> LoadedLog:
        d = self.directory
        names = {p.name for p in d.iterdir()}
        for name in names:
            if name.endswith(TMP_SUFFIX):  # an atomic write that never got renamed
                os.unlink(d / name)
                self.dir_dirty = True
        names = {n for n in names if not n.endswith(TMP_SUFFIX)}
        # A cleaning pass the crash interrupted (storage/swap.py): roll back before
        # its commit point, finish after it. A finished swap rebuilds by scanning.
        swapped = finish_interrupted_swaps(d, names)
        self.dir_dirty |= swapped
        #: below this offset the cleaner (or a follower's leader) may have left offset holes.
        self.gaps_below = read_gaps_below(d)
        bases = sorted(b for n in names if (b := parse_segment_name(n)) is not None)
        stems = {f"{b:020d}" for b in bases}
        for name in names:
            stem, _, suffix = name.partition(".")
            if "." + suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX) and stem not in stems:
                os.unlink(d / name)  # indexes of a segment that is gone
                self.dir_dirty = True
        log_start = _read_int(d / LOG_START_CHECKPOINT)
        recovery_point = _read_int(d / RECOVERY_POINT_CHECKPOINT)
        marker = _read_marker(d / CLEAN_SHUTDOWN_MARKER)
        if CLEAN_SHUTDOWN_MARKER in names:
            # Gone (durably) before anything can be appended: a stale marker
            # after a later crash would skip a scan that is needed.
            os.unlink(d / CLEAN_SHUTDOWN_MARKER)
            self.dir_dirty = True

        segments: list[Segment] | None = None
        report = RecoveryReport(clean=True)
        if (
            marker is not None
            and not swapped
            and bases
            and marker.get("active_segment") == bases[-1]
        ):
            segments = self._load_clean(bases, marker)
        if segments is None:
            segments, report = self._recover(bases, recovery_point)

        start = max(log_start or 0, segments[0].base_offset)
        end = segments[-1].next_offset
        # The checkpoint is written before segments are deleted, so it is never
        # below the first segment. If it is, the first segment was lost in the
        # crash (its directory entry never made durable) and what follows can't
        # be served: offsets would have a hole. Nothing there was durable -
        # a flush syncs the directory before declaring anything durable.
        hole = not report.clean and log_start is not None and segments[0].base_offset > log_start
        if start > end or hole:
            # Also: DeleteRecords moved the start past data a crash then lost.
            # Every offset below the start is gone anyway, so begin empty at it.
            start = log_start if hole and log_start is not None else start
            for segment in segments:
                segment.unlink()
                segment.close()
            segments = [self._new_segment(start)]
            report = attrs.evolve(report, segments_dropped=report.segments_dropped + 1)
            self.dir_dirty = True
        if self.dir_dirty:
            fsync_dir(d)
        for segment in segments:
            segment.dir_synced = True
        # A missing checkpoint means "the first segment's base offset", and a
        # recovery point at the first segment trusts nothing: neither needs a
        # file until it says more than that (saves fsyncs when creating topics).
        first_base = segments[0].base_offset
        persisted_log_start = first_base if log_start is None else log_start
        point = max(first_base, -1 if recovery_point is None else recovery_point)
        active_base = segments[-1].base_offset
        if point > active_base:
            # Recovery dropped the segments after a trusted one, which is now
            # active again and will change: stop vouching for it before any append.
            write_file_atomically(d / RECOVERY_POINT_CHECKPOINT, b"%d\n" % active_base)
            point = active_base
        return LoadedLog(segments, start, report, persisted_log_start, point)

    def _new_segment(self, base: int) -> Segment:
        segment = Segment.create(self.directory, base, self.index_interval_bytes, self.now_ms())
        segment.synced_size = 0
        os.fdatasync(segment.fd)
        self.dir_dirty = True
        return segment

    # -- clean path: trust everything the marker vouches for
    def _load_clean(self, bases: list[int], marker: dict[str, int]) -> list[Segment] | None:
        segments: list[Segment] = []
        try:
            for i, base in enumerate(bases):
                last = i == len(bases) - 1
                next_base = marker["log_end_offset"] if last else bases[i + 1]
                segment = self._load_trusted(base, next_base, active=last)
                if segment is None:
                    raise _Untrusted
                segments.append(segment)
            if segments[-1].size != marker.get("active_size"):
                raise _Untrusted
        except (_Untrusted, KeyError, TypeError):
            for segment in segments:
                segment.close()
            return None
        return segments

    def _load_trusted(self, base: int, next_base: int, *, active: bool) -> Segment | None:
        """A segment whose files were fully synced: read its indexes, don't scan.

        None when the index files fail the sanity check (the caller scans then).
        """
        fd = Segment.open_file(self.directory, base)
        try:
            stat = os.fstat(fd)
            size = stat.st_size
            offset_index, time_index = self._load_indexes(base, active=active)
            if (
                offset_index is None
                or time_index is None
                or not quick_check(offset_index, time_index, size, next_base - base)
            ):
                raise _Untrusted
        except (_Untrusted, OSError):
            os.close(fd)
            return None
        indexer = SegmentIndexer.resume(self.index_interval_bytes, offset_index, time_index, size)
        mtime = stat.st_mtime_ns // 1_000_000
        first_ts = _first_batch_timestamp(fd, size, mtime) if active else None
        segment = Segment(
            self.directory,
            base,
            fd,
            size=size,
            next_offset=next_base,
            indexer=indexer,
            first_batch_timestamp=first_ts,
        )
        segment.last_modified_ms = mtime
        segment.synced_size = size
        if not active:
            segment.sealed = True
            segment.fully_synced = True
            indexer.offset_index.freeze()
            indexer.time_index.freeze()
        return segment

    def _load_indexes(
        self, base: int, *, active: bool
    ) -> tuple[OffsetIndex | None, TimeIndex | None]:
        stem = self.directory / f"{base:020d}"
        loaded: list[OffsetIndex | TimeIndex | None] = []
        for suffix, cls in ((INDEX_SUFFIX, OffsetIndex), (TIMEINDEX_SUFFIX, TimeIndex)):
            try:
                fd = os.open(stem.with_suffix(suffix), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                loaded.append(None)
                continue
            try:
                index = cls.load(fd, mutable=active)
            finally:
                os.close(fd)
            loaded.append(index)  # type: ignore[arg-type]
        offset_index, time_index = loaded
        assert offset_index is None or isinstance(offset_index, OffsetIndex)
        assert time_index is None or isinstance(time_index, TimeIndex)
        return offset_index, time_index

    # -- crash path
    def _recover(
        self, bases: list[int], recovery_point: int | None
    ) -> tuple[list[Segment], RecoveryReport]:
        segments: list[Segment] = []
        scanned = truncated = dropped = 0
        reason: str | None = None
        expected: int | None = None
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            # A cleaned segment may end before the next one begins (holes below the
            # cleaner checkpoint); anywhere else the offsets must continue exactly.
            continues = (
                expected is None
                or base == expected
                or (expected < base and expected < self.gaps_below)
            )
            if reason is not None or not continues:
                # Everything after the first bad batch (or an offset gap) goes:
                # keeping it would leave a hole in the offsets.
                reason = reason or f"segment {base} does not continue at {expected}"
                self._drop(base)
                dropped += 1
                continue
            segment: Segment | None = None
            if recovery_point is not None and base < recovery_point and not last:
                segment = self._load_trusted(base, bases[i + 1], active=False)
            if segment is None:
                segment, cut, reason = self._scan(base)
                scanned += 1
                truncated += cut
            segments.append(segment)
            expected = segment.next_offset
        # A crash can leave the newest segment files empty (created, nothing
        # durable written); drop them so the log continues in the previous one -
        # unless that one ends in a compaction hole: the log end would go back.
        while (
            len(segments) > 1
            and segments[-1].size == 0
            and segments[-1].base_offset <= segments[-2].next_offset
        ):
            empty = segments.pop()
            empty.unlink()
            empty.close()
            self.dir_dirty = True
            dropped += 1
        if not segments:
            segments = [self._new_segment(0)]
        active = segments[-1]
        if active.sealed:
            # It was trusted as sealed but is now the newest: reopen it for appends.
            active.sealed = active.fully_synced = False
            offset_index = OffsetIndex(bytearray(active.offset_index.raw()))
            time_index = TimeIndex(bytearray(active.time_index.raw()))
            active.offset_index.close()
            active.time_index.close()
            active.indexer = SegmentIndexer.resume(
                self.index_interval_bytes, offset_index, time_index, active.size
            )
            active.first_batch_timestamp = _first_batch_timestamp(
                active.fd, active.size, active.last_modified_ms
            )
        for segment in segments[:-1]:
            if not segment.sealed:
                segment.seal()  # the flush below writes and syncs its rebuilt indexes
        return segments, RecoveryReport(
            clean=False,
            segments_scanned=scanned,
            bytes_truncated=truncated,
            segments_dropped=dropped,
            stop_reason=reason,
        )

    def _scan(self, base: int) -> tuple[Segment, int, str | None]:
        fd = Segment.open_file(self.directory, base)
        stat = os.fstat(fd)
        indexer = SegmentIndexer(self.index_interval_bytes)
        result = scan_segment(fd, stat.st_size, base, indexer, gaps_below=self.gaps_below)
        cut = stat.st_size - result.valid_size
        if cut:
            os.ftruncate(fd, result.valid_size)
        first_ts = result.first_batch_timestamp
        mtime = stat.st_mtime_ns // 1_000_000
        segment = Segment(
            self.directory,
            base,
            fd,
            size=result.valid_size,
            next_offset=result.next_offset,
            indexer=indexer,
            first_batch_timestamp=(first_ts if first_ts is None or first_ts >= 0 else mtime),
        )
        segment.last_modified_ms = mtime
        return segment, cut, result.stop_reason

    def _drop(self, base: int) -> None:
        stem = self.directory / f"{base:020d}"
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stem.with_suffix(suffix))
        self.dir_dirty = True


class _Untrusted(Exception):
    pass


def _first_batch_timestamp(fd: int, size: int, mtime_ms: int) -> int | None:
    """segment.ms counts from the first batch's maxTimestamp (the mtime without one)."""
    if size < batch_header.HEADER_SIZE:
        return None
    ts = batch_header.max_timestamp(pread_exact(fd, batch_header.HEADER_SIZE, 0))
    return ts if ts >= 0 else mtime_ms


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = int(raw.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError included
        return None  # a damaged checkpoint is treated as absent: recovery is safe
    return value if value >= 0 else None


def _read_marker(path: Path) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        return None
    return data
