"""The group coordinator: Trio shell around the pure group machines.

This node is the coordinator of every group. The coordinator

* owns one :class:`~trio_broker.state.group.Group` per group id and feeds it
  requests with the monotonic Trio clock (so tests can use ``autojump_clock``);
* parks JoinGroup/SyncGroup requests as :class:`Waiter` objects and wakes them
  with the replies the group machine hands back;
* runs one timer task (started by the broker's root nursery through
  ``broker.services``) that fires due deadlines -- sessions, join and sync
  phases, KIP-394 pending ids -- and expires old offsets of empty groups;
* stores committed offsets durably through :class:`OffsetsStore` and answers a
  commit only after the flusher has synced it;
* stages transactional offsets (TxnOffsetCommit) per producer and commits or
  drops them when the transaction coordinator ends the transaction
  (:meth:`GroupCoordinator.complete_transaction`).

Group membership is stored too: when the leader's SyncGroup brings a generation's
assignment, the group's metadata (members, assignment) is written to the group's offsets
log while the group stays CompletingRebalance; once that write counts the group is
Stable and every parked SyncGroup, the leader's and the followers', is answered
together (a failed write answers them with an error and the group rebalances). A group
that becomes Empty is stored without members, and a removed group gets a tombstone. A
coordinator that loads the log (at startup, or on becoming the leader of the partition)
restores each group as stored: Stable with its members, whose heartbeats go on without
a rebalance.

One path for one broker and many (docs/architecture.md): the coordinator coordinates the
groups whose ``__consumer_offsets`` partition it leads. Whoever leads the partitions tells
it (:meth:`GroupCoordinator.elected` / :meth:`GroupCoordinator.resigned`): in a cluster
the replica manager (docs/cluster.md, "Consumer groups in a cluster"); a node alone is a
cluster of one whose offsets topic has one partition, kept in ``<data_dir>/__consumer_offsets-0``
and led from the start (``groups/own_offsets.py``). Each led partition's table is replayed
from its log in the background, and its writes count once synced and below the
partition's high watermark (alone, the durable end), within ``offsets.commit.timeout.ms``.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from trio_broker.groups.offsets_store import (
    ConsumerGroupSnapshot,
    Entry,
    GroupMetadata,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    PendingWrite,
    ShareGroupRecord,
    StoreRecord,
    TxnOffset,
    group_of,
    storable_group_id,
)
from trio_broker.groups.share_records import (
    RecordKey,
    StoredShareGroup,
    decode_group,
    record_values,
    records_of,
)
from trio_broker.partition.append import Appended, Replication
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.internal_topics import (
    CONSUMER_OFFSETS,
    NotCommitted,
    append_as_leader,
    partition_for,
    wait_counted,
)
from trio_broker.state.consumer_group import (
    CONSUMER_PROTOCOL_TYPE,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ClassicJoin,
    ConsumerGroup,
    ConsumerGroupConfig,
    Heartbeat,
    HeartbeatResult,
    MemberState,
    Refused,
    validate_heartbeat,
)
from trio_broker.state.group import (
    Group,
    GroupConfig,
    GroupRecord,
    GroupState,
    GroupSummary,
    JoinRequest,
    JoinResult,
    Reply,
    SyncResult,
)
from trio_broker.storage.log_protocol import Log

log = logging.getLogger("trio_broker.groups")

#: How often empty groups are checked for expired offsets and forgotten
#: (Kafka's offsets.retention.check.interval.ms).
CLEANUP_INTERVAL_MS = 600_000


class Waiter:
    """One parked JoinGroup or SyncGroup: set once by the group machine's reply."""

    __slots__ = ("_event", "result")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.result: JoinResult | SyncResult | None = None

    def set(self, result: JoinResult | SyncResult) -> None:
        if not self._event.is_set():
            self.result = result
            self._event.set()

    async def wait(self) -> JoinResult | SyncResult:
        await self._event.wait()
        assert self.result is not None
        return self.result


@attrs.frozen
class StableGeneration:
    """Reported to observers each time a generation becomes Stable (tests, metrics)."""

    group_id: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    assignments: Mapping[str, bytes]


def store_error(code: ErrorCode) -> ErrorCode:
    """What the members of a generation whose write failed are answered (Kafka's
    mapping of a failed group metadata append). Anything else unexpected is answered
    COORDINATOR_NOT_AVAILABLE, so that the clients look the coordinator up and retry."""
    if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                ErrorCode.KAFKA_STORAGE_ERROR):  # fmt: skip
        return ErrorCode.NOT_COORDINATOR
    if code is ErrorCode.REQUEST_TIMED_OUT:
        return ErrorCode.REBALANCE_IN_PROGRESS
    if code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                ErrorCode.INVALID_FETCH_SIZE):  # fmt: skip
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def trio_clock_ms() -> int:
    return int(trio.current_time() * 1000)


class OffsetsLeaders(Replication, Protocol):
    """Who leads the ``__consumer_offsets`` partitions, as the coordinator asks it: in a
    cluster the replica manager (``services.leaders``; ``LeadsNothing`` out of the
    cluster), alone an ``OwnPartition`` (a cluster of one, groups/own_offsets.py)."""

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """The partition's replicas and leader, as FindCoordinator answers them."""
        ...

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """This broker is named leader but its term has not begun yet."""
        ...


@attrs.define(eq=False)
class LedPartition:
    """A ``__consumer_offsets`` partition this broker leads."""

    partition: int
    leader_epoch: int
    #: The partition's log (the topic manager's replica, or a node alone's own file:
    #: never closed here).
    log: Log
    #: None while the table loads from the log: its groups answer
    #: COORDINATOR_LOAD_IN_PROGRESS meanwhile.
    store: OffsetsStore | None = None
    loaded: trio.Event = attrs.field(factory=trio.Event)


class GroupCoordinator:
    """Register with ``broker.services``; started by ``Broker.run``."""

    def __init__(
        self,
        broker: Any,
        *,
        offsets_partitions: int,
        leaders: Callable[[], OffsetsLeaders],
        clock_ms: Callable[[], int] = trio_clock_ms,
    ) -> None:
        """``offsets_partitions``: the ``__consumer_offsets`` partition count every
        broker routes groups by (offsets.topic.num.partitions in a cluster; 1 alone);
        ``leaders``: who leads them now (:class:`OffsetsLeaders`)."""
        self.broker = broker
        config = broker.config
        self.group_config = GroupConfig(
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
        )
        self.offsets_retention_ms: int = config.offsets_retention_minutes * 60_000
        #: Timers run on this monotonic clock; commit timestamps use the broker's wall clock.
        self.clock_ms = clock_ms
        self.groups: dict[str, Group] = {}
        #: Groups of the consumer rebalance protocol (KIP-848), stored as one snapshot
        #: record each (docs/consumer-groups.md); a group id is in one table at most.
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        #: group -> the snapshot last written for it (unchanged groups are not rewritten).
        self._stored_snapshots: dict[str, bytes] = {}
        #: Share groups (KIP-932) of the led partitions as their records in the offsets
        #: log say (groups/share_records.py): their epoch, initialized share
        #: partitions and members as last written. Their live membership is
        #: ``broker.shares``' (groups/share.py).
        self.share_groups: dict[str, StoredShareGroup] = {}
        #: Group -> keys of its stored records the load could not read (a member's
        #: damaged record): tombstoned with the group's next write, so they do not stay.
        self._unread_share_records: dict[str, set[RecordKey]] = {}
        #: Called with a led partition's share groups once its table is loaded (the
        #: broker brings them back, with their stored members, into ``shares``).
        self.on_share_groups_loaded: Callable[[Mapping[str, StoredShareGroup]], None] | None
        self.on_share_groups_loaded = None
        #: Called with a partition this broker stopped leading, after its groups went
        #: (the broker drops its share groups' membership too).
        self.on_partition_resigned: Callable[[int], None] | None = None
        #: group.consumer.migration.policy: may a live classic group become a consumer
        #: group (upgrade) and back (downgrade)? Empty groups always may.
        policy = config.group_consumer_migration_policy
        self.upgrade_enabled: bool = policy in ("bidirectional", "upgrade")
        self.downgrade_enabled: bool = policy in ("bidirectional", "downgrade")
        self.consumer_group_config = ConsumerGroupConfig(
            session_timeout_ms=config.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            assignors=tuple(config.group_consumer_assignors),
        )
        #: Called with a StableGeneration whenever a group becomes Stable.
        self.observers: list[Callable[[StableGeneration], None]] = []
        self._wakeup = trio.Event()
        self._next_cleanup_ms: int | None = None
        #: (group id, producer id) -> staged transactional offsets appended but not yet
        #: applied: a transaction's end waits for them, so it ends what the producer staged.
        self._staging: dict[tuple[str, int], list[PendingWrite]] = {}
        #: Every table's writes go through the partitions' leadership, one path for one
        #: broker and many; a write counts within offsets.commit.timeout.ms (Kafka's
        #: acks=-1 append of a group coordinator's records).
        self.leaders = leaders
        self.commit_timeout_s: float = config.offsets_commit_timeout_ms / 1000
        self.offsets_partitions: int = offsets_partitions
        #: partition -> its table, for each led ``__consumer_offsets`` partition.
        self.led: dict[int, LedPartition] = {}
        #: group -> its latest metadata write made without a waiter, until someone waits.
        self._group_writes: dict[str, PendingWrite] = {}
        #: Open while :meth:`run` runs; None before and once it has returned (shutting
        #: down), when work that would start a task here is dropped (:meth:`_start_soon`).
        self._nursery: trio.Nursery | None = None
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the timers; tables come with leadership (:meth:`elected`)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._timer_loop()
        finally:
            self._nursery, self._stopped = None, True

    def _start_soon(self, fn: Callable[..., Awaitable[None]], *args: Any, name: str) -> bool:
        """Start a task in the coordinator's nursery; False once it has stopped.

        The broker's shutdown cancels every service at once: the replica manager can
        still be finishing a leadership change (a flush in a worker thread cannot be
        interrupted) when this coordinator's nursery has already closed. Such late work
        is for a broker that is going away: it is dropped, not an error.
        """
        if self._nursery is None:
            if self._stopped:
                return False
            raise RuntimeError("group coordinator is not running")
        self._nursery.start_soon(fn, *args, name=name)
        return True

    async def wait_loaded(self, partition: int) -> bool:
        """Wait until the led partition's table is loaded: True, or False when it is not
        led (any more) or could not be loaded."""
        led = self.led.get(partition)
        if led is None:
            return False
        await led.loaded.wait()
        return self.led.get(partition) is led and led.store is not None

    @property
    def offsets(self) -> OffsetsStore | None:
        """The table of ``__consumer_offsets-0`` when loaded here (a node alone's only one)."""
        led = self.led.get(0)
        return None if led is None else led.store

    @property
    def store(self) -> OffsetsStore:
        """:attr:`offsets`, which must be there."""
        if self.offsets is None:
            raise RuntimeError("the group coordinator does not lead __consumer_offsets-0")
        return self.offsets

    # ------------------------------------------------------------------ which groups

    def partition_of(self, group_id: str) -> int:
        """The ``__consumer_offsets`` partition holding the group (Kafka's hash)."""
        return partition_for(group_id, self.offsets_partitions)

    def coordinator_error(self, group_id: str) -> ErrorCode:
        """NONE when this broker coordinates the group now; else what to answer:
        NOT_COORDINATOR (another broker leads its partition),
        COORDINATOR_LOAD_IN_PROGRESS (the partition's table is still loading) or
        INVALID_GROUP_ID (an id too long for the offsets log's keys: no broker can store
        the group, so none coordinates it; Kafka's own key serializer fails on it too)."""
        if not storable_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        partition = self.partition_of(group_id)
        led = self.led.get(partition)
        if led is None:
            if self.leaders().about_to_lead(CONSUMER_OFFSETS, partition):
                return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            return ErrorCode.NOT_COORDINATOR
        if led.store is None:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    def store_for(self, group_id: str) -> OffsetsStore:
        """The table holding the group; raises KafkaError (:meth:`coordinator_error`)."""
        led = self.led.get(self.partition_of(group_id))
        if led is None or led.store is None:
            error = self.coordinator_error(group_id)
            raise KafkaError(error, f"group {group_id!r}: {error.name}")
        return led.store

    def elected(self, partition: int, leader_epoch: int, log: Log) -> None:
        """LeadershipListener: this broker leads ``__consumer_offsets-<partition>``; its
        table is replayed in the background (its groups answer
        COORDINATOR_LOAD_IN_PROGRESS until then)."""
        if self._stopped:
            return  # shutting down (the replica manager finished a late election)
        led = self.led.get(partition)
        if led is not None and led.log is log:
            led.leader_epoch = leader_epoch  # a new epoch of the same leadership
            return
        if led is not None:
            self.resigned(partition)
        led = self.led[partition] = LedPartition(partition, leader_epoch, log)
        self._start_soon(self._load, led, name=f"load {CONSUMER_OFFSETS}-{partition}")

    async def _load(self, led: LedPartition) -> None:
        try:
            store = await trio.to_thread.run_sync(OffsetsStore.over, led.log, led.partition)
        except (KafkaError, OSError):
            log.exception("could not load %s-%d", CONSUMER_OFFSETS, led.partition)
            if self.led.get(led.partition) is led:
                del self.led[led.partition]  # NOT_COORDINATOR until it is led again
            led.loaded.set()
            return
        if self.led.get(led.partition) is not led:
            return  # resigned (or re-elected on another log) while loading
        led.store = store
        for group_id in store.group_ids():
            self._restore(group_id, store)
            self._restore_consumer_group(group_id, store)
        loaded_shares = self._restore_share_groups(store)
        if loaded_shares and self.on_share_groups_loaded is not None:
            self.on_share_groups_loaded(loaded_shares)
        led.loaded.set()
        self._poke()  # the restored members' sessions end before the timer's next wake-up
        log.info("coordinating the %d groups of %s-%d (epoch %d)", len(store.group_ids()),
                 CONSUMER_OFFSETS, led.partition, led.leader_epoch)  # fmt: skip

    def resigned(self, partition: int) -> None:
        """LeadershipListener: another broker leads the partition now (or none). Its
        groups are forgotten; their parked JoinGroup/SyncGroup answer NOT_COORDINATOR,
        and the clients find the new coordinator."""
        led = self.led.pop(partition, None)
        if led is None:
            return
        led.loaded.set()  # a transaction end waiting for the load learns it here
        for group_id in [g for g in self.groups if self.partition_of(g) == partition]:
            group = self.groups.pop(group_id)
            self._group_writes.pop(group_id, None)
            for member in group.members.values():
                for waiter in member.join_waiters:
                    assert isinstance(waiter, Waiter)
                    waiter.set(JoinResult(ErrorCode.NOT_COORDINATOR, member_id=member.member_id))
                for waiter in member.sync_waiters:
                    assert isinstance(waiter, Waiter)
                    waiter.set(SyncResult(ErrorCode.NOT_COORDINATOR))
                member.join_waiters, member.sync_waiters = [], []
        # KIP-848 groups too: the new coordinator loads them from the partition's log.
        for group_id in [g for g in self.consumer_groups if self.partition_of(g) == partition]:
            del self.consumer_groups[group_id]
            self._stored_snapshots.pop(group_id, None)
        for group_id in [g for g in self.share_groups if self.partition_of(g) == partition]:
            del self.share_groups[group_id]
            self._unread_share_records.pop(group_id, None)
        if self.on_partition_resigned is not None:
            self.on_partition_resigned(partition)
        self._poke()
        log.info("no longer coordinating the groups of %s-%d", CONSUMER_OFFSETS, partition)

    def find_coordinator(self, group_id: str) -> tuple[ErrorCode, int]:
        """FindCoordinator: (NONE, the coordinator's broker id), or
        COORDINATOR_NOT_AVAILABLE. The leader of the group's ``__consumer_offsets``
        partition (alone, this broker: it leads the one partition). As Kafka, the first
        lookup creates the topic (through ``Services.admin``, in the background: the
        client asks again; a node alone's is there from the start)."""
        partition = self.partition_of(group_id)
        info = self.leaders().partition(CONSUMER_OFFSETS, partition)
        admin = self.broker.admin
        if info is None:
            if CONSUMER_OFFSETS not in admin.view.topics:
                config = self.broker.config
                admin.ensure_internal_topic_soon(
                    CONSUMER_OFFSETS, self.offsets_partitions,
                    config.offsets_topic_replication_factor,
                    {"cleanup.policy": "compact",
                     "segment.bytes": str(config.offsets_topic_segment_bytes),
                     "compression.type": "producer"},
                )  # fmt: skip
            # (A topic made with another count than the configured one, every broker's
            # routing, is a misconfiguration: its missing partitions coordinate nothing.)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1
        if info.leader not in admin.view.brokers:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1
        return ErrorCode.NONE, info.leader

    # ------------------------------------------------------------------ timers

    def _poke(self) -> None:
        """A deadline may have moved earlier: let the timer task look again."""
        self._wakeup.set()

    async def _timer_loop(self) -> None:
        now = self.clock_ms()
        self._next_cleanup_ms = now + CLEANUP_INTERVAL_MS
        while True:
            # A fresh event before scanning, so a poke during the scan is not lost.
            self._wakeup = trio.Event()
            now = self.clock_ms()
            self.fire_due_timers(now)
            if self._next_cleanup_ms is not None and now >= self._next_cleanup_ms:
                self._next_cleanup_ms = now + CLEANUP_INTERVAL_MS
                self.cleanup(now)
            deadlines = [d for g in self.groups.values() if (d := g.next_deadline()) is not None]
            deadlines += [
                d for g in self.consumer_groups.values() if (d := g.next_deadline()) is not None
            ]
            if self._next_cleanup_ms is not None:
                deadlines.append(self._next_cleanup_ms)
            # Scanning every group is O(groups) per wake-up; fine for one node's groups.
            wake_at = (min(deadlines) - now) / 1000 + trio.current_time() if deadlines else math.inf
            with trio.move_on_at(wake_at):
                await self._wakeup.wait()

    def fire_due_timers(self, now_ms: int) -> None:
        for group in list(self.groups.values()):
            deadline = group.next_deadline()
            if deadline is not None and deadline <= now_ms:
                before = group.state
                self._dispatch(group, group.advance_to(now_ms), before)
        for consumer_group in list(self.consumer_groups.values()):
            deadline = consumer_group.next_deadline()
            if deadline is not None and deadline <= now_ms:
                view = self._migration_view(consumer_group)
                for member_id in consumer_group.advance_to(now_ms):
                    log.info("group %r: member %s fenced (session or rebalance timeout)",
                             consumer_group.group_id, member_id)  # fmt: skip
                led_here = self.coordinator_error(consumer_group.group_id) is ErrorCode.NONE
                if led_here and not self._maybe_downgrade(consumer_group, view):
                    self._store_consumer_group(consumer_group)

    def cleanup(self, now_ms: int) -> None:
        """Expire old offsets of empty groups; forget empty groups with nothing left."""
        wall_now = self.broker.now_ms()
        retention = self.offsets_retention_ms
        expired_in: dict[int, list[Entry]] = {}
        for group_id, group in list(self.groups.items()):
            if not group.is_empty() or self.coordinator_error(group_id) is not ErrorCode.NONE:
                continue
            store = self.store_for(group_id)
            expired = expired_in.setdefault(store.partition, [])
            # Consumer groups keep offsets while members are around; once empty for the
            # retention period, or for standalone committers, by commit age (KIP-211).
            if group.protocol_type is None or now_ms - group.state_since_ms >= retention:
                for (topic, partition), value in store.group_offsets(group_id).items():
                    if store.has_pending(group_id, topic, partition):
                        continue  # an open transaction will set it (Kafka's rule)
                    if value.commit_timestamp_ms + retention <= wall_now:
                        expired.append((OffsetKey(group_id, topic, partition), None))
        for expired in expired_in.values():
            if not expired:
                continue
            try:
                write = self.append_offsets(expired)
            except KafkaError:  # the disk failed, or leadership just moved
                log.exception("could not expire offsets")
            else:
                # Expiry need not wait: a lost tombstone just expires again.
                assert write.store is not None
                write.store.apply(write)
        for group_id, cgroup in list(self.consumer_groups.items()):
            if self.coordinator_error(group_id) is not ErrorCode.NONE:
                continue
            if cgroup.is_empty() and not self.store_for(group_id).has_offsets(group_id):
                self._forget_consumer_group(group_id)
        for group_id, group in list(self.groups.items()):
            if self.coordinator_error(group_id) is not ErrorCode.NONE:
                continue
            store = self.store_for(group_id)
            if group.is_empty() and not group.pending_members and not store.has_offsets(group_id):
                group.delete(now_ms)
                del self.groups[group_id]
                if store.group_metadata(group_id) is not None:
                    self._store_nowait(GroupMetadata(group_id, None))

    # ------------------------------------------------------------------ plumbing

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, self.group_config)
        return group

    def _restore(self, group_id: str, store: OffsetsStore) -> Group:
        """The group as ``store`` has it: its stored generation (Stable with members,
        sessions starting now), else a new Empty group."""
        record = store.group_metadata(group_id)
        if record is None or group_id in self.groups:
            return self._group(group_id)
        try:
            group = Group.restore(group_id, record, self.group_config, self.clock_ms())
        except ValueError as exc:  # damaged or contradictory: the members rejoin
            log.warning("not restoring group %r: %s", group_id, exc)
            return self._group(group_id)
        self.groups[group_id] = group
        return group

    def _restore_consumer_group(self, group_id: str, store: OffsetsStore) -> None:
        """A stored KIP-848 group back, members' sessions starting now."""
        raw = store.consumer_group_snapshot(group_id)
        if raw is None:
            return
        try:
            group = ConsumerGroup.decode(group_id, raw, self.consumer_group_config, self.clock_ms())
        except ValueError as exc:  # damaged: its members rejoin
            log.warning("not restoring consumer group %r: %s", group_id, exc)
            return
        # A classic group of the same id was written before (the last write wins).
        self.groups.pop(group_id, None)
        self.consumer_groups[group_id] = group
        self._stored_snapshots[group_id] = raw

    def _restore_share_groups(self, store: OffsetsStore) -> dict[str, StoredShareGroup]:
        """The share groups the table holds (an unreadable one is skipped: its
        members rejoin, its share state is found where it is led)."""
        loaded: dict[str, StoredShareGroup] = {}
        for group_id in store.share_group_ids():
            try:
                stored = decode_group(store.share_group_records(group_id))
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning("not restoring share group %r: %s", group_id, exc)
                continue
            if stored is not None:
                loaded[group_id] = self.share_groups[group_id] = stored
                unread = store.share_group_records(group_id).keys() - record_values(stored).keys()
                if unread:
                    self._unread_share_records[group_id] = set(unread)
        return loaded

    def share_group(self, group_id: str) -> StoredShareGroup | None:
        """The share group as stored here (None: never stored, or deleted)."""
        return self.share_groups.get(group_id)

    def store_share_group(
        self, group_id: str, stored: StoredShareGroup | None
    ) -> PendingWrite | None:
        """Write the share group's records (their tombstones for None) unless they
        say that already; the caller waits for the write (:meth:`wait_offsets_durable`).
        Raises KafkaError as :meth:`append_offsets` (the group is not led here)."""
        known = self.share_groups.get(group_id)
        if stored == known:
            return None
        # Only the records that changed (a member's heartbeat: its current assignment),
        # and the tombstones of those gone (a member that left, a deleted group).
        records = records_of(group_id, stored, known)
        written = {(r.key_version, r.member_id) for r in records}
        unread = self._unread_share_records.pop(group_id, set()) - written
        records += [ShareGroupRecord(v, group_id, None, member) for v, member in sorted(unread)]
        write = self.append_offsets(records)
        if stored is None:
            self.share_groups.pop(group_id, None)
        else:
            self.share_groups[group_id] = stored
        return write

    def _store_consumer_group(self, group: ConsumerGroup) -> None:
        """Write the group's snapshot if it changed (a heartbeat's answer waits for it:
        :meth:`wait_group_stored`)."""
        raw = group.encode()
        if self._stored_snapshots.get(group.group_id) == raw:
            return
        self._stored_snapshots[group.group_id] = raw
        self._store_nowait(ConsumerGroupSnapshot(group.group_id, raw))

    def _forget_consumer_group(self, group_id: str) -> None:
        del self.consumer_groups[group_id]
        if self._stored_snapshots.pop(group_id, None) is not None:
            self._store_nowait(ConsumerGroupSnapshot(group_id, None))

    def _store_nowait(self, *records: GroupMetadata | ConsumerGroupSnapshot) -> None:
        """Write a group's metadata without waiting (an Empty group, a tombstone; a
        migration's tombstone of one form and the other form, in one batch): a lost
        write only means the group loads as it was before, and its members rejoin. A
        LeaveGroup that emptied the group waits for it (:meth:`wait_group_stored`)."""
        group_id = records[0].group_id
        try:
            write = self.append_offsets(list(records))
        except KafkaError as exc:  # the disk failed, or leadership just moved
            log.warning("could not store group %r: %s", group_id, exc)
            return
        assert write.store is not None
        write.store.apply(write)
        self._group_writes[group_id] = write

    def group_write_pending(self, group_id: str) -> bool:
        return group_id in self._group_writes

    async def wait_group_stored(self, group_id: str) -> None:
        """Wait until the group's last metadata write without a waiter counts (or failed)."""
        write = self._group_writes.get(group_id)
        if write is None:
            return
        assert write.store is not None
        try:
            await self._wait_counted(write.store, write.last_offset)
        except KafkaError as exc:
            log.warning("group %r not stored: %s", group_id, exc)
        finally:
            if self._group_writes.get(group_id) is write:
                del self._group_writes[group_id]

    def _store_generation(self, group: Group, record: GroupRecord) -> None:
        """The leader's SyncGroup brought a generation's assignment: write it, and tell
        the group when the write counts or fails (:meth:`Group.store_completed`). Until
        then the group stays CompletingRebalance and nobody is answered."""
        generation = record.generation_id
        try:
            write = self.append_offsets([GroupMetadata(group.group_id, record)])
        except KafkaError as exc:
            self._generation_stored(group, generation, exc)
            return
        if not self._start_soon(self._answer_when_stored, group, generation, write,
                                name=f"store generation of {group.group_id}"):  # fmt: skip
            shutting_down = KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "shutting down")
            self._generation_stored(group, generation, shutting_down)

    async def _answer_when_stored(self, group: Group, generation: int, write: PendingWrite) -> None:
        try:
            await self.wait_offsets_durable(write)
        except KafkaError as exc:
            self._generation_stored(group, generation, exc)
            return
        self._generation_stored(group, generation, None)

    def _generation_stored(self, group: Group, generation: int, exc: KafkaError | None) -> None:
        if exc is not None:
            log.warning("could not store generation %d of group %r: %s", generation,
                        group.group_id, exc)  # fmt: skip
        if self.groups.get(group.group_id) is not group:
            return  # resigned or deleted meanwhile: its parked requests were answered then
        error = ErrorCode.NONE if exc is None else store_error(exc.error_code)
        before = group.state
        self._dispatch(group, group.store_completed(generation, error, self.clock_ms()), before)

    def _dispatch(self, group: Group, replies: Iterable[Reply], before: GroupState) -> None:
        for reply in replies:
            waiter = reply.waiter
            assert isinstance(waiter, Waiter)
            waiter.set(reply.result)
        emptied = group.state is GroupState.EMPTY and before is not GroupState.EMPTY
        if emptied and self.groups.get(group.group_id) is group and self._owns_now(group.group_id):
            # Everyone left: stored without members, so a new coordinator does not bring
            # them back (and the generation goes on from here).
            self._store_nowait(GroupMetadata(group.group_id, group.record()))
        if group.state is GroupState.STABLE and before is not GroupState.STABLE:
            generation = StableGeneration(
                group.group_id, group.generation_id, group.protocol_name, group.leader_id,
                {m.member_id: m.assignment for m in group.members.values()},
            )  # fmt: skip
            for observer in self.observers:
                observer(generation)
        self._poke()

    @staticmethod
    def _settled(waiter: Waiter, result: Any) -> Any:
        """The immediate result, else the waiter's -- the step may have answered it already
        (the last member to rejoin, the leader's own SyncGroup)."""
        if result is not None:
            return result
        return waiter if waiter.result is None else waiter.result

    @staticmethod
    def new_member_id(client_id: str) -> str:
        # Kafka's shape: the client id (so operators can tell members apart) and a UUID.
        return f"{client_id or 'member'}-{uuid.uuid4()}"

    # ------------------------------------------------------------------ group membership

    def join_group(
        self, group_id: str, request: JoinRequest,
        metadata: Callable[[], Mapping[str, int]] = dict,
    ) -> JoinResult | Waiter:  # fmt: skip
        """The answer now, or a waiter that gets it when the join phase ends.

        A consumer-protocol group with members takes the member in as a classic member
        (KIP-848's migration; ``metadata`` gives every topic's partition count, for its
        subscription); the answer waits for the group's write (:meth:`wait_group_stored`).
        An empty one makes way for a classic group (its offsets kept), as in Kafka."""
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:
            if not consumer_group.is_empty():
                return self._classic_join_to_consumer_group(consumer_group, request, metadata())
            self._forget_consumer_group(group_id)
        group = self.groups.get(group_id)
        if group is None:
            if request.member_id:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=request.member_id)
            group = self._group(group_id)
        waiter = Waiter()
        before = group.state
        outcome = group.join(
            request, self.clock_ms(), self.new_member_id(request.client_id), waiter
        )
        self._dispatch(group, outcome.replies, before)
        return self._settled(waiter, outcome.result)

    def _classic_join_to_consumer_group(
        self, group: ConsumerGroup, request: JoinRequest, metadata: Mapping[str, int]
    ) -> JoinResult:
        join = ClassicJoin(
            member_id=request.member_id, instance_id=request.group_instance_id,
            protocol_type=request.protocol_type, protocols=request.protocols,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms, client_id=request.client_id,
            client_host=request.client_host,
            require_known_member_id=(
                request.require_known_member_id and not request.member_id
                and request.group_instance_id is None
            ),
        )  # fmt: skip
        bounds = self.group_config
        timeout = join.session_timeout_ms
        if not bounds.min_session_timeout_ms <= timeout <= bounds.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=request.member_id)
        result = group.classic_join(join, self.clock_ms(), metadata, str(uuid.uuid4()))
        if result.error is ErrorCode.NONE:
            self._store_consumer_group(group)
            self._poke()  # its sync deadline may come first
        return result

    def sync_group(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int,
        protocol_type: str | None, protocol_name: str | None, assignments: Mapping[str, bytes],
    ) -> SyncResult | Waiter:  # fmt: skip
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:  # a classic member of a consumer-protocol group
            return consumer_group.classic_sync(
                member_id, group_instance_id, generation_id, protocol_type, protocol_name,
                self.clock_ms(),
            )  # fmt: skip
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        waiter = Waiter()
        before = group.state
        outcome = group.sync(
            member_id, group_instance_id, generation_id, protocol_type, protocol_name,
            assignments, self.clock_ms(), waiter,
        )  # fmt: skip
        self._dispatch(group, outcome.replies, before)
        if outcome.store is not None:
            self._store_generation(group, outcome.store)  # everyone hears once it counts
        return self._settled(waiter, outcome.result)

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:  # a classic member of a consumer-protocol group
            error = consumer_group.classic_heartbeat(
                member_id, group_instance_id, generation_id, self.clock_ms()
            )
            if error is ErrorCode.REBALANCE_IN_PROGRESS:
                self._poke()  # its join deadline may come first
            return error
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        # No poke: a heartbeat only moves a deadline later. The timer task wakes at the
        # old one, finds nothing due and sleeps again -- cheaper than a scan per heartbeat.
        return group.heartbeat(member_id, group_instance_id, generation_id, self.clock_ms())

    def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> list[ErrorCode]:
        """One error per (member id, group instance id)."""
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:  # classic members of a consumer-protocol group
            results = [consumer_group.classic_leave(m, i) for m, i in members]
            if ErrorCode.NONE in results:
                self._store_consumer_group(consumer_group)
            return results
        group = self.groups.get(group_id)
        if group is None:
            return [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        errors = []
        for member_id, instance_id in members:
            before = group.state
            error, replies = group.leave(member_id, instance_id, self.clock_ms())
            self._dispatch(group, replies, before)
            errors.append(error)
        return errors

    def loading(self) -> bool:
        """Is some led ``__consumer_offsets`` partition's table still loading?"""
        return any(led.store is None for led in self.led.values())

    def list_groups(self) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every group coordinated here."""
        listed = [
            (g.group_id, g.protocol_type or "", g.state.value, "classic")
            for g in self.groups.values()
        ]
        listed += [
            (g.group_id, CONSUMER_PROTOCOL_TYPE, g.state.value, "consumer")
            for g in self.consumer_groups.values()
        ]
        return listed

    # ------------------------------------------------------------------ KIP-848 groups

    def consumer_group_heartbeat(
        self,
        group_id: str,
        request: Heartbeat,
        metadata: Mapping[str, int],
        describable: Callable[[str], bool] | None = None,
    ) -> HeartbeatResult:
        """ConsumerGroupHeartbeat: the group's answer (errors included); ``describable``:
        whether the member's principal may describe a topic (None: no authorizer)."""
        try:
            validate_heartbeat(request, group_id, self.consumer_group_config.assignors)
        except Refused as refused:
            log.info("group %r: heartbeat refused: %s", group_id, refused.message)
            return HeartbeatResult(refused.code, refused.message)
        group = self.consumer_groups.get(group_id)
        if group is None:
            classic = self.groups.get(group_id)
            if classic is not None:
                if request.member_epoch != JOIN_EPOCH:
                    return HeartbeatResult(
                        ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group"
                    )
                if not classic.is_empty():
                    upgraded = self._upgrade(classic)
                    if upgraded is None:
                        return HeartbeatResult(
                            ErrorCode.GROUP_ID_NOT_FOUND,
                            f"Group {group_id} is not a consumer group",
                        )
                    return self._consumer_heartbeat(upgraded, request, metadata, describable)
                # An empty classic group makes way (its committed offsets stay).
                classic.delete(self.clock_ms())
                del self.groups[group_id]
            elif request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return HeartbeatResult(
                    ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found."
                )
            elif request.member_epoch != JOIN_EPOCH:
                # Kafka would answer GROUP_ID_NOT_FOUND; these groups are not stored, so
                # after a restart the members are told to rejoin instead.
                return HeartbeatResult(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {request.member_id} is not a member of group {group_id}.",
                )
            group = self.consumer_groups[group_id] = ConsumerGroup(
                group_id, self.consumer_group_config
            )
        return self._consumer_heartbeat(group, request, metadata, describable)

    def _consumer_heartbeat(
        self,
        group: ConsumerGroup,
        request: Heartbeat,
        metadata: Mapping[str, int],
        describable: Callable[[str], bool] | None,
    ) -> HeartbeatResult:
        view = self._migration_view(group)
        result = group.heartbeat(request, self.clock_ms(), metadata, str(uuid.uuid4()), describable)
        if not self._maybe_downgrade(group, view):
            self._store_consumer_group(group)
        member = group.members.get(result.member_id or "")
        if request.member_epoch == JOIN_EPOCH or (
            member is not None and member.state is MemberState.UNREVOKED_PARTITIONS
        ):
            self._poke()  # a new session or revocation deadline may come first
        return result

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer_groups.get(group_id)

    # ------------------------------------------------------------------ migration (KIP-848)

    def _upgrade(self, classic: Group) -> ConsumerGroup | None:
        """A ConsumerGroupHeartbeat joins a classic group with members: when the policy
        allows and the group uses the consumer protocol, it becomes a consumer group
        whose classic members keep their partitions (Kafka's online upgrade). Its
        parked JoinGroup/SyncGroup requests are answered REBALANCE_IN_PROGRESS (their
        members rejoin the new group); the classic record gets its tombstone with the
        new group's first snapshot. None: the group stays classic."""
        group_id = classic.group_id
        if not self.upgrade_enabled:
            log.info("group %r: online upgrade to a consumer group disabled by "
                     "group.consumer.migration.policy", group_id)  # fmt: skip
            return None
        try:
            group = ConsumerGroup.from_classic(classic, self.consumer_group_config, self.clock_ms())
        except ValueError as exc:
            log.info("group %r: not upgraded to a consumer group: %s", group_id, exc)
            return None
        for member in classic.members.values():
            for waiter in member.join_waiters:
                assert isinstance(waiter, Waiter)
                waiter.set(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id))
            for waiter in member.sync_waiters:
                assert isinstance(waiter, Waiter)
                waiter.set(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            member.join_waiters, member.sync_waiters = [], []
        del self.groups[group_id]
        self._group_writes.pop(group_id, None)
        self.consumer_groups[group_id] = group
        raw = group.encode()
        self._stored_snapshots[group_id] = raw
        self._store_nowait(GroupMetadata(group_id, None), ConsumerGroupSnapshot(group_id, raw))
        log.info("group %r: classic group of generation %d upgraded to a consumer group",
                 group_id, classic.generation_id)  # fmt: skip
        return group

    @staticmethod
    def _migration_view(group: ConsumerGroup) -> tuple[bool, int]:
        """Before a step that may remove members: (does a consumer-protocol member
        remain, the group epoch) -- what :meth:`_maybe_downgrade` compares with."""
        return any(m.classic is None for m in group.members.values()), group.group_epoch

    def _maybe_downgrade(self, group: ConsumerGroup, view: tuple[bool, int]) -> bool:
        """The last consumer-protocol member left (or was fenced) and classic members
        remain: when the policy allows, the group becomes a classic group again at the
        epoch it had before they went (the generation its reconciled members hold), each
        member assigned its target, and rebalances (Kafka's online downgrade). Its
        snapshot gets a tombstone with the classic record. True if it did."""
        had_consumer_members, epoch_before = view
        if not (had_consumer_members and group.all_classic() and self.downgrade_enabled):
            return False
        group_id = group.group_id
        now = self.clock_ms()
        try:
            record = group.classic_record(epoch_before)
            classic = Group.restore(group_id, record, self.group_config, now)
        except ValueError as exc:
            log.warning("group %r: not downgraded to a classic group: %s", group_id, exc)
            return False
        del self.consumer_groups[group_id]
        self._stored_snapshots.pop(group_id, None)
        self.groups[group_id] = classic
        self._store_nowait(ConsumerGroupSnapshot(group_id, None), GroupMetadata(group_id, record))
        self._dispatch(classic, classic.rebalance(now), GroupState.STABLE)
        log.info("group %r: downgraded to a classic group (generation %d), rebalancing",
                 group_id, record.generation_id)  # fmt: skip
        return True

    def commit_partition_error(
        self, group_id: str, member_id: str, epoch: int, topic: str, partition: int
    ) -> ErrorCode:
        """The per-partition part of a KIP-848 member's commit check (KIP-1251)."""
        group = self.consumer_groups.get(group_id)
        if group is None:
            return ErrorCode.NONE
        return group.commit_partition_error(member_id, epoch, (topic, partition))

    def validate_offset_fetch(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode:
        """OffsetFetch v9+ from a member of a KIP-848 group: its epoch must be current."""
        group = self.consumer_groups.get(group_id)
        if group is None:
            return ErrorCode.NONE
        try:
            group.validate_offset_fetch(member_id, epoch)
        except Refused as refused:
            return refused.code
        return ErrorCode.NONE

    def describe_group(self, group_id: str) -> GroupSummary | None:
        group = self.groups.get(group_id)
        return None if group is None else group.summary()

    def delete_groups(
        self, group_ids: Sequence[str]
    ) -> tuple[dict[str, ErrorCode], list[PendingWrite]]:
        """DeleteGroups: only Empty groups go, with their offsets (tombstones).

        The groups are gone at once; the caller waits for the returned writes (one per
        offsets partition) to be durable (:meth:`wait_offsets_durable`) before
        acknowledging. A group this broker does not coordinate gets NOT_COORDINATOR.
        """
        results: dict[str, ErrorCode] = {}
        tombstones: dict[int, list[StoreRecord]] = {}  # one write per offsets partition
        now = self.clock_ms()
        for group_id in group_ids:
            group = self.groups.get(group_id)
            consumer_group = self.consumer_groups.get(group_id)
            if (error := self.coordinator_error(group_id)) is not ErrorCode.NONE:
                results[group_id] = error
            elif consumer_group is not None and not consumer_group.is_empty():
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            elif group is None and consumer_group is None:
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group is not None and not group.is_empty():
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            else:
                if group is not None:
                    group.delete(now)
                    del self.groups[group_id]
                if consumer_group is not None:
                    del self.consumer_groups[group_id]
                    self._stored_snapshots.pop(group_id, None)
                store = self.store_for(group_id)
                out = tombstones.setdefault(store.partition, [])
                # Pending transactional offsets go too: a tombstone drops them.
                partitions = set(store.group_offsets(group_id)) | store.pending_partitions(group_id)
                out += [(OffsetKey(group_id, topic, partition), None)
                        for topic, partition in sorted(partitions)]  # fmt: skip
                # And the staged records themselves, so compaction may drop them.
                out += [TxnOffset(producer_id, store.producer_epoch(producer_id), key, None)
                        for producer_id, key in store.pending_records(group_id)]  # fmt: skip
                out.append(GroupMetadata(group_id, None))
                if consumer_group is not None:
                    out.append(ConsumerGroupSnapshot(group_id, None))
                results[group_id] = ErrorCode.NONE
        return results, [self.append_offsets(records) for records in tombstones.values() if records]

    # ------------------------------------------------------------------ offsets

    def validate_offset_commit(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int,
        api_version: int = 9,
    ) -> ErrorCode:  # fmt: skip
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:
            try:  # generation_id is the member epoch (OffsetCommit v9+)
                consumer_group.validate_offset_commit(member_id, generation_id, api_version)
            except Refused as refused:
                return refused.code
            return ErrorCode.NONE
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # A member of a group we do not know (e.g. from before a restart).
                return ErrorCode.ILLEGAL_GENERATION
            # A consumer that assigns partitions itself and only stores offsets here.
            group = self._group(group_id)
        # (A commit, like a heartbeat, only moves the member's deadline later: no poke.)
        return group.validate_offset_commit(
            member_id, group_instance_id, generation_id, self.clock_ms()
        )

    def append_offsets(self, entries: Sequence[StoreRecord]) -> PendingWrite:
        """Append now (in request order), as the leader of the table's partition; raises
        KafkaError: NOT_COORDINATOR (not led here, or a storage error: Kafka's answer
        to a failed group write), COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE.
        Every entry belongs to one offsets partition."""
        store = self.store_for(group_of(entries[0]))
        now = self.broker.now_ms()
        replication = self.leaders()

        def as_leader(batch: Any) -> Appended:
            return append_as_leader(
                store.log, batch, now_ms=now, durability=self.broker.flusher,
                replication=replication, topic=CONSUMER_OFFSETS, partition=store.partition,
                messages=len(entries),
            )  # fmt: skip

        return store.append(entries, now, as_leader)

    async def _wait_counted(self, store: OffsetsStore, last_offset: int) -> None:
        """Synced, then below the high watermark (in a cluster, replicated) within
        ``commit_timeout_s`` (Kafka answers COORDINATOR_NOT_AVAILABLE after it).

        The timeout is Kafka's: it bounds the wait for the replicas (its coordinators'
        acks=-1 append), not our own fsync, which Kafka does not do and which is waited
        for as long as it takes, alone as in a cluster."""
        try:
            await self.broker.flusher.wait_durable(store.log, last_offset)
        except (KafkaError, OSError):
            pass  # wait_counted sees the failed sync again and answers it
        with trio.move_on_after(self.commit_timeout_s):
            await wait_counted(
                store.log, last_offset, durability=self.broker.flusher,
                replication=self.leaders(), topic=CONSUMER_OFFSETS,
                partition=store.partition,
            )  # fmt: skip
            return
        raise NotCommitted(
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            f"{CONSUMER_OFFSETS}-{store.partition}: not counted within offsets.commit.timeout.ms",
        )

    async def wait_offsets_durable(self, write: PendingWrite) -> None:
        """Wait for the fsync and the high watermark (in a cluster the replication), then
        make the offsets visible; raises NotCommitted (a KafkaError) when the write did
        not count."""
        store = write.store if write.store is not None else self.store
        try:
            await self._wait_counted(store, write.last_offset)
            store.apply_counted(write)
        finally:
            self._forget_staging(write)
        # Cleanup may have forgotten an empty group while its first commit was on its
        # way to disk; a group with offsets must be listed (and deletable).
        for record in write.entries:
            group_id = group_of(record)
            led = self.led.get(store.partition)
            if led is None or led.store is not store:
                break  # leadership moved meanwhile: the new leader has the groups
            known = group_id in self.groups or group_id in self.consumer_groups
            if not known and store.has_offsets(group_id):
                self._group(group_id)  # (a group id is in one table at most)

    # ------------------------------------------------------------------ transactions

    def validate_txn_offset_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
    ) -> ErrorCode:
        """TxnOffsetCommit's group-level check (KIP-447 fencing and the producer's epoch)."""
        if producer_epoch < self.store_for(group_id).producer_epoch(producer_id):
            return ErrorCode.INVALID_PRODUCER_EPOCH  # a zombie of a fenced producer
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:
            try:  # any TxnOffsetCommit version; a stale epoch is ILLEGAL_GENERATION here
                consumer_group.validate_offset_commit(member_id, generation_id, 9)
            except Refused as refused:
                if refused.code is ErrorCode.STALE_MEMBER_EPOCH:
                    return ErrorCode.ILLEGAL_GENERATION
                return refused.code
            return ErrorCode.NONE
        group = self.groups.get(group_id)
        if group is None:
            # Like Kafka, an unknown group is a new Empty one (kept only if this succeeds).
            group = Group(group_id, self.group_config)
        error = group.validate_txn_offset_commit(member_id, group_instance_id, generation_id)
        if error is ErrorCode.NONE:
            self.groups.setdefault(group_id, group)
        return error

    def stage_txn_offsets(
        self,
        producer_id: int,
        producer_epoch: int,
        entries: Sequence[tuple[OffsetKey, OffsetAndMetadata]],
    ) -> PendingWrite:
        """Append offsets pending in the producer's transaction; raises KafkaError.

        The caller waits with :meth:`wait_offsets_durable`; then the offsets are
        pending (OffsetFetch's require_stable sees them) until the transaction ends.
        """
        write = self.append_offsets(
            [TxnOffset(producer_id, producer_epoch, key, value) for key, value in entries]
        )
        for group_id in {key.group_id for key, _ in entries}:
            self._staging.setdefault((group_id, producer_id), []).append(write)
        return write

    def _forget_staging(self, write: PendingWrite) -> None:
        for record in write.entries:
            if isinstance(record, TxnOffset):
                waiting = self._staging.get((record.key.group_id, record.producer_id))
                if waiting is not None and write in waiting:
                    waiting.remove(write)
                    if not waiting:
                        del self._staging[record.key.group_id, record.producer_id]

    async def complete_transaction(
        self, group_id: str, producer_id: int, producer_epoch: int, committed: bool
    ) -> None:
        """End the producer's transaction for the group: commit or drop its staged offsets.

        Called by the transaction coordinator (EndTxn, timeouts, fencing) for each
        group the transaction added with AddOffsetsToTxn. Returns once the end is
        durable (and visible); raises a KafkaError: NotCommitted, or
        INVALID_PRODUCER_EPOCH for an epoch older than the producer's staged offsets.
        """
        # Offsets staged before the end belong to this transaction: let them land first.
        while waiting := self._staging.get((group_id, producer_id)):
            await self.wait_offsets_durable(waiting[0])
        store = self.store_for(group_id)
        if producer_epoch < store.producer_epoch(producer_id):
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"transaction end of producer {producer_id} with fenced epoch {producer_epoch}",
            )
        if producer_id not in store.pending_producers(group_id):
            return  # nothing staged here: nothing to end
        # Every earlier write applied, in log order: which offset is newer is decided on all.
        log_end = store.log.log_end_offset
        if log_end > 0:
            await self._wait_counted(store, log_end - 1)
            store.apply_through(log_end - 1)
        if producer_id not in store.pending_producers(group_id):
            return  # (a tombstone dropped them meanwhile)
        end = store.end_records(group_id, producer_id, producer_epoch, committed)
        await self.wait_offsets_durable(self.append_offsets(end))

    async def complete_transaction_in_partition(
        self, offsets_partition: int, producer_id: int, producer_epoch: int, committed: bool
    ) -> None:
        """A transaction marker for ``__consumer_offsets-<offsets_partition>`` (Kafka's
        way, sent by the transaction coordinator to the partition's leader): commit or
        drop every offset the producer staged in the groups of that partition. Returns
        once the end counts (synced; replicated in a cluster). Raises KafkaError
        NOT_COORDINATOR when this broker does not lead the partition; waits for its
        table if it is still loading.
        """
        led = self.led.get(offsets_partition)
        if led is not None and led.store is None:
            await led.loaded.wait()
        if led is None or led.store is None or self.led.get(offsets_partition) is not led:
            raise KafkaError(
                ErrorCode.NOT_COORDINATOR,
                f"not the leader of {CONSUMER_OFFSETS}-{offsets_partition}",
            )
        store = led.store
        groups = set(store.groups_pending_for(producer_id))
        # And groups whose staged offsets are still on their way to counting.
        groups |= {g for g, p in self._staging if p == producer_id and self._owns(store, g)}
        for group_id in sorted(groups):
            await self.complete_transaction(group_id, producer_id, producer_epoch, committed)

    def _owns_now(self, group_id: str) -> bool:
        return self.coordinator_error(group_id) is ErrorCode.NONE

    def _owns(self, store: OffsetsStore, group_id: str) -> bool:
        return self.partition_of(group_id) == store.partition

    def has_pending_offset(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset of this partition (require_stable)."""
        return self.store_for(group_id).has_pending(group_id, topic, partition)

    def committed(self, group_id: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        return self.store_for(group_id).get(group_id, topic, partition)

    def committed_for_group(self, group_id: str) -> Mapping[tuple[str, int], OffsetAndMetadata]:
        return self.store_for(group_id).group_offsets(group_id)

    def delete_offsets_check(self, group_id: str) -> tuple[ErrorCode, set[str] | None]:
        """OffsetDelete's group-level error and the topics the group still consumes."""
        consumer_group = self.consumer_groups.get(group_id)
        if consumer_group is not None:  # its members' subscriptions are known
            return ErrorCode.NONE, {t for m in consumer_group.members.values() for t in m.topics()}
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, None
        if group.is_empty():
            return ErrorCode.NONE, set()
        subscribed = group.subscribed_topics()
        if subscribed is None:
            # Not a consumer group: we cannot tell what it uses, so only when empty.
            return ErrorCode.NON_EMPTY_GROUP, None
        return ErrorCode.NONE, subscribed
