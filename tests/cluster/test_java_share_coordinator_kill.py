"""The Java ``KafkaShareConsumer`` across a kill -9 of its share group's coordinator
(issue 32): the new coordinator has the member from the group's records in
``__consumer_offsets`` (groups/share_records.py: Kafka's ShareGroupMemberMetadata,
target assignment and ShareGroupCurrentMemberAssignment), and the member goes on
heartbeating with the epoch it holds, without a FENCED_MEMBER_EPOCH or
UNKNOWN_MEMBER_ID rejoin.

Three broker processes; a topic of one partition. The group is picked so that its
coordinator leads neither the partition nor the ``__share_group_state`` partition of
the group's share partition: the kill takes the group's membership alone. Maven runs
``tests/jvm``'s ``ShareCoordinatorKillTest``, which consumes, kills the coordinator
(its pid from here), lets a second member join and checks the group's epoch: one
epoch on (the join), where a first member that rejoined would make it two
(the JUnit test's comment says how).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_cluster_faults import (
    create_topic,
    leaders,
    three_brokers,
)
from tests.cluster.test_java_consumer_protocol_cluster import run_java_cluster_test
from tests.cluster.test_share_admin_cluster import share_roles
from tests.cluster.test_share_state_cluster import (
    CONFIG,
    Cluster,
)
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S

pytestmark = pytest.mark.timeout(MAVEN_TIMEOUT_S + 300)


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


def test_a_java_share_consumer_keeps_its_epoch_across_its_coordinators_kill_9(
    cluster: Cluster,
) -> None:
    topic = f"jobs-{uuid.uuid4().hex[:8]}"
    admin = create_topic(cluster, topic, 1)
    data_leader = leaders(admin, topic)[0]
    roles = share_roles(cluster, admin, topic, data_leader)

    def coordinator_alone(group: str) -> int | None:
        """The group's coordinator, if it leads neither the data nor its share state."""
        coordinator = roles.coordinator(group)
        return None if coordinator in (data_leader, roles.share_coordinator(group)) else coordinator

    group, coordinator = next(
        (g, c) for g in (f"jsg-{i}" for i in range(2000))
        if (c := coordinator_alone(g)) is not None
    )  # fmt: skip
    killed = run_java_cluster_test(cluster, {
        "test": "ShareCoordinatorKillTest",
        "share.topic": topic, "share.group": group, "share.coordinator": coordinator,
        "share.lock.ms": 30_000,  # the broker's default lock (ShareConsumerTest reads it)
    })  # fmt: skip
    assert killed == [coordinator], killed
