"""The share-partition state (trio_broker/state/share_partition.py) against a plain model.

The model keeps every offset of the log with its state, delivery count, holder and lock
deadline, and states KIP-932's rules offset by offset: an acquisition takes the lowest
available offsets (given back or never delivered, the latter only within the in-flight
limit above the start offset) and counts a delivery; an acknowledgement of a range is
refused (INVALID_RECORD_STATE, nothing changes) unless the member holds every offset of
it; a release or a lock that runs out makes a record available again unless its
deliveries are spent, then it is archived; accept and reject finish it. The start offset
is the lowest unfinished offset delivered so far. A log start moved by retention or
DeleteRecords finishes every offset below it (``skip_to``: those records are gone).

A restart goes through the real durable state (groups/share_state.py): the snapshots the
store finds changed are encoded into a batch, appended to a log and, at the restart,
replayed by a fresh store over the same log and restored. Acquisition locks are not
durable (KIP-932): the restored partition must be the live one with every lock lost
(each acquired record available again, or archived once its deliveries are spent), its
finished records still finished and every delivery count kept. A second share
partition's snapshots and a tombstone of a third share the log, so a replay that mixes
keys or ignores a deletion is seen too.
"""

from __future__ import annotations

import itertools
import uuid

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.groups.share_state import (
    ShareKey,
    ShareSnapshot,
    ShareStateStore,
    encode_batch,
    restore,
    snapshot_of,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import AckType, RecordState, SharePartition
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

LOCK_MS = 100
LIMIT = 3
MAX_IN_FLIGHT = 8
MEMBERS = ("a", "b")
TOPIC_ID = uuid.UUID(int=7)
KEY = ShareKey("g", TOPIC_ID, 0)
#: Another share partition of the same topic, whose snapshots share the state log.
NEIGHBOUR = ShareKey("g", TOPIC_ID, 1)
#: A share partition whose group is deleted (its snapshot tombstoned) now and then.
DELETED = ShareKey("gone", TOPIC_ID, 0)


@attrs.define
class Offset:
    state: RecordState = RecordState.AVAILABLE
    count: int = 0
    member: str | None = None
    deadline: int = 0


def _durable_view(sp: SharePartition) -> tuple[object, ...]:
    """What a share partition holds but its locks' deadlines."""
    records = {o: (r.state, r.delivery_count, r.member_id) for o, r in sp.records.items()}
    return sp.start_offset, sp.end_offset, sp.state_epoch, records


class SharePartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.log: list[Offset] = []
        self.sp = SharePartition(
            0, lock_duration_ms=LOCK_MS, delivery_count_limit=LIMIT, max_in_flight=MAX_IN_FLIGHT
        )
        #: Offsets below this were delivered at least once (the model's end offset).
        self.delivered_end = 0
        #: The log's start offset (retention, DeleteRecords): below it nothing is left.
        self.log_start = 0
        #: ``__share_group_state`` and the store over it (handlers/share_persist.py's).
        self.state_log = MemoryLog(LogConfig())
        self.store = ShareStateStore(self.state_log)
        #: The neighbour's state as last persisted (it never changes between writes).
        self.neighbour = SharePartition(
            3, lock_duration_ms=LOCK_MS, delivery_count_limit=LIMIT, max_in_flight=MAX_IN_FLIGHT
        )

    # -- the model's rules
    def finished(self, o: Offset) -> bool:
        return o.state in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)

    def start(self) -> int:
        for i in range(self.delivered_end):
            if not self.finished(self.log[i]):
                return i
        return self.delivered_end

    def give_back(self, o: Offset) -> None:
        o.state = RecordState.ARCHIVED if o.count >= LIMIT else RecordState.AVAILABLE
        o.member = None

    def expire(self) -> None:
        for o in self.log:
            if o.state is RecordState.ACQUIRED and o.deadline <= self.now:
                self.give_back(o)

    # -- rules
    @rule(n=st.integers(1, 6))
    def append(self, n: int) -> None:
        self.log.extend(Offset() for _ in range(n))

    @rule(ms=st.sampled_from([1, 30, LOCK_MS, LOCK_MS + 1]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 5))
    def acquire(self, member: str, max_records: int) -> None:
        runs = self.sp.acquire(member, len(self.log), max_records, self.now)
        got = [
            (o, r.delivery_count) for r in runs for o in range(r.first_offset, r.last_offset + 1)
        ]
        note(f"acquire {member} {max_records} -> {got}")
        self.expire()
        limit = self.start() + MAX_IN_FLIGHT
        expected: list[tuple[int, int]] = []
        for i, o in enumerate(self.log):
            if len(expected) == max_records:
                break
            if o.state is not RecordState.AVAILABLE or (o.count == 0 and i >= limit):
                continue
            o.state, o.member, o.deadline = RecordState.ACQUIRED, member, self.now + LOCK_MS
            o.count += 1
            expected.append((i, o.count))
            self.delivered_end = max(self.delivered_end, i + 1)
        assert got == expected
        # Runs are maximal: neighbours with one delivery count are one run.
        for left, right in itertools.pairwise(runs):
            assert not (
                left.last_offset + 1 == right.first_offset
                and left.delivery_count == right.delivery_count
            )

    @rule(
        member=st.sampled_from(MEMBERS),
        first=st.integers(0, 20),
        length=st.integers(1, 4),
        kind=st.sampled_from(list(AckType)),
        per_offset=st.booleans(),
    )
    def acknowledge(
        self, member: str, first: int, length: int, kind: AckType, per_offset: bool
    ) -> None:
        last = first + length - 1
        types = [int(kind)] * length if per_offset else [int(kind)]
        code = self.sp.acknowledge(member, first, last, types, self.now)
        note(f"ack {member} {first}-{last} {kind.name} -> {code.name}")
        self.expire()
        held = all(
            i < len(self.log)
            and self.log[i].state is RecordState.ACQUIRED
            and self.log[i].member == member
            for i in range(first, last + 1)
        )
        assert code is (ErrorCode.NONE if held else ErrorCode.INVALID_RECORD_STATE)
        if not held:
            return
        for i in range(first, last + 1):
            o = self.log[i]
            if kind is AckType.ACCEPT:
                o.state, o.member = RecordState.ACKNOWLEDGED, None
            elif kind is AckType.RELEASE:
                self.give_back(o)
            else:
                o.state, o.member = RecordState.ARCHIVED, None

    @rule(member=st.sampled_from(MEMBERS))
    def release_member(self, member: str) -> None:
        self.sp.release_member(member)
        for o in self.log:
            if o.state is RecordState.ACQUIRED and o.member == member:
                self.give_back(o)

    @rule(by=st.integers(1, 10))
    def log_start_moves(self, by: int) -> None:
        """Retention or DeleteRecords moved the log start: the offsets below it are gone,
        finished whatever their state (an acquired one can no longer be acknowledged),
        and the next acquisition starts at the log start at the lowest."""
        target = min(self.log_start + by, len(self.log))
        if target <= self.log_start:
            return
        self.sp.skip_to(target)
        note(f"log start -> {target}")
        for o in self.log[self.log_start : target]:
            o.state, o.member = RecordState.ARCHIVED, None
        self.log_start = target
        self.delivered_end = max(self.delivered_end, target)

    def _persist(self) -> None:
        """What share_persist.append_changes writes after a request: the snapshots the
        store finds changed, in one batch, then told to the store."""
        entries = self._changes([(KEY, self.sp), (NEIGHBOUR, self.neighbour)])
        if not entries:
            return
        self.state_log.append(encode_batch(entries, self.now), now_ms=self.now)
        self.store.appended(entries)

    def _changes(
        self, current: list[tuple[ShareKey, SharePartition]]
    ) -> list[tuple[ShareKey, ShareSnapshot | None]]:
        """The snapshots a leader writes: those whose durable state moved since the last
        one stored (share_persist's ``same_state`` test), each in the next snapshot
        epoch."""
        entries: list[tuple[ShareKey, ShareSnapshot | None]] = []
        for key, share_partition in current:
            fresh = snapshot_of(share_partition)
            known = self.store.snapshots.get(key)
            if known is None or not known.same_state(fresh):
                epoch = 0 if known is None else known.snapshot_epoch + 1
                entries.append((key, attrs.evolve(fresh, snapshot_epoch=epoch,
                                                  write_timestamp_ms=self.now)))  # fmt: skip
        return entries

    @rule()
    def persist(self) -> None:
        self._persist()

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 3))
    def neighbour_changes(self, member: str, max_records: int) -> None:
        """The other share partition delivers and acknowledges some records, persisted."""
        self.neighbour.acquire(member, self.neighbour.end_offset + 4, max_records, self.now)
        first = self.neighbour.start_offset
        self.neighbour.acknowledge(member, first, first, [int(AckType.ACCEPT)], self.now)
        self._persist()

    @rule(written=st.booleans())
    def group_deleted(self, written: bool) -> None:
        """Another group's share partition: written, then (maybe at once) deleted."""
        if written:
            entries: list[tuple[ShareKey, ShareSnapshot | None]] = [(DELETED, ShareSnapshot(5))]
            self.state_log.append(encode_batch(entries, self.now), now_ms=self.now)
            self.store.appended(entries)
        tombstones = self.store.tombstones([DELETED])
        if tombstones:
            self.state_log.append(encode_batch(tombstones, self.now), now_ms=self.now)
            self.store.appended(tombstones)

    def _restore(self, key: ShareKey) -> SharePartition:
        return restore(
            self.store.snapshots[key],
            lock_duration_ms=LOCK_MS,
            delivery_count_limit=LIMIT,
            max_in_flight=MAX_IN_FLIGHT,
        )

    @rule()
    def restart(self) -> None:
        """The broker persists, dies and comes back: a fresh store replays the log and
        the share partition is restored from it, every lock lost."""
        self._persist()
        self.store = ShareStateStore(self.state_log)
        self.store.load()
        assert DELETED not in self.store.snapshots
        # The first persist wrote both share partitions' snapshots.
        assert set(self.store.snapshots) == {KEY, NEIGHBOUR}
        restored_neighbour = self._restore(NEIGHBOUR)
        self.neighbour.release_member("a")
        self.neighbour.release_member("b")
        assert _durable_view(restored_neighbour) == _durable_view(self.neighbour)
        self.neighbour = restored_neighbour
        self.sp = self._restore(KEY)
        note("restart")
        for o in self.log:
            if o.state is RecordState.ACQUIRED:
                self.give_back(o)

    @rule()
    def bad_acknowledgements(self) -> None:
        # Malformed batches change nothing: last before first, a wrong number of types,
        # an unknown type.
        before = attrs.asdict(self.sp)
        assert self.sp.acknowledge("a", 3, 2, [1], self.now) is ErrorCode.INVALID_REQUEST
        assert self.sp.acknowledge("a", 0, 2, [1, 1], self.now) is ErrorCode.INVALID_REQUEST
        assert self.sp.acknowledge("a", 0, 0, [9], self.now) is ErrorCode.INVALID_REQUEST
        assert attrs.asdict(self.sp) == before

    # -- invariants
    @invariant()
    def agrees_with_the_model(self) -> None:
        # The implementation runs locks out lazily: compare as of its next use.
        self.sp.expire_locks(self.now)
        self.expire()
        assert self.sp.start_offset == self.start()
        assert self.sp.end_offset == max(self.delivered_end, self.sp.start_offset)
        for i, o in enumerate(self.log):
            state = self.sp.state_of(i)
            if i < self.sp.start_offset:
                assert self.finished(o)
            elif i >= self.sp.end_offset:
                assert o.count == 0
            else:
                assert state is o.state, (i, state, o)
                record = self.sp.records[i]
                assert (record.delivery_count, record.member_id) == (o.count, o.member)
            assert o.count <= LIMIT
        assert self.sp.end_offset - self.sp.start_offset <= MAX_IN_FLIGHT


TestSharePartitionMachine = SharePartitionMachine.TestCase
TestSharePartitionMachine.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
