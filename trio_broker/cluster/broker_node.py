"""A broker joins its cluster: ZooKeeper session, membership, replica manager.

Started by the Broker once its listeners are bound (the registration names their
address), in cluster mode only (``zookeeper.connect``). A second live broker with the
same id, or a ZooKeeper that cannot be reached at start, stops the broker with an error.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

import trio

from trio_broker.cluster.broker_client import BrokerConnectionError
from trio_broker.cluster.controller import Rebalance
from trio_broker.cluster.coordination import NodeExists, ZooKeeperCoordination
from trio_broker.cluster.group_config_watch import GroupConfigWatch
from trio_broker.cluster.inter_broker_stream import login_opener
from trio_broker.cluster.log_dir_events import publish_offline_replicas
from trio_broker.cluster.membership import run_membership, wall_clock_ms
from trio_broker.cluster.replica_fetcher import connect_to_broker
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.cluster.security_store import ClusterSecurity
from trio_broker.cluster.share_state_channel import ShareStateChannel
from trio_broker.cluster.txn_marker_channel import TxnMarkerChannel
from trio_broker.cluster.zk_layout import CLUSTER_ID, BrokerRegistration
from trio_broker.config import BrokerConfig
from trio_broker.groups.share import ShareGroups
from trio_broker.groups.share_coordinator import PartitionedShareCoordinator
from trio_broker.protocol import messages as m
from trio_broker.security.credentials import CredentialStore
from trio_broker.security.inter_broker import (
    InterBrokerLogin,
    inter_broker_listener,
    inter_broker_login,
)
from trio_broker.security.listeners import resolve_listeners
from trio_broker.security.zookeeper_login import read_client_login
from trio_broker.services.cluster_view import ClusterView
from trio_broker.services.internal_topics import TRANSACTION_STATE
from trio_broker.services.topics import TopicManager
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator

__all__ = ["ClusterHost", "run_cluster_node"]

log = logging.getLogger(__name__)
#: How long a stopping broker waits for its connections to other brokers to close.
CLOSE_PEERS_S = 5.0


class ClusterHost(Protocol):
    """What the broker gives its cluster membership (server/broker.py's Broker)."""

    config: BrokerConfig
    topics: TopicManager
    cluster_id: str
    replication: Any
    producers: Any
    #: Internal topics' owners (group and transaction coordinators), by topic name.
    leadership_listeners: dict[str, Any]
    #: The transaction coordinator, which the replica manager elects (below).
    transactions: PartitionedTransactionCoordinator
    #: The share coordinator, whose channel to other brokers is set here.
    share_coordinator: PartitionedShareCoordinator
    #: The share groups, whose group configs the cluster's znodes set.
    shares: ShareGroups
    #: The deterministic simulation's in-memory ZooKeeper session and network (sim/);
    #: None: kazoo to ``zookeeper.connect`` and TCP.
    open_coordination: Any
    open_stream: Any
    #: Set by a graceful shutdown (SIGTERM), as is ``shutdown_begun``.
    shutting_down: bool
    shutdown_begun: trio.Event
    #: The ACL store's owner (None: no authorizer) and the SCRAM users, copies of
    #: ZooKeeper's kept by ``shared_security`` (cluster/security_store.py), set here.
    authorizer: Any
    credentials: CredentialStore
    shared_security: Any

    @property
    def advertised(self) -> tuple[str, int]: ...

    def advertised_endpoints(self) -> list[tuple[str, str, str, int]]: ...

    @property
    def durability(self) -> Any: ...

    @property
    def appends(self) -> Any: ...

    def now_ms(self) -> int: ...

    def joined(self, replication: Any, admin: Any) -> None: ...

    def left(self) -> None: ...


async def join_coordination(host: ClusterHost) -> Any:
    """Open this broker's ZooKeeper session and take the cluster's id (the first broker
    to start writes its own). The broker calls this before it opens its listeners, so
    that no client ever sees an id of its own (librdkafka warns of a client "connected to
    multiple clusters" otherwise); :func:`run_cluster_node` does the rest once they are
    bound. A ZooKeeper that cannot be reached stops the broker here."""
    config = host.config
    assert config.zookeeper_connect is not None
    coord: Any
    if host.open_coordination is not None:
        coord = host.open_coordination()
    else:
        jaas = config.zookeeper_jaas_file
        coord = ZooKeeperCoordination(
            config.zookeeper_connect,
            session_timeout_s=config.zookeeper_session_timeout_ms / 1000,
            login=read_client_login(jaas) if jaas else None,
            set_acl=config.zookeeper_set_acl,
            tls=config.zookeeper_tls(),
        )
        await coord.start()
    try:
        try:
            await coord.create(CLUSTER_ID, f'{{"version":"1","id":"{host.cluster_id}"}}'.encode())
        except NodeExists:
            node = await coord.get(CLUSTER_ID)
            if node is not None:
                try:
                    host.cluster_id = str(json.loads(node.data)["id"])
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring an unreadable %s", CLUSTER_ID)
        # ACLs and users before any client can log in or be authorized: ZooKeeper's,
        # with what a single-node data dir held copied in (cluster/security_store.py).
        security = ClusterSecurity(
            coord, None if host.authorizer is None else host.authorizer.store, host.credentials
        )
        await security.load(config.data_dir if config.storage == "file" else None)
        host.shared_security = security
    except BaseException:
        await coord.stop()
        raise
    return coord


def inter_broker_login_of(config: BrokerConfig) -> InterBrokerLogin | None:
    """How this broker logs in to the others' inter-broker listener; None: plaintext."""
    listener = inter_broker_listener(resolve_listeners(config), config.inter_broker_listener_name)
    login = inter_broker_login(listener, config.security)
    return None if login.tls is None and login.sasl is None else login


async def run_cluster_node(
    host: ClusterHost,
    coord: Any = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Join the cluster with the session :func:`join_coordination` opened (or open one)."""
    config = host.config
    if coord is None:
        coord = await join_coordination(host)
    # The channels to other brokers (markers, share state): their connections close
    # when the broker stops, not at the process's exit.
    peer_channels: list[TxnMarkerChannel | ShareStateChannel] = []
    try:
        view = ClusterView(config.node_id)
        manager = ReplicaManager(
            view, coord, host.topics,
            min_insync_replicas=config.min_insync_replicas,
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            now_ms=host.now_ms, durability=host.durability, on_partition_changed=host.appends.notify,
            producers=host.producers,
            follower_throttle_rate=config.follower_replication_throttled_rate,
            leader_throttle_rate=config.leader_replication_throttled_rate,
            sync_before_counting=config.acks_all_fsync,
            inter_broker_listener=(config.inter_broker_listener_name or "").upper() or None,
        )  # fmt: skip
        manager.leadership_listeners.update(host.leadership_listeners)
        # A secured inter-broker listener: streams to other brokers log in first.
        login = inter_broker_login_of(config)
        plain = host.open_stream or trio.open_tcp_stream
        manager.open_stream = (
            host.open_stream
            if login is None
            else login_opener(login, plain, f"replica-fetcher-{config.node_id}")
        )
        manager.open_marker_stream = (
            host.open_stream
            if login is None
            else login_opener(login, plain, f"broker-{config.node_id}-txn")
        )
        rebalance = None
        if config.auto_leader_rebalance_enable:
            rebalance = Rebalance(interval_s=float(config.leader_imbalance_check_interval_seconds))
        # Every listener is registered (Kafka's endpoints): followers fetch from the
        # inter-broker one, and Metadata answers each client with its own listener's.
        endpoints = host.advertised_endpoints()
        _, _, address, port = endpoints[0]
        registration = BrokerRegistration(
            config.node_id, address, port, config.broker_rack,
            tuple(f"{name}://{h}:{p}" for name, _, h, p in endpoints), wall_clock_ms(),
            tuple((name, protocol) for name, protocol, _, _ in endpoints if name != protocol),
        )  # fmt: skip
        # The coordinator of a transactional id is the leader of its partition of
        # __transaction_state; markers go to the partitions' leaders.
        transactions = host.transactions
        transactions.replication = manager
        channel = TxnMarkerChannel(
            host, manager, offsets_partitions=getattr(config, "offsets_topic_num_partitions", 50)
        )
        transactions.send_markers = channel.send
        transactions.ask_coordinator = channel.ask_coordinator
        manager.leadership_listeners[TRANSACTION_STATE] = transactions
        # The share coordinator of the __share_group_state partitions led here; share
        # partitions led here read and write their state at their coordinators.
        host.share_coordinator.replication = manager
        host.share_coordinator.remote = share_channel = ShareStateChannel(manager)
        peer_channels += [channel, share_channel]
        async with trio.open_nursery() as nursery:
            if isinstance(host.shared_security, ClusterSecurity):
                nursery.start_soon(host.shared_security.follow)
            # Group configs are ZooKeeper's (/config/groups): every broker applies them.
            nursery.start_soon(GroupConfigWatch(coord, host.shares).run)
            await nursery.start(manager.run)
            # A failed log dir: the controller moves leadership off its replicas.
            nursery.start_soon(publish_offline_replicas, coord, config.node_id, host.topics)
            if isinstance(coord, ZooKeeperCoordination):  # the simulation's has no socket
                nursery.start_soon(_fence_while_cut_off, coord, manager,
                                   config.zookeeper_session_timeout_ms / 1000)  # fmt: skip
            await nursery.start(
                lambda task_status: run_membership(
                    coord, registration, view,
                    unclean=config.unclean_leader_election_enable, rebalance=rebalance,
                    on_change=manager.view_changed, on_controller=manager.controller_changed,
                    # A restart right after kill -9 finds the old session's registration:
                    # ZooKeeper drops it within about a session timeout (checked per tick).
                    stale_registration_wait_s=2 * config.zookeeper_session_timeout_ms / 1000,
                    task_status=task_status,
                )
            )  # fmt: skip
            host.joined(manager, manager.admin)
            log.info("broker %d joined the cluster at %s", config.node_id, config.zookeeper_connect)
            task_status.started()
            await host.shutdown_begun.wait()
            # Lead nothing more (acks=all waiters answer NOT_LEADER_OR_FOLLOWER), then
            # leave: closing the session drops the registration at once, and the
            # controller elects in-sync followers while this broker drains its
            # connections. Staying in the cluster meanwhile would let this leader,
            # whose followers can no longer fetch, shrink the ISR to itself and leave
            # its partitions offline once it exits.
            manager.leave()
            nursery.cancel_scope.cancel()
        await coord.stop()
        log.info("broker %d left the cluster", config.node_id)
        # Handlers keep a replica manager that leads nothing until the broker stops.
        await trio.sleep_forever()
    finally:
        host.left()
        await coord.stop()
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_PEERS_S):
            for peer_channel in peer_channels:
                await peer_channel.close()


async def _fence_while_cut_off(
    coord: ZooKeeperCoordination, manager: ReplicaManager, session_timeout_s: float
) -> None:
    """Lead nothing while ZooKeeper has been out of reach for a whole session timeout.

    Cut off from ZooKeeper but not from clients, a leader would otherwise go on taking
    writes (and answering Metadata as the leader) long after the controller elected
    another broker in its place: kazoo only learns the session expired once it
    reaches ZooKeeper again. acks=all writes are safe either way (the followers have
    moved on); this ends the term so clients are told NOT_LEADER_OR_FOLLOWER and move
    on too, as a Kafka broker does once the controller tells it.
    """
    while True:
        changed = coord.connection_changed()
        since = coord.disconnected_since
        if since is None:
            if manager.fenced:
                await _view_settles(manager, limit_s=session_timeout_s)
            manager.fence(False)
            await changed.wait()
            continue
        with trio.move_on_at(since + session_timeout_s):
            await changed.wait()
            continue
        if coord.connected():
            # Back in touch already: the word is still queued behind a stall of the
            # loop, which passed this deadline. Fencing now would end every term for a
            # connection that is up (issue 28).
            await changed.wait()
            continue
        manager.fence(True)
        async with trio.open_nursery() as probing:
            probing.start_soon(_ask_peers_whether_listed, manager)
            await changed.wait()
            probing.cancel_scope.cancel()


#: How often a fenced broker asks the others whether they still list it.
PEER_PROBE_INTERVAL_S = 1.0


async def _ask_peers_whether_listed(manager: ReplicaManager) -> None:
    """Fenced: ask each other broker, over the inter-broker listener, for the brokers
    it lists. One that answers without this broker has a newer view (this broker's
    session expired and the cluster went on): ``manager.dropped_by_peers``. Peers that
    cannot be reached, or still list it, leave it as it is (ZooKeeper may be down
    for every broker alike)."""
    me = manager.view.broker_id
    while not manager.dropped_by_peers:  # (a reconnection attempt restarts the probe)
        for peer in [b for b in manager.view.brokers if b != me]:
            try:
                listed = await _lists_broker(manager, peer, me)
            except BrokerConnectionError:
                continue
            if not listed:
                log.warning("broker %d no longer lists this broker: leaving itself out "
                            "of Metadata until ZooKeeper answers", peer)  # fmt: skip
                manager.dropped_by_peers = True
                return
        await trio.sleep(PEER_PROBE_INTERVAL_S)


async def _lists_broker(manager: ReplicaManager, peer: int, broker_id: int) -> bool:
    client = await connect_to_broker(manager, peer, f"broker-{broker_id}-fenced")
    try:
        # No topics: the broker list only.
        request = m.MetadataRequest(topics=[], allow_auto_topic_creation=False)
        response = await client.call(m.ApiKey.METADATA, 9, request, timeout_s=2.0)
    finally:
        await client.close()
    return any(b.node_id == broker_id for b in response.brokers)


async def _view_settles(manager: ReplicaManager, limit_s: float, quiet_s: float = 0.5) -> None:
    """Back in touch: a session that expired meanwhile makes the membership tasks
    re-read brokers and topics (each re-read changes the view); lead again only once
    that is done (no change for ``quiet_s``), never from the view of before the cut."""
    with trio.move_on_after(limit_s):
        while True:
            with trio.move_on_after(quiet_s):
                await manager.view_event().wait()
                continue
            return
