"""Kafka's ``kafka-share-groups`` (ShareGroupCommand of kafka-tools 4.4.0) against a
broker process: it lists a share group (ListGroups, type ``share``), describes its start
offsets and lag (DescribeShareGroupOffsets v1), is refused a reset while the group has
a member, resets a partition once it is empty (AlterShareGroupOffsets) — a reset that a
``kill -9`` does not undo — deletes the group's offsets of a topic
(DeleteShareGroupOffsets) and finally the group (DeleteGroups).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from tests.e2e.test_consumer_protocol import topic_id_of
from tests.e2e.test_share_state_restart import acquire, join
from tests.kafka_tools import tool
from tests.kafka_tools.tool import share_groups
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(600)


tools_classpath = tool.tools_classpath


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process: BrokerProcess
    with running_broker(tmp_path / "data") as process:
        yield process


def offsets(output: str) -> dict[int, tuple[int, int]]:
    """The describe table: partition -> (start offset, lag)."""
    rows = [line.split() for line in output.splitlines() if line.startswith("sg ")]
    return {int(row[2]): (int(row[3]), int(row[4])) for row in rows}


def test_kafka_share_groups_lists_describes_resets_and_deletes(
    broker: BrokerProcess, tools_classpath: str
) -> None:
    topic = f"q-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=60)
    with broker.connect() as conn:
        join(conn, "sg", "m1", topic)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(10):
            producer.produce(topic, value=b"r%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        topic_id = topic_id_of(conn, topic)
        assert acquire(conn, "sg", "m1", topic_id) == [(0, 4, 1)]  # partition 0
        acked = conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, m.ShareAcknowledgeRequest(
            group_id="sg", member_id="m1", share_session_epoch=-1,
            topics=[m.ShareAcknowledgeRequest.AcknowledgeTopic(topic_id=topic_id, partitions=[
                m.ShareAcknowledgeRequest.AcknowledgeTopic.AcknowledgePartition(
                    partition_index=0, acknowledgement_batches=[
                        m.ShareAcknowledgeRequest.AcknowledgeTopic.AcknowledgePartition
                        .AcknowledgementBatch(first_offset=0, last_offset=2,
                                              acknowledge_types=[1])])])]))  # fmt: skip
        assert acked.responses[0].partitions[0].error_code == ErrorCode.NONE

        listed = share_groups(tools_classpath, broker.bootstrap, "--list")
        assert listed.split() == ["sg"], listed
        # Partition 0: 0-2 accepted, 3-4 given back when the session closed.
        described = share_groups(tools_classpath, broker.bootstrap, "--describe", "--group", "sg")
        assert offsets(described) == {0: (3, 2), 1: (0, 5)}, described

        refused = share_groups(tools_classpath, broker.bootstrap, "--reset-offsets", "--group", "sg",
                               "--topic", f"{topic}:1", "--to-offset", "4", "--execute")  # fmt: skip
        assert "Share group 'sg' is not empty." in refused, refused  # checked by the tool
        # ... and by the broker, for a client that does not look first.
        Alter = m.AlterShareGroupOffsetsRequest
        for group, error in [("sg", ErrorCode.NON_EMPTY_GROUP),
                             ("nobody", ErrorCode.GROUP_ID_NOT_FOUND)]:  # fmt: skip
            answer = conn.request(m.ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, Alter(
                group_id=group, topics=[Alter.AlterShareGroupOffsetsRequestTopic(
                    topic_name=topic, partitions=[
                        Alter.AlterShareGroupOffsetsRequestTopic.AlterShareGroupOffsetsRequestPartition(
                            partition_index=1, start_offset=4)])]))  # fmt: skip
            assert answer.error_code == error, answer

        left = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id="sg", member_id="m1", member_epoch=-1))  # fmt: skip
        assert left.error_code == ErrorCode.NONE
    reset = share_groups(tools_classpath, broker.bootstrap, "--reset-offsets", "--group", "sg",
                         "--topic", f"{topic}:1", "--to-offset", "4", "--execute")  # fmt: skip
    assert "NEW-OFFSET" in reset, reset
    broker.kill9()
    broker.start()
    described = share_groups(tools_classpath, broker.bootstrap, "--describe", "--group", "sg")
    assert offsets(described) == {0: (3, 2), 1: (4, 1)}, described

    deleted = share_groups(tools_classpath, broker.bootstrap, "--delete-offsets", "--group", "sg",
                           "--topic", topic)  # fmt: skip
    assert "Successful" in deleted, deleted
    assert "no offset information" in share_groups(
        tools_classpath, broker.bootstrap, "--describe", "--group", "sg"
    )
    gone = share_groups(tools_classpath, broker.bootstrap, "--delete", "--group", "sg")
    assert "was successful" in gone, gone
    assert share_groups(tools_classpath, broker.bootstrap, "--list").split() == []
