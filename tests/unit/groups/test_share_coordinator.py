"""The share coordinator's tables (trio_broker/groups/share_coordinator.py): routing a
key to its ``__share_group_state`` partition as Kafka does, Kafka's fencing of reads and
writes by leader and state epoch, and a new leader of a state partition replaying what
its predecessor wrote."""

from __future__ import annotations

import base64
import uuid

import attrs

from trio_broker.groups.share_coordinator import (
    PartitionedShareCoordinator,
    ShareCoordinatorTable,
    coordinator_key,
    kafka_uuid_string,
)
from trio_broker.groups.share_state import (
    Entry,
    ShareKey,
    ShareSnapshot,
    StateBatch,
    encode_batch,
)
from trio_broker.partition.append import Origin, append
from trio_broker.partition.partition import Partition, coordinator_partition
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import partition_for
from trio_broker.services.local_replication import LeadsNothing, OwnLog
from trio_broker.state.share_partition import RecordState
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.memory import MemoryLog

TOPIC = uuid.UUID("5f4e3d2c-1b0a-4988-8776-655443322110")
KEY = ShareKey("workers", TOPIC, 3)
ACKED = StateBatch(10, 14, RecordState.ACKNOWLEDGED, 1)
REDELIVER = StateBatch(15, 16, RecordState.AVAILABLE, 2)


def own(log: Log) -> Partition:
    """``log`` as a share coordinator of one writes it (a node alone's ``OwnLog``)."""
    return coordinator_partition(OwnLog(0, log), "__share_group_state", 0, log)


def write(table: ShareCoordinatorTable, entries: list[Entry]) -> None:
    """What the shell does for an accepted write: append, then tell the table."""
    append(own(table.log), encode_batch(entries, 0), origin=Origin.COORDINATOR,
           now_ms=0, durability=None)  # fmt: skip
    table.appended(entries)


def test_a_key_goes_to_the_partition_of_kafkas_coordinator_key() -> None:
    # Kafka's Uuid.toString: URL-safe base64 without padding (22 characters).
    text = kafka_uuid_string(TOPIC)
    assert len(text) == 22 and "=" not in text
    assert uuid.UUID(bytes=base64.urlsafe_b64decode(text + "==")) == TOPIC
    assert coordinator_key(KEY) == f"workers:{text}:3"
    coordinator = PartitionedShareCoordinator(50, LeadsNothing(1))
    assert coordinator.partition_of(KEY) == partition_for(f"workers:{text}:3", 50)
    # Nothing led yet: another broker's business, or loading once elected.
    assert coordinator.table_for(KEY) == ErrorCode.NOT_COORDINATOR
    woken = []
    coordinator.on_elected = lambda: woken.append(True)
    coordinator.elected(coordinator.partition_of(KEY), 4, MemoryLog(LogConfig()))
    assert woken and coordinator.table_for(KEY) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    (table,) = coordinator.load_pending()
    assert coordinator.table_for(KEY) is table and table.leader_epoch == 4
    coordinator.resigned(table.partition)
    assert coordinator.table_for(KEY) == ErrorCode.NOT_COORDINATOR


def test_reads_and_writes_are_fenced_by_leader_and_state_epoch() -> None:
    table = ShareCoordinatorTable(0, 0, MemoryLog(LogConfig()))
    # A key without state: read as uninitialized, and the reader's epoch recorded.
    assert table.read(KEY, 5).snapshot is None and table.read(KEY, 5).error == ErrorCode.NONE
    assert table.check_write(KEY, 4, 0) == ErrorCode.FENCED_LEADER_EPOCH
    assert table.check_write(KEY, 5, 0) == ErrorCode.NONE
    snapshot = ShareSnapshot(10, (ACKED, REDELIVER), state_epoch=1)
    write(table, [table.entry_for(KEY, snapshot, 5, 1_000)])
    stored = table.read(KEY, 5).snapshot
    assert stored is not None and stored.batches == (ACKED, REDELIVER)
    assert (stored.snapshot_epoch, stored.leader_epoch, stored.write_timestamp_ms) == (0, 5, 1_000)
    # A reset (AlterShareGroupOffsets) raised the state epoch: older writers are fenced.
    assert table.check_write(KEY, 5, 0) == ErrorCode.FENCED_STATE_EPOCH
    # The partition's next leader reads: its predecessor can no longer write or read.
    assert table.read(KEY, 6).error == ErrorCode.NONE
    assert table.check_write(KEY, 5, 1) == ErrorCode.FENCED_LEADER_EPOCH
    assert table.read(KEY, 5).error == ErrorCode.FENCED_LEADER_EPOCH
    assert table.check_write(KEY, 6, 1) == ErrorCode.NONE
    # The next snapshot of the key raises its snapshot epoch.
    _, second = table.entry_for(KEY, attrs.evolve(snapshot, start_offset=15), 6, 2_000)
    assert second is not None and second.snapshot_epoch == 1
    assert table.check_write(ShareKey("workers", TOPIC, -1), 6, 1) == ErrorCode.INVALID_REQUEST


def test_a_new_leader_of_the_state_partition_replays_its_predecessors_writes() -> None:
    state_log = MemoryLog(LogConfig())
    old = ShareCoordinatorTable(0, 0, state_log)
    other = ShareKey("workers", TOPIC, 4)
    write(old, [old.entry_for(KEY, ShareSnapshot(10, (ACKED,)), 2, 1_000),
                old.entry_for(other, ShareSnapshot(0), 2, 1_000)])  # fmt: skip
    write(old, [old.entry_for(KEY, ShareSnapshot(10, (ACKED, REDELIVER)), 3, 2_000),
                (other, None)])  # fmt: skip
    # The log is all a successor has (the replicas' copies of it, after a failover).
    coordinator = PartitionedShareCoordinator(1, LeadsNothing(1))
    coordinator.elected(0, 1, state_log)
    (new,) = coordinator.load_pending()
    assert new.store.snapshots == old.store.snapshots
    restored = new.read(KEY, 3).snapshot
    assert restored is not None and restored.batches == (ACKED, REDELIVER)
    assert restored.snapshot_epoch == 1
    # The leader epoch of the last write survives too: the writer before it stays fenced.
    assert new.check_write(KEY, 2, 0) == ErrorCode.FENCED_LEADER_EPOCH
    # A tombstoned key is gone: read as uninitialized, with no epoch to fence.
    assert new.read(other, 0).snapshot is None
    # A new epoch of the same leadership keeps the table; another log replaces it.
    coordinator.elected(0, 2, state_log)
    assert coordinator.tables[0] is new and new.leader_epoch == 2 and not coordinator.loading
    coordinator.elected(0, 3, MemoryLog(LogConfig()))
    assert 0 not in coordinator.tables and 0 in coordinator.loading
