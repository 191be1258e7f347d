"""Idempotent producers: sequence checks per (producer id, partition) and producer ids.

Kafka's rules, implemented once (docs/idempotence.md tells the whole story):

* a batch with producer id -1 is not idempotent and is never checked;
* an epoch older than the partition's is fenced: INVALID_PRODUCER_EPOCH;
* a batch whose (first, last) sequence equals one of the last five batches of the
  same epoch is a retried duplicate: it gets that batch's original offsets, no error;
* a newer epoch must start at sequence 0, the same epoch must continue at
  last sequence + 1 (wrapping from Int32 max to 0): else OUT_OF_ORDER_SEQUENCE_NUMBER;
* a producer the partition has no state for (new, or forgotten after retention or
  expiry) is accepted at any sequence: Kafka 2.5+ (KIP-360) no longer answers
  UNKNOWN_PRODUCER_ID here.

Layers, top to bottom: the rules (:func:`check_append`, :func:`apply_append`, pure, with
CrossHair contracts), the per-partition :class:`ProducerStateManager` (in memory,
pure), its snapshot codec, the producer id decision for InitProducerId, and last the
small amount of file I/O: :class:`ProducerIdAllocator` (persisted id blocks) and
:class:`ProducerStateRegistry` (one manager per partition log, snapshots beside the
log, rebuild from batch headers). Sync and trio-free like the rest of ``state/``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.durable import write_file_atomically

__all__ = [
    "BATCHES_TO_RETAIN",
    "INT32_MAX",
    "MAX_PRODUCER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "Append",
    "BatchMetadata",
    "Duplicate",
    "InitProducerIdDecision",
    "ProducerIdAllocator",
    "ProducerStateEntry",
    "ProducerStateManager",
    "ProducerStateRegistry",
    "ProducerStateStatistics",
    "Reject",
    "SnapshotError",
    "Verdict",
    "apply_append",
    "check_append",
    "decide_init_producer_id",
    "next_sequence",
]

log = logging.getLogger("trio_broker.producer")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
#: Epochs are int16 on the wire.
MAX_PRODUCER_EPOCH = 2**15 - 1
#: Kafka remembers this many batches per producer per partition for duplicate detection;
#: clients cap max.in.flight.requests.per.connection at 5 for idempotence to match.
BATCHES_TO_RETAIN = 5
#: Kafka's producer.id.expiration.ms: state of a producer silent this long is dropped.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
#: Kafka's producer.id.expiration.check.interval.ms.
EXPIRATION_CHECK_INTERVAL_MS = 600_000
#: Producer ids reserved per write of the id block file.
PRODUCER_ID_BLOCK_SIZE = 1000

SNAPSHOT_FILE = "producer_state.json"
PRODUCER_ID_FILE = "producer_id_block.json"
_SNAPSHOT_VERSION = 1


# ----------------------------------------------------------------------------- the state


@attrs.frozen
class BatchMetadata:
    """What is remembered of one appended idempotent batch."""

    first_seq: int = attrs.field(
        validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(INT32_MAX))
    )
    last_seq: int = attrs.field(
        validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(INT32_MAX))
    )
    first_offset: int
    last_offset: int
    #: The batch's max timestamp; drives producer expiry like Kafka's lastTimestamp.
    timestamp: int


def _one_to_five_batches(instance: object, attribute: object, value: tuple[object, ...]) -> None:
    if not 1 <= len(value) <= BATCHES_TO_RETAIN:
        raise ValueError(
            f"a producer entry holds 1 to {BATCHES_TO_RETAIN} batches, not {len(value)}"
        )


@attrs.frozen
class ProducerStateEntry:
    """One producer's state in one partition.

    ``batches`` holds the last (at most five) batches of the current epoch, oldest
    first, and is never empty: an entry exists only once a batch was appended.
    An epoch change forgets the older epoch's batches, as Kafka does, so the
    duplicate window never spans two epochs.
    """

    epoch: int
    batches: tuple[BatchMetadata, ...] = attrs.field(validator=_one_to_five_batches)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset

    @property
    def last_timestamp(self) -> int:
        return self.batches[-1].timestamp


@attrs.frozen
class Append:
    """The batch is the producer's next one: append it."""


@attrs.frozen
class Duplicate:
    """A retry of a batch still in the window: answer with its original offsets."""

    batch: BatchMetadata

    @property
    def original_base_offset(self) -> int:
        return self.batch.first_offset


@attrs.frozen
class Reject:
    """Refuse the batch with a Kafka error; nothing changes."""

    error_code: ErrorCode
    message: str


Verdict = Append | Duplicate | Reject

APPEND = Append()


# ----------------------------------------------------------------------------- the rules


def next_sequence(seq: int) -> int:
    """The sequence after ``seq``: sequences wrap from Int32 max to 0, as in Kafka.

    pre: 0 <= seq <= INT32_MAX
    post: 0 <= __return__ <= INT32_MAX and (__return__ == 0) == (seq == INT32_MAX)
    """
    return 0 if seq == INT32_MAX else seq + 1


def find_duplicate(
    entry: ProducerStateEntry, epoch: int, first_seq: int, last_seq: int
) -> BatchMetadata | None:
    """The remembered batch that ``(epoch, first_seq, last_seq)`` retries, if any."""
    if epoch != entry.epoch:
        return None
    for batch in entry.batches:
        if batch.first_seq == first_seq and batch.last_seq == last_seq:
            return batch
    return None


def check_append(
    entry: ProducerStateEntry | None, epoch: int, first_seq: int, last_seq: int
) -> Verdict:
    """Kafka's verdict on an idempotent batch, given the producer's partition state.

    ``entry`` is None when the partition knows nothing of the producer: a new one,
    or one whose state retention or expiry removed. Kafka 2.5+ accepts such a batch
    at any sequence (KIP-360); refusing it would make the client reset its sequence
    and resend, which is how duplicates get in.

    pre: 0 <= epoch <= MAX_PRODUCER_EPOCH and 0 <= first_seq <= INT32_MAX and 0 <= last_seq <= INT32_MAX
    post: entry is not None or isinstance(__return__, Append)
    post: isinstance(__return__, Reject) == (entry is not None and (epoch < entry.epoch or (epoch > entry.epoch and first_seq != 0) or (epoch == entry.epoch and find_duplicate(entry, epoch, first_seq, last_seq) is None and first_seq != next_sequence(entry.last_seq))))
    post: not isinstance(__return__, Duplicate) or (entry is not None and epoch == entry.epoch and __return__.batch in entry.batches and __return__.batch.first_seq == first_seq and __return__.batch.last_seq == last_seq)
    """
    if entry is None:
        return APPEND
    if epoch < entry.epoch:
        return Reject(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"producer epoch {epoch} is older than the partition's epoch {entry.epoch}",
        )
    if epoch > entry.epoch:
        if first_seq != 0:
            return Reject(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"new producer epoch {epoch} must start at sequence 0, not {first_seq}",
            )
        return APPEND
    duplicate = find_duplicate(entry, epoch, first_seq, last_seq)
    if duplicate is not None:
        return Duplicate(duplicate)
    expected = next_sequence(entry.last_seq)
    if first_seq != expected:
        return Reject(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"sequence {first_seq} is out of order: expected {expected}",
        )
    return APPEND


def apply_append(
    entry: ProducerStateEntry | None, epoch: int, batch: BatchMetadata
) -> ProducerStateEntry:
    """The producer's state after ``batch`` (of ``epoch``) was appended.

    Also used to replay the log on recovery, where nothing is checked: the log is
    the truth, whatever it holds.

    post: __return__.epoch == epoch and __return__.batches[-1] == batch and 1 <= len(__return__.batches) <= BATCHES_TO_RETAIN
    post: entry is None or entry.epoch != epoch or __return__.batches[:-1] == (entry.batches + (batch,))[-BATCHES_TO_RETAIN:-1]
    """
    if entry is None or entry.epoch != epoch:
        return ProducerStateEntry(epoch, (batch,))
    return ProducerStateEntry(epoch, (*entry.batches[1 - BATCHES_TO_RETAIN :], batch))


# ----------------------------------------------------------------- one partition's state


class SnapshotError(ValueError):
    """A snapshot file that cannot be used; the state is rebuilt from the log instead."""


@attrs.define(eq=False)
class ProducerStateManager:
    """Every idempotent producer's state in one partition.

    The broker calls :meth:`check` before an append and :meth:`append` after it, in
    the connection's handler task and in request order; a rejected batch leaves no
    trace, so the producer's later pipelined batches fail with
    OUT_OF_ORDER_SEQUENCE_NUMBER exactly as in Kafka.
    """

    producers: dict[int, ProducerStateEntry] = attrs.field(factory=dict)
    #: The state covers every batch below this offset (Kafka's map end offset):
    #: recovery replays the log from here.
    next_offset: int = 0

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> Verdict:
        if producer_id < 0:  # not idempotent (aiokafka even sends sequence 0 with id -1)
            return APPEND
        return check_append(self.producers.get(producer_id), epoch, first_seq, last_seq)

    def append(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int,
    ) -> None:
        """Remember an appended batch (any producer id: -1 only moves the offset)."""
        if producer_id >= 0 and first_seq >= 0:
            batch = BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp)
            self.producers[producer_id] = apply_append(
                self.producers.get(producer_id), epoch, batch
            )
        self.next_offset = max(self.next_offset, last_offset + 1)

    def replay(self, headers: Iterable[Any]) -> None:
        """Apply batch headers read back from the log (RecordBatchView-like), unchecked."""
        for h in headers:
            self.append(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence,
                h.base_offset,
                h.base_offset + h.last_offset_delta,
                h.max_timestamp,
            )

    def truncate_head(self, log_start_offset: int) -> None:
        """Forget producers whose batches all lie below the new log start offset.

        Kafka does the same when retention or DeleteRecords removes a producer's
        last batch; the producer then counts as unknown (accepted at any sequence).
        """
        gone = [pid for pid, e in self.producers.items() if e.last_offset < log_start_offset]
        for pid in gone:
            del self.producers[pid]
        self.next_offset = max(self.next_offset, log_start_offset)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> None:
        """Forget producers silent for ``expiration_ms`` (by their last batch's timestamp)."""
        gone = [
            pid for pid, e in self.producers.items() if now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in gone:
            del self.producers[pid]

    # ------------------------------------------------------------------ snapshot codec

    def to_snapshot(self) -> bytes:
        """The whole state as JSON: small (≤ 5 batches per producer) and readable."""
        doc = {
            "version": _SNAPSHOT_VERSION,
            "next_offset": self.next_offset,
            "producers": [
                [pid, e.epoch, [attrs.astuple(b) for b in e.batches]]
                for pid, e in sorted(self.producers.items())
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> ProducerStateManager:
        """Parse :meth:`to_snapshot` output; anything unexpected raises SnapshotError."""
        try:
            doc = json.loads(data)
            if doc["version"] != _SNAPSHOT_VERSION:
                raise SnapshotError(f"unknown snapshot version {doc['version']!r}")
            producers: dict[int, ProducerStateEntry] = {}
            for pid, epoch, batches in doc["producers"]:
                metas = tuple(BatchMetadata(*(int(v) for v in b)) for b in batches)
                if not isinstance(pid, int) or not isinstance(epoch, int):
                    raise SnapshotError("producer id and epoch must be integers")
                if not 1 <= len(metas) <= BATCHES_TO_RETAIN:
                    raise SnapshotError(f"producer {pid} has {len(metas)} batches")
                producers[pid] = ProducerStateEntry(epoch, metas)
            next_offset = doc["next_offset"]
            if not isinstance(next_offset, int) or next_offset < 0:
                raise SnapshotError(f"bad next offset {next_offset!r}")
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"unreadable producer state snapshot: {exc}") from None
        return cls(producers, next_offset)


# --------------------------------------------------------------- InitProducerId decisions


@attrs.frozen
class InitProducerIdDecision:
    """What InitProducerId answers: an error, or the producer id and epoch to use.

    ``producer_id`` is None when a fresh id must be allocated (epoch 0).
    """

    error_code: ErrorCode
    producer_id: int | None
    epoch: int


def decide_init_producer_id(
    requested_id: int, requested_epoch: int, issued_below: int
) -> InitProducerIdDecision:
    """InitProducerId without a transactional id.

    No id given: a fresh id. One of id/epoch given without the other: INVALID_REQUEST,
    as in Kafka. Both given (v3+, KIP-360) for an id this broker issued: the same id
    with the next epoch, so the client can restart its sequences at 0 without
    forgetting who it is; at the top epoch a fresh id instead. An id we never issued
    gets a fresh id rather than an error — clients take whatever id they are given.

    pre: issued_below >= 0
    post: __return__.error_code == ErrorCode.NONE or (requested_id == -1) != (requested_epoch == -1)
    post: __return__.error_code != ErrorCode.NONE or __return__.producer_id is None or (__return__.producer_id == requested_id and __return__.epoch == requested_epoch + 1 and 0 < __return__.epoch <= MAX_PRODUCER_EPOCH)
    """
    if requested_id == NO_PRODUCER_ID and requested_epoch == NO_PRODUCER_EPOCH:
        return InitProducerIdDecision(ErrorCode.NONE, None, 0)
    if requested_id == NO_PRODUCER_ID or requested_epoch == NO_PRODUCER_EPOCH:
        return InitProducerIdDecision(ErrorCode.INVALID_REQUEST, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if 0 <= requested_id < issued_below and 0 <= requested_epoch < MAX_PRODUCER_EPOCH:
        return InitProducerIdDecision(ErrorCode.NONE, requested_id, requested_epoch + 1)
    return InitProducerIdDecision(ErrorCode.NONE, None, 0)


# ---------------------------------------------------------------------------- file I/O


class ProducerIdAllocator:
    """Producer ids that never repeat, across restarts too.

    With a file, ids are reserved a block at a time: the block's end is written
    (atomically, fsynced) *before* any id from it is handed out, so a crash at
    worst skips the rest of a block. Without a file (memory mode) it just counts.
    """

    def __init__(self, path: Path | None, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        self.path = path
        self.block_size = block_size
        self._next = 0
        #: Ids below this are reserved on disk; None until the file was read.
        self._block_end: int | None = None if path is not None else 2**63 - 1

    def _reserved_end(self) -> int:
        # Read lazily, so that a bad file fails InitProducerId (which can say so)
        # rather than the produce path, which builds the registry too.
        if self._block_end is None:
            assert self.path is not None
            start = 0
            if self.path.exists():
                try:
                    start = int(json.loads(self.path.read_bytes())["next_block_start"])
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    # Guessing would risk reissuing ids: the operator has to look.
                    raise SnapshotError(
                        f"{self.path}: unreadable producer id block: {exc}"
                    ) from None
                if start < 0:
                    raise SnapshotError(f"{self.path}: negative producer id block {start}")
            self._next = self._block_end = start
        return self._block_end

    @property
    def issued_below(self) -> int:
        """Every id this broker ever handed out is below this (may include unused ids)."""
        end = self._reserved_end()
        return end if self.path is not None else self._next

    def allocate(self) -> int:
        """The next id; raises OSError or SnapshotError if its block cannot be reserved."""
        # Read the reserved end first: its first read also moves _next up to it.
        end = self._reserved_end()
        if self._next >= end:
            assert self.path is not None
            end = self._next + self.block_size
            write_file_atomically(self.path, json.dumps({"next_block_start": end}).encode())
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid


class PartitionLogLike(Protocol):
    """What the registry needs of a partition log (PartitionLog or MemoryLog)."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def iter_batch_headers(self, from_offset: int | None = None) -> Iterator[tuple[int, Any]]: ...


@attrs.define
class ProducerStateStatistics:
    """Counters since start, for operators and tests."""

    appended: int = 0
    duplicates: int = 0
    rejected: dict[ErrorCode, int] = attrs.field(factory=dict)
    partitions_loaded: int = 0


@attrs.define(eq=False)
class _PartitionSlot:
    #: The log the state belongs to; compared by identity to notice a recreated topic.
    log: PartitionLogLike
    manager: ProducerStateManager
    snapshot_path: Path | None
    #: The log start offset the state was last truncated to.
    log_start_offset: int


class ProducerStateRegistry:
    """One :class:`ProducerStateManager` per partition log, plus the producer id allocator.

    Managers are created on a partition's first idempotent batch: from the snapshot
    beside the log if it is usable, then by replaying the batch headers the log holds
    beyond it. :meth:`close` writes the snapshots (clean shutdown).
    """

    def __init__(
        self,
        data_dir: Path | None,
        now_ms: Callable[[], int],
        *,
        expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        read_headers: Callable[[PartitionLogLike, int], Iterator[Any]] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.now_ms = now_ms
        self.expiration_ms = expiration_ms
        self.allocator = ProducerIdAllocator(
            None if data_dir is None else data_dir / PRODUCER_ID_FILE
        )
        self._read_headers = read_headers or read_batch_headers
        self._partitions: dict[tuple[str, int], _PartitionSlot] = {}
        self._next_expiry_check = now_ms() + EXPIRATION_CHECK_INTERVAL_MS
        self._stats = ProducerStateStatistics()

    # ------------------------------------------------------------------ produce path

    def check(self, topic: str, partition: int, log_: PartitionLogLike, batch: Any) -> Verdict:
        if batch.producer_id < 0:
            return APPEND
        manager = self.manager(topic, partition, log_)
        self._maybe_expire()
        verdict = manager.check(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence
        )
        if isinstance(verdict, Duplicate):
            self._stats.duplicates += 1
        elif isinstance(verdict, Reject):
            rejected = self._stats.rejected
            rejected[verdict.error_code] = rejected.get(verdict.error_code, 0) + 1
        return verdict

    def record_append(
        self, topic: str, partition: int, batch: Any, base_offset: int, last_offset: int
    ) -> None:
        if batch.producer_id < 0:
            return
        slot = self._partitions.get((topic, partition))
        if slot is None:  # check() always runs first; a missing manager is a broker bug
            raise RuntimeError(f"no producer state for {topic}-{partition}")
        self._stats.appended += 1
        slot.manager.append(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
            base_offset,
            last_offset,
            batch.max_timestamp,
        )

    def manager(self, topic: str, partition: int, log_: PartitionLogLike) -> ProducerStateManager:
        key = (topic, partition)
        slot = self._partitions.get(key)
        # A deleted and recreated topic has a new log object: its old state must go.
        if slot is None or slot.log is not log_:
            slot = self._partitions[key] = self._load(log_)
        # Retention or DeleteRecords may have moved the log start since the last batch;
        # comparing first keeps the common case to one attribute read.
        start = log_.log_start_offset
        if start != slot.log_start_offset:
            slot.manager.truncate_head(start)
            slot.log_start_offset = start
        return slot.manager

    # ------------------------------------------------------------------ lifecycle

    def _load(self, log_: PartitionLogLike) -> _PartitionSlot:
        directory = log_directory(log_)
        path = None if directory is None else directory / SNAPSHOT_FILE
        start, end = log_.log_start_offset, log_.log_end_offset
        manager = ProducerStateManager(next_offset=start)
        if path is not None and path.exists():
            try:
                loaded = ProducerStateManager.from_snapshot(path.read_bytes())
            except (OSError, SnapshotError) as exc:
                log.warning("%s: %s; rebuilding producer state from the log", path, exc)
            else:
                # A snapshot past the log's end describes batches the log lost (an
                # unclean shutdown truncated it): useless, rebuild from scratch.
                if loaded.next_offset <= end:
                    manager = loaded
        manager.truncate_head(start)
        replay_from = manager.next_offset
        if replay_from < end:
            # The first header read may be a batch that straddles replay_from (the log
            # start can sit inside a batch); one wholly below it is already counted.
            manager.replay(
                h
                for h in self._read_headers(log_, replay_from)
                if h.base_offset + h.last_offset_delta >= replay_from
            )
        manager.next_offset = max(manager.next_offset, end)
        manager.remove_expired(self.now_ms(), self.expiration_ms)
        self._stats.partitions_loaded += 1
        return _PartitionSlot(log_, manager, path, start)

    def statistics(self) -> ProducerStateStatistics:
        return attrs.evolve(self._stats, rejected=dict(self._stats.rejected))

    def _maybe_expire(self) -> None:
        now = self.now_ms()
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + EXPIRATION_CHECK_INTERVAL_MS
        for slot in self._partitions.values():
            slot.manager.remove_expired(now, self.expiration_ms)

    def close(self) -> None:
        """Snapshot every partition's state (clean shutdown); errors are logged, not raised."""
        for (topic, partition), slot in self._partitions.items():
            # No path: memory mode. No directory: the topic was deleted meanwhile.
            if slot.snapshot_path is None or not slot.snapshot_path.parent.is_dir():
                continue
            try:
                write_file_atomically(slot.snapshot_path, slot.manager.to_snapshot())
            except OSError:
                log.exception("cannot snapshot producer state of %s-%d", topic, partition)
        self._partitions.clear()

    @classmethod
    def attached_to(cls, broker: Any) -> ProducerStateRegistry:
        """The broker's registry (its ``producers`` field)."""
        registry: ProducerStateRegistry = broker.producers
        return registry

    @staticmethod
    def close_attached(broker: Any) -> None:
        broker.producers.close()


def log_directory(log_: Any) -> Path | None:
    """A file-backed log's directory, None for an in-memory log."""
    for name in ("directory", "dir", "path"):
        value = getattr(log_, name, None)
        if isinstance(value, Path):
            return value
    return None


def read_batch_headers(log_: PartitionLogLike, from_offset: int) -> Iterator[Any]:
    """Batch headers of ``log_`` from the batch holding ``from_offset`` to the end.

    Only the 61-byte headers are read: replaying producer state never needs records.
    """
    # Imported here: protocol.records pulls in the compression codecs, which the
    # pure rules above (and CrossHair, which imports this module) do not need.
    from trio_broker.protocol.records import RecordBatchView

    for _base_offset, header in log_.iter_batch_headers(from_offset):
        yield RecordBatchView(header)
