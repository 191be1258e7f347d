"""Idempotent producers: the sequence rules per (producer id, partition), pure.

Kafka's rules, implemented once (docs/idempotence.md tells the whole story):

* a batch with producer id -1 is not idempotent and is never checked;
* an epoch older than the partition's is fenced: INVALID_PRODUCER_EPOCH;
* a batch whose (first, last) sequence equals one of the last five batches of the
  same epoch is a retried duplicate: it gets that batch's original offsets, no error;
* a newer epoch must start at sequence 0, the same epoch must continue at
  last sequence + 1 (wrapping from Int32 max to 0): else OUT_OF_ORDER_SEQUENCE_NUMBER;
* a producer the partition has no state for (new, or forgotten after expiry or a
  rebuild from a log that lost its batches) is accepted at any sequence: Kafka 2.5+ (KIP-360) no longer answers
  UNKNOWN_PRODUCER_ID here.

Layers, top to bottom: the rules (:func:`check_append`, :func:`apply_append`, pure, with
CrossHair contracts), the per-partition :class:`ProducerStateManager` (in memory,
pure), its snapshot codec (bytes in, bytes out), and the producer id decision for
InitProducerId. No file I/O here: the registry of partitions with its snapshot files
and the producer id allocator with its block file are in
:mod:`trio_broker.services.producers`. Sync and trio-free like the rest of ``state/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import ProtocolError
from trio_broker.protocol.records import read_control_marker
from trio_broker.state.partition_txns import PartitionTransactions, check_marker

__all__ = [
    "APPEND",
    "BATCHES_TO_RETAIN",
    "INT32_MAX",
    "MAX_PRODUCER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "Append",
    "BatchMetadata",
    "Duplicate",
    "InitProducerIdDecision",
    "ProducerStateEntry",
    "ProducerStateManager",
    "Reject",
    "SnapshotError",
    "Verdict",
    "apply_append",
    "check_append",
    "decide_init_producer_id",
    "next_sequence",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
#: Epochs are int16 on the wire.
MAX_PRODUCER_EPOCH = 2**15 - 1
#: Kafka remembers this many batches per producer per partition for duplicate detection;
#: clients cap max.in.flight.requests.per.connection at 5 for idempotence to match.
BATCHES_TO_RETAIN = 5
#: Version 2 adds the partition's transactions, version 3 the offset of each producer's
#: last marker, version 4 its timestamp; versions 1 to 3 still load.
_SNAPSHOT_VERSION = 4
_READABLE_SNAPSHOT_VERSIONS = (1, 2, 3, 4)


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
    or one whose state expiry removed (or a rebuild from a log without its batches). Kafka 2.5+ accepts such a batch
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
    #: Open and aborted transactions, the LSO (trio_broker.state.partition_txns).
    txns: PartitionTransactions = attrs.field(factory=PartitionTransactions)

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> Verdict:
        if producer_id < 0:  # not idempotent (aiokafka even sends sequence 0 with id -1)
            return APPEND
        marker = self.txns.markers.get(producer_id)
        if marker is not None and epoch < marker.producer_epoch:
            # A transaction marker already carried a newer epoch: this producer is fenced.
            return Reject(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer epoch {epoch} is older than the partition's epoch "
                f"{marker.producer_epoch}",
            )
        return check_append(self.producers.get(producer_id), epoch, first_seq, last_seq)

    def check_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> tuple[ErrorCode, str]:
        """May a transaction marker with these epochs be appended (trio_broker.state.partition_txns)?"""
        entry = self.producers.get(producer_id)
        return check_marker(
            None if entry is None else entry.epoch,
            self.txns.markers.get(producer_id),
            producer_epoch,
            coordinator_epoch,
        )

    def append(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int,
        *,
        is_transactional: bool = False,
    ) -> None:
        """Remember an appended data batch (any producer id: -1 only moves the offset)."""
        if producer_id >= 0 and first_seq >= 0:
            batch = BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp)
            self.producers[producer_id] = apply_append(
                self.producers.get(producer_id), epoch, batch
            )
            self.txns.on_data(producer_id, is_transactional, first_offset)
        self.next_offset = max(self.next_offset, last_offset + 1)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        committed: bool,
        offset: int,
        timestamp: int,
    ) -> None:
        """Remember an appended transaction marker (``timestamp``: the batch's max
        timestamp): it ends the producer's transaction."""
        self.txns.on_marker(
            producer_id, producer_epoch, coordinator_epoch, committed, offset, timestamp
        )
        self.next_offset = max(self.next_offset, offset + 1)

    def replay(self, batches: Iterable[Any]) -> None:
        """Apply batches read back from the log (RecordBatchView-like), unchecked.

        Data batches need only their header; control batches must be whole, as the
        marker's commit/abort is in its record key.
        """
        for h in batches:
            if h.is_control:
                try:
                    marker = read_control_marker(h)
                except ProtocolError:
                    # Not a marker Kafka would write (a log is the truth, whatever it
                    # holds): it ends no transaction, like Kafka's unknown control types.
                    self.next_offset = max(self.next_offset, h.base_offset + 1)
                    continue
                self.append_marker(
                    h.producer_id,
                    h.producer_epoch,
                    marker.coordinator_epoch,
                    marker.committed,
                    h.base_offset,
                    h.max_timestamp,
                )
                continue
            self.append(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence,
                h.base_offset,
                h.base_offset + h.last_offset_delta,
                h.max_timestamp,
                is_transactional=h.is_transactional,
            )

    def truncate_head(self, log_start_offset: int) -> None:
        """The log start moved up (retention, DeleteRecords): producers are kept.

        Kafka 2.5+ (KAFKA-7190, KIP-360) keeps a producer's entry when its batches are
        deleted, open transaction included, and the epochs of its last marker; only
        :meth:`remove_expired` forgets it. So a retry of a deleted batch is still a
        duplicate and an old epoch still fenced, by a batch or by a marker.
        """
        self.txns.truncate_head(log_start_offset)
        self.next_offset = max(self.next_offset, log_start_offset)

    def last_timestamp(self, producer_id: int) -> int | None:
        """The producer's last activity here: its last data batch's or last marker's max
        timestamp, whichever is later (Kafka's entry lastTimestamp; both update it)."""
        entry = self.producers.get(producer_id)
        marker = self.txns.markers.get(producer_id)
        stamps = [x.timestamp for x in (marker,) if x is not None]
        if entry is not None:
            stamps.append(entry.last_timestamp)
        return max(stamps) if stamps else None

    def remove_expired(self, now_ms: int, expiration_ms: int) -> None:
        """Forget producers silent for ``expiration_ms`` (by :meth:`last_timestamp`):
        their batches and their marker epochs together.

        A producer with an open transaction is kept, as in Kafka: its transaction
        still holds the LSO back until a marker (or the coordinator's timeout) ends it.
        """
        ongoing = self.txns.ongoing
        markers = self.txns.markers
        gone = [
            pid
            for pid in {*self.producers, *markers}
            if pid not in ongoing and now_ms - (self.last_timestamp(pid) or 0) >= expiration_ms
        ]
        for pid in gone:
            self.producers.pop(pid, None)
            markers.pop(pid, None)

    # ------------------------------------------------------------------ snapshot codec

    def to_snapshot(self, next_offset: int | None = None) -> bytes:
        """The whole state as JSON: small (≤ 5 batches per producer) and readable.

        ``next_offset``: the offset to record instead of :attr:`next_offset`, when the
        caller knows the batches in between change nothing (a segment's base offset).
        """
        doc = {
            "version": _SNAPSHOT_VERSION,
            "next_offset": self.next_offset if next_offset is None else next_offset,
            "producers": [
                [pid, e.epoch, [attrs.astuple(b) for b in e.batches]]
                for pid, e in sorted(self.producers.items())
            ],
            "txns": self.txns.to_json(),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes, *, now_ms: int = 0) -> ProducerStateManager:
        """Parse :meth:`to_snapshot` output; anything unexpected raises SnapshotError.

        ``now_ms`` stands in for the timestamps of markers that versions 1 to 3 did not
        store (the loader's clock: such a producer expires a full period after loading).
        """
        try:
            doc = json.loads(data)
            if doc["version"] not in _READABLE_SNAPSHOT_VERSIONS:
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
            # Version 1 predates transactions: it had none to carry. Version 2 did not say
            # where each producer's last marker is: below next_offset is all it knew.
            txns = (
                PartitionTransactions.from_json(doc["txns"], max(next_offset - 1, 0), now_ms)
                if "txns" in doc
                else None
            )
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"unreadable producer state snapshot: {exc}") from None
        return cls(producers, next_offset, txns or PartitionTransactions())


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
