"""Internal topics and topic configs in a three-broker cluster, as Kafka behaves.

Real ZooKeeper, three ``trio-broker serve`` processes, confluent-kafka's AdminClient and
raw requests (to pick the broker that answers):

- ``__consumer_offsets`` is listed with ``is_internal`` true (describe_topics), a
  client's Produce into it is INVALID_TOPIC_EXCEPTION, and DescribeConfigs describes it;
- DescribeConfigs and IncrementalAlterConfigs for a topic of one replica, sent to a
  broker without a copy, are answered from ZooKeeper, and the replica applies the change;
- a broker down while its topics were deleted (one of them made again under its name,
  with a new id) deletes its stray copies when it returns, and replicates the new topic.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from tests.cluster.test_cluster_admin import Cluster, admin_of, create, start_cluster
from tests.cluster.test_cluster_e2e import eventually, every_broker_knows, partitions
from tests.cluster.test_cluster_faults import CONFIG, partition_bytes
from trio_broker.cluster.topic_admin import encode_configs
from trio_broker.cluster.zk_layout import TopicAssignment, topic_config_path, topic_path
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

OFFSETS = "__consumer_offsets"
#: offsets.topic.num.partitions in the brokers' CONFIG.
OFFSETS_PARTITIONS = int(re.findall(r"offsets\.topic\.num\.partitions=(\d+)", CONFIG)[-1])
TOPIC_RESOURCE = 2
SET = 0


def find_group_coordinator(cluster: Cluster, group: str) -> int:
    """FindCoordinator v3's error code (the first call makes ``__consumer_offsets``)."""
    with cluster[1].connect() as conn:
        answer = conn.request(
            m.ApiKey.FIND_COORDINATOR, 3, m.FindCoordinatorRequest(key=group, key_type=0)
        )
    return int(answer.error_code)


def describe_configs(cluster: Cluster, broker: int, topic: str) -> tuple[int, dict[str, str]]:
    Req = m.DescribeConfigsRequest
    request = Req(
        resources=[Req.DescribeConfigsResource(resource_type=TOPIC_RESOURCE, resource_name=topic,
                                               configuration_keys=None)],
        include_synonyms=True, include_documentation=False,
    )  # fmt: skip
    with cluster[broker].connect() as conn:
        [result] = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request).results
    return int(result.error_code), {c.name: c.value for c in result.configs}


def set_config(cluster: Cluster, broker: int, topic: str, name: str, value: str) -> int:
    Res = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    request = m.IncrementalAlterConfigsRequest(
        resources=[Res(resource_type=TOPIC_RESOURCE, resource_name=topic, configs=[
            Res.AlterableConfig(name=name, config_operation=SET, value=value)])],
        validate_only=False,
    )  # fmt: skip
    with cluster[broker].connect() as conn:
        [answer] = conn.request(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request).responses
    return int(answer.error_code)


def produce(cluster: Cluster, broker: int, topic: str, value: bytes, acks: int = -1) -> int:
    with cluster[broker].connect() as conn:
        answer = conn.request(
            m.ApiKey.PRODUCE, 9, conn.produce_body(topic, build_batch([(b"k", value)]), acks)
        )
    return int(answer.responses[0].partition_responses[0].error_code)


def put(cluster: Cluster, admin: AdminClient, topic: str, value: bytes) -> bool:
    """One record into ``topic``-0 through its leader, acks=all; True once taken."""
    leader = partitions(admin, topic).get(0, (-1,))[0]
    return leader in cluster and produce(cluster, leader, topic, value) == ErrorCode.NONE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str) -> Iterator[Cluster]:
    """One cluster for the module (a start saved): the first test leaves the brokers
    alone; the second, which stops broker 2 and at the end all three, runs last. Each
    has topics of its own."""
    yield from start_cluster(tmp_path_factory.mktemp("internal"), module_zookeeper)


def test_internal_topics_and_configs_from_any_broker(cluster: Cluster) -> None:
    admin = admin_of(cluster)
    eventually(lambda: find_group_coordinator(cluster, "g") == ErrorCode.NONE, "a coordinator")
    # Broker 1 made the topic; the admin's answers below and broker 2's DescribeConfigs
    # come from brokers that learn of it from their own watches, maybe later.
    every_broker_knows(cluster, OFFSETS, OFFSETS_PARTITIONS)
    assert OFFSETS in admin.list_topics(timeout=5).topics
    [(_, future)] = admin.describe_topics(TopicCollection([OFFSETS])).items()
    assert future.result(timeout=60).is_internal
    create(cluster, admin, "solo", [3])
    [(_, plain)] = admin.describe_topics(TopicCollection(["solo"])).items()
    assert not plain.result(timeout=60).is_internal

    # Only the coordinators write internal topics: any broker refuses a client.
    assert produce(cluster, 1, OFFSETS, b"forged") == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert produce(cluster, 1, OFFSETS, b"forged", acks=1) == ErrorCode.INVALID_TOPIC_EXCEPTION
    error, offsets_configs = describe_configs(cluster, 2, OFFSETS)
    assert error == ErrorCode.NONE and offsets_configs.get("cleanup.policy") == "compact"

    # "solo" lives on broker 3 alone: broker 1 answers from ZooKeeper and its change
    # reaches broker 3's copy (which answers from its own catalogue).
    eventually(lambda: describe_configs(cluster, 1, "solo")[0] == ErrorCode.NONE, "solo known")
    assert "retention.ms" in describe_configs(cluster, 1, "solo")[1]
    assert not (cluster[1].data_dir / "solo-0").exists()  # broker 1 holds no copy
    assert set_config(cluster, 1, "solo", "retention.ms", "12345") == ErrorCode.NONE
    assert describe_configs(cluster, 1, "solo")[1]["retention.ms"] == "12345"
    eventually(
        lambda: describe_configs(cluster, 3, "solo")[1].get("retention.ms") == "12345",
        "broker 3 applies the change broker 1 took",
    )
    assert set_config(cluster, 1, "solo", "retention.ms", "-7") == ErrorCode.INVALID_CONFIG
    assert set_config(cluster, 1, "nowhere", "retention.ms", "1") == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert describe_configs(cluster, 1, "nowhere")[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_stray_copies_go_when_their_broker_returns(cluster: Cluster, module_zookeeper: str) -> None:
    """Last in the module: it stops the shared cluster's brokers."""
    zookeeper = module_zookeeper
    admin = admin_of(cluster)
    for topic in ("doomed", "reborn"):
        create(cluster, admin, topic, [2, 3])
        eventually(lambda topic=topic: put(cluster, admin, topic, b"old-record"), topic)
    cluster[2].stop()
    eventually(lambda: 2 not in admin.list_topics(timeout=5).brokers, "broker 2 gone")
    for future in admin.delete_topics(["doomed", "reborn"]).values():
        future.result(timeout=60)
    zk = KazooClient(hosts=zookeeper)
    zk.start(timeout=30)
    try:
        eventually(lambda: zk.exists(topic_path("reborn")) is None, "reborn deleted")
        # Made again on broker 2 while it is away (as Kafka's ZooKeeper-era tools could):
        # same name, a new topic id.
        zk.create(topic_config_path("reborn"), encode_configs({}), makepath=True)
        assignment = TopicAssignment(uuid.uuid4(), {0: (2, 3)})
        zk.create(topic_path("reborn"), assignment.encode(), makepath=True)
    finally:
        zk.stop()
        zk.close()
    eventually(lambda: partitions(admin, "reborn").get(0, (-1,))[0] == 3, "reborn led by 3")
    assert (cluster[2].data_dir / "doomed-0").exists()

    cluster[2].start()
    eventually(lambda: not (cluster[2].data_dir / "doomed-0").exists(), "doomed's copy deleted")
    eventually(lambda: partitions(admin, "reborn")[0][2] == [2, 3], "broker 2 back in the ISR")
    eventually(lambda: put(cluster, admin, "reborn", b"new-record"), "a record in the new reborn")
    for broker in cluster.values():
        assert broker.stop() == 0
    copy = partition_bytes(cluster[2], "reborn", 0)
    assert copy == partition_bytes(cluster[3], "reborn", 0)
    assert b"new-record" in copy and b"old-record" not in copy
