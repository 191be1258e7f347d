"""Share-partition state belongs to a topic id, not a topic name (KIP-932, as Kafka keys it).

A share group consumes from a topic, acknowledges part of it (its start offset moves),
leaves; the topic is deleted and created again under the same name. The new topic is
another topic (a new id): the group has no share state for it until it is assigned one,
which then starts at the new log end, and its records are delivered from there. The old
topic's state is dropped with it, also from ``__share_group_state`` (tombstones), so a
restart does not bring it back. Raw requests (our codec) to an in-process broker.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.raw_client import RawClient, create_topics_request, file_broker_and_client
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

TOPIC, GROUP, MEMBER = "work", "sharers", "m1"
HB, SF, SA = m.ShareGroupHeartbeatRequest, m.ShareFetchRequest, m.ShareAcknowledgeRequest
ACCEPT = 1


async def create(client: RawClient) -> uuid.UUID:
    result = (await client.call(m.ApiKey.CREATE_TOPICS, 7, create_topics_request(TOPIC))).topics[0]
    assert result.error_code == ErrorCode.NONE, result
    return result.topic_id


async def delete(client: RawClient) -> None:
    body = m.DeleteTopicsRequest(topics=[m.DeleteTopicsRequest.DeleteTopicState(
        name=TOPIC, topic_id=uuid.UUID(int=0))], timeout_ms=10_000)  # fmt: skip
    result = (await client.call(m.ApiKey.DELETE_TOPICS, 6, body)).responses[0]
    assert result.error_code == ErrorCode.NONE, result


async def produce(client: RawClient, count: int) -> None:
    Req = m.ProduceRequest
    batch = bytes(build_batch([(None, b"r%d" % i) for i in range(count)]))
    body = Req(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        Req.TopicProduceData(name=TOPIC, partition_data=[
            Req.TopicProduceData.PartitionProduceData(index=0, records=batch)])])  # fmt: skip
    part = (await client.call(m.ApiKey.PRODUCE, 9, body)).responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.NONE


async def heartbeat(client: RawClient, epoch: int) -> Any:
    body = HB(group_id=GROUP, member_id=MEMBER, member_epoch=epoch,
              subscribed_topic_names=[TOPIC] if epoch == 0 else None)  # fmt: skip
    response = await client.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, body)
    assert response.error_code == ErrorCode.NONE, response
    return response


async def fetch(client: RawClient, topic_id: uuid.UUID, epoch: int) -> list[tuple[int, int, int]]:
    body = SF(
        group_id=GROUP, member_id=MEMBER, share_session_epoch=epoch, max_wait_ms=0,
        min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
            SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
        forgotten_topics_data=[],
    )  # fmt: skip
    response = await client.call(m.ApiKey.SHARE_FETCH, 1, body)
    assert response.error_code == ErrorCode.NONE, response
    part = response.responses[0].partitions[0]
    assert part.error_code == ErrorCode.NONE, part
    return [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records]


async def accept_and_close(client: RawClient, topic_id: uuid.UUID, first: int, last: int) -> None:
    Part = SA.AcknowledgeTopic.AcknowledgePartition
    body = SA(group_id=GROUP, member_id=MEMBER, share_session_epoch=-1, topics=[
        SA.AcknowledgeTopic(topic_id=topic_id, partitions=[Part(partition_index=0,
            acknowledgement_batches=[Part.AcknowledgementBatch(
                first_offset=first, last_offset=last, acknowledge_types=[ACCEPT])])])])  # fmt: skip
    response = await client.call(m.ApiKey.SHARE_ACKNOWLEDGE, 1, body)
    assert response.responses[0].partitions[0].error_code == ErrorCode.NONE, response


async def start_offsets(client: RawClient) -> list[tuple[str, uuid.UUID, int, int]]:
    """(topic, id, partition, start offset) of every partition the group has state for."""
    Req = m.DescribeShareGroupOffsetsRequest
    body = Req(groups=[Req.DescribeShareGroupOffsetsRequestGroup(group_id=GROUP, topics=None)])
    group = (await client.call(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, body)).groups[0]
    assert group.error_code == ErrorCode.NONE
    return [(t.topic_name, t.topic_id, p.partition_index, p.start_offset)
            for t in group.topics for p in t.partitions]  # fmt: skip


async def test_a_recreated_topic_does_not_inherit_share_state(tmp_path: Path) -> None:
    async with file_broker_and_client(tmp_path / "data") as (broker, client):
        old_id = await create(client)
        joined = await heartbeat(client, 0)  # the share partition starts at the log end, 0
        await produce(client, 5)
        assert await fetch(client, old_id, 0) == [(0, 4, 1)]
        await accept_and_close(client, old_id, 0, 4)
        await heartbeat(client, -1)  # leaves; the group keeps its share state
        assert await start_offsets(client) == [(TOPIC, old_id, 0, 5)]

        await delete(client)
        new_id = await create(client)
        assert new_id != old_id
        assert await start_offsets(client) == []  # nothing for the new topic, nor the old
        store = broker.share_coordinator.tables[0].store  # a node alone's one partition
        assert not [k for k in store.snapshots if k.topic_id == old_id]

        await produce(client, 2)  # offsets 0-1, before the group is assigned the topic
        joined = await heartbeat(client, 0)
        assert joined.assignment.topic_partitions[0].topic_id == new_id
        assert await start_offsets(client) == [(TOPIC, new_id, 0, 2)]
        await produce(client, 3)  # offsets 2-4: the group's
        assert await fetch(client, new_id, 0) == [(2, 4, 1)]
        await accept_and_close(client, new_id, 2, 3)
        await heartbeat(client, -1)

    async with file_broker_and_client(tmp_path / "data") as (broker, client):
        assert await start_offsets(client) == [(TOPIC, new_id, 0, 4)]
        store = broker.share_coordinator.tables[0].store
        assert {k.topic_id for k in store.snapshots} == {new_id}
