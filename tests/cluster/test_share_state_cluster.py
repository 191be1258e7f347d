"""Share-group state in a three-broker cluster survives a kill -9 of the share partition's
leader, and of its share coordinator.

Real ``serve`` processes on a real ZooKeeper; the data topic and ``__share_group_state``
(made on first use, as Kafka's share coordinator's) are RF=3. A share partition lives
on its data partition's leader; its durable state on the share coordinator, the leader
of the key's ``__share_group_state`` partition (groups/share_coordinator.py). The test
picks a group whose share coordinator is the data partition's leader, so that one
``kill -9`` takes both the share partition held in memory and the coordinator's table:
what comes back can only come from the replicated state topic; and a group whose share
coordinator is another broker, which the leader writes to over WriteShareGroupState.

Over raw requests (our codec, real sockets): a member acquires ten records, accepts
and rejects some, releases one and holds the rest; the broker is killed with -9. A
member fetching from the partition's new leader gets exactly the released and the held
records, each with delivery count 2 (counts survive, locks do not), never the accepted
or rejected ones; its acknowledgement then counts at the new coordinator.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from tests.cluster.test_cluster_e2e import eventually
from tests.cluster.test_cluster_faults import (
    ConfiguredBroker,
    admin_of,
    create_topic,
    full_isr,
    leaders,
    servers,
    three_brokers,
)
from tests.e2e.conftest import RawConnection
from trio_broker.groups.share_coordinator import coordinator_key
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import partition_for

pytestmark = pytest.mark.timeout(300)

STATE_PARTITIONS = 6
CONFIG = (
    "min.insync.replicas=2\n"
    "replica.lag.time.max.ms=3000\n"
    "default.replication.factor=3\n"
    "zookeeper.session.timeout.ms=4000\n"
    "offsets.topic.num.partitions=3\n"
    "offsets.topic.replication.factor=3\n"
    f"share.coordinator.state.topic.num.partitions={STATE_PARTITIONS}\n"
    "share.coordinator.state.topic.replication.factor=3\n"
    "group.initial.rebalance.delay.ms=0\n"
)
TOPIC = "queue"
SF = m.ShareFetchRequest
SA = m.ShareAcknowledgeRequest
ACCEPT, RELEASE, REJECT = 1, 2, 3
#: Answers of a partition whose share state cannot be read or written yet: ask again.
NOT_YET = {ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
           ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}  # fmt: skip

#: The id a broker answers for a topic it does not know.
NO_TOPIC_ID = uuid.UUID(int=0)

Cluster = dict[int, ConfiguredBroker]


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


def port_of(broker: ConfiguredBroker) -> int:
    return int(broker.bootstrap.rsplit(":", 1)[1])


def fetch(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID, epoch: int
) -> tuple[int, list[tuple[int, int, int]]]:
    """One ShareFetch of partition 0 (epoch 0 opens the session): its partition's error
    and the acquired ranges (first, last, delivery count); a partition with neither is
    left out of the answer."""
    answer = conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id=member, share_session_epoch=epoch, max_wait_ms=0,
        min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
            SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
        forgotten_topics_data=[]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    if not answer.responses:  # nothing to say about the partition: no error, no records
        return ErrorCode.NONE, []
    part = answer.responses[0].partitions[0]
    return part.error_code, [
        (a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records
    ]


def known_topic_id(conn: RawConnection, topic: str) -> uuid.UUID:
    """The topic's id, once the broker's Metadata names it. A broker that has not read a
    new topic from ZooKeeper yet (the admin client's create and leaders come from other
    brokers) answers UNKNOWN_TOPIC_OR_PARTITION with the zero id; a share fetch naming
    the zero id is UNKNOWN_TOPIC_ID at every broker, for good."""
    found: list[uuid.UUID] = []

    def named() -> bool:
        answer = conn.request(m.ApiKey.METADATA, 12, m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False))  # fmt: skip
        [answered] = answer.topics
        found[:] = [answered.topic_id]
        return answered.error_code == ErrorCode.NONE and answered.topic_id != NO_TOPIC_ID

    eventually(named, f"the id of {topic} at the broker", 60)
    return found[0]


def join_group(conn: RawConnection, group: str, member: str, topic: str) -> None:
    """Join with a first ShareGroupHeartbeat, assigned ``topic``. FindCoordinator names the
    leader of the group's ``__consumer_offsets`` partition as soon as the cluster's view
    has it, while that broker may still be loading the partition, which answers
    COORDINATOR_LOAD_IN_PROGRESS meanwhile (as Kafka's; its clients heartbeat again)."""

    def joined() -> bool:
        answer = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=0,
            subscribed_topic_names=[topic]))  # fmt: skip
        if answer.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return False
        assert answer.error_code == ErrorCode.NONE, answer
        assert answer.assignment is not None and answer.assignment.topic_partitions, answer
        return True

    eventually(joined, f"{member} joined {group}", 60)


def open_session(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID
) -> list[tuple[int, int, int]]:
    """Open the member's session once the leader could read the share state (the state
    topic is made on first use, and its partitions move after a kill); what the opening
    fetch acquired."""
    assert topic_id != NO_TOPIC_ID, "a topic id from a broker that did not know the topic"
    acquired: list[tuple[int, int, int]] = []
    errors: list[int] = []

    def opened() -> bool:
        error, acquired[:] = fetch(conn, group, member, topic_id, 0)
        errors.append(error)
        assert error == ErrorCode.NONE or error in NOT_YET, error
        return error == ErrorCode.NONE

    try:
        eventually(opened, f"{member}'s share session at the leader", 90)
    except AssertionError as exc:
        last = ErrorCode(errors[-1]).name if errors else "no answer"
        raise AssertionError(f"{exc}; its last answer: {last}") from None
    return acquired


def acknowledge(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID, epoch: int,
    batches: list[tuple[int, int, int]],
) -> Any:  # fmt: skip
    Part = SA.AcknowledgeTopic.AcknowledgePartition
    return conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, SA(
        group_id=group, member_id=member, share_session_epoch=epoch,
        topics=[SA.AcknowledgeTopic(topic_id=topic_id, partitions=[Part(
            partition_index=0, acknowledgement_batches=[
                Part.AcknowledgementBatch(first_offset=f, last_offset=la, acknowledge_types=[t])
                for f, la, t in batches])])]))  # fmt: skip


def acknowledge_until_stored(
    conn: RawConnection, group: str, member: str, topic_id: uuid.UUID, epoch: int,
    batches: list[tuple[int, int, int]],
) -> int:  # fmt: skip
    """ShareAcknowledge ``batches`` until the partition answers NONE, asking again on a
    share state write that failed (``NOT_YET``: its state partition's ISR not shrunk
    after a kill yet, or its leadership moving), as a client retries. A failed write is
    undone at the leader, the records still the member's, so the retry finds them. Each
    answered request moves the session on: the epoch of the member's next request."""

    def stored() -> bool:
        nonlocal epoch
        acks = acknowledge(conn, group, member, topic_id, epoch, batches)
        assert acks.error_code == ErrorCode.NONE, acks
        epoch += 1
        error = acks.responses[0].partitions[0].error_code
        assert error == ErrorCode.NONE or error in NOT_YET, acks
        return error == ErrorCode.NONE

    eventually(stored, f"{member}'s acknowledgement of {batches} stored", 90)
    return epoch


@pytest.mark.parametrize("coordinator", ["leader", "another"])
def test_acknowledged_records_survive_the_leaders_kill_9(
    cluster: Cluster, coordinator: str
) -> None:
    """``leader``: the group's share coordinator is the data partition's leader, and the
    kill takes both. ``another``: it is another broker, which the leader reads from and
    writes to over ReadShareGroupState / WriteShareGroupState; the kill takes the leader
    with the share partition it held in memory."""
    admin = create_topic(cluster, TOPIC, 1)
    leader = leaders(admin, TOPIC)[0]
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        topic_id = known_topic_id(conn, TOPIC)
        # A first share fetch makes __share_group_state (COORDINATOR_NOT_AVAILABLE
        # until its partitions have leaders).
        assert open_session(conn, "probe", "p1", topic_id) == []
    full_isr(admin, SHARE_GROUP_STATE, STATE_PARTITIONS)
    state_leaders = leaders(admin, SHARE_GROUP_STATE)

    def coordinated_by(group: str) -> int:
        key = coordinator_key(ShareKey(group, topic_id, 0))
        return state_leaders[partition_for(key, STATE_PARTITIONS)]

    group = next(
        g for g in (f"workers-{i}" for i in range(1000))
        if (coordinated_by(g) == leader) == (coordinator == "leader")
    )  # fmt: skip

    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        assert open_session(conn, group, "m1", topic_id) == []  # starts at the log end: 0
        producer = Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
        for i in range(10):
            producer.produce(TOPIC, value=b"r%d" % i, partition=0)
        assert producer.flush(30) == 0
        acquired: list[tuple[int, int, int]] = []
        epoch = 1

        def got_records() -> bool:
            nonlocal epoch
            error, runs = fetch(conn, group, "m1", topic_id, epoch)
            epoch += 1
            assert error == ErrorCode.NONE, error
            acquired.extend(runs)
            return sum(last - first + 1 for first, last, _ in acquired) >= 10

        eventually(got_records, "ten records acquired", 60)
        assert acquired == [(0, 9, 1)]
        acknowledge_until_stored(conn, group, "m1", topic_id, epoch,
                                 [(0, 3, ACCEPT), (4, 4, REJECT), (5, 5, RELEASE), (8, 8, ACCEPT)])  # fmt: skip
        # 6, 7 and 9 stay acquired by m1 when its broker dies.

    cluster[leader].kill9()
    admin = admin_of(cluster)
    eventually(lambda: leaders(admin, TOPIC)[0] not in (-1, leader), "a new leader of the data")
    eventually(
        lambda: all(b not in (-1, leader) for b in leaders(admin, SHARE_GROUP_STATE).values()),
        "new leaders of __share_group_state",
    )
    new_leader = leaders(admin, TOPIC)[0]
    with RawConnection(port_of(cluster[new_leader]), timeout=30) as conn:
        again = open_session(conn, group, "m2", topic_id)
        epoch = 1

        def all_came_back() -> bool:
            # The state partitions' ISRs may still name the dead broker: a fetch whose
            # share state cannot be read yet answers NOT_YET, ask again.
            nonlocal epoch
            error, runs = fetch(conn, group, "m2", topic_id, epoch)
            epoch += 1
            assert error == ErrorCode.NONE or error in NOT_YET, error
            again.extend(runs)
            return sum(last - first + 1 for first, last, _ in again) >= 4

        try:
            eventually(all_came_back, "the four records m1 did not finish", 90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; came back: {again}") from None
        # The released record and the held ones, each on its second delivery; the
        # accepted and rejected ones never again.
        assert again == [(5, 7, 2), (9, 9, 2)]
        assert fetch(conn, group, "m2", topic_id, epoch) == (ErrorCode.NONE, [])
        acknowledge_until_stored(conn, group, "m2", topic_id, epoch + 1,
                                 [(5, 7, ACCEPT), (9, 9, ACCEPT)])  # fmt: skip


GROUP_RESOURCE = 32
#: DescribeConfigs' source of a value set on the group (Kafka's GROUP_CONFIG).
GROUP_CONFIG_SOURCE = 8
SET = 0


def alter_group(conn: RawConnection, group: str, changes: dict[str, str]) -> Any:
    Res = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    request = m.IncrementalAlterConfigsRequest(
        resources=[Res(resource_type=GROUP_RESOURCE, resource_name=group, configs=[
            Res.AlterableConfig(name=n, config_operation=SET, value=v)
            for n, v in changes.items()])],
        validate_only=False,
    )  # fmt: skip
    [answer] = conn.request(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request).responses
    return answer


def group_overrides(conn: RawConnection, group: str) -> dict[str, str]:
    """The group's configs this broker describes as set on the group (not defaults)."""
    Resource = m.DescribeConfigsRequest.DescribeConfigsResource
    request = m.DescribeConfigsRequest(
        resources=[Resource(resource_type=GROUP_RESOURCE, resource_name=group,
                            configuration_keys=None)],
        include_synonyms=False, include_documentation=False,
    )  # fmt: skip
    [result] = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request).results
    assert result.error_code == ErrorCode.NONE, result
    return {c.name: c.value for c in result.configs if c.config_source == GROUP_CONFIG_SOURCE}


def test_group_configs_set_on_one_broker_hold_on_every_broker(cluster: Cluster) -> None:
    """IncrementalAlterConfigs of a GROUP resource taken by a broker that leads nothing
    of the group's: every broker describes the new values, and the data partition's
    leader makes the group's share partition where ``share.auto.offset.reset`` says."""
    admin = create_topic(cluster, TOPIC, 1)
    leader = leaders(admin, TOPIC)[0]
    elsewhere = next(b for b in cluster if b != leader)
    producer = Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
    for i in range(5):
        producer.produce(TOPIC, value=b"early-%d" % i, partition=0)
    assert producer.flush(30) == 0
    group = "configured"
    wanted = {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"}
    with RawConnection(port_of(cluster[elsewhere]), timeout=30) as conn:
        answer = alter_group(conn, group, wanted)
        assert answer.error_code == ErrorCode.NONE, answer
        assert group_overrides(conn, group) == wanted  # this broker's at once
    for broker_id, broker in cluster.items():
        with RawConnection(port_of(broker), timeout=30) as conn:

            def described(conn: RawConnection = conn) -> bool:
                return group_overrides(conn, group) == wanted

            eventually(described, f"broker {broker_id} describes the group's configs", 60)
    # The leader starts the group's share partition at the log start, not its end:
    # the five records produced before anyone joined are the group's.
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        topic_id = known_topic_id(conn, TOPIC)
        assert open_session(conn, group, "m1", topic_id) == [(0, 4, 1)]
    # A refusal is Kafka's, whichever broker takes it.
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        refused = alter_group(conn, group, {"share.delivery.count.limit": "1"})
        assert refused.error_code == ErrorCode.INVALID_CONFIG, refused
        assert group_overrides(conn, group) == wanted


def test_librdkafka_share_consumers_across_the_coordinators_kill_9(cluster: Cluster) -> None:
    """confluent-kafka's ``ShareConsumer`` (librdkafka's share consumer) against the
    cluster: a member accepts half of ten records and closes holding the rest; the
    broker leading the partition and the group's share state is killed with -9; a new
    member, bootstrapped from the other brokers, gets exactly the other half, each on its
    second delivery."""
    admin = create_topic(cluster, TOPIC, 1)
    leader = leaders(admin, TOPIC)[0]
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        topic_id = known_topic_id(conn, TOPIC)
        assert open_session(conn, "probe", "p1", topic_id) == []  # makes the state topic
    full_isr(admin, SHARE_GROUP_STATE, STATE_PARTITIONS)
    state_leaders = leaders(admin, SHARE_GROUP_STATE)
    group = next(
        g for g in (f"rdk-{i}" for i in range(1000))
        if state_leaders[partition_for(coordinator_key(ShareKey(g, topic_id, 0)),
                                       STATE_PARTITIONS)] == leader
    )  # fmt: skip
    # Records produced before the members join are the group's (a cluster's group config).
    with RawConnection(port_of(cluster[leader]), timeout=30) as conn:
        configured = alter_group(conn, group, {"share.auto.offset.reset": "earliest"})
        assert configured.error_code == ErrorCode.NONE, configured
    producer = Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
    for i in range(10):
        producer.produce(TOPIC, value=b"r%d" % i, partition=0)
    assert producer.flush(30) == 0

    def share_consumer(bootstrap: str) -> ShareConsumer:
        consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "share.acknowledgement.mode": "explicit"})  # fmt: skip
        consumer.subscribe([TOPIC])
        return consumer

    first = share_consumer(servers(cluster))
    got: dict[bytes, int] = {}
    try:
        deadline = time.monotonic() + 60
        while len(got) < 10:
            assert time.monotonic() < deadline, f"first member got {sorted(got)}"
            for msg in first.poll(0.5):
                assert msg.error() is None, msg.error()
                got[msg.value()] = msg.delivery_count()
                if int(msg.value()[1:]) < 5:
                    first.acknowledge(msg, AcknowledgeType.ACCEPT)
        assert set(got.values()) == {1}
        results = first.commit_sync(30)  # answered once the acceptances count
        assert all(err is None for err in results.values()), results
    finally:
        first.close()  # r5-r9 unacknowledged

    cluster[leader].kill9()
    admin = admin_of(cluster)
    eventually(lambda: leaders(admin, TOPIC)[0] not in (-1, leader), "a new leader of the data")
    second = share_consumer(servers(cluster))
    again: dict[bytes, int] = {}
    try:
        deadline = time.monotonic() + 90
        while len(again) < 5:
            assert time.monotonic() < deadline, f"second member got {sorted(again)}"
            for msg in second.poll(0.5):
                if msg.error() is not None:  # the cluster settling: asked again
                    continue
                assert msg.value() not in again, msg.value()
                again[msg.value()] = msg.delivery_count()
                second.acknowledge(msg, AcknowledgeType.ACCEPT)
    finally:
        second.close()
    assert again == {b"r%d" % i: 2 for i in range(5, 10)}
