"""Consumer groups in a three-broker cluster: committed offsets survive their coordinator.

Real ``serve`` processes on a real ZooKeeper, RF=3 everywhere (``__consumer_offsets``
too). A group's coordinator is the leader of its ``__consumer_offsets`` partition
(Kafka's hash of the group id); when that broker goes (kill -9, or a graceful stop),
FindCoordinator names the partition's new leader, which rebuilt the group's offsets
from its replica of the partition:

- confluent-kafka, two members: they commit offset 6 of both partitions, close, the
  coordinator is killed with -9; OffsetFetch from the new coordinator answers 6, and
  the group's consumers restart at exactly offset 6 of each partition;
- the same with a graceful stop (SIGTERM) of the coordinator;
- members that stay up through the kill go on with the new coordinator without a
  rebalance (it restored the group), read nothing again, and commit there;
- kafka-python: commit, coordinator killed, the committed offset is read back from the
  new coordinator and a new commit there counts; aiokafka the same through a graceful
  stop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.cluster.test_cluster_e2e import eventually
from tests.cluster.test_cluster_faults import (
    CONFIG,
    Cluster,
    admin_of,
    create_topic,
    producer,
    servers,
    three_brokers,
)
from tests.e2e.conftest import RawConnection
from trio_broker.protocol import messages as m
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, partition_for

pytestmark = pytest.mark.timeout(300)

TOPIC = "events"
#: Kafka's default partition count: groups hash exactly as on a Kafka cluster.
OFFSETS_PARTITIONS = 50
COMMITTED = 6
RECORDS_PER_PARTITION = 10


#: Kafka's 3 s initial rebalance delay, which CONFIG turns off: two members that join an
#: empty group must form it in one generation, each with a partition, before either
#: reads (else the first may read both partitions alone, and the second its one again).
GROUP_CONFIG = CONFIG.replace(
    "offsets.topic.num.partitions=5", f"offsets.topic.num.partitions={OFFSETS_PARTITIONS}"
).replace("group.initial.rebalance.delay.ms=0", "group.initial.rebalance.delay.ms=3000")


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, GROUP_CONFIG) as brokers:
        yield brokers


def produce(bootstrap: str, partition: int, values: range) -> None:
    """Produce ``values`` to one partition of TOPIC (acks=all), waiting for them all."""
    p = producer(bootstrap)
    failed: list[object] = []
    for i in values:
        p.produce(TOPIC, value=str(i).encode(), partition=partition,
                  on_delivery=lambda err, _msg: failed.append(err) if err else None)  # fmt: skip
        p.poll(0)
    assert p.flush(90) == 0 and not failed, failed


def coordinator_of(
    cluster: Cluster, group: str, *, without: tuple[int, ...] = (), at: int | None = None
) -> int:
    """The broker FindCoordinator names for the group, asked of a live broker (``at``, or
    the first) with a raw request (librdkafka's AdminClient aborted the test process once
    while a coordinator it was asking had just been killed); -1 while there is none."""
    live = [b for i, b in cluster.items() if b.running and i not in without]
    if at is not None:
        live = [cluster[at]]
    port = live[0].bootstrap.rsplit(":", 1)[1]
    with RawConnection(int(port)) as conn:
        answer = conn.request(
            m.ApiKey.FIND_COORDINATOR, 3, m.FindCoordinatorRequest(key=group, key_type=0)
        )
    return int(answer.node_id) if answer.error_code == 0 else -1


def new_coordinator(cluster: Cluster, group: str, old: int) -> int:
    """Wait until every survivor's FindCoordinator names one coordinator other than
    ``old``; return it. A survivor's answer is -1 (COORDINATOR_NOT_AVAILABLE) while no
    leader of the group's partition is known to it, and one survivor may name the new
    leader before another (the new leader itself among them) has learned it."""
    found: list[int] = []

    def agreed() -> bool:
        named = {coordinator_of(cluster, group, at=b) for b in cluster if b != old}
        found[:] = list(named)
        return len(named) == 1 and not named & {old, -1}

    eventually(agreed, f"every survivor names a new coordinator of {group} (not {old})")
    return found[0]


def offsets_leader(admin: AdminClient, group: str) -> int:
    """The leader of the group's ``__consumer_offsets`` partition, from metadata."""
    topic = admin.list_topics(CONSUMER_OFFSETS, timeout=10).topics[CONSUMER_OFFSETS]
    assert len(topic.partitions) == OFFSETS_PARTITIONS
    return int(topic.partitions[partition_for(group, OFFSETS_PARTITIONS)].leader)


def consumer(bootstrap: str, group: str, session_timeout_ms: int = 10_000) -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": 500, "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip


def consume_as_group(
    consumers: list[Consumer], wanted: range, timeout_s: float = 90.0
) -> dict[int, list[int]]:
    """Poll all members until each of the two partitions' offsets in ``wanted`` were read
    and the group has settled (every member holds a partition): partition -> the distinct
    offsets read, in order. A member may read a partition again after a rebalance moved
    it (nothing is committed meanwhile), so a count of records read tells nothing."""
    read: dict[int, set[int]] = {}

    def done() -> bool:
        complete = all(set(wanted) <= read.get(p, set()) for p in (0, 1))
        return complete and all(member.assignment() for member in consumers)

    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"read {read} of {wanted} per partition in time"
        for member in consumers:
            msg = member.poll(0.2)
            if msg is not None and msg.error() is None:
                read.setdefault(msg.partition(), set()).add(msg.offset())
    return {p: sorted(offsets) for p, offsets in read.items()}


def committed_by(bootstrap: str, group: str) -> dict[int, int]:
    """OffsetFetch through the group's (current) coordinator."""
    probe = consumer(bootstrap, group)
    try:
        found = probe.committed([TopicPartition(TOPIC, p) for p in (0, 1)], timeout=30)
        return {tp.partition: tp.offset for tp in found}
    finally:
        probe.close()


def commit_then_lose_coordinator(cluster: Cluster, group: str, *, kill: bool) -> None:
    admin = create_topic(cluster, TOPIC, 2)
    for partition in (0, 1):
        produce(servers(cluster), partition, range(RECORDS_PER_PARTITION))
    members = [consumer(servers(cluster), group) for _ in range(2)]
    for member in members:
        member.subscribe([TOPIC])
    read = consume_as_group(members, range(RECORDS_PER_PARTITION))
    assert {p: sorted(o) for p, o in read.items()} == {
        p: list(range(RECORDS_PER_PARTITION)) for p in (0, 1)
    }
    # Both members got a partition each, and each commits offset 6 of its own.
    assignments = [sorted(tp.partition for tp in m.assignment()) for m in members]
    assert sorted(assignments) == [[0], [1]], assignments
    for member, [partition] in zip(members, assignments, strict=True):
        member.commit(offsets=[TopicPartition(TOPIC, partition, COMMITTED)], asynchronous=False)
    for member in members:
        member.close()

    old = coordinator_of(cluster, group)
    assert old == offsets_leader(admin, group)
    assert committed_by(servers(cluster), group) == {0: COMMITTED, 1: COMMITTED}
    # Three replicas per partition, compacted (the log cleaner keeps the latest record
    # per key, as for any compacted topic): its configs as the coordinator made it.
    offsets_topic = admin.list_topics(CONSUMER_OFFSETS, timeout=10).topics[CONSUMER_OFFSETS]
    assert {len(p.replicas) for p in offsets_topic.partitions.values()} == {3}
    catalogue = json.loads((cluster[old].data_dir / "catalogue.json").read_text())
    [made] = [t for t in catalogue["topics"] if t["name"] == CONSUMER_OFFSETS]
    assert made["configs"]["cleanup.policy"] == "compact"
    if kill:
        cluster[old].kill9()
    else:
        cluster[old].stop()
    survivors = admin_of(cluster, without=(old,))

    def moved() -> bool:
        # Every survivor names it, itself included: one that names it before the new
        # leader has learned it leads sends the next OffsetFetch to a broker that
        # answers NOT_COORDINATOR (which librdkafka's committed() raises).
        named = {coordinator_of(cluster, group, at=b) for b in cluster if b != old}
        new = named.pop() if len(named) == 1 else -1
        return new not in (old, -1) and new == offsets_leader(survivors, group)

    eventually(
        moved, "every survivor's FindCoordinator names the new leader of the group's partition"
    )
    # OffsetFetch from the new coordinator: the offsets came with the partition.
    assert committed_by(servers(cluster), group) == {0: COMMITTED, 1: COMMITTED}
    # More records while the group is away; its consumers restart at exactly 6.
    for partition in (0, 1):
        produce(servers(cluster), partition, range(RECORDS_PER_PARTITION, 15))
    members = [consumer(servers(cluster), group) for _ in range(2)]
    try:
        for member in members:
            member.subscribe([TOPIC])
        resumed = consume_as_group(members, range(COMMITTED, 15))
    finally:
        for member in members:
            member.close()
    assert resumed == {p: list(range(COMMITTED, 15)) for p in (0, 1)}


def test_offsets_survive_a_kill_9_of_the_coordinator(cluster: Cluster) -> None:
    commit_then_lose_coordinator(cluster, "resumers", kill=True)


def test_offsets_survive_a_graceful_stop_of_the_coordinator(cluster: Cluster) -> None:
    commit_then_lose_coordinator(cluster, "stoppers", kill=False)


def test_live_members_go_on_with_the_new_coordinator(cluster: Cluster) -> None:
    """The members stay up through the kill: they find the new coordinator, which
    restored the group (members, generation) from its replica, so they are not asked
    to rejoin -- their positions stay where they were (10), past the committed 6 that
    a rebalance would rewind them to -- and their next commits count there."""
    group = "livers"
    create_topic(cluster, TOPIC, 2)
    for partition in (0, 1):
        produce(servers(cluster), partition, range(RECORDS_PER_PARTITION))
    # Kafka's default session (45 s), not the module's 10 s: librdkafka gives its
    # assignment up when no heartbeat was answered for a session, and the failover
    # (the old coordinator's ZooKeeper session lapsing, an election, the group's load)
    # took more than 10 s on a busy machine (busy-a-1: both members rejoined at 6).
    members = [consumer(servers(cluster), group, session_timeout_ms=45_000) for _ in range(2)]
    try:
        for member in members:
            member.subscribe([TOPIC])
        consume_as_group(members, range(RECORDS_PER_PARTITION))
        for member in members:
            mine = [TopicPartition(TOPIC, tp.partition, COMMITTED) for tp in member.assignment()]
            member.commit(offsets=mine, asynchronous=False)
        old = coordinator_of(cluster, group)
        cluster[old].kill9()
        new_coordinator(cluster, group, old)
        for partition in (0, 1):
            produce(servers(cluster), partition, range(RECORDS_PER_PARTITION, 15))
        again: dict[int, list[int]] = {}
        deadline = time.monotonic() + 90
        while any(set(range(RECORDS_PER_PARTITION, 15)) - set(again.get(p, [])) for p in (0, 1)):
            assert time.monotonic() < deadline, f"after the kill the group read {again}"
            for member in members:
                msg = member.poll(0.2)
                if msg is not None and msg.error() is None:
                    again.setdefault(msg.partition(), []).append(msg.offset())
        assert again == {p: list(range(RECORDS_PER_PARTITION, 15)) for p in (0, 1)}, again
        for member in members:
            done = [TopicPartition(TOPIC, tp.partition, 15) for tp in member.assignment()]
            member.commit(offsets=done, asynchronous=False)
    finally:
        for member in members:
            member.close()
    assert committed_by(servers(cluster), group) == {0: 15, 1: 15}


def test_kafka_python_commit_and_fetch_through_a_coordinator_move(cluster: Cluster) -> None:
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    create_topic(cluster, TOPIC, 2)
    group = "pythonic"
    tp = KTopicPartition(TOPIC, 1)

    def standalone() -> KafkaConsumer:
        # Assigns partitions itself: commits and fetches go to the group's coordinator.
        client = KafkaConsumer(
            bootstrap_servers=servers(cluster).split(","), group_id=group,
            enable_auto_commit=False, request_timeout_ms=30_000,
        )  # fmt: skip
        client.assign([tp])
        return client

    first = standalone()
    first.commit({tp: OffsetAndMetadata(5, "before", -1)})
    assert first.committed(tp) == 5
    first.close()
    old = coordinator_of(cluster, group)
    cluster[old].kill9()
    new_coordinator(cluster, group, old)
    second = standalone()
    try:
        assert second.committed(tp) == 5
        second.commit({tp: OffsetAndMetadata(7, "after", -1)})
    finally:
        second.close()
    third = standalone()
    try:
        assert third.committed(tp) == 7
        assert third.committed(tp, metadata=True).metadata == "after"
    finally:
        third.close()


def test_aiokafka_commit_and_fetch_through_a_graceful_coordinator_move(cluster: Cluster) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import OffsetAndMetadata
    from aiokafka.structs import TopicPartition as ATopicPartition

    create_topic(cluster, TOPIC, 2)
    group = "asyncio"
    tp = ATopicPartition(TOPIC, 0)

    async def commit_then_fetch(commit: int | None) -> int | None:
        client = AIOKafkaConsumer(
            bootstrap_servers=servers(cluster), group_id=group, enable_auto_commit=False,
            request_timeout_ms=30_000, retry_backoff_ms=200,
        )  # fmt: skip
        await client.start()
        try:
            client.assign([tp])
            # No fetching: only the coordinator is under test, and aiokafka's stop()
            # raises CancelledError when a fetch to the stopped broker is backing off.
            client.pause(tp)
            if commit is not None:
                await client.commit({tp: OffsetAndMetadata(commit, "")})
            return await asyncio.wait_for(client.committed(tp), 60)
        finally:
            await client.stop()

    assert asyncio.run(commit_then_fetch(4)) == 4
    old = coordinator_of(cluster, group)
    cluster[old].stop()
    new_coordinator(cluster, group, old)
    assert asyncio.run(commit_then_fetch(None)) == 4
    assert asyncio.run(commit_then_fetch(9)) == 9
