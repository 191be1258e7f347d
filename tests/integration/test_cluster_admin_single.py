"""ElectLeaders and the reassignment APIs on a broker that runs alone, every version,
over a real socket, and through kafka-python's admin client.

Alone, the broker leads every partition it has and has nowhere to move one to: an
election is never needed, a move may only name this broker, nothing is ever listed
as moving. Unknown partitions get UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient

from tests.integration.raw_client import RawClient, create_topics_request
from trio_broker.handlers import load_handlers
from trio_broker.handlers.base import HANDLERS
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

load_handlers()


def versions(api_key: int) -> list[int]:
    spec = HANDLERS[api_key]
    return list(range(spec.min_version, spec.max_version + 1))


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        client = RawClient(stream)
        created = await client.call(m.ApiKey.CREATE_TOPICS, 7, create_topics_request("solo", 2))
        assert created.topics[0].error_code == ErrorCode.NONE
        yield client


@pytest.mark.parametrize("version", versions(m.ApiKey.ELECT_LEADERS))
async def test_elect_leaders_alone(raw: RawClient, version: int) -> None:
    Req = m.ElectLeadersRequest
    named = Req(
        election_type=0,
        topic_partitions=[Req.TopicPartitions(topic="solo", partitions=[1, 0, 9])],
        timeout_ms=5000,
    )
    response = await raw.call(m.ApiKey.ELECT_LEADERS, version, named)
    assert response.error_code == ErrorCode.NONE
    [result] = response.replica_election_results
    assert [(p.partition_id, p.error_code) for p in result.partition_result] == [
        (1, ErrorCode.ELECTION_NOT_NEEDED),
        (0, ErrorCode.ELECTION_NOT_NEEDED),
        (9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    everything = await raw.call(
        m.ApiKey.ELECT_LEADERS, version, Req(election_type=0, topic_partitions=None)
    )
    assert everything.replica_election_results == []
    if version >= 1:
        odd = await raw.call(m.ApiKey.ELECT_LEADERS, version, Req(election_type=7, topic_partitions=[
            Req.TopicPartitions(topic="solo", partitions=[0])]))  # fmt: skip
        assert odd.error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("version", versions(m.ApiKey.ALTER_PARTITION_REASSIGNMENTS))
async def test_reassignments_alone(raw: RawClient, broker: Broker, version: int) -> None:
    Req = m.AlterPartitionReassignmentsRequest
    Part = Req.ReassignableTopic.ReassignablePartition
    me = broker.config.node_id
    request = Req(timeout_ms=5000, allow_replication_factor_change=True, topics=[
        Req.ReassignableTopic(name="solo", partitions=[
            Part(partition_index=0, replicas=[me]), Part(partition_index=1, replicas=[me + 1]),
            Part(partition_index=1 + 1, replicas=[me]), Part(partition_index=0, replicas=None),
        ])
    ])  # fmt: skip
    response = await raw.call(m.ApiKey.ALTER_PARTITION_REASSIGNMENTS, version, request)
    assert response.error_code == ErrorCode.NONE
    [topic] = response.responses
    # Partition 0 is named twice: the later entry (a cancel) is the one that counts.
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (0, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS),
        (1, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    listed = await raw.call(
        m.ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, m.ListPartitionReassignmentsRequest(topics=None)
    )
    assert (listed.error_code, listed.topics) == (ErrorCode.NONE, [])


async def test_kafka_python_admin_alone(raw: RawClient, broker: Broker, bootstrap: str) -> None:
    me = broker.config.node_id

    def admin_calls() -> tuple[object, object, object]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            elected = admin.elect_leaders(0, {"solo": [0]}, raise_errors=False)
            moved = admin.alter_partition_reassignments({TopicPartition("solo", 0): [me]})
            return elected, moved, admin.list_partition_reassignments()
        finally:
            admin.close()

    elected, moved, listed = await trio.to_thread.run_sync(admin_calls)
    [result] = elected.replica_election_results  # type: ignore[attr-defined]
    assert result.partition_result[0].error_code == ErrorCode.ELECTION_NOT_NEEDED
    assert moved == {TopicPartition("solo", 0): None}
    assert listed == {}
