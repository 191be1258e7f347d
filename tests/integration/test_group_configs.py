"""Group configs against the in-process broker: authorization, AlterConfigs, the per-group
share settings in force, ListConfigResources, and Kafka 4.4's kafka-configs
``--entity-type groups`` (tests/e2e/test_group_configs.py: the clients, a restart)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.kafka_tools import tool
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import Record, build_batch
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

GROUP = 32
SET = 0
TOPIC_ID = uuid.UUID(int=7)


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        yield RawClient(stream)


async def incremental(raw: RawClient, group: str, name: str, value: str) -> Any:
    Res = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    request = m.IncrementalAlterConfigsRequest(
        resources=[Res(resource_type=GROUP, resource_name=group, configs=[
            Res.AlterableConfig(name=name, config_operation=SET, value=value)])],
        validate_only=False,
    )  # fmt: skip
    [answer] = (await raw.call(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request)).responses
    return answer


async def describe(raw: RawClient, group: str) -> Any:
    Resource = m.DescribeConfigsRequest.DescribeConfigsResource
    request = m.DescribeConfigsRequest(
        resources=[Resource(resource_type=GROUP, resource_name=group, configuration_keys=None)],
        include_synonyms=False, include_documentation=False,
    )  # fmt: skip
    [result] = (await raw.call(m.ApiKey.DESCRIBE_CONFIGS, 4, request)).results
    return result


async def test_alter_configs_replaces_the_group_set(raw: RawClient, broker: Broker) -> None:
    """AlterConfigs (not incremental) takes GROUP resources too: the set given replaces
    the group's overrides."""
    assert (await incremental(raw, "g1", "share.delivery.count.limit", "3")).error_code == 0
    Res = m.AlterConfigsRequest.AlterConfigsResource
    request = m.AlterConfigsRequest(resources=[Res(
        resource_type=GROUP, resource_name="g1",
        configs=[Res.AlterableConfig(name="share.auto.offset.reset", value="earliest")])],
        validate_only=False)  # fmt: skip
    [answer] = (await raw.call(m.ApiKey.ALTER_CONFIGS, 2, request)).responses
    assert answer.error_code == ErrorCode.NONE
    assert broker.shares.group_configs.get("g1") == {"share.auto.offset.reset": "earliest"}


async def test_settings_apply_to_the_group_only(raw: RawClient, broker: Broker) -> None:
    """share.record.lock.duration.ms and share.delivery.count.limit reach the group's
    share partitions, made before or after; another group keeps the broker's."""
    shares = broker.shares
    before = shares.ensure_partition("g2", TOPIC_ID, 0, 0)
    assert (await incremental(raw, "g2", "share.record.lock.duration.ms", "20000")).error_code == 0
    assert (await incremental(raw, "g2", "share.delivery.count.limit", "2")).error_code == 0
    after = shares.ensure_partition("g2", TOPIC_ID, 1, 0)
    other = shares.ensure_partition("g3", TOPIC_ID, 0, 0)
    for share_partition in (before, after):
        [run] = share_partition.acquire("m", readable_end=5, max_records=5, now_ms=1000)
        assert share_partition.records[run.first_offset].lock_deadline_ms == 21_000
        assert share_partition.delivery_count_limit == 2
    other.acquire("m", readable_end=5, max_records=5, now_ms=1000)
    assert (
        other.records[0].lock_deadline_ms
        == 1000 + broker.config.group_share_record_lock_duration_ms
    )


async def test_share_auto_offset_reset_picks_the_start(raw: RawClient, broker: Broker) -> None:
    """A share partition made for the group's first member starts at the log start with
    earliest, at the first record of the last hour with by_duration:PT1H, at the log end
    by default (a ShareGroupHeartbeat assigns it)."""
    broker.topics.create("t-reset", 1)
    log = broker.topics.log("t-reset", 0)
    assert log is not None
    now = broker.now_ms()
    Req = m.ProduceRequest
    for base in (now - 2 * 3_600_000, now):  # three records two hours old, three new
        batch = bytes(build_batch([Record(i, 0, None, b"%d" % i) for i in range(3)],
                                  base_timestamp=base))  # fmt: skip
        data = Req.TopicProduceData(name="t-reset", partition_data=[
            Req.TopicProduceData.PartitionProduceData(index=0, records=batch)])  # fmt: skip
        request = Req(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[data])
        await raw.call(m.ApiKey.PRODUCE, 9, request)
    assert log.log_end_offset == 6
    for group, value in (("early", "earliest"), ("recent", "by_duration:PT1H")):
        assert (await incremental(raw, group, "share.auto.offset.reset", value)).error_code == 0
    topic_id = broker.topics.get("t-reset").topic_id  # type: ignore[union-attr]
    for group, start in (("early", 0), ("recent", 3), ("late", 6)):
        hb = m.ShareGroupHeartbeatRequest(
            group_id=group, member_id=uuid.uuid4().hex, member_epoch=0, rack_id=None,
            subscribed_topic_names=["t-reset"],
        )  # fmt: skip
        answer = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, hb)
        assert answer.error_code == ErrorCode.NONE
        share_partition = broker.shares.partition(group, topic_id, 0)
        assert share_partition is not None and share_partition.start_offset == start, group


async def test_list_config_resources_names_configured_groups(
    raw: RawClient, broker: Broker
) -> None:
    assert (
        await incremental(raw, "listed", "share.isolation.level", "read_committed")
    ).error_code == 0
    answer = await raw.call(m.ApiKey.LIST_CONFIG_RESOURCES, 1,
                            m.ListConfigResourcesRequest(resource_types=[GROUP]))  # fmt: skip
    assert [(r.resource_type, r.resource_name) for r in answer.config_resources] == [
        (GROUP, "listed")
    ]


class TestAuthorization:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")

    async def test_alter_and_describe_need_the_group_acl(
        self, raw: RawClient, broker: Broker
    ) -> None:
        """ALTER_CONFIGS / DESCRIBE_CONFIGS on the GROUP resource (on the cluster is not
        enough), else GROUP_AUTHORIZATION_FAILED, as Kafka answers."""
        assert broker.authorizer is not None
        broker.authorizer.store.add([AclBinding(
            RT.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:ANONYMOUS", "*",
            Operation.ALL, Permission.ALLOW)])  # fmt: skip
        refused = await incremental(raw, "mine", "share.auto.offset.reset", "earliest")
        assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert (await describe(raw, "mine")).error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        broker.authorizer.store.add([AclBinding(
            RT.GROUP, "mine", PatternType.LITERAL, "User:ANONYMOUS", "*", op,
            Permission.ALLOW) for op in (Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS)])  # fmt: skip
        allowed = await incremental(raw, "mine", "share.auto.offset.reset", "earliest")
        assert allowed.error_code == ErrorCode.NONE
        described = await describe(raw, "mine")
        assert described.error_code == ErrorCode.NONE
        assert {c.name: c.value for c in described.configs}["share.auto.offset.reset"] == "earliest"
        other = await incremental(raw, "theirs", "share.auto.offset.reset", "earliest")
        assert other.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED


# ------------------------------------------------------------------ Kafka's kafka-configs


tools_classpath = tool.tools_classpath


@pytest.mark.timeout(300)
async def test_kafka_configs_entity_type_groups(
    broker: Broker, bootstrap: str, tools_classpath: str
) -> None:
    """kafka-configs --alter then --describe --entity-type groups (Kafka 4.4's tool)."""

    def run(*args: str) -> str:
        return tool.run_tool(tools_classpath, "ConfigCommand", "--bootstrap-server", bootstrap,
                             "--entity-type", "groups", "--entity-name", "tool-group",
                             *args).stdout  # fmt: skip

    await trio.to_thread.run_sync(
        run, "--alter", "--add-config", "share.auto.offset.reset=earliest"
    )
    assert broker.shares.group_configs.get("tool-group") == {"share.auto.offset.reset": "earliest"}
    described = await trio.to_thread.run_sync(run, "--describe")
    assert "share.auto.offset.reset=earliest" in described, described


async def test_share_fetch_reports_the_groups_lock_duration(raw: RawClient, broker: Broker) -> None:
    """AcquisitionLockTimeoutMs is the lock the group's acquisitions take: its own
    share.record.lock.duration.ms, else the broker's group.share.record.lock.duration.ms
    (Kafka 4.x's KafkaApis reports the group config's); 0 on a request refused whole
    (Kafka's error response)."""
    broker.topics.create("t-lock", 1)
    topic_id = broker.topics.get("t-lock").topic_id  # type: ignore[union-attr]
    assert (
        await incremental(raw, "locked", "share.record.lock.duration.ms", "20000")
    ).error_code == 0

    async def share_fetch(group: str, member: str) -> Any:
        Req = m.ShareFetchRequest
        request = Req(
            group_id=group, member_id=member, share_session_epoch=0, max_wait_ms=0,
            min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10,
            topics=[Req.FetchTopic(topic_id=topic_id, partitions=[
                Req.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
            forgotten_topics_data=[],
        )  # fmt: skip
        return await raw.call(m.ApiKey.SHARE_FETCH, 1, request)

    locked = await share_fetch("locked", uuid.uuid4().hex)
    assert (locked.error_code, locked.acquisition_lock_timeout_ms) == (ErrorCode.NONE, 20_000)
    default = await share_fetch("plain", uuid.uuid4().hex)
    assert default.error_code == ErrorCode.NONE
    assert default.acquisition_lock_timeout_ms == broker.config.group_share_record_lock_duration_ms
    refused = await share_fetch("locked", "")  # no member id: INVALID_REQUEST
    assert (refused.error_code, refused.acquisition_lock_timeout_ms) == (
        ErrorCode.INVALID_REQUEST,
        0,
    )
