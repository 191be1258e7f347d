"""Replication over a secured inter-broker listener: TLS and SCRAM between brokers.

Three ``serve`` processes; clients use a PLAINTEXT listener, followers the SASL_SSL one
(``inter.broker.listener.name=REPLICATION``): the leader's certificate is checked against
the CA (and its host name), then the follower logs in with SCRAM-SHA-512 as the user
named by ``listener.name.replication.scram-sha-512.sasl.jaas.config``, which exists on
every broker (``trio-broker users add``). ``min.insync.replicas=3`` makes an acks=all
write prove that both followers fetched it. A broker configured with a wrong password
cannot follow (it stays out of the ISR, acks=all is refused), and every record written
is there once it is given the right one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_e2e import eventually, every_broker_lists, partitions
from tests.cluster.test_cluster_faults import (
    Cluster,
    ConfiguredBroker,
    admin_of,
    create_topic,
    running,
)
from tests.e2e.conftest import add_scram_user

pytestmark = pytest.mark.timeout(300)

USER, PASSWORD = "replicator", "s3cret-for-brokers"
TOPIC = "secured"


def config_text(pki: Path, password: str) -> str:
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{USER}" password="{password}";'
    )
    return (
        "listeners=PLAINTEXT://127.0.0.1:0,REPLICATION://127.0.0.1:0\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,REPLICATION:SASL_SSL\n"
        "inter.broker.listener.name=REPLICATION\n"
        "listener.name.replication.sasl.enabled.mechanisms=SCRAM-SHA-512\n"
        f"listener.name.replication.scram-sha-512.sasl.jaas.config={jaas}\n"
        f"ssl.keystore.location={pki / 'server.pem'}\n"
        f"ssl.truststore.location={pki / 'ca.pem'}\n"
        "min.insync.replicas=3\n"
        "default.replication.factor=3\n"
        "replica.lag.time.max.ms=3000\n"
        "zookeeper.session.timeout.ms=4000\n"
        "offsets.topic.num.partitions=1\n"
    )


@contextlib.contextmanager
def secured_cluster(tmp_path: Path, zookeeper: str, passwords: dict[int, str]) -> Iterator[Cluster]:
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(pki / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pki / "server.pem"))
    brokers: Cluster = {}
    for b in (1, 2, 3):
        config = tmp_path / f"broker{b}.properties"
        config.write_text(config_text(pki, passwords[b]))
        brokers[b] = ConfiguredBroker(tmp_path / f"broker{b}", b, zookeeper, config)
        add_scram_user(brokers[b].data_dir, USER, PASSWORD)
    with running(brokers):
        yield brokers


def isr_of(admin: AdminClient) -> list[int]:
    return partitions(admin, TOPIC).get(0, (-1, [], []))[2]


def leader_of(admin: AdminClient) -> int:
    return partitions(admin, TOPIC).get(0, (-1, [], []))[0]


def produce(cluster: Cluster, values: range, *, retry: bool = True) -> list[str]:
    """acks=all; returns the delivery errors. With ``retry`` librdkafka retries what is
    retriable (NOT_ENOUGH_REPLICAS while a restarted follower rejoins) for 30 s."""
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": ",".join(b.bootstrap for b in cluster.values() if b.running),
        "acks": "all", "message.timeout.ms": 30000, "retries": 2**31 - 1 if retry else 0,
    })  # fmt: skip
    for value in values:
        producer.produce(TOPIC, str(value).encode(), partition=0,
                         on_delivery=lambda err, _msg: err and errors.append(err.name()))  # fmt: skip
    assert producer.flush(45) == 0
    return errors


def test_followers_log_in_over_tls_and_scram(tmp_path: Path, zookeeper: str) -> None:
    with secured_cluster(tmp_path, zookeeper, dict.fromkeys((1, 2, 3), PASSWORD)) as cluster:
        admin = create_topic(cluster, TOPIC, 1)  # waits for three in-sync replicas
        assert produce(cluster, range(100)) == []
        # The leader goes (kill -9): the new one's followers log in to it the same way.
        [(leader, _, _)] = partitions(admin, TOPIC).values()
        cluster[leader].kill9()
        admin = admin_of(cluster, without=(leader,))
        # Its ZooKeeper session must expire first (a restart meanwhile finds its broker id
        # still registered and stops, as Kafka's broker does): the controller then moves
        # the leadership.
        eventually(lambda: leader_of(admin) not in (leader, -1), "a new leader")
        cluster[leader].start()
        admin = admin_of(cluster)
        eventually(lambda: all(len(isr) == 3 for _, _, isr in partitions(admin, TOPIC).values()),
                   "three in-sync replicas again after the leader's kill -9")  # fmt: skip
        assert produce(cluster, range(100, 200)) == []


def test_a_broker_with_the_wrong_password_cannot_follow(tmp_path: Path, zookeeper: str) -> None:
    passwords = {1: PASSWORD, 2: PASSWORD, 3: "not-the-password"}
    with secured_cluster(tmp_path, zookeeper, passwords) as cluster:
        admin = admin_of(cluster)
        every_broker_lists(cluster)
        # Broker 1 leads; broker 3 must log in to it to follow, and cannot.
        [future] = admin.create_topics(
            [NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2, 3]])]
        ).values()
        future.result(timeout=60)
        eventually(lambda: "login" in cluster[3].log_text(), "broker 3 logs its refused login")
        eventually(lambda: sorted(isr_of(admin)) == [1, 2],
                   "broker 3 leaves the ISR (it fetches nothing)")  # fmt: skip
        errors = produce(cluster, range(10), retry=False)
        assert errors and set(errors) == {"NOT_ENOUGH_REPLICAS"}, errors
        # Given the right password, it follows: acks=all with all three works again.
        cluster[3].stop()
        cluster[3].config.write_text(
            cluster[3].config.read_text().replace("not-the-password", PASSWORD)
        )
        cluster[3].start()
        eventually(lambda: sorted(isr_of(admin)) == [1, 2, 3],
                   "broker 3 back in the ISR")  # fmt: skip
        assert produce(cluster, range(10, 20)) == []
