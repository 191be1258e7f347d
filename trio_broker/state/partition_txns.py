"""Transactions as one partition sees them: open transactions, aborted ones, the LSO.

Pure and trio-free like the rest of ``state/``; the registry in
:mod:`trio_broker.services.producers` keeps one :class:`PartitionTransactions` per
partition, next to the idempotent producers' sequence state, and feeds it every
appended batch (Kafka keeps both in its ProducerStateManager too).

Kafka's rules, implemented once:

* a transactional data batch from a producer with no open transaction in the
  partition begins one at the batch's base offset;
* a transaction marker (a control batch) ends the producer's open transaction: a
  commit just closes it, an abort also records (producer id, first offset, marker
  offset) in the aborted list, which read_committed fetches return so that
  consumers drop the aborted records;
* the last stable offset (LSO) is the first offset of the oldest open transaction,
  or the high watermark when none is open (or when that is lower);
* a marker whose producer epoch is older than the producer's epoch in the partition
  is INVALID_PRODUCER_EPOCH, one whose coordinator epoch is older than the last
  marker's is TRANSACTION_COORDINATOR_FENCED; a newer producer epoch is accepted and
  becomes the producer's epoch (its next batch starts at sequence 0);
* aborted entries wholly below the log start offset are forgotten; open transactions
  are not, even those retention removed entirely (Kafka 2.5+ keeps them too: the LSO
  is then the log start);
* a producer's marker epochs are kept when the log start passes its last marker, even
  when the marker is all the partition has of it (a fencing abort in a partition it
  never wrote to): the epoch it carries fences the old one there, snapshot and restart
  included, as Kafka's producer entry does. Like that entry they go only by
  producer.id.expiration.ms, counted from the marker's timestamp
  (``ProducerStateManager.remove_expired``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import attrs

from trio_broker.protocol.error_codes import ErrorCode

__all__ = [
    "AbortedTxn",
    "MarkerEpochs",
    "PartitionTransactions",
    "check_marker",
]


@attrs.frozen(order=True)
class AbortedTxn:
    """One aborted transaction's range in the partition: both ends included.

    Ordered by ``last_offset`` (the marker's offset) first: the aborted list is kept
    in marker order, which is log order.
    """

    last_offset: int
    producer_id: int
    first_offset: int


@attrs.frozen
class MarkerEpochs:
    """The epochs the last transaction marker of a producer carried in this partition."""

    producer_epoch: int
    coordinator_epoch: int
    #: Where that marker is (the cleaner keeps a producer's last marker, storage/cleaner.py).
    offset: int
    #: The marker batch's max timestamp: like a data batch's, it keeps the producer from
    #: expiring (Kafka's marker append updates the entry's lastTimestamp).
    timestamp: int


def check_marker(
    data_epoch: int | None,
    last_marker: MarkerEpochs | None,
    producer_epoch: int,
    coordinator_epoch: int,
) -> tuple[ErrorCode, str]:
    """May a marker with these epochs be appended? ``data_epoch``: the producer's epoch
    from its data batches in the partition, None if it has none.

    pre: producer_epoch >= 0
    post: (__return__[0] == ErrorCode.INVALID_PRODUCER_EPOCH) == (producer_epoch < max(data_epoch if data_epoch is not None else -1, last_marker.producer_epoch if last_marker is not None else -1))
    """
    current = max(
        -1 if data_epoch is None else data_epoch,
        -1 if last_marker is None else last_marker.producer_epoch,
    )
    if producer_epoch < current:
        return (
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"marker epoch {producer_epoch} is older than the producer's epoch {current}",
        )
    if last_marker is not None and coordinator_epoch < last_marker.coordinator_epoch:
        return (
            ErrorCode.TRANSACTION_COORDINATOR_FENCED,
            f"coordinator epoch {coordinator_epoch} is older than {last_marker.coordinator_epoch}",
        )
    return ErrorCode.NONE, ""


@attrs.define(eq=False)
class PartitionTransactions:
    """Open and aborted transactions of one partition, and its last stable offset."""

    #: producer id -> first offset of its open transaction in this partition.
    ongoing: dict[int, int] = attrs.field(factory=dict)
    #: Aborted transactions, ordered by marker offset (ascending).
    aborted: list[AbortedTxn] = attrs.field(factory=list)
    #: producer id -> the epochs of its last marker here (epoch fencing of markers).
    markers: dict[int, MarkerEpochs] = attrs.field(factory=dict)

    # ------------------------------------------------------------------ appends

    def on_data(self, producer_id: int, is_transactional: bool, base_offset: int) -> None:
        """A data batch was appended at ``base_offset``."""
        if is_transactional and producer_id >= 0:
            self.ongoing.setdefault(producer_id, base_offset)

    def on_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        committed: bool,
        offset: int,
        timestamp: int,
    ) -> AbortedTxn | None:
        """A marker (max timestamp ``timestamp``) was appended at ``offset``: end the
        producer's transaction.

        Returns the aborted entry it added, if any. A marker for a producer with no
        open transaction here (the coordinator writes to every partition it added,
        data or not) ends nothing; an abort then records nothing either.
        """
        self.markers[producer_id] = MarkerEpochs(
            producer_epoch, coordinator_epoch, offset, timestamp
        )
        first = self.ongoing.pop(producer_id, None)
        if first is None or committed:
            return None
        entry = AbortedTxn(offset, producer_id, first)
        # Markers arrive in log order, so this is an append; insort also keeps a
        # replay of an overlapping range (snapshot + log) sorted.
        if not self.aborted or self.aborted[-1] < entry:
            self.aborted.append(entry)
        elif entry not in self.aborted:
            bisect.insort(self.aborted, entry)
        return entry

    # ------------------------------------------------------------------ queries

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction, None when none is open."""
        return min(self.ongoing.values()) if self.ongoing else None

    def last_stable_offset(self, high_watermark: int, log_start_offset: int = 0) -> int:
        """Kafka's LSO: read_committed consumers read up to (not including) it.

        An open transaction that began below the log start counts from the log start,
        as in Kafka (its first batches are gone; the LSO never points below the log).

        pre: log_start_offset <= high_watermark
        post: __return__ <= high_watermark
        """
        first = self.first_unstable_offset()
        if first is None:
            return high_watermark
        return min(max(first, log_start_offset), high_watermark)

    def aborted_between(self, from_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [from_offset, upper_offset), oldest first.

        A fetch returning data from ``from_offset`` up to ``upper_offset`` sends these:
        the consumer skips a producer's records from its first offset until the
        abort marker.
        """
        # Entries are ordered by marker offset: skip those ending before from_offset.
        start = bisect.bisect_left(self.aborted, AbortedTxn(from_offset, -1, -1))
        return [a for a in self.aborted[start:] if a.first_offset < upper_offset]

    def forget_aborted(self, gone: Iterable[tuple[int, int]]) -> None:
        """The cleaner removed these aborted transactions' data (producer id, marker
        offset) and is about to remove their markers: a fetch must not name them, or a
        consumer would skip the producer's later records looking for a missing marker."""
        doomed = set(gone)
        self.aborted = [a for a in self.aborted if (a.producer_id, a.last_offset) not in doomed]

    # ------------------------------------------------------------------ the log moves

    def truncate_head(self, log_start_offset: int) -> None:
        """The log start moved up (retention, DeleteRecords): forget the aborted entries
        wholly below it, of no use to any fetch. Marker epochs stay (Kafka 2.5+ keeps the
        producer's entry, KIP-360): only expiry forgets them."""
        cut = bisect.bisect_left(self.aborted, AbortedTxn(log_start_offset, -1, -1))
        if cut:
            del self.aborted[:cut]

    # ------------------------------------------------------------------ snapshot

    def to_json(self) -> dict[str, list[list[int]]]:
        return {
            "ongoing": [[pid, first] for pid, first in sorted(self.ongoing.items())],
            "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in self.aborted],
            "markers": [
                [pid, e.producer_epoch, e.coordinator_epoch, e.offset, e.timestamp]
                for pid, e in sorted(self.markers.items())
            ],
        }

    @classmethod
    def from_json(
        cls, doc: object, marker_offset_unknown: int = 0, marker_timestamp_unknown: int = 0
    ) -> PartitionTransactions:
        """Parse :meth:`to_json`; raises ValueError/TypeError/KeyError on anything odd.

        Rows of ``markers`` written before their offset was kept (three integers) get
        ``marker_offset_unknown`` (the snapshot's last offset, an upper bound); rows
        written before their timestamp was (three or four) get
        ``marker_timestamp_unknown``: the loader passes its clock, so such a producer
        gets a whole producer.id.expiration.ms from the upgrade rather than none.
        """
        if not isinstance(doc, dict):
            raise TypeError("transactions must be an object")

        def ints(row: object, n: int) -> list[int]:
            if not isinstance(row, list) or len(row) != n:
                raise ValueError(f"expected {n} integers, got {row!r}")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
                raise ValueError(f"expected integers, got {row!r}")
            return row

        ongoing = {pid: first for pid, first in (ints(r, 2) for r in doc["ongoing"])}
        aborted = sorted(
            AbortedTxn(last, pid, first)
            for pid, first, last in (ints(r, 3) for r in doc["aborted"])
        )
        markers = {}
        for row in doc["markers"]:
            n = len(row) if isinstance(row, list) and len(row) in (4, 5) else 3
            pid, epoch, coord, *rest = ints(row, n)
            offset = rest[0] if rest else marker_offset_unknown
            timestamp = rest[1] if len(rest) > 1 else marker_timestamp_unknown
            markers[pid] = MarkerEpochs(epoch, coord, offset, timestamp)
        return cls(ongoing, aborted, markers)
