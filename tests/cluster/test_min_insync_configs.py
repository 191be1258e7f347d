"""min.insync.replicas in a cluster whose brokers set it to 2: what acks=all gets, and what
DescribeConfigs says a topic inherits. Real ``serve`` processes (three brokers, a private
ZooKeeper), confluent-kafka and our codec.

- A topic of one replica takes idempotent acks=all writes: the effective min ISR is
  min(min.insync.replicas, replicas), as in Kafka since 3.7 (before: NOT_ENOUGH_REPLICAS
  forever).
- A topic of two replicas: every broker (also one that holds no copy) describes its
  min.insync.replicas as 2 from STATIC_BROKER_CONFIG, and 2 is what is enforced: with the
  follower stopped, acks=all is refused. A dynamic broker config set on one broker shows
  on that broker's description of the topic as DYNAMIC_BROKER_CONFIG.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_e2e import eventually, every_broker_knows, partitions
from tests.cluster.test_cluster_faults import Cluster, servers, three_brokers
from trio_broker.handlers.describe_configs import (
    DEFAULT_CONFIG,
    DYNAMIC_BROKER_CONFIG,
    STATIC_BROKER_CONFIG,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

CONFIG = (
    "min.insync.replicas=2\n"
    "replica.lag.time.max.ms=3000\n"
    "default.replication.factor=3\n"
    "zookeeper.session.timeout.ms=4000\n"
    "log.retention.hours=2\n"
)
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str) -> Iterator[Cluster]:
    """One cluster for the module (a start saved): the first test leaves the brokers
    alone; the second, which stops one and changes a broker config, runs last. Each
    has a topic of its own."""
    with three_brokers(tmp_path_factory.mktemp("configs"), module_zookeeper, CONFIG) as brokers:
        yield brokers


def create(cluster: Cluster, topic: str, replicas: list[int]) -> int:
    """One partition on ``replicas``, created once every broker has registered; returns
    its leader."""
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 3, "three brokers listed")
    new = NewTopic(topic, num_partitions=1, replica_assignment=[replicas])

    def created() -> bool:
        [future] = admin.create_topics([new]).values()
        try:
            future.result(timeout=60)
        except KafkaException as exc:  # a broker that has not yet seen all three register
            if exc.args[0].code() != KafkaError.INVALID_REPLICA_ASSIGNMENT:
                raise
            return False
        return True

    eventually(created, f"{topic} created", 60)
    settled: list[int] = []

    def led_and_in_sync() -> bool:
        # .get: a broker that has not read the new topic yet answers no partitions, and one
        # that has read the topic but not its state znode answers leader -1 and no ISR (ci19
        # asked such a broker for the leader right after another had answered "in sync").
        leader, _, isr = partitions(admin, topic).get(0, (-1, [], []))
        if leader < 0 or sorted(isr) != sorted(replicas):
            return False
        settled.append(leader)
        return True

    eventually(led_and_in_sync, f"{topic}: led, every replica in sync", 60)
    leader = settled[-1]

    def everywhere() -> bool:
        # The broker that answered may have read the state znode before the others, the
        # leader among them (which then answers NOT_LEADER_OR_FOLLOWER, leader -1).
        for broker in cluster.values():
            with broker.connect() as conn:
                [meta] = conn.metadata([topic], version=9).topics
            state = [(p.leader_id, sorted(p.isr_nodes)) for p in meta.partitions]
            if state != [(leader, sorted(replicas))]:
                return False
        return True

    eventually(everywhere, f"{topic}: every broker names leader {leader}", 60)

    def leader_leads() -> bool:
        # Metadata names the leader from the cluster's view (ZooKeeper) before that broker
        # has started its term (the log's flush and the epoch's start run in a worker thread
        # first); until then its own answer is NOT_LEADER_OR_FOLLOWER (ci4, a loaded machine:
        # the test's first produce got error 6 right after every broker named the leader).
        try:
            with cluster[leader].connect() as conn:
                conn.end_offset(topic)
        except AssertionError:  # end_offset's check of the ListOffsets error code
            return False
        return True

    eventually(leader_leads, f"{topic}: broker {leader} answers as its leader", 60)
    return leader


def describe_topic(cluster: Cluster, broker: int, topic: str) -> dict[str, Any]:
    """DescribeConfigs v4 with synonyms, asked of one broker: name -> config entry."""
    Req = m.DescribeConfigsRequest
    request = Req(
        resources=[
            Req.DescribeConfigsResource(
                resource_type=TOPIC_RESOURCE, resource_name=topic, configuration_keys=None
            )
        ],
        include_synonyms=True,
        include_documentation=False,
    )
    with cluster[broker].connect() as conn:
        (result,) = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request).results
    assert result.error_code == 0, result
    return {c.name: c for c in result.configs}


def test_acks_all_to_a_topic_of_one_replica_under_min_insync_2(cluster: Cluster) -> None:
    create(cluster, "single", [2])
    delivered: list[Any] = []
    producer = Producer({
        "bootstrap.servers": servers(cluster), "enable.idempotence": True,
        "message.timeout.ms": 30_000,
    })  # fmt: skip
    for i in range(5):
        producer.produce(
            "single", key=b"k", value=b"v%d" % i, on_delivery=lambda e, msg: delivered.append(e)
        )
    assert producer.flush(60) == 0, "records still in flight"
    assert delivered == [None] * 5, delivered
    # What the leader says when asked directly: acks=all taken at once.
    with cluster[2].connect() as conn:
        assert conn.produce("single", build_batch([(b"k", b"raw")]), acks=-1).error_code == 0
        assert conn.end_offset("single") == 6


def test_the_min_insync_replicas_described_is_the_one_enforced(cluster: Cluster) -> None:
    """Last in the module: it stops a broker of the shared cluster."""
    leader = create(cluster, "pair", [1, 2])
    follower = 3 - leader
    for broker in (1, 2, 3):  # broker 3 holds no copy: it reads the topic from ZooKeeper
        configs = describe_topic(cluster, broker, "pair")
        entry = configs["min.insync.replicas"]
        assert (entry.value, entry.config_source) == ("2", STATIC_BROKER_CONFIG), broker
        assert [(s.name, s.value, s.source) for s in entry.synonyms] == [
            ("min.insync.replicas", "2", STATIC_BROKER_CONFIG),
            ("min.insync.replicas", "1", DEFAULT_CONFIG),
        ]
        retention = configs["retention.ms"]
        assert (retention.value, retention.config_source) == ("7200000", STATIC_BROKER_CONFIG)

    with cluster[leader].connect() as conn:
        assert conn.produce("pair", build_batch([(b"a", b"1")]), acks=-1).error_code == 0
    assert cluster[follower].stop() == 0
    # The controller shrinks the ISR when the follower's session ends; the leader, asked
    # below, applies that from its own watch, maybe after broker 3 answered a client.
    every_broker_knows(
        cluster, "pair", 1, 60,
        until=lambda state: state[0][2] == [leader], wanted=f"ISR shrunk to [{leader}]",
    )  # fmt: skip
    with cluster[leader].connect() as conn:
        answer = conn.produce("pair", build_batch([(b"a", b"2")]), acks=-1)
        assert answer.error_code == ErrorCode.NOT_ENOUGH_REPLICAS, answer

        # A dynamic broker config set on the leader shows on its description of the topic.
        Req = m.IncrementalAlterConfigsRequest
        Res = Req.AlterConfigsResource
        change = Res.AlterableConfig(name="log.retention.ms", config_operation=0, value="60000")
        request = Req(
            resources=[
                Res(resource_type=BROKER_RESOURCE, resource_name=str(leader), configs=[change])
            ],
            validate_only=False,
        )
        (altered,) = conn.request(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request).responses
        assert altered.error_code == 0, altered
    retention = describe_topic(cluster, leader, "pair")["retention.ms"]
    assert (retention.value, retention.config_source) == ("60000", DYNAMIC_BROKER_CONFIG)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("log.retention.ms", "60000", DYNAMIC_BROKER_CONFIG),
        ("log.retention.hours", "2", STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", DEFAULT_CONFIG),
    ]
