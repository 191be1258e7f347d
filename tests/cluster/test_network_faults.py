"""Network faults between brokers, and between a broker and ZooKeeper, with real processes.

Each broker has two listeners: PLAINTEXT for clients (connected to directly) and
REPLICATION for followers (``inter.broker.listener.name=REPLICATION``), whose advertised
address is a fault proxy (tests/cluster/netproxy.py) in front of it; and each broker
reaches ZooKeeper through a proxy of its own. Cutting a proxy is then a network
partition that leaves everything else connected.

Scenarios (RF=3, ``min.insync.replicas=2``, idempotent acks=all confluent-kafka
producers), each ending with the invariants of test_cluster_faults.py: every
acknowledged record read back exactly once, in order, nothing read earlier changed:

- a leader cut off from its followers, not from ZooKeeper or clients: the followers
  leave the ISR, acks=all is refused (NOT_ENOUGH_REPLICAS) and nothing is acknowledged
  until the partition heals; then they catch up and rejoin.
- a leader cut off from ZooKeeper, not from clients or followers: its session expires,
  the controller elects a new leader, the old one acknowledges no acks=all write (it
  cannot store an ISR without the followers that moved on); healed, it learns its
  session expired, truncates and follows; its log ends equal to the new leader's.
- a follower cut off from its leader: it leaves the ISR, acks=all goes on with two, and
  once healed it rejoins.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.netproxy import FaultProxy, fetcher_of
from tests.cluster.test_cluster_e2e import eventually, every_broker_knows, partitions
from tests.cluster.test_cluster_faults import (
    CONFIG,
    Acked,
    BackgroundProducer,
    ConfiguredBroker,
    admin_of,
    check_invariants,
    converged,
    copies_alike,
    create_topic,
    full_isr,
    leaders,
    log_sizes,
    partition_bytes,
    produce,
    read_partitions,
    servers,
)
from tests.e2e.conftest import start_all, stop_all
from tests.ports import free_port
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

SESSION_MS = 4000


class ProxiedBroker(ConfiguredBroker):
    """A broker whose followers and ZooKeeper session go through fault proxies."""

    replication: FaultProxy
    zookeeper_link: FaultProxy
    #: ``--capture`` directory (the Jepsen-style run checks them with trio-broker verify).
    capture_dir: Path | None = None

    def command_line(self) -> list[str]:
        extra = [] if self.capture_dir is None else ["--capture", str(self.capture_dir)]
        return [*super().command_line(), *extra]


class ProxiedCluster(dict[int, ProxiedBroker]):
    def proxies(self) -> list[FaultProxy]:
        return [p for b in self.values() for p in (b.replication, b.zookeeper_link)]

    def heal(self) -> None:
        for proxy in self.proxies():
            proxy.heal()


def replication_config(replication_port: int, proxy_port: int) -> str:
    return CONFIG + (
        f"listeners=PLAINTEXT://127.0.0.1:0,REPLICATION://127.0.0.1:{replication_port}\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT\n"
        f"advertised.listeners=REPLICATION://127.0.0.1:{proxy_port}\n"
        "inter.broker.listener.name=REPLICATION\n"
    )


def start_proxied_cluster(
    tmp_path: Path,
    zookeeper: str,
    ids: tuple[int, ...],
    *,
    capture_root: Path | None = None,
    extra_config: str = "",
) -> ProxiedCluster:
    """Brokers ``ids``, each behind a replication proxy and a ZooKeeper proxy (started);
    with ``capture_root``, each captures its traffic into ``capture_root/broker<id>``."""
    zk_address, _, chroot = zookeeper.partition("/")
    zk_host, _, zk_port = zk_address.split(",")[0].rpartition(":")
    for attempt in (1, 2):
        # A second attempt only when a broker lost its replication port to another
        # process between free_port() and its bind (a race no fixture can close: the
        # proxy must know the port before the broker starts); in a fresh directory.
        root = tmp_path if attempt == 1 else tmp_path / "second-start"
        cluster = ProxiedCluster()
        for b in ids:
            replication_port = free_port()
            replication = FaultProxy(("127.0.0.1", replication_port), f"replication-{b}").start()
            zk_link = FaultProxy((zk_host, int(zk_port)), f"zookeeper-{b}").start()
            root.mkdir(parents=True, exist_ok=True)
            config = root / f"broker{b}.properties"
            config.write_text(replication_config(replication_port, replication.port) + extra_config)
            broker = ProxiedBroker(root / f"broker{b}", b, f"{zk_link.address}/{chroot}", config)
            broker.replication, broker.zookeeper_link = replication, zk_link
            if capture_root is not None:
                broker.capture_dir = capture_root / f"broker{b}"
            cluster[b] = broker
        try:
            start_all(cluster.values())
            return cluster
        except BaseException:
            lost_port = any(_said(b, "Address already in use") for b in cluster.values())
            stop_cluster(cluster)  # those started before the failure, and every proxy
            if attempt == 2 or not lost_port:
                raise
            if capture_root is not None:  # the failed start's traffic is no client's
                shutil.rmtree(capture_root, ignore_errors=True)
    raise AssertionError("unreachable")


def _said(broker: ProxiedBroker, text: str) -> bool:
    try:
        return text in broker.current_log()
    except OSError:
        return False


def stop_cluster(cluster: ProxiedCluster) -> None:
    """Stop every broker still running (a paused one continued), then close the proxies."""
    try:
        stop_all(cluster.values())
    finally:
        for proxy in cluster.proxies():
            proxy.close()


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[ProxiedCluster]:
    brokers = start_proxied_cluster(tmp_path, zookeeper, (1, 2, 3))
    try:
        yield brokers
    finally:
        stop_cluster(brokers)


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str
) -> Iterator[ProxiedCluster]:
    """One cluster for the module's last two tests (a start saved): the listeners test
    leaves it alone, the follower cut off, which ends stopping every broker, runs last.
    They sit at the end of the module, so that this cluster never runs beside another."""
    brokers = start_proxied_cluster(tmp_path_factory.mktemp("shared"), module_zookeeper, (1, 2, 3))
    try:
        yield brokers
    finally:
        stop_cluster(brokers)


def test_leader_cut_off_from_its_followers(cluster: ProxiedCluster) -> None:
    admin = create_topic(cluster, "cut", 1)
    acked = Acked()
    produce(servers(cluster), "cut", range(0, 200), acked)
    before = read_partitions(servers(cluster), "cut", 1)
    leader = leaders(admin, "cut")[0]

    cluster[leader].replication.blackhole()  # followers' fetches reach it no more
    # The leader's term counts the shrunk ISR once its write's reply is back; a follower's
    # watch may show the znode first. The raw produce below asks the leader itself: it
    # would take the write (and wait for the cut-off followers) under the ISR of three.
    every_broker_knows(
        cluster, "cut", 1, 60,
        until=lambda state: state[0][2] == [leader], wanted=f"ISR shrunk to [{leader}]",
    )  # fmt: skip
    assert leaders(admin, "cut")[0] == leader, "the leader still has ZooKeeper: no election"
    with cluster[leader].connect() as conn:
        answer = conn.produce("cut", build_batch([(b"x", b"-1")]), acks=-1)
    assert answer.error_code == 19, answer  # NOT_ENOUGH_REPLICAS
    refused = Acked()
    produce(servers(cluster), "cut", range(1000, 1020), refused, timeout_ms=4000)
    assert not refused.partition_of, "acknowledged with the followers cut off"
    assert sum(refused.errors.values()) == 20, refused.errors

    cluster.heal()
    full_isr(admin, "cut", 1)
    produce(servers(cluster), "cut", range(2000, 2100), acked)
    read = read_partitions(servers(cluster), "cut", 1)
    check_invariants(read, acked, before)
    assert -1 not in read[0], "a refused record was appended"
    assert_logs_equal(cluster, "cut", read)


def test_leader_cut_off_from_zookeeper(cluster: ProxiedCluster) -> None:
    admin = create_topic(cluster, "zk", 1)
    acked = Acked()
    produce(servers(cluster), "zk", range(0, 200), acked)
    before = read_partitions(servers(cluster), "zk", 1)
    old = leaders(admin, "zk")[0]
    since = log_sizes(cluster)

    background = BackgroundProducer(servers(cluster), "zk", 10_000)
    eventually(lambda: background.acked_count() > 50, "the producer is under way", 60)
    cluster[old].zookeeper_link.blackhole()
    # Asked directly: the old leader, still reachable, answers from its stale view (and
    # librdkafka may well ask it), so a client's Metadata alone proves nothing.
    others = [b for b in cluster if b != old]
    eventually(lambda: all(leader_seen_by(cluster[b], "zk") not in (old, -1) for b in others),
               "a new leader once the old one's session expired", 60)  # fmt: skip
    # Its peers no longer list it (its registration expired): it leaves itself out of
    # Metadata as they do, so that clients stop asking it.
    eventually(lambda: "no longer lists this broker" in cluster[old].log_text()[since[old] :],
               "the old leader learned that its peers dropped it", 60)  # fmt: skip
    acked_then = background.acked_count()
    eventually(lambda: background.acked_count() > acked_then + 100, "producing goes on", 60)
    # The old leader still believes it leads (ZooKeeper cannot tell it otherwise), and
    # clients still reach it: an acks=all write there must not be acknowledged.
    answers: list[object] = []
    probe = threading.Thread(target=lambda: answers.append(_produce_to(cluster[old], b"-7")),
                             daemon=True)  # fmt: skip
    probe.start()
    probe.join(30)
    [answer] = answers
    assert answer.error_code != 0, answer  # type: ignore[attr-defined]

    cluster.heal()
    eventually(lambda: "session expired" in cluster[old].log_text()[since[old] :],
               "the old leader saw its session expire", 60)  # fmt: skip
    converged(cluster, "zk", 1)
    new = leaders(admin_of(cluster), "zk")[0]
    assert new != old
    more = background.stop()
    for value, p in more.partition_of.items():
        acked.partition_of[value] = p
    read = read_partitions(servers(cluster), "zk", 1)
    check_invariants(read, acked, before)
    assert -7 not in read[0], "the cut-off leader's refused write survived"
    assert_logs_equal(cluster, "zk", read)


def test_clients_see_the_client_listener_followers_the_replication_one(
    shared: ProxiedCluster,
) -> None:
    cluster = shared  # left alone: the next test uses it
    create_topic(cluster, "listeners", 1)
    for broker in cluster.values():
        with broker.connect() as conn:
            answer = conn.metadata(["listeners"], version=9)
        assert {(b.node_id, b.port) for b in answer.brokers} == {
            (i, other.port) for i, other in cluster.items()
        }, "Metadata must name each broker's client listener"
    # Replication goes through the proxies: the leader's proxy sees both followers (their
    # fetchers connect once they learn their role, shortly after the topic is made).
    eventually(lambda: sum(b.replication.connections_made for b in cluster.values()) >= 2,
               "both followers fetch through the leader's replication proxy", 60)  # fmt: skip


def test_follower_cut_off_from_its_leader(shared: ProxiedCluster) -> None:
    """Last in the module: it ends stopping the shared cluster's brokers."""
    cluster = shared
    admin = create_topic(cluster, "fol", 1)
    acked = Acked()
    produce(servers(cluster), "fol", range(0, 200), acked)
    leader = leaders(admin, "fol")[0]
    victim = next(b for b in cluster if b != leader)

    background = BackgroundProducer(servers(cluster), "fol", 10_000)
    eventually(lambda: background.acked_count() > 50, "the producer is under way", 60)
    for broker in cluster.values():  # only its fetches are held: the other follower's go on
        broker.replication.blackhole([fetcher_of(victim)])
    # One condition: a second Metadata answer may come from another broker, whose view
    # has not applied the leader's ISR change yet.
    kept = sorted(b for b in cluster if b != victim)
    eventually(lambda: sorted(partitions(admin, "fol")[0][2]) == kept,
               f"{victim} out of the ISR, {kept} in it", 60)  # fmt: skip
    acked_then = background.acked_count()
    eventually(lambda: background.acked_count() > acked_then + 200, "acks=all with 2 of 3", 60)

    cluster.heal()
    full_isr(admin, "fol", 1, timeout_s=60)
    more = background.stop()
    assert not more.errors, more.errors
    for value, p in more.partition_of.items():
        acked.partition_of[value] = p
    read = read_partitions(servers(cluster), "fol", 1)
    check_invariants(read, acked)
    assert_logs_equal(cluster, "fol", read)


def leader_seen_by(broker: ProxiedBroker, topic: str) -> int:
    with broker.connect() as conn:
        response = conn.metadata([topic], version=9)
    return int(response.topics[0].partitions[0].leader_id)


def _produce_to(broker: ProxiedBroker, value: bytes) -> object:
    with broker.connect(timeout=30) as conn:
        return conn.produce("zk", build_batch([(b"z", value)]), acks=-1)


def assert_logs_equal(cluster: ProxiedCluster, topic: str, read: dict[int, list[int]]) -> None:
    """Once every replica is in sync, all three logs are the same bytes."""
    converged(cluster, topic, len(read))
    copies_alike(cluster, topic)
    for broker in cluster.values():
        assert broker.stop() == 0
    logs = {b: partition_bytes(broker, topic, 0) for b, broker in cluster.items()}
    assert len(set(logs.values())) == 1, {b: len(data) for b, data in logs.items()}
