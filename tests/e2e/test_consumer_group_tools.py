"""Kafka's ``kafka-consumer-groups`` (ConsumerGroupCommand of kafka-tools 4.4.0) against a
broker process, on a group of the consumer protocol (KIP-848): two confluent-kafka
members with ``group.protocol=consumer`` read and commit a topic, and the tool lists the
group as a Consumer group (ListGroups with types), describes its members with their
epochs and assignments and its state and assignor (ConsumerGroupDescribe) and its
offsets and lag (OffsetFetch, ListOffsets); once the members are gone it resets the
group's offsets to the earliest (OffsetCommit as an admin) and deletes the group
(DeleteGroups). Issue 32 asks that Kafka's tool describe such groups; a mixed group (a
classic member in it, KIP-848's migration) is described with each member's type
(ConsumerGroupDescribe v1's MemberType: the tool's UPGRADED column).
"""

from __future__ import annotations

import uuid

import pytest

from tests.e2e import test_consumer_protocol as consumer_protocol
from tests.e2e.test_classic_to_consumer_group import ClassicMember, each_owns
from tests.e2e.test_consumer_protocol import (
    PARTITIONS,
    FastHeartbeatBroker,
    Member,
    make_topic,
    shared,
)
from tests.kafka_tools import tool
from tests.kafka_tools.tool import consumer_groups
from tests.waits import wait_until

pytestmark = pytest.mark.timeout(600)
RECORDS = 20


tools_classpath = tool.tools_classpath


#: A broker whose members heartbeat every second (test_consumer_protocol.py's).
broker = consumer_protocol.fast_heartbeat_broker


def rows(output: str, group: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.split()[:1] == [group]]


def test_kafka_consumer_groups_describes_a_consumer_protocol_group(
    broker: FastHeartbeatBroker, tools_classpath: str
) -> None:
    topic, group = f"cg-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(broker.bootstrap, topic, RECORDS)
    a, b = Member(broker.bootstrap, group, topic, "a"), Member(broker.bootstrap, group, topic, "b")
    try:
        wait_until(shared([a, b], PARTITIONS // 2), "a and b to own two partitions each")
        wait_until(lambda: [m.step() for m in (a, b)] and len(a.read) + len(b.read) >= RECORDS,
                 f"{RECORDS} records")  # fmt: skip
        member_ids = {a.consumer.memberid(), b.consumer.memberid()}

        listed = consumer_groups(tools_classpath, broker.bootstrap, "--list", "--type")
        assert rows(listed, group) == [[group, "Consumer"]], listed

        state = consumer_groups(
            tools_classpath, broker.bootstrap, "--describe", "--group", group, "--state"
        )
        [[_, _host, _id, assignor, group_state, count]] = rows(state, group)
        assert (assignor, group_state, count) == ("uniform", "Stable", "2"), state

        members = consumer_groups(tools_classpath, broker.bootstrap, "--describe", "--group", group,
                                  "--members", "--verbose")  # fmt: skip
        described = rows(members, group)
        assert {row[1] for row in described} == member_ids, members
        # GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS CURRENT-EPOCH CURRENT-ASSIGNMENT
        # TARGET-EPOCH TARGET-ASSIGNMENT: two partitions each, at the target epoch.
        assert sorted(row[3] for row in described) == ["a", "b"], members
        for row in described:
            assert row[4] == "2" and row[5] == row[-2], members

        lags = consumer_groups(tools_classpath, broker.bootstrap, "--describe", "--group", group)
        offsets = {int(row[2]): row for row in rows(lags, group)}
        assert sorted(offsets) == list(range(PARTITIONS)), lags
        per_partition = RECORDS // PARTITIONS
        for row in offsets.values():
            # TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID ...
            assert row[1] == topic and row[3:6] == [str(per_partition), str(per_partition), "0"]
            assert row[6] in member_ids, lags
    finally:
        a.consumer.close()
        b.consumer.close()

    reset = consumer_groups(tools_classpath, broker.bootstrap, "--reset-offsets", "--group", group,
                            "--topic", topic, "--to-earliest", "--execute")  # fmt: skip
    assert {row[3] for row in rows(reset, group)} == {"0"}, reset
    lags = consumer_groups(tools_classpath, broker.bootstrap, "--describe", "--group", group)
    assert {row[5] for row in rows(lags, group)} == {str(RECORDS // PARTITIONS)}, lags

    deleted = consumer_groups(tools_classpath, broker.bootstrap, "--delete", "--group", group)
    assert "successful" in deleted, deleted
    assert rows(consumer_groups(tools_classpath, broker.bootstrap, "--list", "--type"), group) == []


def test_kafka_consumer_groups_tells_classic_members_from_consumer_ones(
    broker: FastHeartbeatBroker, tools_classpath: str
) -> None:
    topic, group = f"cg-mixed-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(broker.bootstrap, topic, RECORDS)
    modern = Member(broker.bootstrap, group, topic, "modern")
    classic: ClassicMember | None = None
    try:
        wait_until(lambda: modern.step() or len(modern.owned()) == PARTITIONS, "modern's four")
        classic = ClassicMember(broker.bootstrap, group, topic, "classic")
        wait_until(each_owns([modern, classic], PARTITIONS // 2), "two partitions each")
        members = consumer_groups(tools_classpath, broker.bootstrap, "--describe", "--group", group,
                                  "--members", "--verbose")  # fmt: skip
        header = next(line.split() for line in members.splitlines() if "UPGRADED" in line)
        upgraded = header.index("UPGRADED")
        types = {row[header.index("CLIENT-ID")]: row[upgraded] for row in rows(members, group)}
        # The consumer-protocol member is "upgraded", the classic one is not.
        assert types == {"modern": "true", "classic": "false"}, members
    finally:
        modern.consumer.close()
        if classic is not None:
            classic.consumer.close()
