"""The state of one share partition (KIP-932): which records a share group has in flight.

A share group reads a partition cooperatively: a ShareFetch *acquires* records for one
member, who holds them under a time lock and then acknowledges each one: ACCEPT
(done), RELEASE (give it back for another delivery) or REJECT (done, unprocessable).
A lock that runs out gives the record back as a release does. Every acquisition counts a
delivery; a record given back after its last allowed delivery is *archived* instead of
offered again. GAP acknowledges an offset that holds no record (a compacted one, a
transaction marker): archived.

Offsets below the start offset (Kafka's SPSO) are finished; ``records`` holds the
state of each offset in [start, end) that is not; offsets from ``end`` up to the log's
readable end have never been acquired. The start moves up over finished offsets as
soon as they are finished, so ``records`` only holds what is in flight.

An acknowledgement may be *pending* (Kafka's state transition in progress): applied,
its records in their new state and written with it, but not yet known to be stored at
the share coordinator. Until :meth:`SharePartition.settle` says whether the write
counted, its records take no other transition (they are not acquired, not acquired
again when released, and the start offset does not pass them); a write that failed
puts them back as they were, acquired by the member with their lock running, so the
member's retry of the acknowledgement finds them (Kafka's
``rollbackOrProcessStateUpdates``).

Pure and synchronous: the caller passes the time (ms) and the log's bounds.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

import attrs

from trio_broker.protocol.error_codes import ErrorCode


class RecordState(enum.IntEnum):
    """Kafka's numbering of a share-partition record's states."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(enum.IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


FINISHED = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@attrs.define
class InFlight:
    state: RecordState
    #: Acquisitions so far (a record's first delivery is 1).
    delivery_count: int = 0
    #: The member holding it while ACQUIRED, else None.
    member_id: str | None = None
    #: When the lock of an ACQUIRED record runs out (ms).
    lock_deadline_ms: int = 0


@attrs.frozen
class Acquired:
    """A run of consecutive offsets acquired with one delivery count (AcquiredRecords)."""

    first_offset: int
    last_offset: int
    delivery_count: int


@attrs.define
class SharePartition:
    start_offset: int
    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    #: At most this many offsets in [start, end) (group.share.partition.max.record.locks).
    max_in_flight: int = 2_000
    end_offset: int = attrs.field(default=-1)
    records: dict[int, InFlight] = attrs.field(factory=dict)
    #: Raised each time the share partition starts over at a given offset
    #: (AlterShareGroupOffsets); stored with its state (Kafka's StateEpoch).
    state_epoch: int = 0
    #: Whether a ShareFetch has read this share partition since it was made or restored
    #: (Kafka's leader loads a share partition's state on the first fetch naming it).
    #: Not share state: left out of comparisons and snapshots.
    loaded: bool = attrs.field(default=False, eq=False)
    #: Offsets of pending acknowledgements -> the record as it was before: restored if
    #: the write of the acknowledgement fails (:meth:`settle`).
    pending: dict[int, InFlight] = attrs.field(factory=dict, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.end_offset < self.start_offset:
            self.end_offset = self.start_offset

    # -- queries
    def state_of(self, offset: int) -> RecordState | None:
        """None below the start (finished) or at/after the end (never acquired)."""
        if offset < self.start_offset or offset >= self.end_offset:
            return None
        record = self.records.get(offset)
        return RecordState.ARCHIVED if record is None else record.state

    def finished_in_flight(self) -> int:
        """Offsets in [start, end) already finished (acknowledged or archived)."""
        return sum(1 for r in self.records.values() if r.state in FINISHED)

    def next_fetch_offset(self, now_ms: int) -> int:
        """Where the next acquisition starts reading the log (Kafka's nextFetchOffset):
        the lowest record given back, else the first offset never acquired."""
        self.expire_locks(now_ms)
        given_back = [o for o, r in self.records.items() if self._acquirable(o, r)]
        return min(given_back, default=self.end_offset)

    def next_lock_deadline(self) -> int | None:
        deadlines = [
            r.lock_deadline_ms for r in self.records.values() if r.state is RecordState.ACQUIRED
        ]
        return min(deadlines, default=None)

    # -- transitions
    def skip_to(self, log_start_offset: int) -> None:
        """Records deleted from the log (retention, DeleteRecords) are finished."""
        if log_start_offset <= self.start_offset:
            return
        for offset in [o for o in self.records if o < log_start_offset]:
            del self.records[offset]
            self.pending.pop(offset, None)  # finished whatever its write does
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._advance()

    def expire_locks(self, now_ms: int) -> None:
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.lock_deadline_ms <= now_ms:
                self._give_back(record)
        self._advance()

    def acquire(
        self, member_id: str, readable_end: int, max_records: int, now_ms: int,
        archive: AbstractSet[int] = frozenset(),
        round_fresh: Callable[[int], int] | None = None,
    ) -> list[Acquired]:  # fmt: skip
        """Lock up to ``max_records`` records below ``readable_end`` (the high
        watermark, or the end of the batches read for this fetch) for ``member_id``:
        those given back first (oldest first), then new ones. Chosen offsets in
        ``archive`` (an aborted transaction's, for read_committed) are archived
        instead: finished, never delivered.

        ``round_fresh(last)``: the offset through which new records are acquired when
        ``max_records`` stops them at ``last`` (Kafka's MaxRecords is a soft limit: the
        log batch holding ``last`` is acquired whole); it may pass ``readable_end``,
        never the partition's ``max_in_flight``."""
        self.expire_locks(now_ms)
        chosen: list[int] = []
        for offset in sorted(self.records):
            if len(chosen) >= max_records or offset >= readable_end:
                break
            if self._acquirable(offset, self.records[offset]):
                chosen.append(offset)
        room = self.start_offset + self.max_in_flight - self.end_offset
        fresh = max(0, min(max_records - len(chosen), readable_end - self.end_offset, room))
        if fresh > 0 and round_fresh is not None:
            last_fresh = self.end_offset + fresh - 1
            fresh += max(0, min(round_fresh(last_fresh) - last_fresh, room - fresh))
        for offset in range(self.end_offset, self.end_offset + fresh):
            self.records[offset] = InFlight(RecordState.AVAILABLE)
            chosen.append(offset)
        self.end_offset += fresh
        runs: list[Acquired] = []
        deadline = now_ms + self.lock_duration_ms
        for offset in chosen:
            record = self.records[offset]
            if offset in archive:
                record.state, record.member_id = RecordState.ARCHIVED, None
                continue
            record.state = RecordState.ACQUIRED
            record.delivery_count += 1
            record.member_id = member_id
            record.lock_deadline_ms = deadline
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.last_offset + 1 == offset
                and last.delivery_count == record.delivery_count
            ):
                runs[-1] = attrs.evolve(last, last_offset=offset)
            else:
                runs.append(Acquired(offset, offset, record.delivery_count))
        if archive:
            self._advance()
        return runs

    def acknowledge(
        self, member_id: str, first: int, last: int, types: Sequence[int], now_ms: int,
        *, pending: bool = False,
    ) -> ErrorCode:  # fmt: skip
        """Acknowledge [first, last]: one type for all of them or one per offset. All or
        nothing: INVALID_RECORD_STATE unless every offset is acquired by ``member_id``
        (its lock may have run out and the record gone to someone else). ``pending``:
        until :meth:`settle`, the acknowledgement may yet be undone (its write failed)."""
        count = last - first + 1
        if count <= 0 or len(types) not in (1, count):
            return ErrorCode.INVALID_REQUEST
        try:
            kinds = [AckType(t) for t in types]
        except ValueError:
            return ErrorCode.INVALID_REQUEST
        self.expire_locks(now_ms)
        for offset in range(first, last + 1):
            record = self.records.get(offset) if self.start_offset <= offset else None
            if (
                record is None
                or record.state is not RecordState.ACQUIRED
                or record.member_id != member_id
            ):
                return ErrorCode.INVALID_RECORD_STATE
        for i, offset in enumerate(range(first, last + 1)):
            kind = kinds[0] if len(kinds) == 1 else kinds[i]
            record = self.records[offset]
            if pending:
                self.pending[offset] = attrs.evolve(record)
            if kind is AckType.ACCEPT:
                record.state, record.member_id = RecordState.ACKNOWLEDGED, None
            elif kind is AckType.RELEASE:
                self._give_back(record)
            else:  # REJECT, GAP
                record.state, record.member_id = RecordState.ARCHIVED, None
        self._advance()
        return ErrorCode.NONE

    def settle(self, first: int, last: int, stored: bool) -> None:
        """The write of the pending acknowledgement of [first, last] counted (``stored``)
        or failed: its records keep their new state, or go back to what they were
        (acquired by the member; a lock that ran out meanwhile gives them back at their
        next use, as Kafka's rollback of a transition whose lock expired)."""
        for offset in range(first, last + 1):
            before = self.pending.pop(offset, None)
            if before is not None and not stored and offset in self.records:
                self.records[offset] = before
        self._advance()

    def release_member(self, member_id: str) -> None:
        """A member left or closed its share session: its records go back."""
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.member_id == member_id:
                self._give_back(record)
        self._advance()

    def _acquirable(self, offset: int, record: InFlight) -> bool:
        # A release whose write is pending is not offered yet: it may be undone.
        return record.state is RecordState.AVAILABLE and offset not in self.pending

    def _give_back(self, record: InFlight) -> None:
        # The last allowed delivery is spent: archive rather than offer it again.
        exhausted = record.delivery_count >= self.delivery_count_limit
        record.state = RecordState.ARCHIVED if exhausted else RecordState.AVAILABLE
        record.member_id = None

    def _advance(self) -> None:
        while self.start_offset < self.end_offset:
            record = self.records.get(self.start_offset)
            if record is not None and (
                record.state not in FINISHED or self.start_offset in self.pending
            ):
                break
            self.records.pop(self.start_offset, None)
            self.start_offset += 1
