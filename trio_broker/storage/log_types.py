"""What both log backends share: the log settings, the append checks, the results.

:class:`LogConfig` (a topic's log settings), the checks an append makes before it
stores anything (:func:`check_append_buffer` for a leader's append,
:func:`check_replicated_batch` for a follower's copy), and what appends and reads
return (:class:`AppendResult`, :class:`FileRegion`). :mod:`trio_broker.storage.log`
re-exports them, where most callers import them from.

This module never imports trio.
"""

from __future__ import annotations

import time

import attrs

from trio_broker.protocol import batch_header
from trio_broker.storage.epoch_cache import (
    EpochOrderViolation,
    LeaderEpochCache,
    batch_leader_epoch,
)
from trio_broker.storage.errors import InvalidReplicatedBatch, UnexpectedAppendOffset
from trio_broker.storage.index import INDEX_ENTRY_MIN_BYTES
from trio_broker.storage.segment import pread_exact

_WEEK_MS = 7 * 24 * 3600 * 1000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _infinite_as_none(value: int | None) -> int | None:
    # Kafka spells "no limit" as -1; we spell it None.
    return None if value is None or value < 0 else value


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _segment_bytes(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    # Positions in the offset index are uint32 and a segment may exceed
    # segment_bytes by one batch, so cap it where Kafka does (Int.MaxValue).
    if not 0 < value <= 0x7FFFFFFF:
        raise ValueError(f"segment_bytes must be in 1..2**31-1, got {value}")


@attrs.frozen
class LogConfig:
    """Per-partition log settings (Kafka's topic-level names in the comments)."""

    segment_bytes: int = attrs.field(default=1 << 30, validator=_segment_bytes)  # segment.bytes
    segment_ms: int = attrs.field(default=_WEEK_MS, validator=_positive)  # segment.ms
    index_interval_bytes: int = attrs.field(default=4096)  # index.interval.bytes
    retention_ms: int | None = attrs.field(  # retention.ms
        default=_WEEK_MS, converter=_infinite_as_none
    )
    retention_bytes: int | None = attrs.field(default=None, converter=_infinite_as_none)
    file_delete_delay_ms: int = 60_000  # file.delete.delay.ms
    # cleanup.policy: "delete" removes old segments by retention; "compact" keeps the
    # latest record per key (storage/cleaner.py); "compact,delete" does both.
    compact: bool = False
    delete: bool = True
    delete_retention_ms: int = 86_400_000  # delete.retention.ms: tombstones' grace period
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = 2**63 - 1  # max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio

    @property
    def max_index_entries(self) -> int:
        """Entries a full segment can need: one per interval, at least a header apart."""
        return self.segment_bytes // max(self.index_interval_bytes, INDEX_ENTRY_MIN_BYTES) + 1


def check_append_buffer(batch: bytearray | memoryview) -> tuple[memoryview, int, int]:
    """(byte view, size, lastOffsetDelta) of a buffer ``append`` may store, else raise.

    Only what storage itself relies on is checked: the header must describe
    exactly this buffer. CRCs and record counts are the produce handler's job.
    """
    view, size, delta, _ = check_append(batch)
    return view, size, delta


def check_append(
    batch: bytes | bytearray | memoryview, writable: bool = True
) -> tuple[memoryview, int, int, int]:
    """check_append_buffer plus the batch's maxTimestamp: one header unpack per append.

    ``writable=False`` for a batch stored unchanged (a follower's): any buffer will do.
    """
    view = memoryview(batch)
    if writable and view.readonly:
        raise TypeError("append rewrites baseOffset in place: pass a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = len(view)
    if size < batch_header.HEADER_SIZE:
        raise ValueError(f"{size} bytes is shorter than a batch header")
    declared, magic, delta, max_timestamp = batch_header.append_fields(view)
    if declared != size:
        raise ValueError(f"batchLength says {declared} bytes but the buffer holds {size}")
    if magic != batch_header.MAGIC:
        raise ValueError("only magic 2 batches can be stored")
    if delta < 0:
        raise ValueError(f"negative lastOffsetDelta {delta}")
    return view, size, delta, max_timestamp


def check_replicated_batch(
    batch: bytes | bytearray | memoryview, log_end_offset: int, epochs: LeaderEpochCache
) -> tuple[memoryview, int, int, int, int, int]:
    """(view, base offset, size, lastOffsetDelta, maxTimestamp, leader epoch) of a fetched
    batch that a follower at ``log_end_offset`` may store unchanged, else raise.

    The header as ``append`` checks it, then what only a copy needs: the batch starts
    at or after the log end (UnexpectedAppendOffset when before: an overlap), its CRC
    matches and its leader epoch (if any) does not go back (InvalidReplicatedBatch).
    A batch starting after the log end leaves an offset hole: the leader's cleaner
    removed the batches between (Kafka's followers accept such holes too; the leader's
    fetch answer is the truth). Changes nothing.
    """
    try:
        view, size, delta, max_timestamp = check_append(batch, writable=False)
    except ValueError as exc:
        raise InvalidReplicatedBatch(f"fetched batch: {exc}") from exc
    base = batch_header.base_offset_and_size(view)[0]
    if base < log_end_offset:
        raise UnexpectedAppendOffset(base, log_end_offset)
    if not batch_header.crc_matches(view):
        raise InvalidReplicatedBatch(f"fetched batch at offset {base}: CRC mismatch")
    epoch = batch_leader_epoch(view)
    if epoch >= 0 and epoch != epochs.latest_epoch:
        try:
            epochs.check_assign(epoch, base)
        except EpochOrderViolation as exc:
            raise InvalidReplicatedBatch(f"fetched batch at offset {base}: {exc}") from exc
    return view, base, size, delta, max_timestamp, epoch


def split_fetched_batches(records: bytes | bytearray | memoryview) -> list[memoryview]:
    """The whole batches of a fetch response's records, in order.

    A partial batch at the end (a fetch's ``max_bytes`` may cut one) is left out; a
    batch length shorter than a header is damage and raises InvalidReplicatedBatch.
    """
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    batches: list[memoryview] = []
    pos, end = 0, len(view)
    while end - pos >= batch_header.LOG_OVERHEAD:
        _, size = batch_header.base_offset_and_size(view, pos)
        if size < batch_header.HEADER_SIZE:
            raise InvalidReplicatedBatch(f"batch length {size} at byte {pos} is too small")
        if size > end - pos:
            break  # the partial trailing batch
        batches.append(view[pos : pos + size])
        pos += size
    return batches


@attrs.frozen
class AppendResult:
    base_offset: int
    last_offset: int
    #: the broker time stamped on the batch, -1 when it kept CreateTime.
    log_append_time: int
    #: where the batch starts in its segment file.
    position: int
    size: int


@attrs.frozen
class FileRegion:
    """A byte range of a segment file for ``os.sendfile``."""

    fd: int
    position: int
    length: int

    def read_bytes(self) -> bytes:
        return pread_exact(self.fd, self.length, self.position)
