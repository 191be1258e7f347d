"""Committed offsets (trio_broker/groups/offsets_store.py), plain and transactional.

No model drove the offsets store's transactional commits (TxnOffsetCommit, then the
transaction's end written by the coordinator's marker). This machine writes plain
commits, staged transactional offsets and transaction ends of two producers through a
real ``OffsetsStore`` (each write appended, then applied, as the group coordinator does
once it is durable), and checks Kafka's rule after every step, against its own record
of the log:

1. a partition's committed offset is the value of the latest record, by its place in
   the log, among the plain commits and the offsets of committed transactions (a
   transactional offset counts from its own record, not its marker: a plain commit
   written between them wins); a pending or aborted transaction's offsets count for
   nothing;
2. a store replayed from the same log (a coordinator move, a restart) answers the same;
3. an offset tombstone (DeleteGroups, OffsetDelete, expiry) deletes the partition's
   offset and drops every transaction's offset of that partition staged before it: a
   later commit of that transaction does not bring the deleted offset back;
4. a transaction's end settles only the offsets staged before it in the log: the
   producer's next transaction may stage offsets whose write the coordinator's waiter
   applies (``apply_counted``, once durable) before the end's waiter does, and those
   stay pending until their own end. (This shape found a broker bug: the next
   staging replaced the ended transaction's staged offset of the same partition, and
   the live table then differed from a replay; ``apply_counted`` now applies every
   earlier write first.)
"""

from __future__ import annotations

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.groups.offsets_store import (
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    TxnOffset,
)
from trio_broker.storage.log import LogConfig

#: Two transactions may stage offsets of the same partition and commit in the other
#: order: Kafka counts each from its own staged record and answers the later one. The
#: store once counted the first commit's rewrite (a plain record written with the end)
#: from the rewrite's place and answered the earlier one; this machine found it.
GROUP = "g"
PARTITIONS = (("t", 0), ("t", 1))
PRODUCERS = (1000, 1001)


class OffsetsStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = OffsetsStore.open(None, LogConfig())
        self.now_ms = 0
        self.next_value = 0
        #: (topic, partition) -> (log offset of the record that set it, offset value)
        self.committed: dict[tuple[str, int], tuple[int, int]] = {}
        #: producer -> (topic, partition) -> (its record's log offset, offset value)
        self.pending: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        #: Writes appended and not yet applied (rule 4's shape): the store is compared
        #: with the model only once every write is applied.
        self.unapplied: list = []

    def _write(self, entries: list, *, deferred: bool = False) -> int:
        write = self.store.append(entries, self.now_ms)
        if deferred:
            self.unapplied.append(write)
        else:
            self.store.apply(write)
        self.now_ms += 1
        return write.base_offset

    def _value(self) -> OffsetAndMetadata:
        self.next_value += 1
        return OffsetAndMetadata(self.next_value)

    @rule(partition=st.sampled_from(PARTITIONS))
    def plain_commit(self, partition: tuple[str, int]) -> None:
        value = self._value()
        at = self._write([(OffsetKey(GROUP, *partition), value)])
        self.committed[partition] = (at, value.offset)
        note(f"commit {partition} = {value.offset} at {at}")

    @rule(producer=st.sampled_from(PRODUCERS), partition=st.sampled_from(PARTITIONS))
    def txn_offset_commit(self, producer: int, partition: tuple[str, int]) -> None:
        value = self._value()
        at = self._write([TxnOffset(producer, 0, OffsetKey(GROUP, *partition), value)])
        self.pending.setdefault(producer, {})[partition] = (at, value.offset)
        note(f"{producer} stages {partition} = {value.offset} at {at}")

    @rule(producer=st.sampled_from(PRODUCERS), committed=st.booleans())
    def transaction_ends(self, producer: int, committed: bool) -> None:
        records = self.store.end_records(GROUP, producer, 0, committed)
        self._write(records)
        for partition, (at, value) in self.pending.pop(producer, {}).items():
            if committed and at > self.committed.get(partition, (-1, 0))[0]:
                self.committed[partition] = (at, value)
        note(f"{producer} {'commits' if committed else 'aborts'}")

    @rule(producer=st.sampled_from(PRODUCERS))
    def plain_commit_inside_a_transaction(self, producer: int) -> None:
        """Rule 1's order, built on purpose: a transaction stages an offset, a plain
        commit of the same partition follows, then the transaction commits."""
        partition = PARTITIONS[PRODUCERS.index(producer)]
        self.txn_offset_commit(producer, partition)
        self.plain_commit(partition)
        self.transaction_ends(producer, committed=True)

    @rule(partition=st.sampled_from(PARTITIONS))
    def offset_tombstone(self, partition: tuple[str, int]) -> None:
        """Rule 3: the partition's offset deleted, with every offset staged before."""
        at = self._write([(OffsetKey(GROUP, *partition), None)])
        self.committed.pop(partition, None)
        for staged in self.pending.values():
            if partition in staged and staged[partition][0] < at:
                del staged[partition]
        note(f"tombstone {partition} at {at}")

    @rule(
        producer=st.sampled_from(PRODUCERS),
        committed=st.booleans(),
        partition=st.sampled_from(PARTITIONS),
    )
    def next_transaction_applied_before_the_end(
        self, producer: int, committed: bool, partition: tuple[str, int]
    ) -> None:
        """Rule 4's shape, built on purpose: the producer's end is appended, its next
        transaction stages an offset right after, and the coordinator applies the
        staging write (durable first) before the end's."""
        records = self.store.end_records(GROUP, producer, 0, committed)
        self._write(records, deferred=True)
        for staged_partition, (at, staged) in self.pending.pop(producer, {}).items():
            if committed and at > self.committed.get(staged_partition, (-1, 0))[0]:
                self.committed[staged_partition] = (at, staged)
        value = self._value()
        key = OffsetKey(GROUP, *partition)
        at = self._write([TxnOffset(producer, 0, key, value)], deferred=True)
        self.pending.setdefault(producer, {})[partition] = (at, value.offset)
        for write in reversed(self.unapplied):  # as the coordinator's waiters may resume
            self.store.apply_counted(write)
        self.unapplied.clear()
        note(f"{producer} {'commits' if committed else 'aborts'}, stages {partition} = "
             f"{value.offset} at {at} (applied first)")  # fmt: skip

    @invariant()
    def committed_offsets_follow_kafkas_rule(self) -> None:
        replayed = OffsetsStore(self.store.log)
        replayed.load()
        for store, name in ((self.store, "the store"), (replayed, "the replayed store")):
            for partition in PARTITIONS:
                got = store.get(GROUP, *partition)
                expected = self.committed.get(partition)
                assert (got.offset if got else None) == (expected[1] if expected else None), (
                    f"{name}: {partition} committed at {got}, Kafka's rule says {expected}"
                )
                held = store.has_pending(GROUP, *partition)
                staged = {p: s[partition] for p, s in self.pending.items() if partition in s}
                assert held == bool(staged), (
                    f"{name}: {partition} held by an open transaction: {held}, "
                    f"the model's staged offsets: {staged}"
                )


TestOffsetsStoreMachine = OffsetsStoreMachine.TestCase
TestOffsetsStoreMachine.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
