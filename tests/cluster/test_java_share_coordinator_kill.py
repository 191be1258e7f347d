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

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_cluster_faults import (
    create_topic,
    full_isr,
    leaders,
    servers,
    three_brokers,
)
from tests.cluster.test_share_admin_cluster import OFFSETS_PARTITIONS, find_group_coordinator
from tests.cluster.test_share_state_cluster import (
    CONFIG,
    STATE_PARTITIONS,
    Cluster,
    known_topic_id,
    open_session,
    port_of,
)
from tests.e2e.conftest import RawConnection
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S, run_maven
from trio_broker.groups.share_coordinator import coordinator_key
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, partition_for

pytestmark = pytest.mark.timeout(MAVEN_TIMEOUT_S + 300)

#: What Maven prints when it cannot download kafka-clients, JUnit or a plugin.
UNRESOLVED = ("Could not resolve dependencies", "Could not transfer artifact",
              "or one of its dependencies could not be resolved")  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


def test_a_java_share_consumer_keeps_its_epoch_across_its_coordinators_kill_9(
    cluster: Cluster,
) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("the Java client needs Java 17 and Maven (scripts/install-system-deps.sh)")
    topic = f"jobs-{uuid.uuid4().hex[:8]}"
    admin = create_topic(cluster, topic, 1)
    data_leader = leaders(admin, topic)[0]
    with RawConnection(port_of(cluster[data_leader]), timeout=30) as conn:
        topic_id = known_topic_id(conn, topic)
        assert open_session(conn, "probe", "p1", topic_id) == []  # makes the state topic
        find_group_coordinator(conn, "probe")  # makes the offsets topic
    full_isr(admin, SHARE_GROUP_STATE, STATE_PARTITIONS)
    full_isr(admin, CONSUMER_OFFSETS, OFFSETS_PARTITIONS)
    state_leaders = leaders(admin, SHARE_GROUP_STATE)
    offsets_leaders = leaders(admin, CONSUMER_OFFSETS)

    def coordinator_alone(group: str) -> int | None:
        """The group's coordinator, if it leads neither the data nor its share state."""
        coordinator = offsets_leaders[partition_for(group, OFFSETS_PARTITIONS)]
        key = coordinator_key(ShareKey(group, topic_id, 0))
        share_coordinator = state_leaders[partition_for(key, STATE_PARTITIONS)]
        return None if coordinator in (data_leader, share_coordinator) else coordinator

    group, coordinator = next(
        (g, c) for g in (f"jsg-{i}" for i in range(2000))
        if (c := coordinator_alone(g)) is not None
    )  # fmt: skip
    pids = {b: broker.proc.pid for b, broker in cluster.items() if broker.proc is not None}
    try:
        totals = run_maven({
            "test": "ShareCoordinatorKillTest",
            "bootstrap": servers(cluster),
            "cluster.pids": ",".join(f"{b}:{pid}" for b, pid in sorted(pids.items())),
            "share.topic": topic, "share.group": group, "share.coordinator": coordinator,
            "share.lock.ms": 30_000,  # the broker's default lock (ShareConsumerTest reads it)
        })  # fmt: skip
    except AssertionError as failed:
        if any(marker in str(failed) for marker in UNRESOLVED):
            pytest.skip(f"Maven could not resolve the Java test module's artifacts: {failed}")
        raise
    killed = [b for b, broker in cluster.items() if not broker.running]
    for b in killed:
        cluster[b].down_on_purpose = True
    logs = "\n".join(broker.log_tail() for broker in cluster.values())
    assert totals == {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}, (totals, logs)
    assert killed == [coordinator], (killed, logs)
