"""Classic and consumer-protocol (KIP-848) members on one group id, Kafka 4's online
migration, with real confluent-kafka members against a broker process:

- a ``group.protocol=classic`` member joins a consumer-protocol group as a classic
  member: the broker's assignor gives it its share, through JoinGroup/SyncGroup, and
  every record is read once, from the committed offsets after a restart of the members;
- a ``group.protocol=consumer`` member joining a live classic group upgrades it: both
  keep reading, no record read twice after the commits, none lost; when it leaves, the
  group is classic again (the downgrade) and the classic member takes every partition;
- ``group.consumer.migration.policy=disabled`` keeps a live classic group classic
  (a ConsumerGroupHeartbeat is GROUP_ID_NOT_FOUND, "not a consumer group"); once it is
  empty, a consumer-protocol member takes the id over and goes on from the classic
  group's committed offsets, as Kafka's coordinator deletes an empty classic group for
  the new one (``maybeDeleteEmptyClassicGroup``) and keeps its offsets.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.e2e import test_consumer_protocol as consumer_protocol
from tests.e2e.test_consumer_protocol import (
    HB,
    PARTITIONS,
    FastHeartbeatBroker,
    Member,
    make_topic,
    make_topic_more,
)
from tests.waits import wait_until
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

#: Records before the upgrade (read and committed by the classic member) and after it.
BEFORE, AFTER = 20, 20


#: A broker whose members heartbeat every second (test_consumer_protocol.py's).
broker_process = consumer_protocol.fast_heartbeat_broker


class DisabledMigrationBroker(FastHeartbeatBroker):
    """As :class:`FastHeartbeatBroker`, with ``group.consumer.migration.policy=disabled``."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        with self.properties.open("a") as properties:
            properties.write("group.consumer.migration.policy=disabled\n")


@pytest.fixture
def disabled_migration_broker(tmp_path: Path) -> Iterator[DisabledMigrationBroker]:
    broker = DisabledMigrationBroker(tmp_path / "data")
    broker.start()
    try:
        yield broker
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


class ClassicMember(Member):
    """A ``group.protocol=classic`` confluent-kafka member (eager ``range``), heartbeating
    every second, committing each record it reads."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "classic",
            "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "heartbeat.interval.ms": 1000, "session.timeout.ms": 45_000,
        })  # fmt: skip
        self.consumer.subscribe([topic])
        self.read: list[str] = []

    def step(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is None:
            return
        error = msg.error()
        if error is not None:
            # librdkafka reports a JoinGroup answered REBALANCE_IN_PROGRESS (a group that
            # was upgraded while the join waited, as Kafka answers it) and rejoins.
            assert not error.fatal() and error.code() == KafkaError.REBALANCE_IN_PROGRESS, error
            return
        value = msg.value()
        assert value is not None
        self.read.append(value.decode())
        self.consumer.commit(message=msg, asynchronous=False)


def consumer_heartbeat(conn: Any, group: str, topic: str) -> m.ConsumerGroupHeartbeatResponse:
    answer: m.ConsumerGroupHeartbeatResponse = conn.request(
        m.ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, HB(
            group_id=group, member_id=uuid.uuid4().hex, member_epoch=0,
            rebalance_timeout_ms=30_000, subscribed_topic_names=[topic], topic_partitions=[]),
    )  # fmt: skip
    return answer


def group_type(conn: Any, group: str) -> str | None:
    listed = conn.request(m.ApiKey.LIST_GROUPS, 5, m.ListGroupsRequest(
        states_filter=[], types_filter=[]))  # fmt: skip
    return next((g.group_type for g in listed.groups if g.group_id == group), None)


def described_members(conn: Any, group: str) -> dict[str, tuple[int, int, int]]:
    """member id -> (type: 0 classic, 1 consumer; member epoch; partitions held), from
    ConsumerGroupDescribe v1."""
    answer = conn.request(m.ApiKey.CONSUMER_GROUP_DESCRIBE, 1,
                          m.ConsumerGroupDescribeRequest(group_ids=[group]))  # fmt: skip
    [described] = answer.groups
    assert described.error_code == ErrorCode.NONE, described
    return {
        x.member_id: (
            x.member_type,
            x.member_epoch,
            sum(len(t.partitions) for t in x.assignment.topic_partitions),
        )
        for x in described.members
    }


def each_owns(members: list[Member], count: int) -> Callable[[], bool]:
    """Every member owns ``count`` partitions, none two members at once (reading on)."""

    def check() -> bool:
        owned = [x.owned() for x in members]
        for member in members:
            member.step()
        together = set().union(*owned)
        return all(len(o) == count for o in owned) and len(together) == sum(map(len, owned))

    return check


def read_all(members: list[Member], total: int) -> Callable[[], bool]:
    def check() -> bool:
        for member in members:
            member.step()
        return sum(len(x.read) for x in members) >= total

    return check


def test_a_classic_member_shares_a_consumer_group(broker_process: FastHeartbeatBroker) -> None:
    bootstrap = broker_process.bootstrap
    topic, group = f"mixed-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 40)
    modern = Member(bootstrap, group, topic, "modern")
    wait_until(lambda: modern.step() or len(modern.owned()) == PARTITIONS, "modern's partitions")
    classic = ClassicMember(bootstrap, group, topic, "classic")
    try:
        wait_until(each_owns([modern, classic], 2), "two partitions each")
        with broker_process.connect() as conn:
            assert group_type(conn, group) == "consumer"
            before = described_members(conn, group)
        # One classic member, one consumer-protocol member, two partitions each.
        assert sorted((kind, held) for kind, _, held in before.values()) == [(0, 2), (1, 2)]
        # Stored: a restarted broker has the same members, types, epochs and partitions,
        # and they read on without a rebalance.
        assert broker_process.stop() == 0
        broker_process.start()
        with broker_process.connect() as conn:
            assert described_members(conn, group) == before
        wait_until(read_all([modern, classic], 40), "40 records")
        assert classic.read, "the classic member read nothing"
    finally:
        classic.consumer.close()
        modern.consumer.close()
    everything = modern.read + classic.read
    assert sorted(everything) == sorted(f"r{i}" for i in range(40)), "read twice or lost"
    # Both committed: members that come back resume after the 40 records.
    make_topic_more(bootstrap, topic, 40, 20)
    again = [Member(bootstrap, group, topic, "again"),
             ClassicMember(bootstrap, group, topic, "classic-again")]  # fmt: skip
    try:
        wait_until(read_all(again, 20), "the next 20 records")
        assert sorted(again[0].read + again[1].read) == sorted(f"r{i}" for i in range(40, 60))
    finally:
        for member in again:
            member.consumer.close()


def test_a_live_classic_group_upgrades_and_downgrades(broker_process: FastHeartbeatBroker) -> None:
    bootstrap = broker_process.bootstrap
    topic, group = f"upgrade-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, BEFORE)
    classic = ClassicMember(bootstrap, group, topic, "classic")
    modern: Member | None = None
    try:
        wait_until(read_all([classic], BEFORE), f"the classic member to read {BEFORE}")
        with broker_process.connect() as conn:
            assert group_type(conn, group) == "classic"
        modern = Member(bootstrap, group, topic, "modern")  # the upgrade
        wait_until(each_owns([classic, modern], 2), "two partitions each")
        with broker_process.connect() as conn:
            assert group_type(conn, group) == "consumer"
        make_topic_more(bootstrap, topic, BEFORE, AFTER)
        wait_until(read_all([classic, modern], BEFORE + AFTER), f"{AFTER} more records")
        modern.consumer.close()  # the last consumer-protocol member leaves: downgrade
        with broker_process.connect() as conn:
            wait_until(lambda: group_type(conn, group) == "classic", "a classic group again")
        make_topic_more(bootstrap, topic, BEFORE + AFTER, AFTER)
        wait_until(each_owns([classic], PARTITIONS), "the classic member to own everything")
        rest = BEFORE + 2 * AFTER - len(modern.read)  # the classic member reads on alone
        wait_until(read_all([classic], rest), "the last records")
    finally:
        classic.consumer.close()
        if modern is not None:
            modern.consumer.close()
    everything = classic.read + (modern.read if modern is not None else [])
    assert sorted(everything) == sorted(f"r{i}" for i in range(BEFORE + 2 * AFTER))


def test_disabled_migration_keeps_a_live_classic_group_then_an_empty_one_makes_way(
    disabled_migration_broker: DisabledMigrationBroker,
) -> None:
    bootstrap = disabled_migration_broker.bootstrap
    topic, group = f"disabled-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, BEFORE)
    classic = ClassicMember(bootstrap, group, topic, "classic")
    try:
        wait_until(read_all([classic], BEFORE), f"the classic member to read {BEFORE}")
        with disabled_migration_broker.connect() as conn:
            refused = consumer_heartbeat(conn, group, topic)
        assert refused.error_code == ErrorCode.GROUP_ID_NOT_FOUND, refused
    finally:
        classic.consumer.close()

    make_topic_more(bootstrap, topic, BEFORE, AFTER)
    modern = Member(bootstrap, group, topic, "modern")
    try:
        wait_until(lambda: modern.step() or len(modern.read) >= AFTER, f"{AFTER} more records")
        # From the classic group's commits: only the records produced after them.
        assert sorted(modern.read) == sorted(f"r{i}" for i in range(BEFORE, BEFORE + AFTER))
        committed = modern.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        assert [tp.offset for tp in committed] == [(BEFORE + AFTER) // PARTITIONS] * PARTITIONS
    finally:
        modern.consumer.close()
