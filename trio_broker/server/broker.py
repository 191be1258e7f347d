"""The broker: shared state plus the root nursery that owns every task.

Task tree (see docs/architecture.md)::

    serve (root nursery)
    ├── flusher                 group commit: one fsync for many appends
    ├── handler pool            N handler tasks, one bounded queue each
    ├── loop watchdog           samples the event loop's lag, logs stalls
    ├── delayed operations      deferred responses: acks=all waits, long-poll fetches
    ├── retention               deletes old segments periodically
    ├── log cleaner             compacts cleanup.policy=compact logs (docs/compaction.md)
    ├── group coordinator       session and rebalance timers
    ├── transaction timers      timed-out transactions aborted, idle ids expired
    └── acceptor (per listener) accepts; one nursery of connections
        └── connection          reader task + writer task
"""

from __future__ import annotations

import errno
import itertools
import logging
import socket as stdlib_socket
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import trio

from trio_broker.config import BrokerConfig, ensure_cluster_id
from trio_broker.groups import GroupCoordinator
from trio_broker.groups.coordinator import OffsetsLeaders
from trio_broker.groups.offsets_store import open_offsets_log
from trio_broker.groups.own_offsets import coordinator_alone
from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.groups.share_coordinator import (
    PartitionedShareCoordinator,
    ShareCoordinatorTable,
)
from trio_broker.groups.share_records import StoredShareGroup
from trio_broker.groups.share_state import SHARE_GROUP_STATE, open_share_state_log
from trio_broker.handlers import load_handlers
from trio_broker.handlers.base import HANDLERS, ClientInfo, HandlerSpec
from trio_broker.handlers.share_persist import (
    delete_deleted_topics_state,
    delete_state,
    deleted_topics_of_groups,
    forget_topic,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.security.authorize import Authorizer
from trio_broker.security.credentials import CredentialStore
from trio_broker.security.decoy import decoy_secret
from trio_broker.security.listeners import Listener, resolve_listeners
from trio_broker.server.backoff import retry_with_backoff
from trio_broker.server.connection import Connection
from trio_broker.server.fetch_waits import FetchWaits
from trio_broker.server.flusher import Flusher
from trio_broker.server.handler_pool import HandlerPool
from trio_broker.server.log_cleaner import LogCleaner
from trio_broker.server.loop_watchdog import LoopWatchdog
from trio_broker.server.memory_budget import MemoryBudget
from trio_broker.server.quotas import with_request_quota
from trio_broker.server.share_coordinator_loader import ShareCoordinatorLoader
from trio_broker.server.transaction_timers import TransactionTimers
from trio_broker.server.transport import open_connection, tls_contexts
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, TRANSACTION_STATE
from trio_broker.services.local_replication import (
    BrokerReplication,
    DataReplication,
    LeadsNothing,
    LocalReplication,
    LocalView,
)
from trio_broker.services.own_partition import OWN_PARTITIONS, OwnPartition
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.quotas import QuotaService
from trio_broker.services.stats import BrokerStats
from trio_broker.services.topic_admin import LocalAdmin, NotInCluster, TopicAdmin
from trio_broker.services.topics import TopicManager
from trio_broker.services.txn_markers import append_txn_marker
from trio_broker.state.fetch_sessions import FetchSessionCache
from trio_broker.storage.cleaner import TransactionFacts
from trio_broker.storage.data_dir_lock import lock_data_dir
from trio_broker.storage.durable import make_dirs_durable
from trio_broker.storage.errors import StorageError
from trio_broker.storage.group_commit import FlushPolicy
from trio_broker.storage.group_configs import GroupConfigStore
from trio_broker.storage.log import LogConfig, PartitionLog, wall_clock_ms
from trio_broker.storage.log_protocol import Log
from trio_broker.transactions.coordinator import TransactionCoordinator, open_transaction_log
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator

log = logging.getLogger("trio_broker")


#: How long a graceful shutdown waits for in-flight requests before cancelling.
DRAIN_TIMEOUT_S = 10.0
#: A failed deletion of a deleted topic's share state is tried again after this long
#: (s), doubled after each further failure up to the maximum.
SHARE_SWEEP_RETRY_S = 1.0
SHARE_SWEEP_RETRY_MAX_S = 60.0
#: How often (s) the share groups coordinated here are looked at for members whose
#: session ran out, whose records are then tombstoned.
SHARE_EXPIRY_CHECK_S = 1.0
#: Back-off when accept() fails for lack of file descriptors (EMFILE).
ACCEPT_BACKOFF_S = 0.1


class Broker:
    def __init__(self, config: BrokerConfig, *, now_ms: Callable[[], int] = wall_clock_ms) -> None:
        load_handlers()
        self.config = config
        self.now_ms = now_ms
        data_dir = config.data_dir if config.storage == "file" else None
        log_dirs = (data_dir, *config.extra_log_dirs) if data_dir is not None else ()
        for log_dir in log_dirs:
            # Its entry in the parent must be durable too, even if an earlier run made
            # it: everything in it (catalogue, logs, meta.properties) hangs off it.
            make_dirs_durable(log_dir, sync_existing=True)
        # Before any log is opened (and recovered): one broker process per log dir.
        self._data_dir_locks = []
        try:
            for log_dir in log_dirs:
                self._data_dir_locks.append(lock_data_dir(log_dir))
        except BaseException:
            for held in self._data_dir_locks:
                held.close()
            raise
        self.cluster_id = ensure_cluster_id(data_dir, config.cluster_id, log_dirs[1:])
        self.log_defaults = LogConfig(
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            retention_ms=None if config.retention_ms < 0 else config.retention_ms,
            retention_bytes=None if config.retention_bytes < 0 else config.retention_bytes,
            compact="compact" in config.log_cleanup_policy.replace(" ", "").split(","),
            delete="delete" in config.log_cleanup_policy.replace(" ", "").split(","),
            delete_retention_ms=config.log_cleaner_delete_retention_ms,
            min_compaction_lag_ms=config.log_cleaner_min_compaction_lag_ms,
            max_compaction_lag_ms=config.log_cleaner_max_compaction_lag_ms,
            min_cleanable_dirty_ratio=config.log_cleaner_min_cleanable_ratio,
        )
        self.topics = TopicManager(data_dir, self.log_defaults, now_ms, log_dirs[1:])
        self.flusher = Flusher(
            FlushPolicy(
                flush_messages=config.flush_interval_messages,
                flush_ms=config.flush_interval_ms,
                sync_acks_all=config.acks_all_fsync,
            )
        )
        self.topics.on_log_closed = self.flusher.forget
        #: ACL enforcement (trio_broker.security), or None when no authorizer is configured.
        #: In a cluster its ACLs, like the SCRAM users below, are a copy of ZooKeeper's
        #: (cluster/security_store.py), written through ``shared_security``.
        clustered = bool(config.zookeeper_connect)
        self.authorizer = Authorizer.from_config(config, None if clustered else data_dir)
        self.shared_security: Any = None
        self.router: dict[int, HandlerSpec] = {
            key: with_request_quota(spec) for key, spec in HANDLERS.items()
        }
        self.memory = MemoryBudget(config.queued_request_bytes_limit)
        self.handler_pool = HandlerPool(self, config.num_handlers)
        self.loop_watchdog = LoopWatchdog(self.handler_pool)
        self.stats = BrokerStats()
        #: Idempotent producers' sequence state (services/producers.py), kept in the data dir.
        self.producers = ProducerStateRegistry(
            data_dir, now_ms, expiration_ms=config.producer_id_expiration_ms
        )
        #: Client quotas; a throttled client's connection is muted by the shell.
        self.quotas = QuotaService(config, self.stats)
        self.quotas.on_throttle = self._throttle_connection
        self.connections: dict[int, Connection] = {}
        #: Open connections per client IP (max.connections.per.ip).
        self.connections_per_ip: dict[str, int] = {}
        self._connection_ids = itertools.count(1)
        #: Long-poll fetches wait here, each on its own partitions; whatever changes a
        #: partition (appends, its HW, its leadership) notifies that partition.
        self.appends = FetchWaits()
        self.topics.on_partition_deleted = self.appends.notify
        #: Incremental fetch sessions (KIP-227): handlers/fetch.py opens and uses them.
        self.fetch_sessions: FetchSessionCache[Any, Any] = FetchSessionCache(
            config.max_incremental_fetch_session_cache_slots
        )
        #: Set by shutdown(): long polls answer at once, readers stop taking requests.
        self.shutting_down = False
        #: Set with ``shutting_down``, for tasks that wait for it (the cluster node).
        self.shutdown_begun = trio.Event()
        #: Set once requests may be served: at once on a single node; in a cluster once
        #: the broker has joined (registered, with a replica manager), as Kafka starts
        #: processing requests only after its registration. Until then connections wait
        #: in the listen backlog: a broker without its cluster view would answer as a
        #: single node (lead every partition, acknowledge writes alone).
        self.accepting = trio.Event()
        self.root_nursery: trio.Nursery = None  # type: ignore[assignment]  # set by run()
        self.bound: list[tuple[str, int]] = []
        #: Every listener (listeners config; one PLAINTEXT by default), in bind order.
        self.listeners: list[Listener] = resolve_listeners(config)
        #: Bound address per listener name; TLS contexts per TLS listener (built at start).
        self.listener_bound: dict[str, tuple[str, int]] = {}
        self.tls_contexts = tls_contexts(self.listeners)
        #: SCRAM/PLAIN users, in the data dir (trio-broker users add|delete|list).
        self.credentials = CredentialStore.in_data_dir(None if clustered else config.data_dir)
        #: Derives unknown users' decoy SCRAM salts (security/decoy.py).
        uses_sasl = any(listener.uses_sasl for listener in self.listeners)
        self.sasl_decoy_secret = decoy_secret(config.data_dir if uses_sasl else None)
        self._root_scope: trio.CancelScope | None = None
        #: One per acceptor (listener); shutdown cancels them all.
        self._accept_scopes: list[trio.CancelScope] = []
        #: Extra long-lived tasks (e.g. the group coordinator) register here.
        self.services: list[Any] = []
        #: Log compaction (server/log_cleaner.py); run when log.cleaner.enable.
        self.log_cleaner = LogCleaner(
            self._compactable_logs,
            now_ms,
            backoff_ms=config.log_cleaner_backoff_ms,
            io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
            dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
            forget_aborted=self._forget_aborted,
            transaction_facts=self._transaction_facts,
        )
        #: Owners of internal topics (services/internal_topics.py), by topic name: the
        #: replica manager tells them about leadership once this broker joins a cluster.
        self.leadership_listeners: dict[str, Any] = {}
        #: The coordinators lead the partitions of their internal topics they are told
        #: of (services/internal_topics.py): the group coordinator __consumer_offsets',
        #: the transaction coordinator __transaction_state's, one table per partition
        #: (docs/transactions.md). In a cluster the replica manager tells them, once this
        #: broker joined (until then it leads nothing). Alone, a cluster of one, each
        #: topic has one partition in its own file (<data_dir>/__consumer_offsets-0,
        #: <data_dir>/__transaction_state-0), led from start to end by an OwnPartition:
        #: started after its coordinator's service, it elects the coordinator and waits
        #: for its table before clients come.
        self.groups: GroupCoordinator
        self.transactions: PartitionedTransactionCoordinator
        #: Alone, those partitions by topic, which clients see as the topics' one
        #: partition (services/own_partition.py); in a cluster the topics are the topic
        #: manager's, and this stays empty.
        self.own_internal_topics: dict[str, OwnPartition] = {}
        if clustered:
            self.groups = GroupCoordinator(
                self, offsets_partitions=config.offsets_topic_num_partitions,
                # The replica manager once joined, LeadsNothing before and after.
                leaders=lambda: cast(OffsetsLeaders, self.replication),
            )  # fmt: skip
            self.leadership_listeners[CONSUMER_OFFSETS] = self.groups
            self.transactions = PartitionedTransactionCoordinator(
                config.transaction_state_log_num_partitions, self._transaction_table,
                LeadsNothing(config.node_id),
            )  # fmt: skip
            self.services += [self.groups, TransactionTimers(self.transactions, config)]
        else:
            self.groups, own_offsets = coordinator_alone(
                self, self._in_first_log_dir(partial(open_offsets_log, data_dir, self.log_defaults))
            )
            own_transactions = OwnPartition(
                TRANSACTION_STATE, config.node_id,
                self._in_first_log_dir(partial(open_transaction_log, data_dir, self.log_defaults)),
                run_off_loop=self.run_off_loop,
            )  # fmt: skip
            self.transactions = PartitionedTransactionCoordinator(
                OWN_PARTITIONS, self._transaction_table, own_transactions
            )
            timers = TransactionTimers(self.transactions, config)
            own_transactions.elect = self.transactions.elected
            own_transactions.wait_loaded = partial(timers.wait_loaded, 0)
            self.services += [self.groups, own_offsets, timers, own_transactions]
            self.own_internal_topics[CONSUMER_OFFSETS] = own_offsets
            self.own_internal_topics[TRANSACTION_STATE] = own_transactions
        #: Share groups (KIP-932): membership, share partitions, share sessions.
        self.shares = ShareGroups(ShareGroupsConfig(
            session_timeout_ms=config.group_share_session_timeout_ms,
            heartbeat_interval_ms=config.group_share_heartbeat_interval_ms,
            record_lock_duration_ms=config.group_share_record_lock_duration_ms,
            delivery_count_limit=config.group_share_delivery_count_limit,
            partition_max_record_locks=config.group_share_partition_max_record_locks,
            # Kafka's GroupCoordinatorConfig: never below offsets.commit.timeout.ms.
            initialize_retry_interval_ms=max(config.group_share_initialize_retry_interval_ms,
                                             config.offsets_commit_timeout_ms),
        ), GroupConfigStore(data_dir))  # fmt: skip
        #: Their durable state is the share coordinator's: one table per led
        #: __share_group_state partition (groups/share_coordinator.py), loaded by its
        #: loader once elected. In a cluster the replica manager elects them once this
        #: broker joined; alone, a share coordinator of one, an OwnPartition of
        #: <data_dir>/__share_group_state-0 does at start (the file a node alone kept
        #: its snapshots in before, in the same records), as for the other coordinators.
        share_loader: ShareCoordinatorLoader
        if clustered:
            self.share_coordinator = PartitionedShareCoordinator(
                config.share_coordinator_state_topic_num_partitions, LeadsNothing(config.node_id)
            )
            self.leadership_listeners[SHARE_GROUP_STATE] = self.share_coordinator
            share_loader = ShareCoordinatorLoader(self.share_coordinator)
            self.services.append(share_loader)
        else:
            own_shares = OwnPartition(
                SHARE_GROUP_STATE, config.node_id,
                self._in_first_log_dir(partial(open_share_state_log, data_dir, self.log_defaults)),
                run_off_loop=self.run_off_loop,
            )  # fmt: skip
            self.share_coordinator = PartitionedShareCoordinator(OWN_PARTITIONS, own_shares)
            share_loader = ShareCoordinatorLoader(self.share_coordinator)
            own_shares.elect = self.share_coordinator.elected
            own_shares.wait_loaded = partial(share_loader.wait_loaded, 0)
            self.services += [share_loader, own_shares]
            self.own_internal_topics[SHARE_GROUP_STATE] = own_shares
        self.share_coordinator.on_loaded = self._recall_share_groups
        #: Share groups whose deleted topics' share state is being deleted now.
        self._deleting_share_topics: set[str] = set()
        self.groups.on_share_groups_loaded = self._recall_stored_share_groups
        self.groups.on_partition_resigned = self._unload_share_groups
        self.topics.on_topic_deleted = self._forget_share_state
        #: The traffic capture tap (trio_broker.capture), or None: the hot path checks this.
        self.capture: Any = None
        #: The tap itself, kept while capture is switched off at runtime (capture/control.py).
        self.capture_tap: Any = None
        if config.capture_dir is not None:
            from trio_broker.capture.tap import CaptureTap

            self.capture = self.capture_tap = CaptureTap(config.capture_dir, config.node_id)
            self.services.append(self.capture)
        #: This broker's replication and topic administration (``leaders``, ``admin``),
        #: never None: a node alone is a cluster of one (its own leader and controller,
        #: changing its catalogue at once); a clustered broker holds the replica manager
        #: and its ``ZooKeeperAdmin`` while it is in the cluster (``joined``), and leads
        #: and changes nothing before it joins and after it leaves (``left``).
        self.replication: BrokerReplication
        self.topic_admin: TopicAdmin
        self._out_of_cluster: tuple[BrokerReplication, TopicAdmin]
        if clustered:
            self._out_of_cluster = (LeadsNothing(config.node_id), NotInCluster(config.node_id))
        else:
            view = LocalView(
                config.node_id, config.broker_rack, self.topics, self.advertised_endpoints
            )
            alone = LocalReplication(
                view,
                # It takes every partition the catalogue loaded, now, and each one
                # opened later: the registry its Partitions hold entries of is made first.
                producers=self.producers,
                # Synced records only, where acks=all waits for the sync and every
                # append is synced at once (docs/reliability.md: else the operator chose
                # the page cache for acks=0/1 records, and the HW is the log end).
                counts_synced_only=config.acks_all_fsync and self.flusher.policy.syncs_every_append,
                on_partition_changed=self.appends.notify,
            )
            self._out_of_cluster = (alone, LocalAdmin(view))
        self.replication, self.topic_admin = self._out_of_cluster
        # A sync moves a node alone's high watermark (its durable end): its long polls look.
        self.flusher.on_synced = self._log_synced
        #: The deterministic simulation (sim/) runs brokers in one process and sets these
        #: to its in-memory ZooKeeper and network; None: kazoo and TCP.
        self.open_coordination: Callable[[], Any] | None = None
        self.open_stream: Any = None
        #: The Prometheus /metrics and /health responder (trio_broker.server.metrics), or None.
        self.metrics: Any = None
        if config.metrics_listener is not None:
            from trio_broker.server.metrics import MetricsService

            self.metrics = MetricsService(self, config.metrics_listener)
            self.services.append(self.metrics)

    def _log_synced(self, log: object) -> None:
        """``Flusher.on_synced``: told to the replication of the moment (it changes
        when a clustered broker joins and leaves)."""
        self.replication.log_synced(log)

    def _recall_share_groups(self, table: ShareCoordinatorTable) -> None:
        """A share coordinator's table is loaded: the groups with state in it for topics
        that exist come back empty (their members come from the group coordinator's
        records, if this broker coordinates them: ``_recall_stored_share_groups``), so
        that a node alone restarted lists and describes them, and its admin APIs find
        them. Their share partitions are read when first used (handlers/share_persist.py)."""
        topic_ids = {topic.topic_id for topic in self.topics.topics.values()}
        self.shares.recall_groups(
            {key.group_id for key in table.store.snapshots if key.topic_id in topic_ids}
        )

    def _recall_stored_share_groups(self, stored: Mapping[str, StoredShareGroup]) -> None:
        """This broker coordinates the groups of a ``__consumer_offsets`` partition now
        (it restarted, or took the partition over): its share groups come back at their
        stored epochs, with their stored members (who go on with the epochs they hold;
        their sessions start afresh)."""
        self.shares.recall_groups(stored, {g: s.epoch for g, s in stored.items()})
        self.shares.restore_members(stored, self.now_ms(), self._topic_ids())
        self._sweep_deleted_share_topics()  # deleted while another broker coordinated them

    def _topic_ids(self) -> dict[str, uuid.UUID]:
        """Each topic's id by name, as the cluster's view has them (a share group's
        coordinator may hold no replica of its topics)."""
        return {name: info.topic_id for name, info in self.leaders.view.topics.items()}

    def _unload_share_groups(self, partition: int) -> None:
        """Another broker coordinates the groups of ``__consumer_offsets-<partition>``
        now: their share groups' membership goes from here (groups/share.py)."""
        self.shares.unload_groups(lambda group_id: self.groups.partition_of(group_id) == partition)

    def _in_first_log_dir(self, open_log: Callable[[], Log]) -> Callable[[], Log]:
        """``open_log`` of a node alone's coordinator log (in the first log dir), whose
        log then goes offline with that dir, and comes back with it, as a topic
        partition's there (storage/log_dir_state.py)."""
        topics = self.topics

        def open_in_dir() -> Log:
            log = open_log()
            if isinstance(log, PartitionLog) and topics.log_dirs:
                log.join_dir(topics.dir_states.state(topics.log_dirs[0]))
            return log

        return open_in_dir

    def _forget_share_state(self, topic_id: uuid.UUID) -> None:
        """A topic is deleted: its share state goes (handlers/share_persist.py), at the
        share coordinators of other brokers in the background (a topic's deletion does
        not wait for it, as Kafka's does not)."""
        elsewhere = forget_topic(self, topic_id)
        if elsewhere and self.root_nursery is not None:
            self.root_nursery.start_soon(self._delete_share_state, elsewhere)
        self._sweep_deleted_share_topics()

    def _sweep_deleted_share_topics(self) -> None:
        """The share groups coordinated here whose records name deleted topics: their
        share state goes at every share coordinator holding it, in the background, one
        task per group at a time (handlers/share_persist.py; as Kafka's group coordinator
        sends DeleteShareGroupState when a topic is deleted). Called when the cluster's
        topics change, a topic held here is deleted, and a group's records are loaded;
        a group's failed deletion is tried again by its task, on a timer with backoff."""
        if self.root_nursery is None:
            return
        for group_id, topic_ids in deleted_topics_of_groups(self).items():
            if group_id not in self._deleting_share_topics:
                self._deleting_share_topics.add(group_id)
                self.root_nursery.start_soon(self._delete_deleted_share_topics, group_id, topic_ids)

    async def _delete_deleted_share_topics(self, group_id: str, topic_ids: set[uuid.UUID]) -> None:
        """Until it is done: a failure (a share coordinator moving, a peer down) is tried
        again on a timer with backoff, not only at the next change of the cluster's
        topics, which may never come. Each try takes what is left then: nothing once
        the group is deleted, coordinated elsewhere or rid of the topics."""
        tries = 0

        async def attempt() -> bool:
            nonlocal tries
            tries += 1
            left = topic_ids if tries == 1 else deleted_topics_of_groups(self).get(group_id)
            if not left:
                return True
            return await delete_deleted_topics_state(self, group_id, left) is ErrorCode.NONE

        try:
            await retry_with_backoff(
                attempt, first_s=SHARE_SWEEP_RETRY_S, max_s=SHARE_SWEEP_RETRY_MAX_S,
                what=f"deleting the share state of deleted topics of group {group_id!r}",
            )  # fmt: skip
        finally:
            self._deleting_share_topics.discard(group_id)

    async def _follow_deleted_share_topics(self, admin: TopicAdmin) -> None:
        """While this broker is in its cluster: at each change of the cluster's topics,
        look for share groups whose topics were deleted (the broker may hold no replica
        of them, so the topic manager does not tell it)."""
        # A cluster's admin (cluster/topic_admin.py) says when its view changes.
        view_event: Callable[[], trio.Event] | None = getattr(admin, "view_event", None)
        if view_event is None:
            return
        while self.topic_admin is admin:
            changed = view_event()
            self._sweep_deleted_share_topics()
            await changed.wait()

    async def _delete_share_state(self, keys: list[Any]) -> None:
        try:
            failed = {k: e for k, e in (await delete_state(self, keys)).items() if e}
        except Exception:  # a background task: never the root nursery's end
            log.exception("deleting the share state of a deleted topic")
            return
        if failed:
            # Left behind, never read again (no topic has their id): compaction keeps them.
            log.warning("share state of a deleted topic not deleted: %s", failed)

    # ------------------------------------------------------------------ services (handlers/base.py)

    def monotonic_ms(self) -> float:
        return trio.current_time() * 1000

    async def run_off_loop(self, fn: Callable[[], Any]) -> Any:
        return await trio.to_thread.run_sync(fn)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    # ------------------------------------------------------------------ tasks

    async def run(self, task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled or :meth:`shutdown`; report the broker once listening."""
        try:
            with trio.CancelScope() as root_scope:
                self._root_scope = root_scope
                async with trio.open_nursery() as root:
                    await root.start(self.flusher.run)
                    await root.start(self.handler_pool.run)
                    await root.start(self.loop_watchdog.run, name="loop-watchdog")
                    self.root_nursery = root
                    self.flusher.background = root
                    root.start_soon(self._retention_loop, name="retention")
                    root.start_soon(self._share_expiry_loop, name="share-expiry")
                    if self.config.log_cleaner_enable:
                        root.start_soon(self.log_cleaner.run, name="log-cleaner")
                    for service in self.services:
                        await root.start(service.run)
                    coordination = None
                    if self.config.zookeeper_connect:
                        # The cluster's id before any client can ask (cluster/broker_node.py).
                        from trio_broker.cluster.broker_node import join_coordination

                        coordination = await join_coordination(self)
                    for spec in self.listeners:
                        listener = await self._open_listener(spec)
                        await root.start(self._accept_loop, listener, spec, name="acceptor")
                    if self.config.zookeeper_connect:
                        # After the listeners: the registration names their address.
                        await root.start(self._run_cluster, coordination, name="cluster")
                    self.accepting.set()
                    task_status.started(self)
        finally:
            # Plain synchronous calls: they run even when the scope was cancelled.
            self.topics.close()
            self.producers.close()  # after the logs are flushed
            for service in self.services:
                close = getattr(service, "close", None)
                if close is not None:
                    close()
            for held in self._data_dir_locks:
                held.close()  # the last: everything is closed

    async def _run_cluster(
        self, coordination: Any, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Join the cluster in ZooKeeper and replicate (trio_broker/cluster)."""
        from trio_broker.cluster.broker_node import run_cluster_node

        await run_cluster_node(self, coordination, task_status=task_status)

    @property
    def leaders(self) -> DataReplication:
        """Services.leaders: this broker's replication (``replication``)."""
        return self.replication

    @property
    def admin(self) -> TopicAdmin:
        """Services.admin: this broker's topic administration (``topic_admin``)."""
        return self.topic_admin

    def joined(self, replication: BrokerReplication, admin: TopicAdmin) -> None:
        """The broker joined its cluster: the replica manager and its admin."""
        self.replication, self.topic_admin = replication, admin
        if self.root_nursery is not None:
            self.root_nursery.start_soon(self._follow_deleted_share_topics, admin)

    def left(self) -> None:
        """The broker left its cluster: it leads and changes nothing (as before joining)."""
        self.replication, self.topic_admin = self._out_of_cluster

    @property
    def durability(self) -> Flusher:
        return self.flusher

    def _throttle_connection(self, connection_id: int, delay_ms: int) -> None:
        conn = self.connections.get(connection_id)
        if conn is not None:
            conn.throttle(delay_ms)

    async def _open_listener(self, spec: Listener) -> trio.socket.SocketType:
        family = stdlib_socket.AF_INET6 if ":" in spec.host else stdlib_socket.AF_INET
        sock = trio.socket.socket(family, stdlib_socket.SOCK_STREAM)
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEADDR, 1)
        await sock.bind((spec.host, spec.port))
        sock.listen(1024)
        host, port = sock.getsockname()[:2]
        self.bound.append((host, port))
        self.listener_bound[spec.name] = (host, port)
        return sock

    @property
    def advertised(self) -> tuple[str, int]:
        """The address Metadata gives for the first listener."""
        return self.advertised_for(None)

    def advertised_for(self, connection_id: int | None) -> tuple[str, int]:
        """The address Metadata gives a client: that of the listener it connected to."""
        return self._advertised_of(self._listener_of(connection_id))

    def listener_name_for(self, connection_id: int | None) -> str:
        """The name of the listener a client connected to (the first one if unknown)."""
        return self._listener_of(connection_id).name

    def advertised_endpoints(self) -> list[tuple[str, str, str, int]]:
        """(name, security protocol, host, port) of every listener, as registered."""
        return [(spec.name, spec.protocol, *self._advertised_of(spec)) for spec in self.listeners]

    def _listener_of(self, connection_id: int | None) -> Listener:
        conn = None if connection_id is None else self.connections.get(connection_id)
        return self.listeners[0] if conn is None or conn.listener is None else conn.listener

    def _advertised_of(self, spec: Listener) -> tuple[str, int]:
        if spec.advertised is not None:
            return spec.advertised
        host, port = self.listener_bound.get(spec.name, (spec.host, spec.port))
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return (host, port)

    async def _accept_loop(
        self, listener: trio.socket.SocketType, spec: Listener, task_status: trio.TaskStatus[None]
    ) -> None:
        async with trio.open_nursery() as connections:
            accept_scope = trio.CancelScope()
            self._accept_scopes.append(accept_scope)
            with accept_scope, listener:
                task_status.started()
                host, port = self.listener_bound[spec.name]
                if spec.protocol == "PLAINTEXT" and len(self.listeners) == 1:
                    log.info("listening on %s:%d", host, port)
                else:
                    log.info("listening on %s:%d (%s, %s)", host, port, spec.name, spec.protocol)
                await self.accepting.wait()
                while True:
                    try:
                        sock, addr = await listener.accept()
                    except OSError as exc:
                        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                            log.warning("accept failed (%s); backing off", exc)
                            await trio.sleep(ACCEPT_BACKOFF_S)
                            continue
                        raise
                    host = str(addr[0])
                    if (
                        len(self.connections) >= self.config.max_connections
                        or self.connections_per_ip.get(host, 0)
                        >= self.config.max_connections_per_ip
                    ):
                        self.stats.connections_rejected += 1
                        sock.close()
                        continue
                    sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
                    conn_id = next(self._connection_ids)
                    client = ClientInfo(conn_id, host, int(addr[1]))
                    conn = open_connection(self, sock, client, spec)
                    self.connections[conn_id] = conn
                    self.connections_per_ip[host] = self.connections_per_ip.get(host, 0) + 1
                    self.stats.connections_accepted += 1
                    connections.start_soon(self._run_connection, conn, name=f"conn-{conn_id}")

    async def _run_connection(self, conn: Connection) -> None:
        try:
            await conn.run()
        finally:
            self.connections.pop(conn.id, None)
            host = conn.client.host
            left = self.connections_per_ip.get(host, 0) - 1
            if left > 0:
                self.connections_per_ip[host] = left
            else:
                self.connections_per_ip.pop(host, None)

    def _transaction_table(
        self, partition: int, leader_epoch: int, log_: Log, replication: Any,
        send_markers: Any,
    ) -> TransactionCoordinator:  # fmt: skip
        """The coordinator's table of one led __transaction_state partition (its log is
        the topic manager's, or alone the OwnPartition's)."""
        config = self.config
        return TransactionCoordinator(
            log_, topics=self.topics, producers=self.producers, durability=self.flusher,
            appends=self.appends, groups=self.groups,
            allocate_producer_id=lambda: self.producers.allocator.allocate(),
            # Markers are written in this broker's term of each partition (used alone:
            # in a cluster the partitions' leaders write them, ``send_markers``).
            write_marker=partial(append_txn_marker, leaders=self.replication),
            now_ms=self.now_ms,
            max_timeout_ms=config.transaction_max_timeout_ms,
            expiration_ms=config.transactional_id_expiration_ms, replication=replication,
            txn_partition=partition, coordinator_epoch=leader_epoch,
            send_markers=send_markers, owns_log=False,
        )  # fmt: skip

    async def _transaction_facts(self, log_: Log) -> TransactionFacts | None:
        """A topic partition's LSO, aborted transactions and active producers, for the
        cleaner (else None: the internal logs hold no transactional batches). The
        producer state is loaded in a worker thread if it is not yet (it may replay a
        segment's headers)."""
        key = self.topics.key_of(log_)
        if key is None:
            return None
        name, partition = key
        # A replica cleans only what is committed (below its HW: alone the log end; a
        # partition it neither leads nor follows, nothing), and a follower's producer
        # state is rebuilt from what it copied.
        replica_hw = self.replication.replica_high_watermark(name, partition)
        hw = min(log_.log_end_offset, replica_hw if replica_hw is not None else 0)
        if self.replication.leader_term(name, partition) is None:
            self.producers.forget(name, partition)
        await trio.to_thread.run_sync(self.producers.prepare, name, partition, log_)
        if log_ is not self.topics.log(name, partition):
            return None  # deleted meanwhile
        lso = self.producers.last_stable_offset(name, partition, log_, hw)
        aborted = self.producers.aborted_between(name, partition, log_, log_.log_start_offset, lso)
        return TransactionFacts(
            lso,
            tuple((a.producer_id, a.first_offset, a.last_offset) for a in aborted),
            self.producers.active_producers(name, partition, log_),
            high_watermark=hw,
        )

    def _forget_aborted(self, log_: Log, gone: list[tuple[int, int]]) -> None:
        """The cleaner removed these aborted transactions' data: read_committed fetches
        stop naming them before their markers go (docs/compaction.md)."""
        key = self.topics.key_of(log_)
        if key is not None:
            self.producers.forget_aborted(*key, log_, gone)

    def _compactable_logs(self) -> list[Log]:
        """Every partition log, the committed-offsets log and the transaction log (the
        cleaner keeps the compacted ones)."""
        logs = list(self.topics.all_logs())
        offsets = self.groups.offsets
        if offsets is not None and CONSUMER_OFFSETS not in self.topics.topics:  # alone
            logs.append(offsets.log)
        for table in self.transactions.tables.values():
            if TRANSACTION_STATE not in self.topics.topics:  # alone: the coordinator's own
                logs.append(table.log)
        for share_table in self.share_coordinator.tables.values():
            if SHARE_GROUP_STATE not in self.topics.topics:  # alone: the coordinator's own
                logs.append(share_table.log)
        return logs

    async def _share_expiry_loop(self) -> None:
        """Members of the share groups coordinated here whose session ran out go, and
        their records' tombstones are written (Kafka's coordinator has a timer per
        member), so that a coordinator loading the group later does not bring them back;
        a heartbeat or describe in between would expire them too (groups/share.py), but
        only a heartbeat writes. A failed write leaves the records (logged), and a load
        brings those members back for one more session timeout."""
        while True:
            await trio.sleep(SHARE_EXPIRY_CHECK_S)
            self.shares.expire_members(self.now_ms())
            # Every group whose stored members include one gone from memory: expired
            # now, or earlier by a describe (which writes nothing).
            for group_id, group in list(self.shares.groups.items()):
                known = self.groups.share_group(group_id)
                if known is None or not known.members.keys() - group.members.keys():
                    continue
                if self.groups.coordinator_error(group_id) is not ErrorCode.NONE:
                    continue  # a data partition's leader's copy, or moving
                try:
                    write = self.groups.store_share_group(
                        group_id, known.with_membership(group, self._topic_ids())
                    )
                    if write is not None:
                        await self.groups.wait_offsets_durable(write)
                except KafkaError as exc:
                    log.warning("share group %r: expired members not tombstoned: %s",
                                group_id, exc)  # fmt: skip

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            now = self.now_ms()
            for name, topic in list(self.topics.topics.items()):
                for partition, log_ in enumerate(topic.logs):
                    # Only what this replica knows committed (Kafka's deletableSegments):
                    # a leader never deletes records a follower may still need to copy.
                    hw = self.replication.replica_high_watermark(name, partition)
                    if hw is None or log_.offline:
                        # Neither leader nor follower here now, or its log dir is
                        # offline (as Kafka, whose failed dir's logs leave the log
                        # manager: nothing is deleted there until it is back).
                        continue
                    try:
                        log_.apply_retention(now, hw)
                    except (OSError, StorageError):  # a segment deletion failed
                        log.exception("retention failed")

    async def shutdown(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then stop everything."""
        self.shutting_down = True
        self.shutdown_begun.set()
        for accept_scope in self._accept_scopes:
            accept_scope.cancel()
        for conn in list(self.connections.values()):
            conn.stop_reading()
        self.appends.notify_all()  # long-poll fetches see shutting_down and answer now
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            # A bounded poll, only during shutdown.
            while any(c.sequencer.in_flight for c in self.connections.values()):  # noqa: ASYNC110
                await trio.sleep(0.01)
        if self._root_scope is not None:
            self._root_scope.cancel()


async def serve(
    config: BrokerConfig,
    *,
    handle_signals: bool = True,
    capture_on: bool = True,
    capture_full: bool = False,
) -> None:
    """Run a broker until SIGINT/SIGTERM, then shut down gracefully (SIGUSR1 toggles capture)."""
    import signal

    from trio_broker.capture.control import toggle_capture

    broker = Broker(config)
    if broker.capture_tap is not None:
        broker.capture_tap.full_records = capture_full  # --capture-records full
    if not capture_on:
        broker.capture = None  # --capture-paused: the tap waits in broker.capture_tap
    if not handle_signals:
        await broker.run()
        return
    # Closing its signal receiver, trio raises the signals it holds unread again, with
    # the handlers from before it opened: with the default ones, a second SIGTERM (a
    # service manager's) that came as the broker finished stopping killed the
    # process with -15 at the end of a graceful stop. Ignored there, it is dropped;
    # and once a stop began they stay ignored until the process exits (kill -9 is
    # the way to cut a graceful stop short).
    stop_signals = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in stop_signals}
    try:
        await _serve_until_stopped(broker, toggle_capture)
    finally:
        if not broker.shutting_down:
            for signum, handler in before.items():
                signal.signal(signum, handler)


async def _serve_until_stopped(broker: Broker, toggle_capture: Callable[[Broker], str]) -> None:
    """Run the broker; answer signals until it has stopped (the first SIGINT/SIGTERM
    stops it, later ones are logged). The receiver opens before the broker listens: a
    signal that arrives right after "listening on" must still mean a graceful stop."""
    import signal

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:

            async def run_then_stop_answering(task_status: trio.TaskStatus[Broker]) -> None:
                await broker.run(task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped: nothing left to answer

            await nursery.start(run_then_stop_answering)
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGUSR1:
                    log.info("received SIGUSR1: capture %s", toggle_capture(broker))
                elif broker.shutting_down:
                    log.info("received %s; already shutting down", name)
                else:
                    log.info("received %s; shutting down", name)
                    await broker.shutdown()
