"""The share coordinator of a cluster: ``__share_group_state``'s partitions (KIP-932).

As in Kafka, a share partition's durable state, keyed by (group, topic id, partition),
belongs to partition ``partition_for("group:topicId:partition", n)`` of the replicated
topic ``__share_group_state`` (n = ``share.coordinator.state.topic.num.partitions``),
and its *share coordinator* is that partition's leader. The share partition itself
lives on the data partition's leader, which reads its state from the share coordinator
when it starts serving it (ReadShareGroupState) and writes every durable change there
(WriteShareGroupState); the coordinator appends the snapshot to its partition's log
through the one append path and answers once it counts (synced, below the high
watermark: every in-sync replica has it). When leadership of a ``__share_group_state``
partition moves, the new leader replays its log into a fresh table, so what was written
survives a ``kill -9`` of the coordinator's broker.

The rules of Kafka's share coordinator kept here, per key:

- a write or read carrying a data-partition leader epoch below the last one recorded
  for the key is ``FENCED_LEADER_EPOCH``: a deposed leader cannot overwrite the state
  its successor read (a read records the reader's epoch, so it fences its predecessor
  at once);
- a write carrying a state epoch below the stored one is ``FENCED_STATE_EPOCH`` (the
  share partition was reset, AlterShareGroupOffsets, since the writer read it);
- a read of a key with no state answers start offset -1 and state epoch 0 (the
  leader then starts the share partition where ``share.auto.offset.reset`` says).

Every write here is a whole snapshot (Kafka's ``ShareSnapshot`` record; its
``ShareUpdate`` deltas are not written: the leader sends its share partition's whole
durable state, which ``group.share.partition.max.record.locks`` keeps small).

Sans-I/O: no trio. :class:`PartitionedShareCoordinator` is the ``LeadershipListener``
of the topic; the shell loads the elected partitions' tables (``load_pending``) and
performs the appends the tables ask for.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from trio_broker.groups.share_state import Entry, ShareKey, ShareSnapshot, ShareStateStore
from trio_broker.partition.append import Replication
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.internal_topics import partition_for
from trio_broker.storage.log_protocol import Log

__all__ = [
    "NO_LEADER_EPOCH",
    "UNINITIALIZED_START_OFFSET",
    "PartitionedShareCoordinator",
    "RemoteShareState",
    "ShareCoordinatorTable",
    "ShareLeaders",
    "StateWrite",
    "coordinator_key",
]

log = logging.getLogger("trio_broker.groups")

#: A read of a key without state answers this start offset (Kafka's).
UNINITIALIZED_START_OFFSET = -1
#: The leader epoch of a request that comes from no share partition's leader (the
#: group coordinator's summary reads and initializations): it fences no one.
NO_LEADER_EPOCH = -1


def kafka_uuid_string(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def coordinator_key(key: ShareKey) -> str:
    """Kafka's ``SharePartitionKey.asCoordinatorKey``: what picks the state partition."""
    return f"{key.group_id}:{kafka_uuid_string(key.topic_id)}:{key.partition}"


@attrs.frozen
class ReadResult:
    error: ErrorCode
    #: The stored snapshot; None with NONE: the key has no state yet.
    snapshot: ShareSnapshot | None = None


class ShareCoordinatorTable:
    """The snapshots of one led ``__share_group_state`` partition, over its log."""

    def __init__(self, partition: int, leader_epoch: int, state_log: Log) -> None:
        self.partition = partition
        #: The epoch of this broker's leadership of the state partition.
        self.leader_epoch = leader_epoch
        self.store = ShareStateStore(state_log)
        #: Per key, the highest data-partition leader epoch a read or write carried.
        self.leader_epochs: dict[ShareKey, int] = {}

    @property
    def log(self) -> Log:
        return self.store.log

    def load(self) -> int:
        """Replay the partition's log (the last snapshot of a key wins); records read."""
        records = self.store.load()
        for key, snapshot in self.store.snapshots.items():
            self.leader_epochs[key] = snapshot.leader_epoch
        return records

    def read(self, key: ShareKey, leader_epoch: int) -> ReadResult:
        """ReadShareGroupState for one key by the data partition's leader in
        ``leader_epoch``, which from now on fences writers of older epochs."""
        if key.partition < 0:
            return ReadResult(ErrorCode.INVALID_REQUEST)
        if leader_epoch == NO_LEADER_EPOCH:
            # A summary, not a leader's read (the group coordinator's, for the admin
            # APIs; Kafka's ReadShareGroupStateSummary): it fences no one.
            return ReadResult(ErrorCode.NONE, self.store.snapshots.get(key))
        if self.leader_epochs.get(key, -1) > leader_epoch:
            return ReadResult(ErrorCode.FENCED_LEADER_EPOCH)
        self.leader_epochs[key] = leader_epoch
        return ReadResult(ErrorCode.NONE, self.store.snapshots.get(key))

    def check_write(self, key: ShareKey, leader_epoch: int, state_epoch: int) -> ErrorCode:
        """Whether WriteShareGroupState may store a snapshot for ``key`` (Kafka's checks,
        in its order)."""
        if key.partition < 0:
            return ErrorCode.INVALID_REQUEST
        stored = self.store.snapshots.get(key)
        if leader_epoch == NO_LEADER_EPOCH:
            # InitializeShareGroupState: the share partition starts over in a new state
            # epoch (which fences its leader's later writes of the old one).
            if stored is not None and stored.state_epoch >= state_epoch:
                return ErrorCode.FENCED_STATE_EPOCH
            return ErrorCode.NONE
        if self.leader_epochs.get(key, -1) > leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if stored is not None and stored.state_epoch > state_epoch:
            return ErrorCode.FENCED_STATE_EPOCH
        return ErrorCode.NONE

    def entry_for(
        self, key: ShareKey, snapshot: ShareSnapshot, leader_epoch: int, now_ms: int
    ) -> Entry:
        """The record to append for an accepted write: the snapshot with the key's next
        snapshot epoch, the writer's leader epoch (an initialization, which has none,
        keeps the stored one: it still fences the leaders before it) and the write time."""
        stored = self.store.snapshots.get(key)
        if leader_epoch == NO_LEADER_EPOCH:
            leader_epoch = self.leader_epochs.get(key, NO_LEADER_EPOCH)
        return key, attrs.evolve(
            snapshot,
            snapshot_epoch=0 if stored is None else stored.snapshot_epoch + 1,
            leader_epoch=leader_epoch,
            write_timestamp_ms=now_ms,
        )

    def appended(self, entries: list[Entry]) -> None:
        """``entries`` are in the log (maybe not durable yet): the table holds them."""
        self.store.appended(entries)
        for key, snapshot in entries:
            if snapshot is None:
                self.leader_epochs.pop(key, None)
            else:
                self.leader_epochs[key] = max(
                    self.leader_epochs.get(key, -1), snapshot.leader_epoch
                )


@attrs.frozen
class StateWrite:
    """One share partition's snapshot, written by its leader in ``leader_epoch``."""

    key: ShareKey
    snapshot: ShareSnapshot
    leader_epoch: int


class RemoteShareState(Protocol):
    """ReadShareGroupState / WriteShareGroupState / InitializeShareGroupState /
    DeleteShareGroupState to the share coordinator on another broker, and ListOffsets to
    a data partition's leader (cluster/share_state_channel.py); errors come back as
    error codes."""

    async def read(
        self, coordinator: int, key: ShareKey, leader_epoch: int
    ) -> tuple[ErrorCode, ShareSnapshot | None]: ...

    async def write(
        self, coordinator: int, group_id: str, writes: Sequence[StateWrite]
    ) -> dict[ShareKey, ErrorCode]: ...

    async def initialize(
        self, coordinator: int, group_id: str, writes: Sequence[StateWrite]
    ) -> dict[ShareKey, ErrorCode]: ...

    async def delete(
        self, coordinator: int, keys: Sequence[ShareKey]
    ) -> dict[ShareKey, ErrorCode]: ...

    async def partition_offsets(
        self, leader: int, topic: str, partition: int
    ) -> tuple[ErrorCode, int, int]:
        """A data partition's (error, log start offset, high watermark), asked of its
        leader: a share group's lag at a coordinator holding no replica of the topic."""
        ...


class ShareLeaders(Replication, Protocol):
    """Who leads the ``__share_group_state`` partitions: the tables write through it
    and the leaders of share partitions find their share coordinator in it."""

    def partition(self, topic: str, partition: int) -> PartitionInfo | None: ...


@attrs.frozen
class _Loading:
    leader_epoch: int
    log: Log


class PartitionedShareCoordinator:
    """One :class:`ShareCoordinatorTable` per led ``__share_group_state`` partition
    (module docstring); a ``LeadershipListener`` of that topic."""

    def __init__(self, num_partitions: int, leaders: ShareLeaders) -> None:
        #: share.coordinator.state.topic.num.partitions in a cluster, fixed for its
        #: life; 1 on a node alone.
        self.num_partitions = num_partitions
        #: Who leads the partitions (the tables write through it, the leaders of share
        #: partitions find their coordinator in it): alone its ``OwnPartition`` from
        #: start to end; in a cluster ``LeadsNothing`` until the broker joins, then the
        #: replica manager (cluster/broker_node.py).
        self.replication: ShareLeaders = leaders
        self.tables: dict[int, ShareCoordinatorTable] = {}
        #: Led partitions whose tables wait for :meth:`load_pending`.
        self.loading: dict[int, _Loading] = {}
        #: The shell's wake-up: something is waiting to load.
        self.on_elected: Callable[[], None] = lambda: None
        #: Told of each table once loaded: the groups it holds state for are known
        #: (empty) to a group coordinator on this broker (set by the wiring).
        self.on_loaded: Callable[[ShareCoordinatorTable], None] = lambda table: None
        #: The requests to another broker's share coordinator, set once this broker
        #: joins the cluster.
        self.remote: RemoteShareState | None = None

    # ------------------------------------------------------------------ LeadershipListener

    def elected(self, partition: int, leader_epoch: int, log_: Log) -> None:
        table = self.tables.get(partition)
        if table is not None and table.log is log_:
            # A new epoch of a leadership held all along: the table is current.
            table.leader_epoch = leader_epoch
            return
        self.tables.pop(partition, None)
        self.loading[partition] = _Loading(leader_epoch, log_)
        self.on_elected()

    def resigned(self, partition: int) -> None:
        self.loading.pop(partition, None)
        if self.tables.pop(partition, None) is not None:
            log.info("no longer the share coordinator of __share_group_state-%d", partition)

    def load_pending(self) -> list[ShareCoordinatorTable]:
        """Replay the log of every partition elected since the last call."""
        loaded = []
        while self.loading:
            partition, pending = next(iter(self.loading.items()))
            del self.loading[partition]
            table = ShareCoordinatorTable(partition, pending.leader_epoch, pending.log)
            records = table.load()
            self.tables[partition] = table
            loaded.append(table)
            self.on_loaded(table)
            log.info("share coordinator of __share_group_state-%d (epoch %d): %d share "
                     "partitions from %d records", partition, pending.leader_epoch,
                     len(table.store.snapshots), records)  # fmt: skip
        return loaded

    # ------------------------------------------------------------------ routing

    def partition_of(self, key: ShareKey) -> int:
        return partition_for(coordinator_key(key), self.num_partitions)

    def table_for(self, key: ShareKey) -> ShareCoordinatorTable | ErrorCode:
        """The key's table, or why this broker cannot answer for it now."""
        partition = self.partition_of(key)
        table = self.tables.get(partition)
        if table is not None:
            return table
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NOT_COORDINATOR

    def keys(
        self, *, group_id: str | None = None, topic_id: uuid.UUID | None = None
    ) -> list[ShareKey]:
        """The keys with state in the tables led here, of a group and/or of a topic."""
        return [
            key
            for table in self.tables.values()
            for key in table.store.snapshots
            if group_id in (None, key.group_id) and topic_id in (None, key.topic_id)
        ]

    def close(self) -> None:
        """The logs are their leadership's (the topic manager's, an ``OwnPartition``):
        nothing to close here."""
        self.tables.clear()
        self.loading.clear()
