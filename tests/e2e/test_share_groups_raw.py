"""Share groups (KIP-932) over raw requests: the error codes Kafka gives bad input.

ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and ShareAcknowledge against a real
broker process: joins and epochs, a group id taken by a classic group, share-session
epochs (open, next, stale, close), acknowledgements of records not held, an unknown
topic id, and a delivery's acquired ranges and delivery counts.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from kafka import KafkaProducer

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_consumer_protocol import make_topic, topic_id_of
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

HB = m.ShareGroupHeartbeatRequest
SF = m.ShareFetchRequest
SA = m.ShareAcknowledgeRequest


def api_versions(conn: Any) -> dict[int, tuple[int, int]]:
    answer = conn.request(m.ApiKey.API_VERSIONS, 3, m.ApiVersionsRequest(
        client_software_name="raw", client_software_version="1"))  # fmt: skip
    return {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}


def fetch(conn: Any, group: str, member: str, epoch: int, topic_id: uuid.UUID,
          acks: list[tuple[int, int, list[int]]] | None = None, max_wait_ms: int = 0) -> Any:  # fmt: skip
    batches = [SF.FetchTopic.FetchPartition.AcknowledgementBatch(
        first_offset=f, last_offset=la, acknowledge_types=t) for f, la, t in acks or []]  # fmt: skip
    return conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id=member, share_session_epoch=epoch, max_wait_ms=max_wait_ms,
        min_bytes=1, max_bytes=1 << 20, max_records=3, batch_size=3,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[SF.FetchTopic.FetchPartition(
            partition_index=0, acknowledgement_batches=batches)])],
        forgotten_topics_data=[]))  # fmt: skip


def acknowledge(conn: Any, group: str, member: str, epoch: int, topic_id: uuid.UUID,
                acks: list[tuple[int, int, list[int]]]) -> Any:  # fmt: skip
    return conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, SA(
        group_id=group, member_id=member, share_session_epoch=epoch,
        topics=[SA.AcknowledgeTopic(topic_id=topic_id, partitions=[
            SA.AcknowledgeTopic.AcknowledgePartition(partition_index=0, acknowledgement_batches=[
                SA.AcknowledgeTopic.AcknowledgePartition.AcknowledgementBatch(
                    first_offset=f, last_offset=la, acknowledge_types=t)
                for f, la, t in acks])])]))  # fmt: skip


def test_share_group_requests_and_their_errors(broker_process: BrokerProcess) -> None:
    topic, group = f"kip932-{uuid.uuid4().hex[:8]}", f"share-{uuid.uuid4().hex[:8]}"
    make_topic(broker_process.bootstrap, topic, 0)
    with broker_process.connect() as conn:
        versions = api_versions(conn)
        assert versions[76] == (1, 1) and versions[77] == (1, 1)
        assert versions[78] == (1, 1) and versions[79] == (1, 1)

        def beat(**fields: Any) -> Any:
            body: dict[str, Any] = {"group_id": group, "member_id": "m1", "member_epoch": 0,
                                    "subscribed_topic_names": [topic]}  # fmt: skip
            body.update(fields)
            return conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, HB(**body))

        assert beat(member_id="").error_code == ErrorCode.INVALID_REQUEST
        assert beat(group_id="").error_code == ErrorCode.INVALID_REQUEST
        assert beat(subscribed_topic_names=None).error_code == ErrorCode.INVALID_REQUEST
        assert beat(member_epoch=-2).error_code == ErrorCode.INVALID_REQUEST
        assert beat(member_epoch=1).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        joined = beat()
        assert joined.error_code == ErrorCode.NONE and joined.member_epoch > 0
        topic_id = topic_id_of(conn, topic)
        assert joined.assignment.topic_partitions[0].topic_id == topic_id
        assert beat(
            member_epoch=joined.member_epoch + 5, subscribed_topic_names=None
        ).error_code == (ErrorCode.FENCED_MEMBER_EPOCH)
        described = conn.request(m.ApiKey.SHARE_GROUP_DESCRIBE, 1, m.ShareGroupDescribeRequest(
            group_ids=[group, "nobody"], include_authorized_operations=False)).groups  # fmt: skip
        assert described[0].error_code == ErrorCode.NONE and described[0].group_state == "Stable"
        assert [mb.member_id for mb in described[0].members] == ["m1"]
        assert described[1].error_code == ErrorCode.GROUP_ID_NOT_FOUND

        # Records produced after the assignment are the group's (it starts at the log end).
        # One batch each: MaxRecords stops at a batch's end (Kafka's soft limit).
        with KafkaProducer(bootstrap_servers=broker_process.bootstrap) as producer:
            for i in range(5):
                producer.send(topic, value=b"v%d" % i, partition=0)
                producer.flush()

        # Share sessions: only epoch 0 opens one; acknowledgements may not ride on it.
        assert fetch(conn, group, "m1", 1, topic_id).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        opened = fetch(conn, group, "m1", 0, topic_id, acks=[(0, 0, [1])])
        assert opened.error_code == ErrorCode.INVALID_REQUEST
        first = fetch(conn, group, "m1", 0, topic_id)
        assert first.error_code == ErrorCode.NONE
        part = first.responses[0].partitions[0]
        assert [
            (a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records
        ] == [(0, 2, 1)]
        assert first.acquisition_lock_timeout_ms == 30_000
        assert (
            fetch(conn, group, "m1", 5, topic_id).error_code
            == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        )
        # Offsets 3-4 are not held by m1: refused whole. Then release 0, accept 1-2.
        bad = acknowledge(conn, group, "m1", 1, topic_id, [(2, 3, [1])])
        assert bad.responses[0].partitions[0].error_code == ErrorCode.INVALID_RECORD_STATE
        good = fetch(conn, group, "m1", 2, topic_id, acks=[(0, 2, [2, 1, 1])])
        part = good.responses[0].partitions[0]
        assert part.acknowledge_error_code == ErrorCode.NONE
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [
            (0, 0, 2), (3, 4, 1),
        ]  # fmt: skip
        assert acknowledge(conn, group, "m1", 0, topic_id, [(0, 0, [1])]).error_code == (
            ErrorCode.INVALID_SHARE_SESSION_EPOCH
        )
        unknown = fetch(conn, group, "m1", 3, uuid.uuid4())
        assert unknown.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
        # Closing the session gives back what it held: another member gets it next.
        closed = acknowledge(conn, group, "m1", -1, topic_id, [(3, 4, [3])])
        assert closed.responses[0].partitions[0].error_code == ErrorCode.NONE
        assert fetch(conn, group, "m1", 4, topic_id).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        assert beat(member_id="m2").error_code == ErrorCode.NONE
        other = fetch(conn, group, "m2", 0, topic_id)
        part = other.responses[0].partitions[0]
        assert [
            (a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records
        ] == [(0, 0, 3)]
        assert len(part.records.parts if hasattr(part.records, "parts") else part.records) > 0
        # A group id a classic group holds is not a share group.
        classic = conn.request(m.ApiKey.JOIN_GROUP, 5, m.JoinGroupRequest(
            group_id=f"classic-{group}", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            member_id="", protocol_type="consumer",
            protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))  # fmt: skip
        assert classic.error_code in (ErrorCode.NONE, ErrorCode.MEMBER_ID_REQUIRED)
        assert beat(group_id=f"classic-{group}").error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_a_leave_keeps_the_share_session_until_its_last_request_or_connection(
    broker_process: BrokerProcess,
) -> None:
    """As Kafka: membership and share sessions are apart. librdkafka's close() sends its
    leave and its last acknowledgements (ShareAcknowledge, epoch -1) at once on two
    connections; taken in that order the acknowledgements still land (before the fix:
    SHARE_SESSION_NOT_FOUND, and the leave had given the records back). A session
    whose member left without its last request ends with the connection that opened
    it, giving back what it held at once (the locks here last 30 s)."""
    topic, group = f"kip932-{uuid.uuid4().hex[:8]}", f"share-{uuid.uuid4().hex[:8]}"
    make_topic(broker_process.bootstrap, topic, 0)

    def beat(conn: Any, member: str, epoch: int) -> Any:
        return conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, HB(
            group_id=group, member_id=member, member_epoch=epoch,
            subscribed_topic_names=[topic] if epoch == 0 else None))  # fmt: skip

    def acquired(answer: Any) -> list[tuple[int, int, int]]:
        part = answer.responses[0].partitions[0]
        return [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records]

    with broker_process.connect() as coordinator, broker_process.connect() as leader:
        assert beat(coordinator, "m1", 0).error_code == ErrorCode.NONE
        topic_id = topic_id_of(coordinator, topic)
        with KafkaProducer(bootstrap_servers=broker_process.bootstrap) as producer:
            for i in range(4):  # one batch each: MaxRecords 3 takes three
                producer.send(topic, value=b"v%d" % i, partition=0)
                producer.flush()
        assert acquired(fetch(leader, group, "m1", 0, topic_id)) == [(0, 2, 1)]
        assert beat(coordinator, "m1", -1).error_code == ErrorCode.NONE  # the leave first
        closed = acknowledge(leader, group, "m1", -1, topic_id, [(0, 2, [1, 2, 3])])
        assert closed.error_code == ErrorCode.NONE
        assert closed.responses[0].partitions[0].error_code == ErrorCode.NONE
        # m2 gets the released offset 1 again and offset 3; 0 was accepted, 2 rejected.
        assert beat(coordinator, "m2", 0).error_code == ErrorCode.NONE
        with broker_process.connect() as lost:
            taken = fetch(lost, group, "m2", 0, topic_id)
            assert acquired(taken) == [(1, 1, 2), (3, 3, 1)]
            assert beat(coordinator, "m2", -1).error_code == ErrorCode.NONE
        # m2 left and its connection closed without an epoch -1 request: m3 gets what
        # m2 held at once, not after the 30 s locks.
        assert beat(coordinator, "m3", 0).error_code == ErrorCode.NONE
        deadline = time.monotonic() + 10
        while not acquired(again := fetch(leader, group, "m3", 0, topic_id)):
            assert time.monotonic() < deadline, "m2's records not given back"
        assert acquired(again) == [(1, 1, 3), (3, 3, 2)]
