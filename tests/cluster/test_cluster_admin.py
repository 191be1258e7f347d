"""Administering a three-broker cluster with real clients: leader elections (ElectLeaders).

Real ZooKeeper, three ``trio-broker serve`` processes, confluent-kafka's and
kafka-python's admin clients (both send ElectLeaders to the controller that Metadata
names). Scenarios:

- preferred election: the preferred leader returns after a restart, the admin moves
  leadership back to it; asking again is ELECTION_NOT_NEEDED; an unknown partition is
  UNKNOWN_TOPIC_OR_PARTITION; a broker that is not the controller answers NOT_CONTROLLER;
- unclean election: the only in-sync replica is gone and an out-of-sync one is alive;
  the preferred election is PREFERRED_LEADER_NOT_AVAILABLE, the partition stays offline
  (``unclean.leader.election.enable`` is false) until the admin asks for an unclean
  election, which makes the live replica leader with an ISR of itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

from tests.cluster.test_cluster_e2e import eventually, partitions
from tests.cluster.test_cluster_faults import CONFIG, ConfiguredBroker
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(180)

Cluster = dict[int, ConfiguredBroker]


@pytest.fixture
def brokers(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    config = tmp_path / "broker.properties"
    config.write_text(CONFIG)
    cluster = {
        b: ConfiguredBroker(tmp_path / f"broker{b}", b, zookeeper, config) for b in (1, 2, 3)
    }
    try:
        for broker in cluster.values():
            broker.start()
        yield cluster
    finally:
        for broker in cluster.values():
            if broker.running:
                broker.stop()


def admin_of(cluster: Cluster) -> AdminClient:
    bootstrap = ",".join(b.bootstrap for b in cluster.values() if b.running)
    return AdminClient({"bootstrap.servers": bootstrap, "topic.metadata.refresh.interval.ms": 500})


def create(admin: AdminClient, topic: str, replicas: list[int]) -> None:
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 3, "three brokers listed")
    [future] = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replica_assignment=[replicas])]
    ).values()
    future.result(timeout=30)
    eventually(
        lambda: partitions(admin, topic).get(0, (0, [], []))[2] == replicas,
        f"{topic}-0 led by {replicas[0]} with ISR {replicas}",
    )


def elect(admin: AdminClient, election_type: ElectionType, topic: str, partition: int = 0) -> int:
    """The partition's error code from confluent-kafka's elect_leaders (0: elected)."""
    tp = TopicPartition(topic, partition)
    result = admin.elect_leaders(election_type, [tp]).result(timeout=40)
    [(answered, error)] = result.items()
    assert (answered.topic, answered.partition) == (topic, partition)
    if error is None:
        return 0
    assert isinstance(error, KafkaError), error
    return int(error.code())


def controller_id(admin: AdminClient) -> int:
    return int(admin.list_topics(timeout=5).controller_id)


def test_preferred_election_moves_leadership_back(brokers: Cluster) -> None:
    admin = admin_of(brokers)
    create(admin, "preferred", [1, 2, 3])
    brokers[1].stop()  # SIGTERM, a graceful stop: leadership moves to broker 2
    brokers[1].start()
    # Back in the ISR, but not leading: the imbalance check runs every 300 s.
    eventually(
        lambda: (state := partitions(admin, "preferred")[0])[0] == 2 and len(state[2]) == 3,
        "broker 1 back in the ISR of preferred-0, broker 2 leading",
    )
    assert elect(admin, ElectionType.PREFERRED, "preferred") == 0
    eventually(lambda: partitions(admin, "preferred")[0][0] == 1, "broker 1 leads again")
    assert elect(admin, ElectionType.PREFERRED, "preferred") == ErrorCode.ELECTION_NOT_NEEDED
    assert elect(admin, ElectionType.UNCLEAN, "preferred") == ErrorCode.ELECTION_NOT_NEEDED
    assert (
        elect(admin, ElectionType.PREFERRED, "preferred", 7) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )

    # kafka-python's admin (it names the partitions itself): nothing needs an election.
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        response = kadmin.elect_leaders(0, {"preferred": [0]}, raise_errors=False)
        assert response.error_code == 0
        [result] = response.replica_election_results
        assert [(p.partition_id, p.error_code) for p in result.partition_result] == [
            (0, ErrorCode.ELECTION_NOT_NEEDED)
        ]
    finally:
        kadmin.close()

    # Any broker but the controller refuses, so that clients look the controller up.
    controller = controller_id(admin)
    other = next(b for i, b in brokers.items() if i != controller)
    request = m.ElectLeadersRequest(
        election_type=0,
        topic_partitions=[m.ElectLeadersRequest.TopicPartitions(topic="preferred", partitions=[0])],
        timeout_ms=5000,
    )
    with other.connect() as conn:
        answer = conn.request(m.ApiKey.ELECT_LEADERS, 2, request)
    assert answer.error_code == ErrorCode.NOT_CONTROLLER
    [result] = answer.replica_election_results
    assert [p.error_code for p in result.partition_result] == [ErrorCode.NOT_CONTROLLER]
    # All partitions (null): as Kafka, only those that needed an election are listed.
    everything = m.ElectLeadersRequest(election_type=0, topic_partitions=None, timeout_ms=5000)
    with brokers[controller].connect() as conn:
        answer = conn.request(m.ApiKey.ELECT_LEADERS, 2, everything)
    assert (answer.error_code, answer.replica_election_results) == (0, [])


def test_unclean_election_on_request_only(brokers: Cluster) -> None:
    admin = admin_of(brokers)
    create(admin, "unclean", [1, 2])
    brokers[2].kill9()  # the follower falls out of the ISR after replica.lag.time.max.ms
    eventually(lambda: partitions(admin, "unclean")[0][2] == [1], "ISR of unclean-0 is [1]")
    brokers[1].kill9()  # the last in-sync replica: the partition goes offline
    # A broker id comes back only once ZooKeeper dropped the killed session's registration.
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 1, "only broker 3 left")
    brokers[2].start()
    eventually(
        lambda: (
            len(admin.list_topics(timeout=5).brokers) == 2
            and partitions(admin, "unclean")[0][0] == -1
        ),
        "unclean-0 offline with brokers 2 and 3 up",
    )
    assert (
        elect(admin, ElectionType.PREFERRED, "unclean") == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    )
    assert partitions(admin, "unclean")[0][0] == -1, "no election without being asked"
    assert elect(admin, ElectionType.UNCLEAN, "unclean") == 0
    eventually(
        lambda: partitions(admin, "unclean")[0][::2] == (2, [2]),
        "broker 2 leads unclean-0, alone in its ISR",
    )
    assert elect(admin, ElectionType.UNCLEAN, "unclean") == ErrorCode.ELECTION_NOT_NEEDED
