"""Offset expiry (``GroupCoordinator.cleanup``) beside transactional offset commits.

No machine ran the group coordinator's cleanup: the offsets store machine drives the
store whose ``has_pending`` the cleanup asks, and the broker machine never lets an
offset grow old. This machine runs a node alone's real group coordinator (the broker's
wiring, ``coordinator_alone``, over a ``MemoryLog``, with its flusher) on a Trio mock
clock that stands still: every wait is for the flusher, never for time. A standalone
consumer (a group without a protocol, as a consumer that assigns its partitions itself)
commits offsets, two transactional producers stage offsets of the same partitions
(TxnOffsetCommit) and end their transactions, the broker's clocks move by up to the
retention, the cleanup runs as the coordinator's timer runs it, and the broker restarts
(a fresh coordinator replays the same log). After every step Kafka's rules must hold
(GroupMetadataManager's cleanup, KIP-211 for a group without a protocol):

1. an offset expires once its commit timestamp is ``offsets.retention.minutes`` old,
   and not before, unless an open transaction holds an offset of the same partition:
   then it stays (the transaction will set it, or its abort leaves it as it was);
2. a committed transaction's offset is the partition's offset unless a record of the
   partition later in the log set another, and it expires by its own commit timestamp;
   an aborted one counts for nothing;
3. what the coordinator answers (committed offsets, and which partitions an open
   transaction holds: OffsetFetch's require_stable) is what a restart replays;
4. once a producer's offsets were written with a newer epoch (its transactional id
   re-initialised: the coordinator aborts the open transaction with the bumped epoch),
   TxnOffsetCommit with an older epoch is refused INVALID_PRODUCER_EPOCH (a zombie),
   before and after a restart. A step builds the fence;
5. a transaction's end settles every offset staged before it, a TxnOffsetCommit whose
   write is still on its way (appended, not yet durable) included: the end waits for
   it, and the staged offset commits (or is dropped) with the transaction, never left
   pending. A step builds it (random steps await each write before the next).
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tests.lone_coordinator import Clocks, start_lone_coordinator
from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import GroupCoordinator
from trio_broker.groups.offsets_store import OffsetAndMetadata, OffsetKey, PendingWrite
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.memory import MemoryLog

GROUP = "g"
PARTITIONS = (("t", 0), ("t", 1))
PRODUCERS = (1000, 1001)
RETENTION_MINUTES = 1
RETENTION_MS = RETENTION_MINUTES * 60_000
CONFIG = BrokerConfig(
    storage="memory", offsets_retention_minutes=RETENTION_MINUTES,
    group_initial_rebalance_delay_ms=0,
)  # fmt: skip

Partition = tuple[str, int]


@attrs.frozen
class Offset:
    value: int
    commit_timestamp_ms: int
    #: The write's place among the machine's writes (log order).
    at: int


@attrs.define
class Model:
    """Kafka's rules over what the machine wrote."""

    committed: dict[Partition, Offset] = attrs.field(factory=dict)
    #: producer -> partition -> its staged offset
    pending: dict[int, dict[Partition, Offset]] = attrs.field(factory=dict)
    #: producer -> its epoch now (rule 4): its records carry it once it wrote one.
    epochs: dict[int, int] = attrs.field(factory=dict)
    #: producer -> the newest epoch of a record it wrote.
    written_epochs: dict[int, int] = attrs.field(factory=dict)

    def held_by_a_transaction(self, partition: Partition) -> bool:
        return any(partition in staged for staged in self.pending.values())

    def expire(self, wall_ms: int) -> list[Partition]:
        expired = [
            partition
            for partition, offset in self.committed.items()
            if offset.commit_timestamp_ms + RETENTION_MS <= wall_ms
            and not self.held_by_a_transaction(partition)
        ]
        for partition in expired:
            del self.committed[partition]
        return expired


Step = tuple[Any, ...]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.sampled_from(PARTITIONS)),
        st.tuples(st.just("stage"), st.sampled_from(PRODUCERS), st.sampled_from(PARTITIONS)),
        st.tuples(st.just("end"), st.sampled_from(PRODUCERS), st.booleans()),
        st.tuples(
            st.just("advance"),
            st.sampled_from((1, RETENTION_MS // 2, RETENTION_MS - 1, RETENTION_MS)),
        ),
        st.just(("cleanup",)),
        st.just(("restart",)),
        st.tuples(st.just("old_offset_under_a_transaction"), st.sampled_from(PRODUCERS)),
        st.tuples(st.just("fence"), st.sampled_from(PRODUCERS), st.sampled_from(PARTITIONS)),
        st.tuples(
            st.just("end_overtakes_staging"),
            st.sampled_from(PRODUCERS),
            st.sampled_from(PARTITIONS),
            st.booleans(),
        ),
    ),
    max_size=30,
)


class Machine:
    def __init__(self) -> None:
        self.clocks = Clocks()
        self.log = MemoryLog()
        self.model = Model()
        self.values = itertools.count(1)
        self.writes = itertools.count()

    async def start(self, nursery: trio.Nursery) -> tuple[GroupCoordinator, trio.CancelScope]:
        return await start_lone_coordinator(nursery, self.clocks, self.log, CONFIG)

    async def run(self, script: list[Step]) -> None:
        async with trio.open_nursery() as nursery:
            coordinator, scope = await self.start(nursery)
            for step in script:
                note(f"{step}")
                if step[0] == "restart":
                    scope.cancel()
                    coordinator, scope = await self.start(nursery)
                else:
                    await self.do(coordinator, step)
                self.check(coordinator)
            scope.cancel()

    async def do(self, coordinator: GroupCoordinator, step: Step) -> None:
        model, clocks = self.model, self.clocks
        if step[0] == "commit":
            partition: Partition = step[1]
            error = coordinator.validate_offset_commit(GROUP, "", None, -1)
            assert error is ErrorCode.NONE, error
            offset = Offset(next(self.values), clocks.wall_ms, next(self.writes))
            write = coordinator.append_offsets([(self.key(partition), self.value(offset))])
            await coordinator.wait_offsets_durable(write)
            model.committed[partition] = offset
        elif step[0] == "stage":
            write = self.stage(coordinator, producer=step[1], partition=step[2])
            await coordinator.wait_offsets_durable(write)
        elif step[0] == "end":
            producer, committed = step[1], step[2]
            epoch = model.epochs.get(producer, 0)
            await coordinator.complete_transaction(GROUP, producer, epoch, committed)
            if model.pending.get(producer):  # an end is written only over staged offsets
                model.written_epochs[producer] = epoch
            self.model_ends(producer, committed)
        elif step[0] == "advance":
            # The timer runs the cleanup every few minutes: once the clocks moved.
            clocks.wall_ms += step[1]
            clocks.monotonic_ms += step[1]
            await self.do(coordinator, ("cleanup",))
        elif step[0] == "old_offset_under_a_transaction":
            # Rule 1's exception, built on purpose (random steps seldom line it up): an
            # offset as old as the retention when a transaction stages one of its
            # partition and the cleanup runs.
            producer = step[1]
            partition = PARTITIONS[PRODUCERS.index(producer)]
            parts: list[Step] = [
                ("commit", partition),
                ("advance", RETENTION_MS),
                ("stage", producer, partition),
                ("cleanup",),
            ]
            for part in parts:
                await self.do(coordinator, part)
                self.check(coordinator)
        elif step[0] == "fence":
            # Rule 4's shape: InitProducerId bumps the producer's epoch, the coordinator
            # aborts its open transaction with the new epoch, and the producer's next
            # transaction stages an offset with it (so a record carries the new epoch).
            producer, partition = step[1], step[2]
            model.epochs[producer] = model.epochs.get(producer, 0) + 1
            await self.do(coordinator, ("end", producer, False))
            await self.do(coordinator, ("stage", producer, partition))
        elif step[0] == "end_overtakes_staging":
            # Rule 5's shape: the staging's write is appended, and the end is asked
            # before the write's waiter ran (both then run side by side).
            producer, partition, committed = step[1], step[2], step[3]
            epoch = model.epochs.get(producer, 0)
            write = self.stage(coordinator, producer, partition)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(coordinator.complete_transaction, GROUP, producer, epoch,
                                   committed)  # fmt: skip
                nursery.start_soon(coordinator.wait_offsets_durable, write)
            self.model_ends(producer, committed)
        elif step[0] == "cleanup":
            coordinator.cleanup(clocks.monotonic_ms)
            expired = model.expire(clocks.wall_ms)
            if expired:
                next(self.writes)
            note(f"expired (Kafka's rule): {expired}")
        else:  # pragma: no cover
            raise AssertionError(step)

    def stage(
        self, coordinator: GroupCoordinator, producer: int, partition: Partition
    ) -> PendingWrite:
        """TxnOffsetCommit of a new offset for ``partition`` in ``producer``'s open
        transaction (validated, then staged: its write, not yet durable, is returned);
        the model stages it too."""
        epoch = self.model.epochs.get(producer, 0)
        error = coordinator.validate_txn_offset_commit(GROUP, producer, epoch, "", None, -1)
        assert error is ErrorCode.NONE, error
        offset = Offset(next(self.values), self.clocks.wall_ms, next(self.writes))
        write = coordinator.stage_txn_offsets(
            producer, epoch, [(self.key(partition), self.value(offset))]
        )
        self.model.pending.setdefault(producer, {})[partition] = offset
        self.model.written_epochs[producer] = epoch
        return write

    def model_ends(self, producer: int, committed: bool) -> None:
        """The model's end of ``producer``'s transaction: a commit applies each staged
        offset newer than the committed one; an abort drops them."""
        for partition, offset in self.model.pending.pop(producer, {}).items():
            current = self.model.committed.get(partition)
            if committed and (current is None or current.at < offset.at):
                self.model.committed[partition] = offset

    @staticmethod
    def key(partition: Partition) -> OffsetKey:
        return OffsetKey(GROUP, *partition)

    @staticmethod
    def value(offset: Offset) -> OffsetAndMetadata:
        return OffsetAndMetadata(offset.value, commit_timestamp_ms=offset.commit_timestamp_ms)

    def check(self, coordinator: GroupCoordinator) -> None:
        for partition in PARTITIONS:
            got = coordinator.committed(GROUP, *partition)
            expected = self.model.committed.get(partition)
            assert (got.offset if got else None) == (expected.value if expected else None), (
                f"{partition}: the coordinator answers {got}, Kafka's rule says {expected}"
            )
            held = coordinator.has_pending_offset(GROUP, *partition)
            assert held == self.model.held_by_a_transaction(partition), (
                f"{partition}: held by an open transaction: {held}, "
                f"the model says {self.model.pending}"
            )
        for producer, written in self.model.written_epochs.items():
            if written > 0:  # rule 4: a zombie of the fenced epoch
                error = coordinator.validate_txn_offset_commit(
                    GROUP, producer, written - 1, "", None, -1
                )
                assert error is ErrorCode.INVALID_PRODUCER_EPOCH, (
                    f"producer {producer} wrote offsets with epoch {written}; TxnOffsetCommit "
                    f"with epoch {written - 1} answers {error.name}, not INVALID_PRODUCER_EPOCH"
                )


#: pytest-timeout's guard against a hang, not a budget: planted slips at load 15-18
#: were stopped by the 300 s default while the failure shrank (the sixteenth round).
pytestmark = pytest.mark.timeout(1200)


@settings(max_examples=60, deadline=None)
@given(script=steps)
def test_offsets_expire_by_kafkas_rules_beside_transactions(script: list[Step]) -> None:
    machine = Machine()
    # A clock that stands still: nothing here waits for time, and a wait that did would
    # hang (pytest-timeout says so) rather than pass by the wall clock.
    trio.run(machine.run, script, clock=trio.testing.MockClock())
