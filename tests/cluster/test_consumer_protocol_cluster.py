"""KIP-848 consumer groups (group.protocol=consumer) in a three-broker cluster.

Real ``serve`` processes on a real ZooKeeper, RF=3 everywhere (``__consumer_offsets``
too). A KIP-848 group lives where a classic one does: with the leader of its
``__consumer_offsets`` partition, stored there as records its followers copy. Two
librdkafka members share a topic and commit what they read; the coordinator is killed
with -9; the new coordinator (a follower of that partition until then) restored the
group from its replica: the members carry on with their heartbeats there, read every
record produced after the kill exactly once between them, and what they commit is
there for a new member of the group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.cluster import test_groups_replicated as replicated_groups
from tests.cluster.test_cluster_e2e import eventually
from tests.cluster.test_cluster_faults import Cluster, create_topic, servers, three_brokers
from tests.cluster.test_groups_replicated import TOPIC, coordinator_of, produce
from trio_broker.protocol import messages as m

#: The classic groups' tests' config (50 offsets partitions, RF=3), with heartbeats every
#: second: the members learn of their shares at heartbeats, and at the default 5 s the
#: test spent most of its time waiting for them. Sessions stay as shipped (45 s), so the
#: members outlive the coordinator's kill and its successor's load on a busy machine.
KIP848_CONFIG = replicated_groups.GROUP_CONFIG + "group.consumer.heartbeat.interval.ms=1000\n"


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, KIP848_CONFIG) as brokers:
        yield brokers


pytestmark = pytest.mark.timeout(300)

PARTITIONS = 4
GROUP = "kip848-cluster"


def member(bootstrap: str, name: str) -> Consumer:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": GROUP, "group.protocol": "consumer",
        "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip
    consumer.subscribe([TOPIC])
    return consumer


def read_until(
    members: list[Consumer], wanted: dict[int, set[int]], timeout_s: float = 90.0
) -> dict[int, list[int]]:
    """Poll every member, committing each record read, until each partition's wanted
    offsets were read: partition -> offsets read, in order (duplicates kept)."""
    read: dict[int, list[int]] = {}
    deadline = time.monotonic() + timeout_s
    while any(offsets - set(read.get(p, [])) for p, offsets in wanted.items()):
        assert time.monotonic() < deadline, f"read {read}, wanted {wanted}"
        for consumer in members:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            read.setdefault(msg.partition(), []).append(msg.offset())
            consumer.commit(message=msg, asynchronous=False)
    return read


#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR.
RETRIABLE = (14, 15, 16)


def describe_members(cluster: Cluster, coordinator: int) -> list[str] | None:
    """ConsumerGroupDescribe of GROUP, asked of its coordinator: the members' client ids
    (None while it is still loading the group, or no longer the coordinator)."""
    with cluster[coordinator].connect() as conn:
        answer = conn.request(
            m.ApiKey.CONSUMER_GROUP_DESCRIBE, 0,
            m.ConsumerGroupDescribeRequest(group_ids=[GROUP], include_authorized_operations=False),
        )  # fmt: skip
    [group] = answer.groups
    if group.error_code in RETRIABLE:
        return None
    assert group.error_code == 0, group
    return sorted(mem.client_id for mem in group.members)


def test_a_consumer_group_survives_a_kill_9_of_its_coordinator(cluster: Cluster) -> None:
    create_topic(cluster, TOPIC, PARTITIONS)
    for partition in range(PARTITIONS):
        produce(servers(cluster), partition, range(5))
    members = [member(servers(cluster), name) for name in ("m1", "m2")]
    try:
        first = read_until(members, {p: set(range(5)) for p in range(PARTITIONS)})
        assert all(sorted(set(o)) == list(range(5)) for o in first.values()), first

        def shared() -> bool:
            for consumer in members:  # polls apply the assignments the heartbeats bring
                assert consumer.poll(0.1) is None, "a record nobody produced"
            return all(len(c.assignment()) == 2 for c in members)

        eventually(shared, "the two members share the four partitions", 60)
        old = coordinator_of(cluster, GROUP)
        assert describe_members(cluster, old) == ["m1", "m2"]

        cluster[old].kill9()
        eventually(lambda: coordinator_of(cluster, GROUP, without=(old,)) not in (old, -1),
                   "a new coordinator", 60)  # fmt: skip
        new = coordinator_of(cluster, GROUP, without=(old,))
        # The new coordinator restored the group from its replica of the partition.
        eventually(lambda: describe_members(cluster, new) is not None,
                   "the new coordinator loaded the group", 60)  # fmt: skip
        assert describe_members(cluster, new) == ["m1", "m2"]

        for partition in range(PARTITIONS):
            produce(servers(cluster), partition, range(5, 10))
        after = read_until(members, {p: set(range(5, 10)) for p in range(PARTITIONS)})
        # Each record after the kill once: the members went on from what they
        # committed, not from the start and not twice.
        assert after == {p: list(range(5, 10)) for p in range(PARTITIONS)}, after
    finally:
        for consumer in members:
            consumer.close()

    probe = Consumer({"bootstrap.servers": servers(cluster), "group.id": GROUP,
                      "group.protocol": "consumer"})  # fmt: skip
    try:
        committed = probe.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30
        )
    finally:
        probe.close()
    assert {tp.partition: tp.offset for tp in committed} == dict.fromkeys(range(PARTITIONS), 10)
