"""The share coordinator (groups/share_coordinator.py) against KIP-932's fencing rules.

Share partitions' leaders read and write their state at the share coordinator, each
naming the leader epoch of the data partition it leads. The coordinator keeps per key
the highest leader epoch a read or an accepted write carried, and:

1. a read or write naming an older leader epoch is refused (FENCED_LEADER_EPOCH);
2. a write whose state epoch is older than the stored snapshot's is refused
   (FENCED_STATE_EPOCH); in Kafka's order, the leader epoch first;
3. an accepted write is stored with the key's next snapshot epoch, its writer's leader
   epoch and the time, and is what the next read answers; a deleted group's tombstone
   removes the key;
4. a coordinator move (resigned, elected at a new epoch, its table replayed by
   ``load_pending``) keeps every stored snapshot, and the leader epochs the stored
   snapshots carry fence as before (a read's fence without a write is not durable);
   while away or loading it answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS.

The machine drives a real ``PartitionedShareCoordinator`` of one partition over a memory
log and appends what it accepts as the handlers do (``encode_batch``, then
``appended``); the model is a dict.
"""

from __future__ import annotations

import uuid

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.groups.share_coordinator import PartitionedShareCoordinator, ShareCoordinatorTable
from trio_broker.groups.share_state import ShareKey, ShareSnapshot, StateBatch, encode_batch
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.local_replication import LeadsNothing
from trio_broker.state.share_partition import RecordState
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

KEYS = (
    ShareKey("g", uuid.UUID(int=1), 0),
    ShareKey("g", uuid.UUID(int=1), 1),
    ShareKey("h", uuid.UUID(int=2), 0),
)
EPOCHS = st.integers(0, 4)


@attrs.define
class Stored:
    snapshot: ShareSnapshot


class ShareCoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.log = MemoryLog(LogConfig())
        self.coordinator = PartitionedShareCoordinator(1, LeadsNothing(1))
        self.epoch = 0
        self.coordinator.elected(0, self.epoch, self.log)
        self.coordinator.load_pending()
        #: The model: per key the stored snapshot, and the fence (highest leader epoch).
        self.stored: dict[ShareKey, ShareSnapshot] = {}
        self.fence: dict[ShareKey, int] = {}

    def _table(self) -> ShareCoordinatorTable:
        table = self.coordinator.table_for(KEYS[0])
        assert isinstance(table, ShareCoordinatorTable)
        return table

    def _append(self, entries: list[tuple[ShareKey, ShareSnapshot | None]]) -> None:
        self.log.append(encode_batch(entries, self.now), now_ms=self.now)
        self._table().appended(entries)

    @rule(key=st.sampled_from(KEYS), leader_epoch=EPOCHS)
    def leader_reads(self, key: ShareKey, leader_epoch: int) -> None:
        result = self._table().read(key, leader_epoch)
        note(f"read {key.group_id}/{key.partition} at {leader_epoch} -> {result.error.name}")
        if self.fence.get(key, -1) > leader_epoch:
            assert result.error is ErrorCode.FENCED_LEADER_EPOCH
            return
        assert result.error is ErrorCode.NONE
        assert result.snapshot == self.stored.get(key)
        self.fence[key] = leader_epoch

    @rule(
        key=st.sampled_from(KEYS),
        leader_epoch=EPOCHS,
        state_epoch=st.integers(0, 3),
        start=st.integers(0, 50),
        acked=st.integers(0, 3),
    )
    def leader_writes(
        self, key: ShareKey, leader_epoch: int, state_epoch: int, start: int, acked: int
    ) -> None:
        table = self._table()
        batches = (
            (StateBatch(start + 1, start + acked, RecordState.ACKNOWLEDGED, 1),) if acked else ()
        )
        snapshot = ShareSnapshot(start, batches, state_epoch=state_epoch)
        error = table.check_write(key, leader_epoch, state_epoch)
        note(
            f"write {key.group_id}/{key.partition} at {leader_epoch}/{state_epoch} -> {error.name}"
        )
        known = self.stored.get(key)
        if self.fence.get(key, -1) > leader_epoch:
            assert error is ErrorCode.FENCED_LEADER_EPOCH
            return
        if known is not None and known.state_epoch > state_epoch:
            assert error is ErrorCode.FENCED_STATE_EPOCH
            return
        assert error is ErrorCode.NONE
        entry = table.entry_for(key, snapshot, leader_epoch, self.now)
        expected = attrs.evolve(
            snapshot,
            snapshot_epoch=0 if known is None else known.snapshot_epoch + 1,
            leader_epoch=leader_epoch,
            write_timestamp_ms=self.now,
        )
        assert entry == (key, expected)
        self._append([entry])
        self.stored[key] = expected
        self.fence[key] = max(self.fence.get(key, -1), leader_epoch)

    @rule(key=st.sampled_from(KEYS))
    def group_deleted(self, key: ShareKey) -> None:
        tombstones = self._table().store.tombstones([key])
        assert [k for k, _ in tombstones] == ([key] if key in self.stored else [])
        if tombstones:  # only a stored key gets one; a read's fence stays otherwise
            self._append(list(tombstones))
            del self.stored[key]
            self.fence.pop(key, None)

    @rule(ms=st.integers(1, 500))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(same_log=st.booleans())
    def coordinator_moves(self, same_log: bool) -> None:
        """A new epoch of the leadership held all along (``same_log``), or the
        leadership lost to another broker and won back: the table is replayed."""
        self.epoch += 1
        if same_log:
            self.coordinator.elected(0, self.epoch, self.log)
            assert not self.coordinator.loading
            assert self._table().leader_epoch == self.epoch
            return
        self.coordinator.resigned(0)
        for key in KEYS:
            assert self.coordinator.table_for(key) is ErrorCode.NOT_COORDINATOR
        self.coordinator.elected(0, self.epoch, self.log)
        for key in KEYS:
            assert self.coordinator.table_for(key) is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert len(self.coordinator.load_pending()) == 1
        assert self._table().leader_epoch == self.epoch
        # Only what the log holds survives: the stored snapshots' leader epochs.
        self.fence = {key: snap.leader_epoch for key, snap in self.stored.items()}

    @invariant()
    def the_table_holds_what_was_accepted(self) -> None:
        assert self._table().store.snapshots == self.stored


TestShareCoordinator = ShareCoordinatorMachine.TestCase
TestShareCoordinator.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
