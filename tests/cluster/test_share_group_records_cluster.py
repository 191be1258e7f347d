"""A share group's coordinator killed with -9: the next one knows every share partition
the group has (issue 32), from the group's records in ``__consumer_offsets``
(groups/share_records.py: Kafka's ShareGroupMetadata and
ShareGroupStatePartitionMetadata).

Three broker processes; a topic of three partitions. The group is picked so that each
broker that survives the kill leads one of its partitions and is also the share
coordinator of that partition's share state: whichever of the two becomes the group's
coordinator, the other partition's share state is on another broker, which a
coordinator knowing only its own tables and memory would miss. A member (raw requests)
consumes from both and accepts some records, then leaves; the group's coordinator is
killed with -9; Kafka 4.4's ``kafka-share-groups`` asked of a survivor describes the
group's offsets without naming a topic (both partitions), then deletes the group, and
the share coordinators hold no state of any of its partitions afterwards.

And a topic's deletion reaches a share coordinator that holds no replica of the topic:
the group's coordinator, told by the cluster's topics, sends DeleteShareGroupState
(Kafka's ``onTopicsDeleted``), though the one broker holding the topic (restarted since
its member consumed, so holding no share partition of it in memory) sends nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from tests.cluster.test_cluster_e2e import eventually, every_broker_lists
from tests.cluster.test_cluster_faults import (
    admin_of,
    create_topic,
    leaders,
    servers,
    three_brokers,
)
from tests.cluster.test_share_admin_cluster import (
    OFFSETS_PARTITIONS,
    find_group_coordinator,
    leave,
    share_roles,
)
from tests.cluster.test_share_state_cluster import (
    ACCEPT,
    CONFIG,
    NOT_YET,
    SA,
    SF,
    STATE_PARTITIONS,
    Cluster,
    join_group,
    port_of,
)
from tests.e2e.conftest import RawConnection
from tests.kafka_tools import tool
from tests.kafka_tools.tool import share_groups
from trio_broker.groups.share_coordinator import coordinator_key
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import partition_for

pytestmark = pytest.mark.timeout(600)

TOPIC = "jobs"
PARTITIONS = 3
RECORDS = 4  # per partition consumed; the first three accepted


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


tools_classpath = tool.tools_classpath


def share_fetch(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID, partition: int,
    epoch: int,
) -> tuple[int, list[tuple[int, int, int]]]:  # fmt: skip
    """One ShareFetch of ``partition`` (epoch 0 opens the session): its error and the
    acquired ranges (first, last, delivery count)."""
    Part = SF.FetchTopic.FetchPartition
    answer = conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id=member, share_session_epoch=epoch, max_wait_ms=0,
        min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[Part(
            partition_index=partition, acknowledgement_batches=[])])],
        forgotten_topics_data=[]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    if not answer.responses:
        return ErrorCode.NONE, []
    part = answer.responses[0].partitions[0]
    return part.error_code, [
        (a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records
    ]


def consume(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID, partition: int,
    bootstrap: str,
) -> None:  # fmt: skip
    """Open the member's session at the partition's leader (which starts the share
    partition at the log end), produce, acquire the records, accept all but the last
    and close the session (which gives the last back)."""
    state: dict[str, Any] = {"epoch": 0, "acquired": []}

    def fetched(count: int) -> bool:
        error, runs = share_fetch(conn, group, member, topic_id, partition, state["epoch"])
        assert error == ErrorCode.NONE or error in NOT_YET, error
        if error == ErrorCode.NONE:
            state["epoch"] += 1
            state["acquired"] += runs
        return error == ErrorCode.NONE and (
            sum(last - first + 1 for first, last, _ in state["acquired"]) >= count
        )

    eventually(lambda: fetched(0), f"a share session at the leader of {partition}", 90)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"r%d" % i, partition=partition)
    assert producer.flush(30) == 0
    eventually(lambda: fetched(RECORDS), f"{RECORDS} records of {TOPIC}-{partition}", 60)
    assert state["acquired"] == [(0, RECORDS - 1, 1)]
    Part = SA.AcknowledgeTopic.AcknowledgePartition
    answer = conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, SA(
        group_id=group, member_id=member, share_session_epoch=-1,
        topics=[SA.AcknowledgeTopic(topic_id=topic_id, partitions=[Part(
            partition_index=partition, acknowledgement_batches=[Part.AcknowledgementBatch(
                first_offset=0, last_offset=RECORDS - 2, acknowledge_types=[ACCEPT])])])]))  # fmt: skip
    assert answer.responses[0].partitions[0].error_code == ErrorCode.NONE, answer


def summary(conn: RawConnection, group: str, topic_id: uuid.UUID, partition: int) -> Any:
    """A summary read of the share partition's state at its share coordinator:
    (error, start offset)."""
    Read = m.ReadShareGroupStateRequest
    answer = conn.request(m.ApiKey.READ_SHARE_GROUP_STATE, 0, Read(group_id=group, topics=[
        Read.ReadStateData(topic_id=topic_id, partitions=[
            Read.ReadStateData.PartitionData(partition=partition, leader_epoch=-1)])]))  # fmt: skip
    part: Any = answer.results[0].partitions[0]
    return part.error_code, part.start_offset


def described(output: str, group: str) -> dict[int, tuple[str, str]]:
    """The describe table: partition -> (start offset, lag), as printed."""
    rows = [line.split() for line in output.splitlines() if line.startswith(f"{group} ")]
    return {int(row[2]): (row[3], row[4]) for row in rows if len(row) >= 5}


def test_a_new_group_coordinator_knows_every_share_partition(
    cluster: Cluster, tools_classpath: str
) -> None:
    admin = create_topic(cluster, TOPIC, PARTITIONS)
    data_leaders = leaders(admin, TOPIC)
    roles = share_roles(cluster, admin, TOPIC, data_leaders[0])
    topic_id, offsets_leaders = roles.topic_id, roles.offsets_leaders
    share_coordinator = roles.share_coordinator

    def plan(group: str) -> tuple[int, dict[int, int]] | None:
        """(the group's coordinator, survivor -> a partition it leads and is the share
        coordinator of), if each survivor has one."""
        coordinator = offsets_leaders[partition_for(group, OFFSETS_PARTITIONS)]
        own = {}
        for partition, leader in data_leaders.items():
            if leader != coordinator and share_coordinator(group, partition) == leader:
                own.setdefault(leader, partition)
        return (coordinator, own) if len(own) == 2 else None

    group, (coordinator, own) = next(
        (g, found) for g in (f"sg-{i}" for i in range(2000)) if (found := plan(g)) is not None
    )
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        assert find_group_coordinator(conn, group) == coordinator
        join_group(conn, group, "m1", TOPIC)  # assigned the three partitions
    for leader, partition in own.items():
        with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
            consume(conn, group, "m1", topic_id, partition, servers(cluster))
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        leave(conn, group, "m1")

    cluster[coordinator].kill9()
    survivor = next(iter(own))
    with RawConnection(port_of(cluster[survivor]), timeout=30) as conn:
        eventually(lambda: find_group_coordinator(conn, group) in own, "a new coordinator", 90)
    bootstrap = cluster[survivor].bootstrap
    expected = {partition: ("3", "1") for partition in own.values()}
    last = [""]

    def both_described() -> bool:
        last[0] = share_groups(tools_classpath, bootstrap, "--describe", "--offsets",
                               "--group", group)  # fmt: skip
        table = described(last[0], group)
        return all(table.get(p) == want for p, want in expected.items())

    try:
        eventually(both_described, "both partitions described", 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the tool said:\n{last[0]}") from None

    gone = share_groups(tools_classpath, bootstrap, "--delete", "--group", group)
    assert "was successful" in gone, gone
    # No share state of any of the group's partitions at their share coordinators.
    admin = admin_of(cluster)
    eventually(
        lambda: all(b in own for b in leaders(admin, SHARE_GROUP_STATE).values()),
        "the state partitions led by survivors",
    )
    state_leaders = leaders(admin, SHARE_GROUP_STATE)
    for partition in range(PARTITIONS):
        key = coordinator_key(ShareKey(group, topic_id, partition))
        at = state_leaders[partition_for(key, STATE_PARTITIONS)]
        with RawConnection(port_of(cluster[at]), timeout=30) as conn:
            assert summary(conn, group, topic_id, partition) == (ErrorCode.NONE, -1), partition


def test_a_deleted_topics_share_state_goes_where_no_replica_was(cluster: Cluster) -> None:
    holder = 1  # the topic's one replica
    admin = admin_of(cluster)
    every_broker_lists(cluster)  # the broker that takes the CreateTopics sees broker 1 live
    [created] = admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[holder]])]).values()
    created.result(timeout=60)
    eventually(lambda: leaders(admin, TOPIC)[0] == holder, f"{TOPIC} led by {holder}")
    found = share_roles(cluster, admin, TOPIC, holder)
    topic_id = found.topic_id

    def roles(group: str) -> tuple[int, int]:
        """(the group's coordinator, its share partition's share coordinator)."""
        return found.coordinator(group), found.share_coordinator(group)

    group = next(g for g in (f"sg-{i}" for i in range(2000)) if holder not in roles(g))
    coordinator, share_coordinator = roles(group)
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        assert find_group_coordinator(conn, group) == coordinator
        join_group(conn, group, "m1", TOPIC)
    with RawConnection(port_of(cluster[holder]), timeout=30) as conn:
        consume(conn, group, "m1", topic_id, 0, servers(cluster))
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        leave(conn, group, "m1")
    with RawConnection(port_of(cluster[share_coordinator]), timeout=30) as conn:
        assert summary(conn, group, topic_id, 0) == (ErrorCode.NONE, RECORDS - 1)

    cluster[holder].restart()  # it holds the share partition in memory no more
    eventually(lambda: leaders(admin, TOPIC)[0] == holder, f"{TOPIC} led by {holder} again")
    [deleted] = admin.delete_topics([TOPIC]).values()
    deleted.result(timeout=60)

    with RawConnection(port_of(cluster[share_coordinator]), timeout=30) as conn:
        eventually(
            lambda: summary(conn, group, topic_id, 0) == (ErrorCode.NONE, -1),
            f"the share state of the deleted topic gone from broker {share_coordinator}",
        )
    # And from the group's records: it has share state for no topic now.
    Req = m.DescribeShareGroupOffsetsRequest
    with RawConnection(port_of(cluster[coordinator]), timeout=30) as conn:
        answer = conn.request(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, Req(groups=[
            Req.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)]))  # fmt: skip
        assert answer.groups[0].error_code == ErrorCode.NONE, answer
        assert answer.groups[0].topics == [], answer
