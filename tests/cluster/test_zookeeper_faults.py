"""ZooKeeper itself failing under a running three-broker cluster (real processes).

Each scenario has its own private ZooKeeper (so that it can be paused, killed and
restarted on the same port with its data directory), three ``serve`` processes
(``min.insync.replicas=2``, ``zookeeper.session.timeout.ms=4000``, RF=3), a
confluent-kafka idempotent acks=all producer and a consumer group. At the end: every
acknowledged record is read back exactly once, in order within its partition; every
broker is registered and every broker's Metadata agrees (same leaders and epochs, full
ISRs).

- ZooKeeper paused (SIGSTOP) for less than the session timeout: nothing changes; the
  same leaders in the same epochs, no session expires, acks=all goes on.
- ZooKeeper killed with -9 and restarted on its port and data after longer than the
  session timeout: producing and consuming go on (ZooKeeper restores the sessions).
- ZooKeeper back only after it expired every session (restarted first where the
  brokers cannot reach it): every broker learns it, registers again, a controller is
  elected in a new epoch, and the same end state follows.
- ZooKeeper down: acks=all goes on while the ISRs stay full (nothing needs storing);
  CreateTopics fails for the client; a broker still stops on SIGTERM; its followers'
  leaders cannot store the smaller ISR, so acks=all waits until ZooKeeper returns.
- A three-server ensemble loses the server that leads it (kill -9), then a broker: the
  quorum holds, sessions move to the other servers and live on, the controller elects
  new leaders, and the server rejoins.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from tests.cluster.test_cluster_e2e import eventually, partitions
from tests.cluster.test_cluster_faults import (
    CONFIG,
    LAG_MS,
    SESSION_MS,
    Acked,
    BackgroundProducer,
    ConfiguredBroker,
    check_invariants,
    converged,
    create_topic,
    log_sizes,
    read_partitions,
    servers,
)
from tests.e2e.conftest import start_all, stop_all
from trio_broker.cluster.local_zookeeper import (
    LocalZooKeeper,
    quorum_mode,
    start_local_ensemble,
    start_local_zookeeper,
)

pytestmark = pytest.mark.timeout(300)

TOPIC_PARTITIONS = 3


class ZooKeeperCluster:
    """A private ZooKeeper and three brokers on it."""

    def __init__(self, tmp_path: Path) -> None:
        self.zk_dir = tmp_path / "zookeeper"
        self.zookeeper: LocalZooKeeper = start_local_zookeeper(self.zk_dir)
        config = tmp_path / "broker.properties"
        config.write_text(CONFIG)
        self.brokers = {
            b: ConfiguredBroker(tmp_path / f"broker{b}", b, self.zookeeper.hosts, config)
            for b in (1, 2, 3)
        }

    def signal_zookeeper(self, sig: signal.Signals) -> None:
        self.zookeeper.process.send_signal(sig)

    def kill_zookeeper(self) -> None:
        self.zookeeper.process.kill()
        self.zookeeper.process.wait(10)

    def restart_zookeeper(self) -> None:
        """On the same port, with the same data directory (its snapshot and log)."""
        self.zookeeper = start_local_zookeeper(self.zk_dir, port=self.zookeeper.port)

    def restart_zookeeper_expiring_sessions(self) -> None:
        """Restart it where the brokers cannot reach it (another port) until it has
        expired their sessions, then on its own port again: a ZooKeeper that comes back
        after a long outage."""
        port = self.zookeeper.port
        aside = start_local_zookeeper(self.zk_dir)
        try:
            client = KazooClient(hosts=aside.hosts)
            client.start(timeout=30)
            try:
                eventually(lambda: not client.get_children("/brokers/ids"), "sessions expired", 60)
            finally:
                client.stop()
                client.close()
        finally:
            aside.stop()
        self.zookeeper = start_local_zookeeper(self.zk_dir, port=port)

    def stop(self) -> None:
        stop_everything(self.brokers, [self.zookeeper])


def stop_everything(brokers: dict[int, ConfiguredBroker], servers: list[LocalZooKeeper]) -> None:
    """The brokers first (they may need ZooKeeper to stop cleanly), then the servers (a
    paused one is continued first, so that it hears SIGTERM)."""
    try:
        stop_all(brokers.values())
    finally:
        for server in servers:
            server.process.send_signal(signal.SIGCONT)
            server.stop()


@pytest.fixture
def zk_cluster(tmp_path: Path) -> Iterator[ZooKeeperCluster]:
    cluster = ZooKeeperCluster(tmp_path)
    try:
        start_all(cluster.brokers.values())
        yield cluster
    finally:
        cluster.stop()


class GroupConsumer:
    """A consumer group member that polls and commits in a thread (bounded in time)."""

    def __init__(self, bootstrap: str, topic: str, limit_s: float = 120.0) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "zk-faults",
            "auto.offset.reset": "earliest", "enable.auto.commit": True,
            "auto.commit.interval.ms": 500, "session.timeout.ms": 10000,
            "topic.metadata.refresh.interval.ms": 1000,
        })  # fmt: skip
        self.consumer.subscribe([topic])
        self.received = 0
        self.stopping = threading.Event()
        self.deadline = time.monotonic() + limit_s
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set() and time.monotonic() < self.deadline:
            msg = self.consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                self.received += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.consumer.close()


def leadership(cluster: ZooKeeperCluster) -> dict[int, tuple[int, int]]:
    """Each partition's (leader, leader epoch), as broker 1 answers Metadata."""
    with cluster.brokers[1].connect() as conn:
        response = conn.metadata(["zk"], version=9)
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in response.topics[0].partitions}


def registered_everywhere(cluster: ZooKeeperCluster) -> bool:
    for broker in cluster.brokers.values():
        with broker.connect() as conn:
            response = conn.metadata(["zk"], version=9)
        if sorted(b.node_id for b in response.brokers) != [1, 2, 3]:
            return False
        if response.controller_id not in (1, 2, 3):
            return False
    return True


def start_traffic(cluster: ZooKeeperCluster) -> tuple[BackgroundProducer, GroupConsumer]:
    create_topic(cluster.brokers, "zk", TOPIC_PARTITIONS)
    bootstrap = servers(cluster.brokers)
    # Bounded, and enough for the longest scenario at about 500 records a second.
    background = BackgroundProducer(bootstrap, "zk", 0, limit=100_000)
    group = GroupConsumer(bootstrap, "zk")
    eventually(lambda: background.acked_count() > 100, "the producer is under way", 60)
    eventually(lambda: group.received > 50, "the group consumes", 60)
    return background, group


def finish(
    cluster: ZooKeeperCluster, background: BackgroundProducer, group: GroupConsumer
) -> Acked:
    """Producing and consuming go on; then every broker agrees and every acknowledged
    record is there exactly once."""
    acked_then, received_then = background.acked_count(), group.received
    eventually(lambda: background.acked_count() > acked_then + 200, "producing goes on", 60)
    eventually(lambda: group.received > received_then + 100, "the group consumes again", 60)
    acked = background.stop()
    group.stop()
    eventually(lambda: registered_everywhere(cluster), "every broker registered, everywhere", 60)
    converged(cluster.brokers, "zk", TOPIC_PARTITIONS)
    read = read_partitions(servers(cluster.brokers), "zk", TOPIC_PARTITIONS)
    check_invariants(read, acked)
    return acked


def test_zookeeper_paused_within_the_session_changes_nothing(
    zk_cluster: ZooKeeperCluster,
) -> None:
    background, group = start_traffic(zk_cluster)
    converged(zk_cluster.brokers, "zk", TOPIC_PARTITIONS)
    before = leadership(zk_cluster)
    since = log_sizes(zk_cluster.brokers)
    zk_cluster.signal_zookeeper(signal.SIGSTOP)
    try:
        acked_then = background.acked_count()
        time.sleep(SESSION_MS / 2000)
        # The ISRs are full and nothing needs storing: acks=all goes on meanwhile.
        assert background.acked_count() > acked_then, "no acknowledgement while ZooKeeper slept"
    finally:
        zk_cluster.signal_zookeeper(signal.SIGCONT)
    acked = finish(zk_cluster, background, group)
    assert not acked.errors, acked.errors
    assert leadership(zk_cluster) == before, "leadership moved"
    for b, broker in zk_cluster.brokers.items():
        assert "session expired" not in broker.log_text()[since[b] :], f"broker {b}"


def test_zookeeper_killed_and_restarted_after_the_session(zk_cluster: ZooKeeperCluster) -> None:
    background, group = start_traffic(zk_cluster)
    zk_cluster.kill_zookeeper()
    time.sleep(SESSION_MS / 1000 + 2)
    zk_cluster.restart_zookeeper()
    # ZooKeeper restores the sessions from its log with a fresh timeout: brokers that
    # reconnect within it keep them (measured: they all do, within a second); any that
    # did not register again. Either way the end state must be the same.
    acked = finish(zk_cluster, background, group)
    assert not acked.errors, acked.errors


def test_zookeeper_back_after_the_sessions_expired(zk_cluster: ZooKeeperCluster) -> None:
    background, group = start_traffic(zk_cluster)
    since = log_sizes(zk_cluster.brokers)
    zk_cluster.kill_zookeeper()
    zk_cluster.restart_zookeeper_expiring_sessions()
    # Every broker learns that its session expired, registers again, and a controller is
    # elected in a new epoch; leaders keep (or hand over) their partitions.
    for b, broker in zk_cluster.brokers.items():
        eventually(
            lambda broker=broker, b=b: "session expired" in broker.log_text()[since[b] :],
            f"broker {b} saw its session expire",
            60,
        )
    acked = finish(zk_cluster, background, group)
    assert not acked.errors, acked.errors


def test_zookeeper_down_acks_wait_for_isr_changes(zk_cluster: ZooKeeperCluster) -> None:
    background, group = start_traffic(zk_cluster)
    brokers = zk_cluster.brokers
    zk_cluster.kill_zookeeper()
    acked_then = background.acked_count()
    time.sleep(SESSION_MS / 1000 + 1)
    # Nothing needs storing while the ISRs stay full: acks=all goes on.
    eventually(
        lambda: background.acked_count() > acked_then + 200, "acks=all without ZooKeeper", 60
    )
    # Admin requests that write to ZooKeeper fail for the client; the broker still serves.
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    [future] = admin.create_topics([NewTopic("later", 1)], request_timeout=3).values()
    with pytest.raises(KafkaException):
        future.result(timeout=10)
    with brokers[1].connect() as conn:
        assert conn.metadata(["zk"], version=9).topics[0].error_code == 0

    # A broker stops (it still can: its ZooKeeper calls do not hold it). Its partitions'
    # leaders cannot store the smaller ISR, so acks=all waits rather than counting on
    # two replicas that ZooKeeper does not know about.
    assert brokers[3].stop() == 0
    # An observation window, not a synchronisation: past replica.lag.time.max.ms each
    # leader proposes an ISR without broker 3, which waits for ZooKeeper (kazoo holds
    # the write while disconnected: no log line or metric shows the proposal), and for
    # 2 s more nothing may be acknowledged.
    time.sleep(LAG_MS / 1000 + 1)
    stalled_at = background.acked_count()
    time.sleep(2)
    assert background.acked_count() == stalled_at, "acknowledged without a stored ISR"

    zk_cluster.restart_zookeeper()
    # The ISR changes are stored, acks=all goes on with two; broker 3's old session
    # expires (it could not close it) and it can join again.
    eventually(lambda: background.acked_count() > stalled_at + 100, "acks=all with two", 60)
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 2, "broker 3 gone", 60)
    brokers[3].start()
    acked = finish(zk_cluster, background, group)
    assert not acked.errors, acked.errors


class EnsembleCluster:
    """Three brokers on a three-server ZooKeeper ensemble (a quorum, as production runs
    it); the brokers' connect string names all three servers."""

    def __init__(self, tmp_path: Path) -> None:
        self.ensemble = start_local_ensemble(tmp_path / "zookeeper")
        hosts = ",".join(server.hosts for server in self.ensemble)
        try:
            client = KazooClient(hosts=hosts)
            client.start(timeout=30)
            try:
                client.ensure_path("/ensemble")
            finally:
                client.stop()
                client.close()
        except BaseException:  # the caller's try has not begun: stop the servers here
            for server in self.ensemble:
                server.stop()
            raise
        config = tmp_path / "broker.properties"
        config.write_text(CONFIG)
        self.brokers = {
            b: ConfiguredBroker(tmp_path / f"broker{b}", b, hosts + "/ensemble", config)
            for b in (1, 2, 3)
        }

    def stop(self) -> None:
        stop_everything(self.brokers, self.ensemble)


def test_a_zookeeper_ensemble_loses_its_leader_server(tmp_path: Path) -> None:
    """kill -9 of the ZooKeeper server that leads the ensemble, then of a broker: the
    other two servers keep the quorum, kazoo moves each broker's session to one of them
    (the session lives on: no broker registers again), the controller elects leaders for
    the killed broker's partitions, and the killed server rejoins the ensemble."""
    cluster = EnsembleCluster(tmp_path)
    try:
        start_all(cluster.brokers.values())
        background, group = start_traffic(cluster)  # type: ignore[arg-type]
        since = log_sizes(cluster.brokers)
        [zk_leader] = [s for s in cluster.ensemble if quorum_mode(s) == "leader"]
        zk_leader.process.kill()
        zk_leader.process.wait(10)
        eventually(
            lambda: (
                sorted(quorum_mode(s) or "" for s in cluster.ensemble if s is not zk_leader)
                == ["follower", "leader"]
            ),
            "the two other servers elect a leader",
            60,
        )
        acked_then = background.acked_count()
        eventually(lambda: background.acked_count() > acked_then + 200, "acks=all goes on", 60)
        # The controller still works through the two servers: a broker killed with -9
        # loses its partitions to the others.
        victim = 3
        cluster.brokers[victim].kill9()
        admin = AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
        eventually(
            lambda: victim not in [leader for leader, _, _ in partitions(admin, "zk").values()],
            "the killed broker's partitions have other leaders",
            60,
        )
        zk_leader.restart()
        assert quorum_mode(zk_leader) in ("leader", "follower")
        cluster.brokers[victim].start()
        acked = finish(cluster, background, group)  # type: ignore[arg-type]
        assert not acked.errors, acked.errors
        for b in (1, 2):
            text = cluster.brokers[b].log_text()[since[b] :]
            assert "session expired" not in text, f"broker {b} lost its session"
    finally:
        cluster.stop()
