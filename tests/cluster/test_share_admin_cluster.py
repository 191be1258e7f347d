"""The share admin APIs in a cluster go to the share coordinator (issue 32): Kafka 4.4's
own ``kafka-share-groups`` (ShareGroupCommand), bootstrapped at a broker that is not the
group's coordinator, describes, resets and deletes the offsets of a share group, and
deletes the group, against three broker processes where the group's coordinator, the
data partition's leader and the share coordinator of its share partition are three
different brokers. Each answer holds at the share coordinator (another broker's
summary read says so), and the data partition's leader, which held the share partition
before the reset, delivers from the reset start offset to the next member.

With raw requests: the group's coordinator holds no replica of the topic (replication
factor 1 on another broker) and still describes (the lag from the leader's high
watermark), resets and deletes the group's share state, as Kafka's does from its
metadata image; and the data partition's leader, which knows the group, leaves it
alone in DeleteGroups (NOT_COORDINATOR).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_e2e import eventually
from tests.cluster.test_cluster_faults import (
    create_topic,
    full_isr,
    leaders,
    servers,
    three_brokers,
)
from tests.cluster.test_share_state_cluster import (
    ACCEPT,
    CONFIG,
    RELEASE,
    STATE_PARTITIONS,
    Cluster,
    acknowledge,
    fetch,
    join_group,
    known_topic_id,
    open_session,
    port_of,
)
from tests.e2e.conftest import RawConnection
from tests.kafka_tools import tool
from tests.kafka_tools.tool import share_groups
from trio_broker.groups.share_coordinator import coordinator_key
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, partition_for

pytestmark = pytest.mark.timeout(600)

OFFSETS_PARTITIONS = 3  # offsets.topic.num.partitions in CONFIG
TOPIC = "work"


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


tools_classpath = tool.tools_classpath


def start_and_lag(output: str, group: str) -> dict[int, tuple[int, int]]:
    """The describe table: partition -> (start offset, lag)."""
    rows = [line.split() for line in output.splitlines() if line.startswith(f"{group} ")]
    return {int(row[2]): (int(row[3]), int(row[4])) for row in rows}


def find_group_coordinator(conn: RawConnection, group: str) -> int:
    """FindCoordinator until it names one (the offsets topic is made on first use)."""
    found: list[int] = []

    def named() -> bool:
        answer = conn.request(m.ApiKey.FIND_COORDINATOR, 4, m.FindCoordinatorRequest(
            key_type=0, coordinator_keys=[group]))  # fmt: skip
        [coordinator] = answer.coordinators
        found[:] = [coordinator.node_id]
        return coordinator.error_code == ErrorCode.NONE

    eventually(named, f"a coordinator for {group}", 90)
    return found[0]


@attrs.frozen
class ShareRoles:
    """Which broker does what for a topic's share groups once the internal topics exist:
    the leaders of ``__consumer_offsets`` (group coordinators) and of
    ``__share_group_state`` (share coordinators), by partition."""

    topic_id: uuid.UUID
    offsets_leaders: dict[int, int]
    state_leaders: dict[int, int]

    def coordinator(self, group: str) -> int:
        """The group's coordinator."""
        return self.offsets_leaders[partition_for(group, OFFSETS_PARTITIONS)]

    def share_coordinator(self, group: str, partition: int = 0) -> int:
        """The share coordinator of the group's share partition ``partition``."""
        key = coordinator_key(ShareKey(group, self.topic_id, partition))
        return self.state_leaders[partition_for(key, STATE_PARTITIONS)]


def share_roles(cluster: Cluster, admin: AdminClient, topic: str, via: int) -> ShareRoles:
    """Makes the state and offsets topics through broker ``via`` (a probe's share session
    and FindCoordinator), waits for their full ISRs, and says who leads what."""
    with RawConnection(port_of(cluster[via]), timeout=30) as conn:
        topic_id = known_topic_id(conn, topic)
        assert open_session(conn, "probe", "p1", topic_id) == []  # makes the state topic
        find_group_coordinator(conn, "probe")  # makes the offsets topic
    full_isr(admin, SHARE_GROUP_STATE, STATE_PARTITIONS)
    full_isr(admin, CONSUMER_OFFSETS, OFFSETS_PARTITIONS)
    return ShareRoles(topic_id, leaders(admin, CONSUMER_OFFSETS), leaders(admin, SHARE_GROUP_STATE))


def summary(conn: RawConnection, group: str, topic_id: uuid.UUID) -> tuple[int, int, int]:
    """A summary read (leader epoch -1) at the share coordinator, broker to broker:
    (error, state epoch, start offset) of partition 0's share state."""
    Read = m.ReadShareGroupStateRequest
    answer = conn.request(m.ApiKey.READ_SHARE_GROUP_STATE, 0, Read(group_id=group, topics=[
        Read.ReadStateData(topic_id=topic_id, partitions=[
            Read.ReadStateData.PartitionData(partition=0, leader_epoch=-1)])]))  # fmt: skip
    part: Any = answer.results[0].partitions[0]
    return part.error_code, part.state_epoch, part.start_offset


def leave(conn: RawConnection, group: str, member: str) -> None:
    answer = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
        group_id=group, member_id=member, member_epoch=-1))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer


def test_kafka_share_groups_reaches_the_share_coordinator(
    cluster: Cluster, tools_classpath: str
) -> None:
    admin = create_topic(cluster, TOPIC, 1)
    leader = leaders(admin, TOPIC)[0]
    found = share_roles(cluster, admin, TOPIC, leader)
    topic_id = found.topic_id

    def roles(group: str) -> tuple[int, int]:
        """(the group's coordinator, its share partition's share coordinator)."""
        return found.coordinator(group), found.share_coordinator(group)

    # Three brokers, three roles: nothing the admin APIs do is a local call.
    group = next(
        g for g in (f"sg-{i}" for i in range(1000)) if len({leader, *roles(g)}) == 3
    )  # fmt: skip
    coordinator, share_coordinator = roles(group)
    asked = next(b for b in cluster if b != coordinator)  # the tool's bootstrap
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        assert find_group_coordinator(conn, group) == coordinator
        join_group(conn, group, "m1", TOPIC)
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        # The share partition starts at the log end, 0: the group's coordinator
        # initialized it there when m1 joined, and the leader reads it as it first serves it.
        assert open_session(conn, group, "m1", topic_id) == []
        producer = Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
        for i in range(5):
            producer.produce(TOPIC, value=b"r%d" % i, partition=0)
        assert producer.flush(30) == 0
        assert fetch(conn, group, "m1", topic_id, 1) == (ErrorCode.NONE, [(0, 4, 1)])
        # 0-2 accepted; 3-4 given back as the session closes.
        answer = acknowledge(conn, group, "m1", topic_id, -1, [(0, 2, ACCEPT)])
        assert answer.responses[0].partitions[0].error_code == ErrorCode.NONE, answer
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        leave(conn, group, "m1")

    bootstrap = cluster[asked].bootstrap
    described = share_groups(tools_classpath, bootstrap, "--describe", "--group", group)
    assert start_and_lag(described, group) == {0: (3, 2)}, described

    reset = share_groups(tools_classpath, bootstrap, "--reset-offsets", "--group", group,
                         "--topic", f"{TOPIC}:0", "--to-offset", "1", "--execute")  # fmt: skip
    assert "NEW-OFFSET" in reset, reset
    # Held at the share coordinator, in a new state epoch (read from a third broker):
    # 2, above the 1 the group's coordinator initialized the partition in when m1 joined
    # (InitializeShareGroupState, as Kafka's, the partition being led elsewhere).
    with RawConnection(port_of(cluster[share_coordinator]), timeout=30) as conn:
        assert summary(conn, group, topic_id) == (ErrorCode.NONE, 2, 1)
    described = share_groups(tools_classpath, bootstrap, "--describe", "--group", group)
    assert start_and_lag(described, group) == {0: (1, 4)}, described
    # The data partition's leader, which held the share partition at 3, reads it again
    # for a new session: the next member gets 1-4, each on a first delivery.
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        join_group(conn, group, "m2", TOPIC)
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        assert open_session(conn, group, "m2", topic_id) == [(1, 4, 1)]
        answer = acknowledge(conn, group, "m2", topic_id, -1, [(1, 4, ACCEPT)])
        assert answer.responses[0].partitions[0].error_code == ErrorCode.NONE, answer
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        leave(conn, group, "m2")
    described = share_groups(tools_classpath, bootstrap, "--describe", "--group", group)
    assert start_and_lag(described, group) == {0: (5, 0)}, described

    deleted = share_groups(tools_classpath, bootstrap, "--delete-offsets", "--group", group,
                           "--topic", TOPIC)  # fmt: skip
    assert "Successful" in deleted, deleted
    with RawConnection(port_of(cluster[share_coordinator]), timeout=30) as conn:
        assert summary(conn, group, topic_id) == (ErrorCode.NONE, 0, -1)
    assert "no offset information" in share_groups(
        tools_classpath, bootstrap, "--describe", "--group", group
    )
    gone = share_groups(tools_classpath, bootstrap, "--delete", "--group", group)
    assert "was successful" in gone, gone
    assert group not in share_groups(tools_classpath, bootstrap, "--list").split()


Desc, Alter = m.DescribeShareGroupOffsetsRequest, m.AlterShareGroupOffsetsRequest
Delete = m.DeleteShareGroupOffsetsRequest


def describe_offsets(
    conn: RawConnection, group: str, topic: str | None
) -> list[tuple[str, int, int, int, int]]:
    """DescribeShareGroupOffsets v1 of ``topic``'s partition 0 (None: every partition the
    group has share state for): (topic, partition, start offset, lag, error) rows."""
    Group = Desc.DescribeShareGroupOffsetsRequestGroup
    topics = None if topic is None else [
        Group.DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=[0])]  # fmt: skip
    answer = conn.request(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, Desc(groups=[
        Group(group_id=group, topics=topics)]))  # fmt: skip
    [described] = answer.groups
    assert described.error_code == ErrorCode.NONE, described
    return [(t.topic_name, p.partition_index, p.start_offset, p.lag, p.error_code)
            for t in described.topics for p in t.partitions]  # fmt: skip


def delete_groups(conn: RawConnection, group: str) -> int:
    answer = conn.request(m.ApiKey.DELETE_GROUPS, 2, m.DeleteGroupsRequest(groups_names=[group]))
    [result] = answer.results
    return int(result.error_code)


def test_a_coordinator_without_a_replica_of_the_topic_describes_resets_and_deletes(
    cluster: Cluster,
) -> None:
    admin = create_topic(cluster, TOPIC, 1)  # the state and offsets topics, as above
    offsets_leaders = share_roles(cluster, admin, TOPIC, leaders(admin, TOPIC)[0]).offsets_leaders
    # One replica, on a broker that coordinates the group chosen below.
    holder = offsets_leaders[0]
    solo = "solo"
    [made] = admin.create_topics(
        [NewTopic(solo, num_partitions=1, replica_assignment=[[holder]])]
    ).values()
    made.result(timeout=60)
    eventually(lambda: leaders(admin, solo) == {0: holder}, f"{solo}-0 led by {holder}")
    group = next(
        g for g in (f"nr-{i}" for i in range(1000))
        if offsets_leaders[partition_for(g, OFFSETS_PARTITIONS)] != holder
    )  # fmt: skip
    coordinator = offsets_leaders[partition_for(group, OFFSETS_PARTITIONS)]

    def joined(member: str) -> bool:
        """The coordinator assigns the topic once its view has it."""
        answer = coord.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0,
            subscribed_topic_names=[solo]))  # fmt: skip
        if answer.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return False  # the coordinator is loading its partition still (join_group)
        assert answer.error_code == ErrorCode.NONE, answer
        if answer.assignment is not None and answer.assignment.topic_partitions:
            return True
        leave(coord, group, member)
        return False

    with (
        RawConnection(port_of(cluster[coordinator]), timeout=30) as coord,
        RawConnection(port_of(cluster[holder]), timeout=30) as lead,
    ):
        assert find_group_coordinator(coord, group) == coordinator
        topic_id = known_topic_id(lead, solo)
        eventually(lambda: joined("m1"), f"{group} assigned {solo}")
        assert open_session(lead, group, "m1", topic_id) == []
        producer = Producer({"bootstrap.servers": servers(cluster), "acks": "1"})
        for i in range(5):
            producer.produce(solo, value=b"r%d" % i, partition=0)
        assert producer.flush(30) == 0
        # acks=1 answers before the high watermark (the fsync) moves: fetch until it has.
        acquired: list[tuple[int, int, int]] = []

        def fetched() -> bool:
            error, acquired[:] = fetch(lead, group, "m1", topic_id, len(fetches) + 1)
            fetches.append(error)
            assert error == ErrorCode.NONE, error
            return bool(acquired)

        fetches: list[int] = []
        eventually(fetched, "the five records at the leader")
        assert acquired == [(0, 4, 1)]
        answer = acknowledge(lead, group, "m1", topic_id, -1, [(0, 2, ACCEPT)])
        assert answer.responses[0].partitions[0].error_code == ErrorCode.NONE, answer
        leave(coord, group, "m1")

        # The topic's share state, and the lag from the leader's high watermark (5).
        assert describe_offsets(coord, group, solo) == [(solo, 0, 3, 2, ErrorCode.NONE)]
        assert describe_offsets(coord, group, None) == [(solo, 0, 3, 2, ErrorCode.NONE)]
        Topic = Alter.AlterShareGroupOffsetsRequestTopic
        altered = coord.request(m.ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, Alter(
            group_id=group, topics=[Topic(topic_name=solo, partitions=[
                Topic.AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=1)
            ])]))  # fmt: skip
        assert altered.error_code == ErrorCode.NONE, altered
        assert [p.error_code for t in altered.responses for p in t.partitions] == [0], altered
        assert describe_offsets(coord, group, solo) == [(solo, 0, 1, 4, ErrorCode.NONE)]

        # The leader knows the group now (it read the reset state for a new session):
        # DeleteGroups there is not its to answer, and the state stays.
        assert joined("m2")
        assert open_session(lead, group, "m2", topic_id) == [(1, 4, 1)]
        answer = acknowledge(lead, group, "m2", topic_id, -1, [(1, 4, RELEASE)])
        assert answer.error_code == ErrorCode.NONE, answer
        leave(coord, group, "m2")
        assert delete_groups(lead, group) == ErrorCode.NOT_COORDINATOR
        assert describe_offsets(coord, group, solo) == [(solo, 0, 1, 4, ErrorCode.NONE)]

        deleted = coord.request(m.ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, Delete(
            group_id=group, topics=[
                Delete.DeleteShareGroupOffsetsRequestTopic(topic_name=solo)]))  # fmt: skip
        assert deleted.error_code == ErrorCode.NONE, deleted
        assert [(t.topic_name, t.error_code) for t in deleted.responses] == [(solo, 0)], deleted
        assert describe_offsets(coord, group, solo) == [(solo, 0, -1, -1, ErrorCode.NONE)]
        assert delete_groups(coord, group) == ErrorCode.NONE
