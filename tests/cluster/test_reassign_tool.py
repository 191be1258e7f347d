"""Kafka's own reassignment tool throttles a move in a three-broker cluster (KIP-73).

``kafka-reassign-partitions.sh --execute --throttle N`` (ReassignPartitionsCommand of
org.apache.kafka:kafka-tools 4.4.0, resolved by Maven: tests/kafka_tools) sets, with
IncrementalAlterConfigs, ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` on every broker the move involves (BROKER
resources named by broker id: dynamic broker configs) and the topic's
``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas``,
then starts the move; ``--verify`` reports it done and deletes all four again. Checked:
the configs it set, as confluent-kafka's AdminClient and every broker describe them; the
move copies 2 MB in about 2 MB / rate; afterwards nothing is throttled any more.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka.admin import KafkaAdminClient

from tests.cluster.test_cluster_admin import Cluster, admin_of, create, start_cluster
from tests.cluster.test_cluster_e2e import eventually, every_broker_knows
from tests.cluster.test_cluster_faults import (
    Acked,
    copies_alike,
    partition_bytes,
    producer,
    servers,
)
from tests.kafka_tools import tool
from tests.kafka_tools.classpath import kafka_tools_classpath
from trio_broker.protocol import messages as m

pytestmark = pytest.mark.timeout(300)

TOPIC = "tool-moved"
RATE = 200_000  # bytes per second: about 10 s for the 2 MB written before the move
WRITTEN = 2_000_000
LEADER_LIST = "leader.replication.throttled.replicas"
FOLLOWER_LIST = "follower.replication.throttled.replicas"
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
UNLIMITED = str(2**63 - 1)
DYNAMIC_BROKER_CONFIG = 2  # Kafka's ConfigSource codes
DEFAULT_CONFIG = 5


@pytest.fixture(scope="module")
def tools_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("Kafka's reassignment tool needs Java 17 and Maven"
                    " (scripts/install-system-deps.sh)")  # fmt: skip
    return kafka_tools_classpath(tmp_path_factory.mktemp("kafka-tools"))


@pytest.fixture
def brokers(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    yield from start_cluster(tmp_path, zookeeper)


def reassign(classpath: str, cluster: Cluster, *args: str) -> str:
    return tool.run_tool(classpath, "reassign.ReassignPartitionsCommand", "--bootstrap-server",
                         servers(cluster), *args).stdout  # fmt: skip


def described(admin: AdminClient, kind: ResourceType, name: str) -> dict[str, ConfigEntry]:
    [future] = admin.describe_configs([ConfigResource(kind, name)]).values()
    return dict(future.result(timeout=60))


def pairs(value: str) -> set[str]:
    return {v.strip() for v in value.split(",") if v.strip()}


def topic_configs_at(cluster: Cluster, broker: int) -> dict[str, str]:
    """The topic's configs as one broker describes them (its copy, or ZooKeeper's)."""
    Req = m.DescribeConfigsRequest
    request = Req(
        resources=[Req.DescribeConfigsResource(resource_type=2, resource_name=TOPIC,
                                               configuration_keys=None)],
        include_synonyms=False, include_documentation=False,
    )  # fmt: skip
    with cluster[broker].connect() as conn:
        answer = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request)
    [result] = answer.results
    assert result.error_code == 0, result.error_message
    return {c.name: c.value for c in result.configs}


def test_kafka_reassign_tool_throttles_a_move_and_verify_removes_the_throttles(
    brokers: Cluster, tools_classpath: str, tmp_path: Path
) -> None:
    cluster = brokers
    admin = admin_of(cluster)
    create(cluster, admin, TOPIC, [1, 2])
    acked = Acked()
    writer = producer(servers(cluster))
    for i in range(WRITTEN // 1000):
        writer.produce(TOPIC, value=str(i).rjust(1000).encode(), on_delivery=acked.delivered)
        writer.poll(0)
    assert writer.flush(60) == 0
    assert len(acked.partition_of) == WRITTEN // 1000, acked.errors

    plan = tmp_path / "reassignment.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": 0, "replicas": [2, 3], "log_dirs": ["any", "any"]},
    ]}))  # fmt: skip
    started = time.monotonic()
    out = reassign(tools_classpath, cluster, "--reassignment-json-file", str(plan),
                   "--execute", "--throttle", str(RATE))  # fmt: skip
    assert "Successfully started partition reassignment" in out, out

    # What the tool set: the existing replicas on the leader side, the joining one on the
    # follower side, and both rates on every broker of the move.
    # (Any broker answers, each call perhaps another: one with a copy once its config watch
    # applied the change, so the check is the wait's condition.)
    def throttled_lists() -> tuple[set[str], set[str]]:
        topic = described(admin, ResourceType.TOPIC, TOPIC)
        leader, follower = topic.get(LEADER_LIST), topic.get(FOLLOWER_LIST)
        return (pairs(leader.value or "") if leader else set(),
                pairs(follower.value or "") if follower else set())  # fmt: skip

    eventually(
        lambda: throttled_lists() == ({"0:1", "0:2"}, {"0:3"}),
        "the topic's throttled replicas: leader side 0:1, 0:2, follower side 0:3",
    )
    for broker in (1, 2, 3):
        configs = described(admin, ResourceType.BROKER, str(broker))
        for key in (LEADER_RATE, FOLLOWER_RATE):
            assert (configs[key].value, configs[key].source) == (str(RATE), DYNAMIC_BROKER_CONFIG)
            assert not configs[key].is_read_only
        # Every broker holds the topic configs: its copy follows the config znode.
        eventually(
            lambda b=broker: pairs(topic_configs_at(cluster, b).get(FOLLOWER_LIST, "")) == {"0:3"},
            f"broker {broker} describes the throttled replicas",
        )

    kadmin = KafkaAdminClient(bootstrap_servers=servers(cluster))
    try:
        eventually(lambda: kadmin.list_partition_reassignments() == {}, "the move finished", 240)
    finally:
        kadmin.close()
    took = time.monotonic() - started
    print(f"the throttled move took {took:.1f} s")
    # Throttled: 2 MB at 200 KB/s take about 10 s (no throttle: well under a second). Only
    # the floor is checked: a busy machine makes the move slower, and must not make it red.
    assert took > 0.7 * WRITTEN / RATE, took
    # The tool's --verify compares the plan with a Metadata answer from any broker: wait
    # until every broker's own watch has brought it the move's end, not just one.
    every_broker_knows(
        cluster, TOPIC, 1,
        until=lambda state: state[0][1:] == ([2, 3], [2, 3]), wanted="replicas and ISR 2, 3",
    )  # fmt: skip

    out = reassign(tools_classpath, cluster, "--reassignment-json-file", str(plan), "--verify")
    assert f"Reassignment of partition {TOPIC}-0 is completed" in out, out
    assert "Clearing broker-level throttles" in out and "Clearing topic-level throttles" in out
    for broker in (1, 2, 3):  # 1: no copy any more, ZooKeeper's word; 2 and 3: theirs
        eventually(
            lambda b=broker: not {LEADER_LIST, FOLLOWER_LIST} & set(topic_configs_at(cluster, b)),
            f"broker {broker}: no throttled replicas",
        )
    for broker in (1, 2, 3):
        configs = described(admin, ResourceType.BROKER, str(broker))
        for key in (LEADER_RATE, FOLLOWER_RATE):
            assert (configs[key].value, configs[key].source) == (UNLIMITED, DEFAULT_CONFIG)
    copies_alike({b: cluster[b] for b in (2, 3)}, TOPIC)
    leader_log = partition_bytes(cluster[2], TOPIC, 0)
    assert len(leader_log) > WRITTEN
    for broker in cluster.values():
        assert broker.stop() == 0
    assert partition_bytes(cluster[3], TOPIC, 0) == partition_bytes(cluster[2], TOPIC, 0)


def test_throttle_configs_through_confluent_kafka(brokers: Cluster) -> None:
    """The same configs set by IncrementalAlterConfigs from confluent-kafka: a bad list
    is INVALID_CONFIG, a rate on another broker's resource goes to that broker, and
    DELETE restores the static rate."""
    admin = admin_of(brokers)
    create(brokers, admin, TOPIC, [1, 2])

    def alter(resource: ConfigResource) -> None:
        [future] = admin.incremental_alter_configs([resource]).values()
        future.result(timeout=60)

    def entry(name: str, value: str | None, op: AlterConfigOpType) -> ConfigEntry:
        return ConfigEntry(name, value, incremental_operation=op)

    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    bad = ConfigResource(ResourceType.TOPIC, TOPIC,
                         incremental_configs=[entry(LEADER_LIST, "0:one", SET)])  # fmt: skip
    with pytest.raises(KafkaException) as refused:
        alter(bad)
    assert refused.value.args[0].code() == 40, refused.value  # INVALID_CONFIG
    assert LEADER_LIST in refused.value.args[0].str()
    alter(ConfigResource(ResourceType.TOPIC, TOPIC,
                         incremental_configs=[entry(LEADER_LIST, "*", SET)]))  # fmt: skip
    for broker in (1, 2, 3):
        eventually(
            lambda b=broker: topic_configs_at(brokers, b).get(LEADER_LIST) == "*",
            f"broker {broker} describes {LEADER_LIST}=*",
        )
    for broker in (1, 3):
        alter(ConfigResource(ResourceType.BROKER, str(broker),
                             incremental_configs=[entry(LEADER_RATE, "1234", SET)]))  # fmt: skip
    for broker, value in ((1, "1234"), (2, UNLIMITED), (3, "1234")):
        assert described(admin, ResourceType.BROKER, str(broker))[LEADER_RATE].value == value
    alter(ConfigResource(ResourceType.BROKER, "3",
                         incremental_configs=[entry(LEADER_RATE, None, DELETE)]))  # fmt: skip
    configs = described(admin, ResourceType.BROKER, "3")
    assert (configs[LEADER_RATE].value, configs[LEADER_RATE].source) == (UNLIMITED, DEFAULT_CONFIG)
    with pytest.raises(KafkaException):
        alter(ConfigResource(ResourceType.BROKER, "1",
                             incremental_configs=[entry(FOLLOWER_RATE, "-5", SET)]))  # fmt: skip
    # Restarted, broker 1 keeps its dynamic rate (dynamic-broker-configs.json).
    brokers[1].stop()
    brokers[1].start()
    fresh = admin_of(brokers)
    eventually(lambda: len(fresh.list_topics(timeout=5).brokers) == 3, "broker 1 is back")
    eventually(
        lambda: described(fresh, ResourceType.BROKER, "1")[LEADER_RATE].value == "1234",
        "broker 1 still throttles at 1234 B/s",
    )
