"""Log compaction (Kafka's log cleaner): keep the latest record of each key.

Two halves. The pure half decides: which closed segments a pass may rewrite
(:func:`plan_cleaning`: ``min.compaction.lag.ms``, ``max.compaction.lag.ms``,
``min.cleanable.dirty.ratio``), the key -> latest offset map (:func:`build_offset_map`)
and what stays of each batch (:func:`filter_batch`). The file half
(:func:`clean_log`) reads the segments, writes the survivors into a new segment and
swaps it in with the crash-safe protocol of :mod:`trio_broker.storage.swap`.

What stays (docs/compaction.md):

- a record whose key has no later record in the cleaned range, and every record
  without a key;
- a tombstone (null value) until its batch's delete horizon has passed: the first
  pass that keeps it stamps the horizon (now + ``delete.retention.ms``) into the batch,
  as Kafka does since KIP-534 (attribute bit 6, the horizon as the base timestamp;
  record timestamps are unchanged);
- a transaction marker (control batch) while its transaction still has data in the
  log (Kafka's ``CleanedTransactionMetadata``): the first pass that finds none stamps a
  delete horizon into the marker, a pass after the horizon drops it (KIP-534);
- transactional data as Kafka's cleaner treats it, when the partition's transaction
  state is given (:class:`TransactionFacts`): only below the last stable offset (an
  open transaction is not decided yet); a committed transaction's records are
  compacted like any others; an aborted transaction's batches are dropped and hide
  nothing (an aborted write must not remove the value it failed to replace). Without
  that state (a log no broker tracks) transactional batches stay whole and hide nothing;
- the last batch of every producer id in the log, whole, and its last data batch (the
  one with its last sequence) when a marker follows that, so the idempotent producer
  state rebuilt from batch headers after a restart stays right (Kafka's cleaner keeps
  the batch of each producer's last data offset, or the markers of its epoch when it
  has only markers).

The key map covers the dirty part (past ``cleaner-offset.checkpoint``), as in Kafka,
and the clean part's latest offsets besides: an earlier pass left the clean part with
one record per key except in the batches it kept whole, which a later pass filters once
their producer wrote again (Kafka keeps only such a batch's header). With ``max_keys``
(``log.cleaner.dedupe.buffer.size``) it takes dirty segments while their keys fit and
the pass stops after the last one it mapped; the next pass goes on from there.

A batch that keeps some records is re-encoded with the same base offset, last offset
delta, partition leader epoch, producer id, epoch, base sequence and codec; a batch
that keeps none is dropped, leaving an offset hole that fetch, the indexes and
recovery accept below the cleaner checkpoint.

This module never imports trio; it blocks only in plain ``os`` calls.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import attrs

from trio_broker.protocol import batch_header
from trio_broker.protocol.compression import XERIAL_MAGIC, Compression
from trio_broker.protocol.records import (
    LOG_APPEND_TIME,
    Record,
    RecordBatchView,
    build_batch,
)
from trio_broker.storage.durable import fsync_dir, rename_durably, write_all
from trio_broker.storage.index import MAX_RELATIVE_OFFSET, SegmentIndexer
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.recovery import scan_segment
from trio_broker.storage.segment import (
    LOG_SUFFIX,
    Segment,
    iter_batches,
    iter_headers,
    pread_exact,
)
from trio_broker.storage.swap import (
    cleaned_name,
    read_cleaner_checkpoint,
    swap_name,
    unlink_segment_files,
    write_cleaner_checkpoint,
)

#: Batch attribute bit 6 (KIP-534): the base timestamp holds the delete horizon.
DELETE_HORIZON_BIT = 0x40

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")

# --------------------------------------------------------------------------- planning


@attrs.frozen
class SegmentFacts:
    """What planning needs of one closed segment."""

    base_offset: int
    #: the offset the next segment starts at.
    end_offset: int
    size: int
    #: the largest record timestamp (the file's mtime without one).
    max_timestamp: int
    #: the first batch's timestamp: max.compaction.lag.ms counts from it.
    first_timestamp: int


@attrs.frozen
class CleaningPlan:
    #: how many of the oldest closed segments the pass rewrites.
    count: int
    #: the first offset the pass leaves alone (the next pass's first dirty offset).
    end_offset: int
    dirty_ratio: float
    #: cleaning is due whatever the ratio (max.compaction.lag.ms, a tombstone's horizon).
    forced: bool


def plan_cleaning(
    closed: Sequence[SegmentFacts],
    *,
    first_dirty: int,
    now_ms: int,
    config: LogConfig,
    tombstones_due: bool = False,
) -> CleaningPlan | None:
    """Whether a pass is due over the closed segments ``closed`` (oldest first), and its extent.

    Kafka's rules: a segment holding a record younger than ``min.compaction.lag.ms``
    and everything after it stay dirty; the pass runs when the dirty share of the
    cleanable bytes reaches ``min.cleanable.dirty.ratio``, or the oldest dirty record
    is older than ``max.compaction.lag.ms``, or (KIP-534) a tombstone is past its horizon.
    The plan, when there is one, covers 1 to ``len(closed)`` segments (tested with
    Hypothesis in tests/unit/storage/test_cleaner.py rather than a CrossHair contract).
    """
    count = 0
    for facts in closed:
        # Only the dirty segments wait out the lag (Kafka looks from the first dirty
        # offset, and not at all with a lag of 0): a clean segment with a recent or
        # future timestamp, such as one a pass emptied and a restart dated by its
        # file's mtime, must not hold back a dirty record past max.compaction.lag.ms.
        if (
            config.min_compaction_lag_ms > 0
            and facts.end_offset > first_dirty
            and now_ms - facts.max_timestamp < config.min_compaction_lag_ms
        ):
            break
        count += 1
    if count == 0:
        return None
    cleanable = closed[:count]
    dirty = [f for f in cleanable if f.end_offset > first_dirty]
    dirty_bytes = sum(f.size for f in dirty)
    total = sum(f.size for f in cleanable)
    ratio = dirty_bytes / total if total else 0.0
    overdue = bool(dirty) and now_ms - dirty[0].first_timestamp > config.max_compaction_lag_ms
    if not dirty and not tombstones_due:
        return None
    if ratio < config.min_cleanable_dirty_ratio and not overdue and not tombstones_due:
        return None
    return CleaningPlan(count, cleanable[-1].end_offset, ratio, overdue or tombstones_due)


def group_segments(
    facts: Sequence[SegmentFacts], segment_bytes: int, max_index_entries: int
) -> list[int]:
    """Sizes (in segments) of consecutive groups, each rewritten into one segment.

    A group's input fits ``segment_bytes`` and its offsets fit the index's 32-bit
    relative offsets; a segment bigger than that is a group of its own.
    """
    groups: list[int] = []
    i = 0
    while i < len(facts):
        size, n = facts[i].size, 1
        while (
            i + n < len(facts)
            and size + facts[i + n].size <= segment_bytes
            and facts[i + n].end_offset - facts[i].base_offset <= MAX_RELATIVE_OFFSET
            and n < max_index_entries
        ):
            size += facts[i + n].size
            n += 1
        groups.append(n)
        i += n
    return groups


# --------------------------------------------------------------------------- filtering


@attrs.frozen
class TransactionFacts:
    """A partition's transaction state, as far as cleaning needs it (Kafka's rules)."""

    #: Nothing at or above it is cleaned: a transaction open there is not decided yet.
    last_stable_offset: int
    #: (producer id, first offset, marker offset) of every aborted transaction.
    aborted: tuple[tuple[int, int, int], ...] = ()
    #: The producer ids the partition's producer state holds (not expired by
    #: producer.id.expiration.ms): only their last batches are kept whole (Kafka's
    #: lastRecordsOfActiveProducers). None: not known, every producer's are kept.
    active_producers: frozenset[int] | None = None
    #: The replica's high watermark: retention after a pass deletes no segment reaching
    #: above it. None: the whole log is committed.
    high_watermark: int | None = None

    def is_aborted(self, batch: RecordBatchView) -> bool:
        """Whether ``batch`` is data of an aborted transaction."""
        if not batch.is_transactional or batch.is_control:
            return False
        return self.aborted_at(batch.producer_id, batch.base_offset)

    def aborted_at(self, pid: int, offset: int) -> bool:
        """Whether the producer's transactional data at ``offset`` was aborted."""
        return any(p == pid and first <= offset <= last for p, first, last in self.aborted)

    def has_abort_marker_at(self, batch: RecordBatchView) -> bool:
        """Whether ``batch`` is the marker of one of the aborted transactions."""
        pid, offset = batch.producer_id, batch.base_offset
        return any(p == pid and last == offset for p, _first, last in self.aborted)


def _keeps_whole(batch: RecordBatchView, txns: TransactionFacts | None = None) -> bool:
    """Transactional data and markers are filtered only when the transactions' fate is known."""
    return txns is None and (batch.is_control or batch.is_transactional)


class TransactionTracker:
    """Whether a marker's transaction still has data in the log (Kafka's
    ``CleanedTransactionMetadata``), fed every batch of a pass in log order.

    A transaction's data precedes its marker; a producer has one open transaction at a
    time. A marker may go once a pass reaches it without having met data of its
    transaction: the data was removed by earlier passes (compacted away, aborted) or by
    retention. Meeting it in this pass keeps the marker, even if the pass drops that
    data, so a marker always outlives its data by at least one pass.
    """

    def __init__(self) -> None:
        #: producers whose current transaction had a batch in this pass.
        self._with_data: set[int] = set()
        #: ... and a batch this pass keeps.
        self._with_kept_data: set[int] = set()
        #: the last marker read: its transaction had data, all of which this pass drops
        #: (the next pass can give it a horizon, so one is due right away).
        self.emptied = False
        #: the offsets of the markers this pass read.
        self.markers_seen: set[int] = set()

    def marker_without_data(self, batch: RecordBatchView) -> bool:
        """Note ``batch``; for a marker, whether its transaction had no data left."""
        if batch.is_control:
            pid = batch.producer_id
            self.markers_seen.add(batch.base_offset)
            had_data = pid in self._with_data
            self.emptied = had_data and pid not in self._with_kept_data
            self._with_data.discard(pid)
            self._with_kept_data.discard(pid)
            return not had_data
        if batch.is_transactional:
            self._with_data.add(batch.producer_id)
        return False

    def data_kept(self, batch: RecordBatchView) -> None:
        """The pass keeps (some of) ``batch``."""
        if batch.is_transactional and not batch.is_control:
            self._with_kept_data.add(batch.producer_id)


def build_offset_map(
    batches: Iterable[tuple[RecordBatchView, Sequence[Record]]],
    offsets: dict[bytes, int] | None,
    *,
    kept_whole: set[int] | None = None,
    pinned: set[bytes] | None = None,
    txns: TransactionFacts | None = None,
) -> None:
    """Record in ``offsets`` the latest offset of every key of ``batches`` (in log order).

    ``pinned`` collects the keys of batches that stay whole (transactional ones, and
    those whose base offset is in ``kept_whole``): their tombstones must stay too, or
    the older value a whole batch keeps would come back as the latest. ``offsets`` None:
    only ``pinned`` is collected (the clean part of the log).
    """
    for batch, records in batches:
        if batch.is_control:
            continue  # a marker's record is no key of the topic
        aborted = txns is not None and txns.is_aborted(batch)
        whole = _keeps_whole(batch, txns) or (
            kept_whole is not None and batch.base_offset in kept_whole
        )
        if whole and pinned is not None:
            pinned.update(r.key for r in records if r.key is not None)
        if _keeps_whole(batch, txns) or aborted or offsets is None:
            continue
        base = batch.base_offset
        for record in records:
            if record.key is not None:
                offsets[record.key] = base + record.offset_delta


def delete_horizon(batch: RecordBatchView) -> int | None:
    """The delete horizon a previous pass stamped into the batch, if any."""
    if batch.attributes & DELETE_HORIZON_BIT:
        return batch.base_timestamp
    return None


@attrs.frozen
class Filtered:
    """What :func:`filter_batch` decided for one batch."""

    #: the records that stay (all of them: the batch is kept as it is).
    kept: tuple[Record, ...]
    #: write these bytes instead of the batch; None with ``kept``: keep the original;
    #: None without: drop the batch.
    rewritten: bytes | None
    #: a kept tombstone's delete horizon, for scheduling the pass that drops it.
    horizon: int | None = None

    @property
    def dropped(self) -> bool:
        return not self.kept


def filter_batch(
    batch: RecordBatchView,
    records: Sequence[Record],
    offsets: dict[bytes, int],
    *,
    now_ms: int,
    delete_retention_ms: int,
    keep_whole: bool = False,
    pinned: set[bytes] | frozenset[bytes] = frozenset(),
    txns: TransactionFacts | None = None,
    marker_without_data: bool = False,
) -> Filtered:
    """Which records of ``batch`` survive a pass whose key map is ``offsets``.

    ``keep_whole``: the batch is its producer's last one in the log. A tombstone of a
    key in ``pinned`` (see :func:`build_offset_map`) outlives its horizon. With
    ``txns``, an aborted transaction's batch is dropped, and a marker whose transaction
    has no data left (``marker_without_data``, from :class:`TransactionTracker`) gets a
    delete horizon, then goes once it has passed.
    """
    if keep_whole or _keeps_whole(batch, txns):
        return Filtered(tuple(records), None)
    if batch.is_control:
        if not marker_without_data:
            return Filtered(tuple(records), None)
        marker_horizon = delete_horizon(batch)
        if marker_horizon is None:
            stamped = now_ms + delete_retention_ms
            return Filtered(tuple(records), encode_retained(batch, records, stamped), stamped)
        if now_ms < marker_horizon:
            return Filtered(tuple(records), None, marker_horizon)
        return Filtered((), None)
    if txns is not None and txns.is_aborted(batch):
        return Filtered((), None)
    base = batch.base_offset
    horizon = delete_horizon(batch)
    kept: list[Record] = []
    tombstones = False
    for record in records:
        if record.key is not None:
            latest = offsets.get(record.key)
            if latest is not None and base + record.offset_delta < latest:
                continue  # a later record has this key
            if record.value is None:
                if horizon is None or now_ms < horizon:
                    tombstones = True
                elif record.key not in pinned:
                    continue  # the tombstone's grace period is over
                # else: past its horizon but pinned; kept, and no reason for a pass
        kept.append(record)
    if not kept:
        return Filtered((), None)
    stamp = tombstones and horizon is None
    if len(kept) == len(records) and not stamp:
        return Filtered(tuple(records), None, horizon if tombstones else None)
    new_horizon = (now_ms + delete_retention_ms) if stamp else horizon
    rewritten = encode_retained(batch, kept, new_horizon if stamp else None)
    return Filtered(tuple(kept), rewritten, new_horizon if tombstones else None)


def encode_retained(
    batch: RecordBatchView, kept: Sequence[Record], stamp_horizon: int | None
) -> bytes:
    """``batch`` re-encoded with only ``kept``; offsets, producer fields and codec stay.

    The last offset delta stays the original one (so the batch covers the same offsets
    and its producer's last sequence is unchanged, as in Kafka). With ``stamp_horizon``
    the batch gets the delete-horizon bit and the horizon as its base timestamp; every
    record's timestamp delta is shifted so that its timestamp does not change.
    """
    base_timestamp = batch.base_timestamp
    records: Sequence[Record] = kept
    if stamp_horizon is not None:
        shift = base_timestamp - stamp_horizon
        records = [attrs.evolve(r, timestamp_delta=r.timestamp_delta + shift) for r in kept]
        base_timestamp = stamp_horizon
    log_append = bool(batch.attributes & batch_header.TIMESTAMP_TYPE_BIT)
    codec = batch.compression
    # Snappy keeps its framing: xerial (the Java and Python clients') or raw (librdkafka's).
    xerial = (
        codec is Compression.SNAPPY
        and bytes(batch.buf[batch_header.HEADER_SIZE : batch_header.HEADER_SIZE + 8])
        == XERIAL_MAGIC
    )
    out = build_batch(
        records,
        base_offset=batch.base_offset,
        compression=codec,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        base_timestamp=base_timestamp,
        partition_leader_epoch=batch.partition_leader_epoch,
        is_transactional=batch.is_transactional,
        is_control=batch.is_control,
        timestamp_type=LOG_APPEND_TIME if log_append else 0,
        snappy_xerial=xerial,
    )
    attributes = _I16.unpack_from(out, batch_header.ATTRIBUTES_AT)[0]
    if stamp_horizon is not None or delete_horizon(batch) is not None:
        attributes |= DELETE_HORIZON_BIT
    _I16.pack_into(out, batch_header.ATTRIBUTES_AT, attributes)
    _I32.pack_into(out, batch_header.LAST_OFFSET_DELTA_AT, batch.last_offset_delta)
    if log_append:
        # Every record's timestamp is the batch's LogAppendTime (its maxTimestamp).
        _I64.pack_into(out, batch_header.MAX_TIMESTAMP_AT, batch.max_timestamp)
    _U32.pack_into(out, batch_header.CRC_AT, batch_header.compute_crc(out))
    return bytes(out)


# --------------------------------------------------------------------------- rate limit


class Throttler:
    """Keeps the cleaner's reads and writes under ``bytes_per_second`` (Kafka's Throttler):
    after each chunk of work it sleeps for as long as the work ran ahead of the rate."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        stop: threading.Event | None = None,
    ) -> None:
        self.bytes_per_second = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._stop = stop
        self._start = clock()
        self._bytes = 0

    def maybe_throttle(self, nbytes: int) -> None:
        self._bytes += nbytes
        if self.bytes_per_second <= 0 or self.bytes_per_second == float("inf"):
            return
        due = self._start + self._bytes / self.bytes_per_second
        ahead = due - self._clock()
        if ahead > 0:
            if self._stop is not None:
                self._stop.wait(ahead)
            else:
                self._sleep(ahead)


# --------------------------------------------------------------------------- the pass


class CleaningStopped(Exception):
    """The broker is shutting down: the pass stopped between two groups or batches."""


@attrs.define
class CleanResult:
    """What one pass did (for logs, metrics, the bench and tests)."""

    segments_in: int = 0
    segments_out: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    batches_dropped: int = 0
    batches_rewritten: int = 0
    records_dropped: int = 0
    #: markers dropped (their transaction had no data left and their horizon passed).
    markers_dropped: int = 0
    #: (producer id, marker offset) of the aborted transactions (TransactionFacts) with no
    #: data left: their marker got its horizon or went, or was gone already. The fetch
    #: path's aborted list must forget them before a later pass removes the marker.
    aborts_without_data: list[tuple[int, int]] = attrs.field(factory=list)
    #: distinct keys in the key map (at most ``max_keys``, or one segment's worth).
    keys_mapped: int = 0
    #: when a later pass has work: the earliest delete horizon of a kept tombstone or
    #: marker, or now when a marker's data all went in this pass (its horizon is next).
    next_horizon: int | None = None
    seconds: float = 0.0


def segment_facts(log: PartitionLog, segments: Sequence[Segment]) -> list[SegmentFacts]:
    bases = log.segment_base_offsets()
    following = dict(itertools.pairwise(bases))
    facts = []
    for segment in segments:
        end = following.get(segment.base_offset, segment.next_offset)
        first = segment.first_batch_timestamp
        if first is None:
            first = _first_timestamp(segment)
        facts.append(
            SegmentFacts(
                segment.base_offset, end, segment.size, segment.retention_timestamp(), first
            )
        )
    return facts


def _first_timestamp(segment: Segment) -> int:
    if segment.size < batch_header.HEADER_SIZE:
        return segment.last_modified_ms
    ts = batch_header.max_timestamp(pread_exact(segment.fd, batch_header.HEADER_SIZE, 0))
    return ts if ts >= 0 else segment.last_modified_ms


def plan_for(
    log: PartitionLog, now_ms: int, *, tombstones_due: bool = False
) -> CleaningPlan | None:
    """:func:`plan_cleaning` for a live log (None for a log that is not compacted)."""
    if not log.config.compact or log.closed or log.offline:
        return None
    closed = log.cleanable_segments()
    if not closed:
        return None
    return plan_cleaning(
        segment_facts(log, closed),
        first_dirty=read_cleaner_checkpoint(log.directory),
        now_ms=now_ms,
        config=log.config,
        tombstones_due=tombstones_due,
    )


def _read_batches(
    segment: Segment, throttler: Throttler | None, stop: threading.Event | None
) -> Iterator[tuple[RecordBatchView, list[Record]]]:
    for info in iter_batches(segment.fd, 0, segment.size):
        if stop is not None and stop.is_set():
            raise CleaningStopped
        raw = pread_exact(segment.fd, info.size, info.position)
        if len(raw) != info.size:
            raise OSError(f"segment {segment.base_offset} is shorter than its batches")
        if throttler is not None:
            throttler.maybe_throttle(info.size)
        batch = RecordBatchView(raw)
        yield batch, batch.records()


def _last_batches_of_producers(
    log: PartitionLog, cleaned: Sequence[Segment], end_offset: int, txns: TransactionFacts | None
) -> set[int]:
    """Base offsets of each active producer's last batch and last data batch in the whole
    log (headers only); every producer's when ``txns`` does not say which are active.

    The last data batch holds the producer's last sequence (Kafka's LogCleaner keeps
    the batch of each active producer's lastDataOffset); the last batch, when a marker,
    holds its latest epochs (Kafka keeps the markers of a producer with no data). Not
    aborted data: Kafka keeps only its header (an empty batch), which we do not write;
    it goes as aborted data does, and no older batch is kept in its place (a rebuild
    that saw an older sequence would refuse the producer's next one). An expired producer
    keeps nothing: its state is gone, a rebuild must not bring it back.
    """
    active = None if txns is None else txns.active_producers
    last: dict[int, int] = {}
    #: producer id -> (base offset, transactional) of its last data batch.
    last_data: dict[int, tuple[int, bool]] = {}

    def note(header: bytes | memoryview) -> None:
        fields = batch_header.unpack_header(header)
        pid, base, attributes = fields.producer_id, fields.base_offset, fields.attributes
        if pid >= 0 and (active is None or pid in active):
            last[pid] = base
            if not attributes & batch_header.CONTROL_BIT:
                last_data[pid] = (base, bool(attributes & batch_header.TRANSACTIONAL_BIT))

    for segment in cleaned:
        for _, header in iter_headers(segment.fd, 0, segment.size):
            note(header)
    for _, header in log.iter_batch_headers(end_offset):
        note(header)
    kept = set(last.values())
    for pid, (base, transactional) in last_data.items():
        if not (transactional and txns is not None and txns.aborted_at(pid, base)):
            kept.add(base)
    return kept


def clean_log(
    log: PartitionLog,
    now_ms: int,
    *,
    plan: CleaningPlan | None = None,
    throttler: Throttler | None = None,
    stop: threading.Event | None = None,
    after_step: Callable[[str], None] | None = None,
    txns: TransactionFacts | None = None,
    max_keys: int | None = None,
) -> CleanResult | None:
    """One cleaning pass over ``log`` (blocking: run it in a worker thread).

    None when no pass is due. ``after_step(name)`` is called between the steps of
    the swap protocol (crash tests kill the process there). ``txns``: the
    partition's transaction state; the pass then stops below its last stable offset.
    ``max_keys``: the key map's bound; the pass stops after the last dirty segment
    whose keys fit (at least one), and the next pass goes on from there.
    """
    started = time.monotonic()
    plan = plan or plan_for(log, now_ms)
    if plan is None:
        return None
    segments = log.cleanable_segments()[: plan.count]
    facts = segment_facts(log, segments)
    if txns is not None:  # only decided transactions: segments below the LSO
        below = sum(1 for _ in itertools.takewhile(
            lambda f: f.end_offset <= txns.last_stable_offset, facts))  # fmt: skip
        segments, facts = segments[:below], facts[:below]
    if not segments:
        return None
    config = log.config
    result = CleanResult()
    # Batches kept whole: every producer's last one in the log up to the end of the dirty
    # part (a bounded key map may end the pass earlier; keeping more is safe).
    keep_whole = _last_batches_of_producers(log, segments, facts[-1].end_offset, txns)
    first_dirty = read_cleaner_checkpoint(log.directory)
    clean_count = sum(1 for _ in itertools.takewhile(lambda f: f.end_offset <= first_dirty, facts))
    pinned: set[bytes] = set()
    # An earlier pass left one record per key here, but for batches it kept whole: once
    # their producer wrote again they are filtered like any other, so the clean part's
    # latest offsets are mapped too (else a superseded record kept whole outlives its
    # key's tombstone and the deleted value comes back).
    clean_offsets: dict[bytes, int] = {}
    for segment in segments[:clean_count]:
        build_offset_map(_read_batches(segment, throttler, stop), clean_offsets,
                         kept_whole=keep_whole, pinned=pinned, txns=txns)  # fmt: skip
    offsets: dict[bytes, int] = {}
    mapped = clean_count
    for segment in segments[clean_count:]:
        segment_offsets: dict[bytes, int] = {}
        segment_pinned: set[bytes] = set()
        build_offset_map(
            _read_batches(segment, throttler, stop), segment_offsets, kept_whole=keep_whole,
            pinned=segment_pinned, txns=txns,
        )  # fmt: skip
        new_keys = sum(1 for key in segment_offsets if key not in offsets)
        if max_keys is not None and mapped > clean_count and len(offsets) + new_keys > max_keys:
            break  # the map is full: this segment and the rest wait for the next pass
        offsets.update(segment_offsets)
        pinned |= segment_pinned
        mapped += 1
    segments, facts = segments[:mapped], facts[:mapped]
    result.keys_mapped = len(offsets)
    offsets = clean_offsets | offsets  # the dirty part's later offsets win
    tracker = TransactionTracker() if txns is not None else None
    step = after_step or (lambda _name: None)
    index = 0
    cleaned_end = -1
    for size in group_segments(facts, config.segment_bytes, config.max_index_entries):
        group = segments[index : index + size]
        end = facts[index + size - 1].end_offset
        index += size
        if stop is not None and stop.is_set():
            raise CleaningStopped
        written = _clean_group(
            log, group, end, offsets, keep_whole, pinned, now_ms, result, throttler, stop, step,
            txns, tracker,
        )  # fmt: skip
        if not written:
            break
        cleaned_end = end
    if txns is not None and tracker is not None:
        # An aborted transaction whose marker an earlier pass removed (the state that
        # still names it came from before: a snapshot) has no data left either.
        result.aborts_without_data.extend(
            (pid, last) for pid, _first, last in txns.aborted
            if last < cleaned_end and last not in tracker.markers_seen
        )  # fmt: skip
    result.seconds = time.monotonic() - started
    return result


def _clean_group(
    log: PartitionLog,
    group: list[Segment],
    end: int,
    offsets: dict[bytes, int],
    keep_whole: set[int],
    pinned: set[bytes],
    now_ms: int,
    result: CleanResult,
    throttler: Throttler | None,
    stop: threading.Event | None,
    step: Callable[[str], None],
    txns: TransactionFacts | None = None,
    tracker: TransactionTracker | None = None,
) -> bool:
    directory = log.directory
    base = group[0].base_offset
    config = log.config
    cleaned_path = directory / cleaned_name(base)
    fd = os.open(cleaned_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    indexer = SegmentIndexer(config.index_interval_bytes)
    position = 0
    first_ts: int | None = None
    try:
        for segment in group:
            for batch, records in _read_batches(segment, throttler, stop):
                result.bytes_read += batch.size_in_bytes
                # Every batch goes through the tracker, in log order, before its verdict.
                without_data = tracker is not None and tracker.marker_without_data(batch)
                whole = batch.base_offset in keep_whole
                verdict = filter_batch(
                    batch,
                    records,
                    offsets,
                    now_ms=now_ms,
                    delete_retention_ms=config.delete_retention_ms,
                    keep_whole=whole,
                    pinned=pinned,
                    txns=txns,
                    marker_without_data=without_data,
                )
                horizon = verdict.horizon
                if without_data and txns is not None and txns.has_abort_marker_at(batch):
                    result.aborts_without_data.append((batch.producer_id, batch.base_offset))
                if tracker is not None:
                    if not verdict.dropped:
                        tracker.data_kept(batch)
                    if batch.is_control and tracker.emptied and not whole:
                        horizon = now_ms  # the next pass stamps this marker: due now
                if horizon is not None and (
                    result.next_horizon is None or horizon < result.next_horizon
                ):
                    result.next_horizon = horizon
                if verdict.dropped:
                    result.batches_dropped += 1
                    if batch.is_control:
                        result.markers_dropped += 1
                    else:
                        result.records_dropped += len(records)
                    continue
                data = verdict.rewritten
                if data is None:
                    data = bytes(batch.buf[: batch.size_in_bytes])
                else:
                    result.batches_rewritten += 1
                    result.records_dropped += len(records) - len(verdict.kept)
                write_all(fd, data)
                max_ts = batch_header.max_timestamp(data)
                if first_ts is None:
                    first_ts = max_ts
                indexer.on_batch(batch.base_offset - base, position, len(data), max_ts)
                position += len(data)
                if throttler is not None:
                    throttler.maybe_throttle(len(data))
        os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(cleaned_path)
        raise
    step("cleaned-written")
    result.segments_in += len(group)
    result.bytes_written += position
    with log.cleaning_lock:
        if log.closed or log.offline or not _still_in_log(log, group):
            os.close(fd)
            os.unlink(cleaned_path)
            return False
        # Holes become legal below the checkpoint before any file with holes can be
        # read as a segment (storage/swap.py, step 2).
        if read_cleaner_checkpoint(directory) < end:
            write_cleaner_checkpoint(directory, end)
        step("checkpoint-written")
        swap_path = directory / swap_name(base, end)
        rename_durably([(cleaned_path, swap_path)])
        step("swap-committed")
        for segment in group:
            unlink_segment_files(directory, segment.base_offset)
        step("old-deleted")
        rename_durably([(swap_path, directory / (group[0].name + LOG_SUFFIX))])
        step("swap-renamed")
        cleaned = _open_cleaned(log, fd, base, position, end, indexer, group, first_ts)
        cleaned.write_index_files(sync=True)
        fsync_dir(directory)
        step("indexes-written")
        log.replace_segments(group, cleaned, now_ms)
    result.segments_out += 1
    return True


def _still_in_log(log: PartitionLog, group: list[Segment]) -> bool:
    live = {id(s) for s in log.cleanable_segments()}
    return all(id(s) in live for s in group)


def _open_cleaned(
    log: PartitionLog,
    fd: int,
    base: int,
    size: int,
    end: int,
    indexer: SegmentIndexer,
    group: list[Segment],
    first_ts: int | None,
) -> Segment:
    segment = Segment(
        log.directory,
        base,
        fd,
        size=size,
        next_offset=end,
        indexer=indexer,
        first_batch_timestamp=first_ts,
    )
    segment.last_modified_ms = max(s.last_modified_ms for s in group)
    segment.synced_size = size
    segment.seal()
    segment.dir_synced = True
    segment.fully_synced = True
    return segment


def verify_segment(segment_fd: int, size: int, base: int, gaps_below: int) -> bool:
    """Whether a segment file reads back whole (for tests and the bench)."""
    scanned = scan_segment(segment_fd, size, base, gaps_below=gaps_below)
    return scanned.valid_size == size and scanned.stop_reason is None


__all__ = [
    "DELETE_HORIZON_BIT",
    "CleanResult",
    "CleaningPlan",
    "CleaningStopped",
    "Filtered",
    "SegmentFacts",
    "Throttler",
    "TransactionTracker",
    "build_offset_map",
    "clean_log",
    "delete_horizon",
    "encode_retained",
    "filter_batch",
    "group_segments",
    "plan_cleaning",
    "plan_for",
]
