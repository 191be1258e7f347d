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
2. a store replayed from the same log (a coordinator move, a restart) answers the same.
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

    def _write(self, entries: list) -> int:  # type: ignore[type-arg]
        write = self.store.append(entries, self.now_ms)
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


TestOffsetsStoreMachine = OffsetsStoreMachine.TestCase
TestOffsetsStoreMachine.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
