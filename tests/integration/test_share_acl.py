"""Share groups under ACLs (KIP-932), as Kafka authorizes them, against an in-process
broker: READ on the group for ShareGroupHeartbeat, ShareFetch and ShareAcknowledge,
DESCRIBE on it for ShareGroupDescribe, DESCRIBE on each subscribed topic for the
heartbeat and READ on each fetched topic. Raw requests, so every error code is visible;
the bindings are seeded into the broker's store (the setup, not the subject)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_acl_clients import connect, grant
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import Operation, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)
SF = m.ShareFetchRequest
SA = m.ShareAcknowledgeRequest


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")


async def test_share_group_apis_check_group_and_topic_acls(broker: Broker) -> None:
    jobs, secret = broker.topics.create("jobs", 1), broker.topics.create("secret", 1)
    grant(broker, RT.TOPIC, "jobs", Operation.READ, Operation.DESCRIBE)
    grant(broker, RT.GROUP, "*", Operation.READ, Operation.DESCRIBE)
    grant(broker, RT.GROUP, "forbidden", Operation.ALL, permission=Permission.DENY)
    denied, topic_denied = (
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    )

    def fetch(group: str, topic_id: object, epoch: int = 0) -> SF:
        return SF(group_id=group, member_id="m1", share_session_epoch=epoch, max_wait_ms=0,
                  min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10,
                  topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
                      SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
                  forgotten_topics_data=[])  # fmt: skip

    async with connect(broker) as raw:

        async def beat(group: str, topics: list[str]) -> int:
            answer = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
                group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=topics))  # fmt: skip
            return int(answer.error_code)

        assert await beat("forbidden", ["jobs"]) == denied
        assert await beat("ok", ["jobs", "secret"]) == topic_denied
        assert await beat("ok", ["jobs"]) == ErrorCode.NONE
        described = await raw.call(m.ApiKey.SHARE_GROUP_DESCRIBE, 1, m.ShareGroupDescribeRequest(
            group_ids=["forbidden", "ok"], include_authorized_operations=False))  # fmt: skip
        assert [g.error_code for g in described.groups] == [denied, ErrorCode.NONE]
        forbidden = await raw.call(m.ApiKey.SHARE_FETCH, 1, fetch("forbidden", jobs.topic_id))
        assert forbidden.error_code == denied and forbidden.responses == []
        hidden = await raw.call(m.ApiKey.SHARE_FETCH, 1, fetch("ok", secret.topic_id))
        assert hidden.error_code == ErrorCode.NONE
        assert hidden.responses[0].partitions[0].error_code == topic_denied
        acked = await raw.call(m.ApiKey.SHARE_ACKNOWLEDGE, 1, SA(
            group_id="forbidden", member_id="m1", share_session_epoch=1, topics=[]))  # fmt: skip
        assert acked.error_code == denied


async def test_share_admin_apis_check_group_and_topic_acls(broker: Broker) -> None:
    """DescribeShareGroupOffsets: DESCRIBE on the group and each topic; Alter: READ on
    the group and each topic; Delete (and DeleteGroups): DELETE on the group, READ on
    each topic. ListGroups lists the share group with type ``share``."""
    jobs, secret = broker.topics.create("jobs", 1), broker.topics.create("secret", 1)
    grant(broker, RT.TOPIC, "jobs", Operation.READ, Operation.DESCRIBE)
    grant(broker, RT.TOPIC, "nope", Operation.DESCRIBE)  # no such topic: not an error
    grant(broker, RT.GROUP, "*", Operation.READ, Operation.DESCRIBE)
    grant(broker, RT.GROUP, "forbidden", Operation.ALL, permission=Permission.DENY)
    denied, topic_denied = (
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    )
    Desc, Alter = m.DescribeShareGroupOffsetsRequest, m.AlterShareGroupOffsetsRequest
    Delete = m.DeleteShareGroupOffsetsRequest
    AlterPart = Alter.AlterShareGroupOffsetsRequestTopic.AlterShareGroupOffsetsRequestPartition

    async with connect(broker) as raw:
        for epoch in (0, -1):  # joins (its share partition starts at 0), then leaves
            answer = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
                group_id="ok", member_id="m1", member_epoch=epoch,
                subscribed_topic_names=["jobs"] if epoch == 0 else None))  # fmt: skip
            assert answer.error_code == ErrorCode.NONE
        listed = await raw.call(m.ApiKey.LIST_GROUPS, 5, m.ListGroupsRequest(
            states_filter=[], types_filter=["share"]))  # fmt: skip
        assert [(g.group_id, g.group_type, g.protocol_type, g.group_state)
                for g in listed.groups] == [("ok", "share", "share", "Empty")]  # fmt: skip

        described = await raw.call(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, Desc(groups=[
            Desc.DescribeShareGroupOffsetsRequestGroup(group_id="forbidden", topics=None),
            Desc.DescribeShareGroupOffsetsRequestGroup(group_id="ok", topics=None),
            Desc.DescribeShareGroupOffsetsRequestGroup(group_id="ok", topics=[
                Desc.DescribeShareGroupOffsetsRequestGroup.DescribeShareGroupOffsetsRequestTopic(
                    topic_name=name, partitions=[0]) for name in ("jobs", "secret", "nope")]),
        ]))  # fmt: skip
        forbidden, every, named = described.groups
        assert forbidden.error_code == denied
        assert [(t.topic_name, t.topic_id) for t in every.topics] == [("jobs", jobs.topic_id)]
        rows = [(t.topic_name, p.start_offset, p.lag, p.error_code)
                for t in named.topics for p in t.partitions]  # fmt: skip
        assert rows == [("jobs", 0, 0, 0), ("secret", -1, -1, topic_denied), ("nope", -1, -1, 0)]

        altered = await raw.call(m.ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, Alter(
            group_id="ok", topics=[Alter.AlterShareGroupOffsetsRequestTopic(
                topic_name=name, partitions=[AlterPart(partition_index=0, start_offset=0)])
                for name in ("jobs", "secret")]))  # fmt: skip
        assert altered.error_code == ErrorCode.NONE
        assert [(t.topic_name, t.partitions[0].error_code) for t in altered.responses] == [
            ("jobs", ErrorCode.NONE), ("secret", topic_denied)]  # fmt: skip
        refused = await raw.call(m.ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, Alter(
            group_id="forbidden", topics=[]))  # fmt: skip
        assert refused.error_code == denied

        def delete() -> Delete:
            return Delete(group_id="ok", topics=[
                Delete.DeleteShareGroupOffsetsRequestTopic(topic_name=name)
                for name in ("jobs", "secret")])  # fmt: skip

        no_delete = await raw.call(m.ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, delete())
        assert no_delete.error_code == denied
        grant(broker, RT.GROUP, "ok", Operation.DELETE)
        deleted = await raw.call(m.ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, delete())
        assert [(t.topic_name, t.error_code) for t in deleted.responses] == [
            ("jobs", ErrorCode.NONE), ("secret", topic_denied)]  # fmt: skip
        assert secret.topic_id not in {t.topic_id for t in deleted.responses}
        gone = await raw.call(m.ApiKey.DELETE_GROUPS, 2, m.DeleteGroupsRequest(
            groups_names=["ok"]))  # fmt: skip
        assert [(r.group_id, r.error_code) for r in gone.results] == [("ok", ErrorCode.NONE)]
