"""This broker's part in replication: which partitions it leads, which it follows.

The cluster's partition states live in ZooKeeper and reach :class:`ClusterView`
through ``topics_watch``. Whenever they change, :meth:`ReplicaManager._apply` makes the
local roles match:

- a partition this broker leads gets a :class:`LeaderPartition` term (a new one for every
  leader epoch): the epoch begins in the log (``begin_epoch``), followers' fetches feed it,
  and acks=all produces wait on its high watermark;
- a partition it follows is handed to the replica fetcher of its leader
  (``replica_fetcher.py``), which truncates (KIP-279) and then copies the leader's log.

The terms' rules are pure (``replication/leader.py``, ``replication/replica_rules.py``);
the manager holds the roles, feeds the terms, wakes the partitions' waiters, and wires
the parts it owns, each a module of this package:

- ``isr_store.py``: a term's ISR changes, written to the partition's state znode
  conditionally (a refused write drops the proposal; the next view brings the truth);
- ``local_copies.py``: the local copy of each topic with a replica here, made when the
  topic appears in the view, deleted once ZooKeeper confirms the cluster lost it;
- ``config_watch.py``: topic configs and the broker config default from their znodes;
- ``replication_throttles.py``: the replication throttles at the rates in force;
- ``producer_id_blocks.py``: producer-id blocks claimed in ZooKeeper;
- ``topic_admin.py``: topic and config administration (``self.admin``);
- ``replica_fetcher.py``: the fetchers of the partitions followed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from trio_broker.cluster.broker_client import OpenStream
from trio_broker.cluster.config_watch import TopicConfigWatch
from trio_broker.cluster.controller import ControllerActions
from trio_broker.cluster.coordination import (
    Coordination,
)
from trio_broker.cluster.isr_store import store_isr
from trio_broker.cluster.local_copies import LocalCopies
from trio_broker.cluster.producer_id_blocks import supply_producer_id_blocks
from trio_broker.cluster.replica_fetcher import FollowerRole, run_fetchers
from trio_broker.cluster.replication_throttles import ReplicationThrottles
from trio_broker.cluster.topic_admin import ZooKeeperAdmin
from trio_broker.cluster.waiting import Signal, wait_any
from trio_broker.partition.append import Durability, Term
from trio_broker.partition.partition import Follows
from trio_broker.replication.controller_rules import (
    NO_LEADER,
)
from trio_broker.replication.leader import AckState, IsrProposal, LeaderPartition
from trio_broker.replication.replica_rules import (
    HighWatermarkFloors,
    Key,
    leader_log_progress,
    leaving_replica,
)
from trio_broker.replication.throttle import UNLIMITED_RATE
from trio_broker.services.cluster_view import ClusterView, PartitionInfo
from trio_broker.services.internal_topics import LeadershipListener
from trio_broker.services.local_replication import DataReplication
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import Topic, TopicManager

__all__ = ["ReplicaManager"]

log = logging.getLogger(__name__)


class ReplicaManager:
    def __init__(
        self,
        view: ClusterView,
        coord: Coordination,
        topics: TopicManager,
        *,
        min_insync_replicas: int,
        replica_lag_time_max_ms: int,
        now_ms: Callable[[], int],
        durability: Durability,
        on_partition_changed: Callable[[str, int], None] = lambda topic, partition: None,
        producers: ProducerStateRegistry | None = None,
        follower_throttle_rate: int = UNLIMITED_RATE,
        leader_throttle_rate: int = UNLIMITED_RATE,
        sync_before_counting: bool = True,
        inter_broker_listener: str | None = None,
    ) -> None:
        self.view = view
        self.coord = coord
        self.topics = topics
        # A moved log this broker leads is taken again at once (_partition_opened).
        topics.on_partition_opened = self._partition_opened
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.now_ms = now_ms
        self.durability = durability
        #: Idempotent producers' state (services/producers.py): rebuilt from the log when a
        #: replica becomes leader; its id allocator takes blocks from ZooKeeper.
        self.producers = producers
        #: The registry whose entries the Partitions it takes hold (``producers``, or a
        #: registry of its own in memory for a manager made without one: a test's).
        self._producer_state = (
            producers if producers is not None else ProducerStateRegistry(None, now_ms)
        )
        #: A partition's log end, HW or leadership changed: the long-poll fetches watching
        #: it (server/fetch_waits.py) read it again.
        self.on_partition_changed = on_partition_changed
        #: Replication throttles (KIP-73) at the rates in force (replication_throttles.py).
        self.throttles = ReplicationThrottles(
            self,
            follower_throttle_rate=follower_throttle_rate,
            leader_throttle_rate=leader_throttle_rate,
        )
        #: acks.all.fsync: a replica's log end counts (leader's HW, follower's next fetch
        #: offset) only once synced; False: once appended, relying on replication as Kafka.
        self.sync_before_counting = sync_before_counting
        #: inter.broker.listener.name: whose endpoint followers fetch from (None: first).
        self.inter_broker_listener = inter_broker_listener
        #: (topic, partition) -> this broker's leader term.
        self.terms: dict[Key, LeaderPartition] = {}
        #: id(log) -> the partition this broker leads on it (:meth:`log_synced`), and
        #: back; dropped when the term ends.
        self._led_logs: dict[int, Key] = {}
        self._led_log_ids: dict[Key, int] = {}
        #: (topic, partition) -> what this broker follows.
        self.following: dict[Key, FollowerRole] = {}
        self._view_changed = Signal()
        self._hw_moved: dict[Key, Signal] = {}
        #: The HW each ended term of this broker reached: where later roles start.
        self.hw_floors = HighWatermarkFloors()
        #: Roles changed: fetchers re-read ``following`` (set by _apply).
        self.roles_changed = Signal()
        self._nursery: trio.Nursery | None = None
        #: Set while ZooKeeper has been unreachable past the session timeout (fence()).
        self.fenced = False
        #: Fenced, and another broker's Metadata no longer lists this one: the cluster
        #: went on without it (its registration expired). Metadata then leaves this
        #: broker out too; while every broker is fenced (ZooKeeper down) none does.
        self.dropped_by_peers = False
        #: The controller's actions while this broker is the controller (admin requests).
        self.controller: ControllerActions | None = None
        #: Topic and config administration through ZooKeeper (``Services.admin``).
        self.admin = ZooKeeperAdmin(self)
        #: This broker's copies of cluster topics: made, grown, deleted (local_copies.py).
        self.copies = LocalCopies(self)
        #: The cluster topics it holds a copy of (``AdminHost``, ``ConfigWatchHost``).
        self.local_copies = self.copies.names
        #: Internal topics' owners by topic name (services/internal_topics.py): the group
        #: and transaction coordinators learn here which of their partitions this broker
        #: leads.
        self.leadership_listeners: dict[str, LeadershipListener] = {}
        #: The broker is shutting down (:meth:`leave`): no view is applied any more, and
        #: an election still under way when it came makes no term.
        self.left = False
        #: How fetchers reach leaders (BrokerClient's OpenStream); None: TCP.
        self.open_stream: OpenStream | None = None
        #: The same for the transaction marker channel (its own client id when logging in).
        self.open_marker_stream: OpenStream | None = None
        #: Topic configs and the broker config default from their znodes (config_watch.py).
        self.configs = TopicConfigWatch(self, min_insync_replicas=min_insync_replicas)
        # A new dynamic min.insync.replicas default reaches the terms without a restart.
        topics.on_broker_configs_changed = self.configs.apply_min_insync

    # ------------------------------------------------------------------ for handlers

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.view.topics.get(topic)
        return None if info is None else info.partitions.get(partition)

    @property
    def accepts_follower_fetches(self) -> bool:
        """A Fetch with a replica id is a follower's (``handlers/fetch.py``)."""
        return True

    def leader_term(self, topic: str, partition: int) -> LeaderPartition | None:
        return self.terms.get((topic, partition))

    def replica_high_watermark(self, topic: str, partition: int) -> int | None:
        """This replica's high watermark of a partition it leads or follows, else None.

        What every replica has below it is committed and never truncated: the log
        cleaner cleans only below it (Kafka's rule, the LSO being at most the HW).
        """
        key = (topic, partition)
        role = self.terms.get(key) or self.following.get(key)  # it leads, or it follows
        return None if role is None else role.high_watermark

    def log_synced(self, log: object) -> None:
        """The flusher synced a log. A log this broker leads counts toward its term's
        high watermark once synced (``sync_before_counting``, a leader's
        ``leader_synced``): the term takes the sync at once, and if the HW moved the
        partition's waiters look (a consumer's long poll, an acks=-1 write). Before,
        the sync was seen only at the next refresh (a follower's fetch, an acks=-1
        write's wait, the lag loop every replica.lag.time.max.ms / 4): with no
        follower in the ISR, an acks=1 record reached consumers that late."""
        key = self._led_logs.get(id(log))
        if key is None or self.topics.log(*key) is not log:
            return
        led = self.terms.get(key)
        if led is not None and self._refresh(key, led):
            self.wake(key)

    # A follower's read records its progress in partition/read.py (Kafka's
    # Partition.updateFollowerFetchState, by the rules of replication/replica_rules.py):
    # the follower's log end and last caught-up time, an ISR expansion, a high watermark
    # advance, once per Fetch request (its first read). What it asks and sets off here:

    @property
    def counts_synced_only(self) -> bool:
        return self.sync_before_counting

    def may_join(self, topic: str, partition: int, replica: int, term: Term) -> bool:
        return not self._leaving((topic, partition), replica, term)

    def progressed(
        self, topic: str, partition: int, term: Term, moved: bool,
        proposal: IsrProposal | None,
    ) -> None:  # fmt: skip
        """The partition's waiters look again (``moved``: the HW, or the low watermark
        DeleteRecords waits for, may have moved); an ISR change is stored, for the term
        of this broker's that proposed it (the read found it here, in this same step)."""
        key = (topic, partition)
        if moved:
            self.wake(key)
        if proposal is not None:
            proposer = self.terms.get(key)
            if proposer is not None and proposer is term:
                self._store_isr_soon(topic, partition, proposer, proposal)

    def _leaving(self, key: Key, replica: int, term: Term) -> bool:
        """``replica_rules.leaving_replica``, as the view has the partition's move."""
        moving = self.partition(*key)
        return moving is not None and leaving_replica(
            replica, moving.removing_replicas, moving.adding_replicas, term.isr
        )

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        while True:
            state = self.commit_state(topic, partition, last_offset)
            if state is not AckState.WAITING:
                return state
            await self._hw_event((topic, partition)).wait()

    def commit_state(self, topic: str, partition: int, last_offset: int) -> AckState:
        key = (topic, partition)
        term = self.terms.get(key)
        if term is None:
            return AckState.LEADERSHIP_LOST
        if self._refresh(key, term):
            self.wake(key)  # the HW event wait_committed waits on, and the partition's notify
        return term.ack_state(last_offset)

    def low_watermark(self, topic: str, partition: int) -> int | None:
        """The lowest log start over this leader and the followers on live (registered)
        brokers, or None when not leading (Kafka's lowWatermarkIfLeader)."""
        log_ = self.topics.log(topic, partition)
        if (topic, partition) not in self.terms or log_ is None:
            return None
        return self.terms[topic, partition].low_watermark(log_.log_start_offset, self.view.brokers)

    async def wait_low_watermark(self, topic: str, partition: int, offset: int) -> int | None:
        """DeleteRecords: until every live replica's log starts at ``offset`` at least
        (followers move theirs when a fetch tells them the leader's, and tell it back
        in their next fetch). None when this broker stops leading the partition."""
        key = (topic, partition)
        while True:
            low = self.low_watermark(topic, partition)
            if low is None or low >= offset:
                return low
            # A follower's fetch, the end of the term, or a broker going (the view).
            await wait_any(self._hw_event(key), self._view_changed)

    def background(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Start ``task`` in the manager's nursery; False if it is not running."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(task)
        return True

    def controller_changed(self, actions: ControllerActions | None) -> None:
        """Membership's word: this broker became the controller (or stopped being it)."""
        self.controller = actions

    def fence(self, fenced: bool) -> None:
        """ZooKeeper unreachable for longer than the session timeout (``fenced``): the
        session has surely expired and another broker leads in a newer epoch, so end
        every term now (acks=all waiters answer NOT_LEADER_OR_FOLLOWER, new writes are
        refused) and take none up again from this stale view until ZooKeeper answers
        again (``fenced=False``: the view is applied afresh)."""
        if fenced == self.fenced:
            return
        self.fenced = fenced
        self.dropped_by_peers = False
        log.warning("ZooKeeper unreachable past the session timeout: leading nothing"
                    if fenced else "ZooKeeper reachable again")  # fmt: skip
        if fenced:
            # Through _end_term: an internal topic's owner must drop its table too, or a
            # later election of this broker (same log: "a new epoch of the same
            # leadership") would keep serving the state it had before the fence while
            # another coordinator wrote on (the 30-minute Jepsen run: stale offsets).
            for key in list(self.terms):
                self._end_term(key)
        self.view_changed()

    # ------------------------------------------------------------------ configs

    def apply_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Topic ``name``'s stored overrides (``AdminHost``): :class:`TopicConfigWatch`."""
        self.configs.apply_topic_configs(name, configs)

    def apply_cluster_default_configs(self, configs: dict[str, str]) -> None:
        self.configs.apply_cluster_default_configs(configs)

    # ------------------------------------------------------------------ throttles

    @property
    def follower_throttle_rate(self) -> int:
        """follower.replication.throttled.rate in force (``FetcherHost``)."""
        return self.throttles.follower_throttle_rate

    def follower_throttled(self, name: str, partition: int) -> bool:
        return self.throttles.follower_throttled(name, partition)

    def leader_throttle_budget(self, name: str, partition: int, replica: int) -> int | None:
        return self.throttles.leader_throttle_budget(name, partition, replica)

    def leader_throttle_used(self, nbytes: int) -> None:
        self.throttles.leader_throttle_used(nbytes)

    def about_to_lead(self, name: str, partition: int) -> bool:
        """The view names this broker leader of ``name``-``partition`` but its term has
        not begun yet (the apply loop is on its way there). An internal topic's owner
        answers COORDINATOR_LOAD_IN_PROGRESS then, which clients retry on this broker,
        rather than NOT_COORDINATOR, which sends them back to FindCoordinator, whose
        answer (the view) names this broker again."""
        if self.fenced or (name, partition) in self.terms:
            return False
        info = self.partition(name, partition)
        return info is not None and info.leader == self.view.broker_id

    def leave(self) -> None:
        """The broker shuts down: end every term and stop following (for good: the
        caller cancels this manager's tasks next)."""
        self.left = True
        for key in list(self.terms):
            self._end_term(key)
        self.following.clear()
        self.roles_changed.set()
        self.roles_changed = Signal()

    # ------------------------------------------------------------------ tasks

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._apply_loop)
                nursery.start_soon(self._lag_loop)
                nursery.start_soon(run_fetchers, self)
                nursery.start_soon(self.configs.run)
                if self.producers is not None:
                    self.producers.allocator.use_cluster_blocks()
                    nursery.start_soon(
                        supply_producer_id_blocks,
                        self.coord,
                        self.view.broker_id,
                        self.producers.allocator,
                    )
                task_status.started()
        finally:
            self._nursery = None  # closed: nothing more starts here

    def view_changed(self) -> None:
        """Called by the ZooKeeper watch tasks whenever the view was updated."""
        self._view_changed.set()
        self._view_changed = Signal()

    def view_event(self) -> Signal:
        return self._view_changed

    async def _apply_loop(self) -> None:
        while not self.left:
            changed = self._view_changed
            try:
                await self._apply()
            except Exception:  # one bad partition must not stop the others' roles
                log.exception("applying the cluster view")
            await changed.wait()

    async def _apply(self) -> None:
        me = self.view.broker_id
        roles_changed = False
        await self.copies.delete_strays_once()
        for name, topic in list(self.view.topics.items()):
            if self.left:
                return  # shutting down (leave() may have come during any await here)
            mine = [p for p, info in topic.partitions.items() if me in info.replicas]
            if not mine:
                continue
            if await self.copies.ensure(name, topic.topic_id, len(topic.partitions)) is None:
                continue
            for p in mine:
                if self.left:
                    return
                info = topic.partitions[p]
                key = (name, p)
                if info.leader == me and self.fenced:
                    continue  # a stale view: leading would take writes that can be lost
                if info.leader == me:
                    term = self.terms.get(key)
                    if term is None or term.leader_epoch != info.leader_epoch:
                        if self._a_previous_life_led(info):
                            continue  # the controller gives this life a new epoch
                        if self._offline(key):
                            # Its log dir failed after the controller chose it (Kafka's
                            # broker answers such a LeaderAndIsr KAFKA_STORAGE_ERROR):
                            # no term; the controller elects another once it reads this
                            # broker's offline replicas (cluster/log_dir_events.py).
                            continue
                        await self._become_leader(name, p, info)
                        roles_changed = True
                    elif term.isr != frozenset(info.isr) and term.pending is None:
                        term.isr = frozenset(info.isr)  # the controller's word, same epoch
                else:
                    self._end_term(key)
                    role = self.following.get(key)
                    if info.leader == NO_LEADER:
                        if role is not None:
                            del self.following[key]
                            roles_changed = True
                    elif role is None or (role.leader, role.leader_epoch) != (
                        info.leader,
                        info.leader_epoch,
                    ):
                        self._become_follower(key, info, role)
                        roles_changed = True
                    elif not self._holds(key):
                        self._follow(key)  # its log was put in another's place meanwhile
        for key in [*self.following, *self.terms]:
            topic_info = self.view.topics.get(key[0])
            held = topic_info.partitions.get(key[1]) if topic_info is not None else None
            if held is None or me not in held.replicas:
                self._end_term(key)
                self.following.pop(key, None)
                roles_changed = True
                if held is not None:  # moved away by a reassignment (not a deleted topic)
                    self.hw_floors.forget(key)
                    await self.copies.drop_replica(*key)
        await self.copies.drop_deleted_topics()
        if roles_changed:
            self.roles_changed.set()
            self.roles_changed = Signal()

    def _a_previous_life_led(self, info: PartitionInfo) -> bool:
        """Was this state, naming this broker leader, written before its registration?
        Then it named a previous life of this broker (a restart, or a session that
        expired, before the controller saw the registration go). A term in that epoch
        could append, at offsets its followers hold from the old life's unsynced tail,
        records they cannot tell apart; the controller bumps the epoch
        (``controller.restarted_leader``) and the term starts in the new one."""
        mine = self.view.brokers.get(self.view.broker_id)
        return mine is not None and 0 < info.state_zxid < mine.registered_zxid

    def drop_roles(self, name: str) -> None:
        """End every role in topic ``name`` and forget its ended terms' HWs: its local
        copy goes (``LocalCopiesHost``)."""
        for key in [k for k in [*self.following, *self.terms] if k[0] == name]:
            self._end_term(key)
            self.following.pop(key, None)
        self.hw_floors.forget_topic(name)

    async def _become_leader(self, name: str, partition: int, info: PartitionInfo) -> None:
        key = (name, partition)
        log_ = self.topics.log(name, partition)
        assert log_ is not None
        role = self.following.pop(key, None)
        if self.producers is not None:  # batches it appended as a follower were never checked
            self.producers.forget(name, partition)
        # The log's tail is durable before the term counts it (its HW starts there).
        await trio.to_thread.run_sync(log_.flush)
        await trio.to_thread.run_sync(log_.begin_epoch, info.leader_epoch)
        if self.left:
            # The broker began shutting down while the flush ran in its worker thread
            # (which a cancel cannot interrupt): no term, and the internal topics'
            # coordinators, maybe stopped already, are not told.
            return
        if self.fenced:
            # ZooKeeper was lost past the session timeout during the flush: another
            # broker may lead in a newer epoch already, so this view is stale and no term
            # starts (fence ended the older one). The role it had stays until the view is
            # applied afresh.
            if role is not None:
                self.following[key] = role
            return
        # The HW the new term starts at is read now, with no await before the term is in
        # place: a previous term of this broker (the same leader in an older epoch)
        # answered fetches during the flush and its HW may have moved on meanwhile.
        previous = self.terms.get(key)
        known = [r.high_watermark for r in (previous, role) if r is not None]
        hw = self.hw_floors.leader_start(key, log_.log_end_offset, *known)
        self.terms[key] = LeaderPartition.become_leader(
            broker_id=self.view.broker_id,
            leader_epoch=info.leader_epoch,
            replicas=info.replicas,
            isr=frozenset(info.isr),
            log_end_offset=log_.log_end_offset,
            high_watermark=hw,
            now_ms=self.now_ms(),
            # The local copy's configs: the config watch keeps them (and the term) current.
            min_insync_replicas=self.configs.min_insync(self.configs.local_configs(name)),
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
        )
        self._led_logs[id(log_)], self._led_log_ids[key] = key, id(log_)
        self._take(key)
        self.wake(key)
        log.info("leading %s-%d in epoch %d, ISR %s", name, partition, info.leader_epoch,
                 sorted(info.isr))  # fmt: skip
        listener = self.leadership_listeners.get(name)
        if listener is not None:
            listener.elected(partition, info.leader_epoch, log_)

    def _become_follower(
        self, key: Key, info: PartitionInfo, previous: FollowerRole | None
    ) -> None:
        """This broker follows ``info.leader`` for ``key`` in ``info.leader_epoch``
        (Kafka's makeFollower; its term, if it led, ended first: ``_end_term``): the
        fetcher of that leader takes the partition (truncating first), and the
        partition's :class:`Partition` takes the follower's role (:meth:`_follow`)."""
        hw = previous.high_watermark if previous is not None else 0
        hw = self.hw_floors.follower_start(key, hw)
        self.following[key] = FollowerRole(
            Follows(info.leader, info.leader_epoch), high_watermark=hw
        )
        self._follow(key)
        log.info("following broker %d for %s-%d in epoch %d",
                 info.leader, key[0], key[1], info.leader_epoch)  # fmt: skip

    def _holds(self, key: Key) -> bool:
        """Whether ``key``'s Partition is held on its current log (``Topic.replica``)."""
        topic = self.topics.get(key[0])
        return (
            topic is not None
            and 0 <= key[1] < len(topic.logs)
            and (topic.replica(key[1]) is not None)
        )

    def _follow(self, key: Key) -> None:
        """Take ``key``'s Partition as this broker's role in it is (``Topic.
        make_follower``): made when it becomes a follower, never on a lookup; the same
        object when it held one on the same log (a leader demoted, a new leader)."""
        topic = self.topics.get(key[0])
        role = self.following.get(key)
        if topic is None or role is None or not 0 <= key[1] < len(topic.logs):
            return
        topic.make_follower(key[1], role.follows, self._producer_state.entry(*key))

    def _take(self, key: Key) -> None:
        """Take ``key``'s Partition in this broker's term of it (``Topic.make_leader``): made
        when the term begins, never on a lookup; the same object, in the new term, when
        this broker led it before on the same log."""
        topic = self.topics.get(key[0])
        term = self.terms.get(key)
        if topic is None or term is None or not 0 <= key[1] < len(topic.logs):
            return
        topic.make_leader(key[1], term, self._producer_state.entry(*key))

    def _partition_opened(self, topic: Topic, index: int) -> None:
        """``TopicManager.on_partition_opened``: a log put in place of one this broker
        leads (a move to another log dir) is led in the term it had, and one it follows
        is followed in its role (a new copy, created or grown, is taken only when its
        role begins: ``_become_leader``, ``_become_follower``)."""
        key = (topic.name, index)
        if key in self.terms:
            log_ = topic.logs[index]
            self._led_logs.pop(self._led_log_ids.pop(key, -1), None)
            self._led_logs[id(log_)], self._led_log_ids[key] = key, id(log_)
            self._take(key)
        elif key in self.following:
            self._follow(key)

    def _end_term(self, key: Key) -> None:
        """This broker stops leading ``key`` (if it did): acks=all waiters learn it
        (LEADERSHIP_LOST), and so does the internal topic's owner."""
        term = self.terms.pop(key, None)
        if term is None:
            return
        self._led_logs.pop(self._led_log_ids.pop(key, -1), None)
        topic = self.topics.get(key[0])
        if topic is not None:
            # The data path's lookup finds it led no more; the Partition stays, for the
            # role that comes next (a follower's: _become_follower), as Kafka's does.
            topic.stop_leading(key[1])
        self.hw_floors.term_ended(key, term.high_watermark)
        self.wake(key)
        listener = self.leadership_listeners.get(key[0])
        if listener is not None:
            listener.resigned(key[1])

    async def _lag_loop(self) -> None:
        while True:
            await trio.sleep(max(self.replica_lag_time_max_ms / 4000, 0.05))
            now = self.now_ms()
            for (name, partition), term in list(self.terms.items()):
                if self._offline((name, partition)):
                    # Its log dir failed: it shrinks no ISR (its followers cannot fetch
                    # from it, which says nothing of them) and the controller, told by
                    # cluster/log_dir_events.py, moves the leadership off it, as Kafka
                    # leaves an offline partition out of its ISR checks.
                    continue
                if self._refresh((name, partition), term):
                    self.wake((name, partition))
                proposal = term.check_lagging(now)
                if proposal is not None:
                    self._store_isr_soon(name, partition, term, proposal)

    def _store_isr_soon(
        self, name: str, partition: int, term: LeaderPartition, proposal: IsrProposal
    ) -> None:
        if self._nursery is None:
            return  # stopped: the term ends with the broker
        self._nursery.start_soon(self._store_isr, name, partition, term, proposal)

    async def _store_isr(
        self, name: str, partition: int, term: LeaderPartition, proposal: IsrProposal
    ) -> None:
        if await store_isr(self.coord, self.view.broker_id, name, partition, term, proposal):
            self.wake((name, partition))

    # ------------------------------------------------------------------ helpers

    def _offline(self, key: Key) -> bool:
        """Whether this broker's log of ``key`` is in a failed log dir."""
        log_ = self.topics.log(*key)
        return log_ is not None and log_.offline

    def _refresh(self, key: Key, term: LeaderPartition) -> bool:
        """``replica_rules.leader_log_progress`` from the partition's log: True if the
        term's log end or HW moved."""
        log_ = self.topics.log(*key)
        if log_ is None:
            return False
        counted = log_.durable_end_offset if self.sync_before_counting else log_.log_end_offset
        return leader_log_progress(term, log_.log_end_offset, counted)

    def _hw_event(self, key: Key) -> Signal:
        event = self._hw_moved.get(key)
        if event is None:
            event = self._hw_moved[key] = Signal()
        return event

    def partition_changed(self, topic: str, partition: int) -> None:
        """A replica fetcher appended to a partition this broker follows, or learned a
        higher HW: its waiting fetches (none while only leaders answer fetches) look."""
        self.on_partition_changed(topic, partition)

    def wake(self, key: Key) -> None:
        event = self._hw_moved.pop(key, None)
        if event is not None:
            event.set()
        self.on_partition_changed(*key)


if TYPE_CHECKING:  # mypy checks that the replica manager is the data path's replication
    _DATA_PATH: type[DataReplication] = ReplicaManager
