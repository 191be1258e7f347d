"""Group membership survives a kill -9 of its coordinator in a three-broker cluster.

The leader's SyncGroup stores the generation (members, assignment) in the group's
``__consumer_offsets`` partition, replicated like commits. When the coordinator dies,
the partition's new leader restores the group Stable from its replica: two live
confluent-kafka members find it and heartbeat on -- no rebalance (no revoke/assign
callback), the same member ids, commits of the same generation accepted -- and
consumption goes on exactly once: every offset read once, none skipped, none again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.cluster import test_groups_replicated as replicated
from tests.cluster.test_cluster_faults import Cluster, admin_of, create_topic, servers
from tests.cluster.test_groups_replicated import (
    TOPIC,
    committed_by,
    coordinator_of,
    new_coordinator,
    offsets_leader,
    produce,
)

pytestmark = pytest.mark.timeout(300)

#: Three brokers, RF=3, 50 ``__consumer_offsets`` partitions (Kafka's hash of group ids).
cluster = replicated.cluster

GROUP = "stayers"
FIRST, TOTAL = 10, 15


class Member:
    """A consumer that records its rebalance callbacks."""

    def __init__(self, bootstrap: str) -> None:
        self.callbacks: list[str] = []
        self.lock = threading.Lock()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "heartbeat.interval.ms": 500,
            # Long enough to outlast the failover (ZooKeeper session, election, load):
            # librdkafka gives up its assignment itself after a session of failed heartbeats.
            "session.timeout.ms": 30_000, "topic.metadata.refresh.interval.ms": 1000,
        })  # fmt: skip
        self.consumer.subscribe([TOPIC], on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.callbacks.append(f"assign {sorted(p.partition for p in partitions)}")

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.callbacks.append(f"revoke {sorted(p.partition for p in partitions)}")

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.callbacks)


def read_until(members: list[Member], read: dict[int, list[int]], until: int) -> None:
    """Poll every member until ``read`` (partition -> offsets) holds ``until`` records."""
    deadline = time.monotonic() + 60
    while sum(map(len, read.values())) < until:
        assert time.monotonic() < deadline, f"read only {read} of {until} records"
        for member in members:
            msg = member.consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                read.setdefault(msg.partition(), []).append(msg.offset())


def test_members_keep_their_generation_through_a_coordinator_kill(cluster: Cluster) -> None:
    admin = create_topic(cluster, TOPIC, 2)
    for partition in (0, 1):
        produce(servers(cluster), partition, range(FIRST))
    members = [Member(servers(cluster)) for _ in range(2)]
    try:
        read: dict[int, list[int]] = {}
        read_until(members, read, 2 * FIRST)
        for member in members:  # commit what each read (the positions, 10)
            member.consumer.commit(asynchronous=False)
        assert committed_by(servers(cluster), GROUP) == {0: FIRST, 1: FIRST}
        callbacks = [m.seen() for m in members]
        assert sorted(callbacks) == [["assign [0]"], ["assign [1]"]], callbacks
        member_ids = {m.consumer.memberid() for m in members}

        old = coordinator_of(cluster, GROUP)
        assert old == offsets_leader(admin, GROUP)
        cluster[old].kill9()
        survivors = admin_of(cluster, without=(old,))
        # Every survivor, not the first alone: the commits and committed() below may ask
        # another, which would answer NOT_COORDINATOR until its own view has the new leader.
        new_coordinator(cluster, GROUP, old)
        for partition in (0, 1):
            produce(servers(cluster), partition, range(FIRST, TOTAL))
        read_until(members, read, 2 * TOTAL)
        # Exactly once: each offset read once, in order, across the move.
        assert read == {p: list(range(TOTAL)) for p in (0, 1)}, read
        # Commits carry the member id and generation: the new coordinator accepts them.
        for member in members:
            member.consumer.commit(asynchronous=False)
        assert committed_by(servers(cluster), GROUP) == {0: TOTAL, 1: TOTAL}
        [future] = survivors.describe_consumer_groups([GROUP]).values()
        described = future.result(timeout=60)
        assert described.state.name == "STABLE"
        assert {m.member_id for m in described.members} == member_ids
        assert {m.consumer.memberid() for m in members} == member_ids
        assert [m.seen() for m in members] == callbacks, "a member was asked to rebalance"
    finally:
        for member in members:
            member.consumer.close()
