"""Share-partition state survives a broker restart (``__share_group_state``).

Against a real broker process with a data dir, over raw requests: a member acquires ten
records and settles some of them (accepted, rejected, released) while others stay
acquired; then the broker is killed with SIGKILL (or stopped cleanly) and started again on
the same data dir. The member, back from its group's records, heartbeats with the epoch
it holds and fetches in a new share session: the acknowledged and rejected records
never come back, the released and the still-acquired ones do with their delivery count
kept (locks are not durable), and a second group that joined but never fetched still
starts where it joined, not at the log end after the restart.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_consumer_protocol import topic_id_of
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

HB = m.ShareGroupHeartbeatRequest
SF = m.ShareFetchRequest
SA = m.ShareAcknowledgeRequest
ACCEPT, RELEASE, REJECT = 1, 2, 3


def join(conn: Any, group: str, member: str, topic: str) -> None:
    answer = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, HB(
        group_id=group, member_id=member, member_epoch=0, subscribed_topic_names=[topic]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    assert answer.assignment is not None and answer.assignment.topic_partitions


def acquire(conn: Any, group: str, member: str, topic_id: uuid.UUID) -> list[tuple[int, int, int]]:
    """Open a share session and take what there is: (first, last, delivery count)."""
    answer = conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id=member, share_session_epoch=0, max_wait_ms=0, min_bytes=1,
        max_bytes=1 << 20, max_records=100, batch_size=100,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
            SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
        forgotten_topics_data=[]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    part = answer.responses[0].partitions[0]
    assert part.error_code == ErrorCode.NONE
    return [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records]


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, value=b"r%d" % i, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("how", ["kill9", "clean"])
def test_share_state_survives_a_restart(broker_process: BrokerProcess, how: str) -> None:
    topic, group, idle = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("queue", "sg", "idle"))
    admin = AdminClient({"bootstrap.servers": broker_process.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
    with broker_process.connect() as conn:
        join(conn, group, "m1", topic)
        join(conn, idle, "i1", topic)  # starts at the log end: 0
        produce(broker_process.bootstrap, topic, 10)
        topic_id = topic_id_of(conn, topic)
        assert acquire(conn, group, "m1", topic_id) == [(0, 9, 1)]
        acks = conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, SA(
            group_id=group, member_id="m1", share_session_epoch=1,
            topics=[SA.AcknowledgeTopic(topic_id=topic_id, partitions=[
                SA.AcknowledgeTopic.AcknowledgePartition(partition_index=0, acknowledgement_batches=[
                    SA.AcknowledgeTopic.AcknowledgePartition.AcknowledgementBatch(
                        first_offset=f, last_offset=la, acknowledge_types=[t])
                    for f, la, t in [(0, 3, ACCEPT), (4, 4, REJECT), (5, 5, RELEASE),
                                     (8, 8, ACCEPT)]])])]))  # fmt: skip
        assert acks.error_code == ErrorCode.NONE
        assert acks.responses[0].partitions[0].error_code == ErrorCode.NONE
        # 6, 7 and 9 stay acquired by m1 (30 s locks) when the broker goes down.

    if how == "kill9":
        broker_process.kill9()
        broker_process.start()
    else:
        broker_process.restart()

    with broker_process.connect() as conn:
        described = conn.request(m.ApiKey.SHARE_GROUP_DESCRIBE, 1, m.ShareGroupDescribeRequest(
            group_ids=[group], include_authorized_operations=False)).groups  # fmt: skip
        # The member is back from the group's records, at the epoch it was given: it
        # goes on heartbeating with it, no rejoin (its share session is gone).
        assert described[0].error_code == ErrorCode.NONE and described[0].group_state == "Stable"
        [member] = described[0].members
        assert member.member_id == "m1" and member.member_epoch == described[0].group_epoch
        assert heartbeat(conn, group, "m1", member.member_epoch, topic) == member.member_epoch
        # Released 5 and the lost locks of 6, 7, 9 come back, each on its second delivery;
        # 0-4 (below the start offset) and 8 (accepted) do not.
        assert acquire(conn, group, "m1", topic_id) == [(5, 7, 2), (9, 9, 2)]
        # The idle group kept its start offset: the records produced after it joined.
        join(conn, idle, "i1", topic)
        assert acquire(conn, idle, "i1", topic_id) == [(0, 9, 1)]


def heartbeat(conn: Any, group: str, member: str, epoch: int, topic: str) -> int:
    """A ShareGroupHeartbeat (join with epoch 0, leave with -1); the member epoch."""
    answer = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, HB(
        group_id=group, member_id=member, member_epoch=epoch,
        subscribed_topic_names=[topic] if epoch == 0 else None))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.member_epoch)


def test_the_group_coordinators_share_records_survive_a_restart(
    broker_process: BrokerProcess,
) -> None:
    """The group's records in ``__consumer_offsets`` (its epoch and its initialized share
    partitions, groups/share_records.py): after a kill -9 the group comes back at its
    epoch, a member joining then gets a higher one, and DescribeShareGroupOffsets without
    topics names the partitions; a group whose share state was deleted (no snapshot
    left) is still there, empty, as Kafka keeps it until DeleteGroups."""
    topic, group, other = (f"{n}-{uuid.uuid4().hex[:8]}" for n in ("queue", "sg", "gone"))
    admin = AdminClient({"bootstrap.servers": broker_process.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=60)
    with broker_process.connect() as conn:
        heartbeat(conn, group, "m1", 0, topic)
        epoch = heartbeat(conn, group, "m2", 0, topic)
        heartbeat(conn, group, "m1", -1, topic)
        heartbeat(conn, group, "m2", -1, topic)
        [before] = describe(conn, [group])
        assert before.group_state == "Empty" and before.group_epoch > epoch
        heartbeat(conn, other, "o1", 0, topic)
        heartbeat(conn, other, "o1", -1, topic)
        deleted = conn.request(m.ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0,
                               m.DeleteShareGroupOffsetsRequest(group_id=other, topics=[
                                   m.DeleteShareGroupOffsetsRequest.DeleteShareGroupOffsetsRequestTopic(
                                       topic_name=topic)]))  # fmt: skip
        assert deleted.error_code == ErrorCode.NONE, deleted
        assert deleted.responses[0].error_code == ErrorCode.NONE, deleted

    broker_process.kill9()
    broker_process.start()

    with broker_process.connect() as conn:
        [after, emptied] = describe(conn, [group, other])
        assert (after.error_code, after.group_state) == (ErrorCode.NONE, "Empty")
        assert after.group_epoch == before.group_epoch
        assert (emptied.error_code, emptied.group_state) == (ErrorCode.NONE, "Empty")
        Req = m.DescribeShareGroupOffsetsRequest
        offsets = conn.request(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, Req(groups=[
            Req.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)]))  # fmt: skip
        [described] = offsets.groups
        assert [(t.topic_name, sorted(p.partition_index for p in t.partitions))
                for t in described.topics] == [(topic, [0, 1])]  # fmt: skip
        assert heartbeat(conn, group, "m3", 0, topic) > before.group_epoch


def describe(conn: Any, groups: list[str]) -> Any:
    return conn.request(m.ApiKey.SHARE_GROUP_DESCRIBE, 1, m.ShareGroupDescribeRequest(
        group_ids=groups, include_authorized_operations=False)).groups  # fmt: skip
