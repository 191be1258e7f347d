"""Reference model of transactions in one partition's log, in eight sentences.

1. A producer's transaction in the partition begins at its first transactional data
   record after its previous marker (or ever) and ends at its next marker.
2. A transaction is open while no marker has ended it; the last stable offset (LSO) is
   the smallest first offset of the open transactions (never below the log start), or
   the log end (the high watermark of a single node) when none is open.
3. A transaction ended by an abort marker is aborted: its range is its first offset to
   the marker's offset; the aborted list holds every such range that still has a
   record at or above the log start (one whose records are all gone hides nothing, so
   whether it is still listed does not matter).
4. A record is committed when it is below the LSO, at or above the log start, not in
   a control batch, and either not transactional or in a transaction ended by a commit.
5. Nothing else moves any of this: flushing, restarting or crashing the broker keeps it.
6. Retention and DeleteRecords may move the log start past an open transaction's first
   offset (Kafka does not hold the log start back for it): the LSO is then the log start.
   A rebuild from the log after that sees the transaction begin at its first record at
   or above the log start, so the LSO may stand anywhere from the log start up to that
   record (docs/transactions.md's known limit), never below the log start.
7. A producer with an open transaction is never expired (producer.id.expiration.ms
   counts only for producers with none): its sequence is still checked.
8. A marker with a newer producer epoch (a fencing abort) fences the older epoch in the
   partition while the marker is in the log, whether or not the marker ended a
   transaction here and whether or not the producer has data here: a transactional
   batch of the older epoch (a zombie's produce that crossed the fence) is refused
   INVALID_PRODUCER_EPOCH.
9. When the cleaner has removed an aborted transaction's records it names the
   transaction (producer id, marker offset) to the partition before removing the marker:
   from then on no fetch lists it, or a consumer would skip the producer's later records
   waiting for a marker that is gone (Kafka's cleaner drops the aborted entry with the
   data). The model lists only aborts whose records are left (sentence 3), so here it is
   the code's own list that must drop it.

The model keeps the whole log as a flat list of entries and derives every answer by
scanning it, so it shares no data structure with ``trio_broker.state.partition_txns``;
``statemachine/test_partition_txn_machine.py`` drives both.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    """One record (data) or marker of the log, at ``offset``."""

    offset: int
    producer_id: int
    transactional: bool
    #: None for a data record; True/False for a commit/abort marker.
    commit: bool | None
    value: bytes


@dataclass
class ModelLog:
    entries: list[Entry] = field(default_factory=list)
    log_start: int = 0

    @property
    def end(self) -> int:
        return self.entries[-1].offset + 1 if self.entries else 0

    def transactions(self) -> list[tuple[int, int, int | None, bool | None]]:
        """(producer id, first offset, end marker offset or None, committed) per transaction."""
        open_first: dict[int, int] = {}
        done: list[tuple[int, int, int | None, bool | None]] = []
        for e in self.entries:
            if e.commit is None:
                if e.transactional and e.producer_id not in open_first:
                    open_first[e.producer_id] = e.offset
            elif e.producer_id in open_first:
                done.append((e.producer_id, open_first.pop(e.producer_id), e.offset, e.commit))
        return done + [(pid, first, None, None) for pid, first in open_first.items()]

    def lso(self) -> int:
        open_firsts = [first for _, first, end, _ in self.transactions() if end is None]
        if not open_firsts:
            return self.end
        return min(max(min(open_firsts), self.log_start), self.end)

    def lso_bounds(self) -> tuple[int, int]:
        """Sentence 6: the lowest and highest LSO a rebuild may give."""
        high = self.end
        for pid, first, end, _ in self.transactions():
            if end is not None:
                continue
            if first < self.log_start:  # cut by the log start: a rebuild sees it later
                first = min(
                    (e.offset for e in self.entries
                     if e.producer_id == pid and e.commit is None and e.offset >= self.log_start),
                    default=self.end,
                )  # fmt: skip
            high = min(high, first)
        return self.lso(), high

    def aborted(self) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset), by marker offset."""
        return sorted(
            ((pid, first, end) for pid, first, end, commit in self.transactions() if commit is False
             and end is not None and self.has_records(pid, first, end)),
            key=lambda a: a[2],
        )  # fmt: skip

    def has_records(self, producer_id: int, first: int, end: int) -> bool:
        """Does ``producer_id`` have a data record in [first, end) at or above the log start?"""
        return any(
            e.producer_id == producer_id and e.commit is None and first <= e.offset < end
            and e.offset >= self.log_start
            for e in self.entries
        )  # fmt: skip

    def committed_values(self, lso: int | None = None) -> list[bytes]:
        """Committed records below ``lso`` (default: :meth:`lso`)."""
        aborted_or_open = set()
        for pid, first, end, commit in self.transactions():
            if commit is not True:
                stop = self.end if end is None else end
                aborted_or_open |= {(pid, o) for o in range(first, stop)}
        lso = self.lso() if lso is None else lso
        return [
            e.value
            for e in self.entries
            if self.log_start <= e.offset < lso
            and e.commit is None
            and (not e.transactional or (e.producer_id, e.offset) not in aborted_or_open)
        ]
