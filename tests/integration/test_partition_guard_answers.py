"""Kafka's answers of the one partition guard, over a real socket (issue 29).

An in-process broker (1) joins a cluster whose view it is given: it holds a copy of
``followed`` (partition 0, three records) led by broker 2 in leader epoch 5, holds
``leaderless`` whose partition has no leader, and holds no copy of ``elsewhere`` (one
partition, on other brokers). Its replica manager leads nothing. Every answer below is
Kafka's (ReplicaManager.getPartitionOrError, Partition.getLocalLog); each one marked
"was" differs from what the broker answered before the guard was written once:

- a follower compares the client's leader epoch with the one it knows before it says
  NOT_LEADER_OR_FOLLOWER: older FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH, in
  Fetch, ListOffsets and OffsetForLeaderEpoch (was NOT_LEADER_OR_FOLLOWER);
- ListOffsets from the debugging replica id (-2) reads the follower's copy: the log
  end, the epoch it knows (was NOT_LEADER_OR_FOLLOWER); a follower's replica id and a
  consumer still need the leader;
- a partition held here without a leader is NOT_LEADER_OR_FOLLOWER (was
  LEADER_NOT_AVAILABLE);
- Produce and Fetch to a partition the cluster lacks, of a topic held on other brokers:
  UNKNOWN_TOPIC_OR_PARTITION (was NOT_LEADER_OR_FOLLOWER); its partition 0 stays
  NOT_LEADER_OR_FOLLOWER;
- DeleteRecords on a follower: NOT_LEADER_OR_FOLLOWER (no epoch in that request); on a
  partition of ``__consumer_offsets`` the cluster has, INVALID_TOPIC_EXCEPTION wherever
  it is asked (was NOT_LEADER_OR_FOLLOWER here, and a cut of the log on its leader).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.integration.stand_in import stand_in_replica_manager
from tests.wire_requests import fetch_request
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import PartitionInfo, TopicInfo

E = ErrorCode
LEADER, EPOCH, RECORDS = 2, 5, 3
CONSUMER, DEBUGGING = -1, -2


async def follow(broker: Broker) -> None:
    me = broker.config.node_id
    manager = stand_in_replica_manager(broker)
    followed = broker.topics.create("followed", 1)
    log = broker.topics.log("followed", 0)
    assert log is not None and followed.topic_id is not None
    log.append(build_batch([(None, b"r%d" % i) for i in range(RECORDS)]), now_ms=0)
    leaderless = broker.topics.create("leaderless", 1)
    assert leaderless.topic_id is not None
    led = PartitionInfo((me, LEADER), LEADER, EPOCH, (me, LEADER))
    offline = PartitionInfo((me, LEADER), -1, EPOCH, (me,))
    view = manager.view.topics
    view["followed"] = TopicInfo("followed", followed.topic_id, {0: led})
    view["leaderless"] = TopicInfo("leaderless", leaderless.topic_id, {0: offline})
    view["elsewhere"] = TopicInfo("elsewhere", uuid.uuid4(), {0: led})
    view["__consumer_offsets"] = TopicInfo("__consumer_offsets", uuid.uuid4(), {0: led})
    broker.replication = manager


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    await follow(broker)
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        yield RawClient(stream)


async def list_offsets(
    raw: RawClient, topic: str, current: int = -1, replica_id: int = CONSUMER
) -> tuple[int, int, int]:
    Req = m.ListOffsetsRequest
    part = Req.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, timestamp=-1, current_leader_epoch=current
    )
    request = Req(replica_id=replica_id, isolation_level=0,
                  topics=[Req.ListOffsetsTopic(name=topic, partitions=[part])])  # fmt: skip
    answer = (await raw.call(m.ApiKey.LIST_OFFSETS, 7, request)).topics[0].partitions[0]
    return answer.error_code, answer.offset, answer.leader_epoch


async def offset_for_epoch(raw: RawClient, topic: str, current: int) -> int:
    Req = m.OffsetForLeaderEpochRequest
    part = Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=EPOCH
    )
    request = Req(replica_id=-1, topics=[Req.OffsetForLeaderTopic(topic=topic, partitions=[part])])
    response = await raw.call(m.ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, request)
    return int(response.topics[0].partitions[0].error_code)


async def fetch(raw: RawClient, topic: str, partition: int, current: int = -1) -> Any:
    request = fetch_request(topic, partition, current_leader_epoch=current)
    return (await raw.call(m.ApiKey.FETCH, 12, request)).responses[0].partitions[0]


async def produce(raw: RawClient, topic: str, partition: int) -> int:
    Req = m.ProduceRequest
    batch = bytes(build_batch([(None, b"new")]))
    request = Req(acks=1, timeout_ms=10_000, topic_data=[Req.TopicProduceData(
        name=topic, partition_data=[Req.TopicProduceData.PartitionProduceData(
            index=partition, records=batch)],
    )])  # fmt: skip
    response = await raw.call(m.ApiKey.PRODUCE, 9, request)
    return int(response.responses[0].partition_responses[0].error_code)


async def delete_records(raw: RawClient, topic: str) -> int:
    Req = m.DeleteRecordsRequest
    part = Req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=1)
    request = Req(timeout_ms=1_000,
                  topics=[Req.DeleteRecordsTopic(name=topic, partitions=[part])])  # fmt: skip
    response = await raw.call(m.ApiKey.DELETE_RECORDS, 2, request)
    return int(response.topics[0].partitions[0].error_code)


async def test_a_follower_checks_the_leader_epoch_first(raw: RawClient) -> None:
    for current, error in (
        (-1, E.NOT_LEADER_OR_FOLLOWER),
        (EPOCH, E.NOT_LEADER_OR_FOLLOWER),
        (EPOCH - 1, E.FENCED_LEADER_EPOCH),
        (EPOCH + 1, E.UNKNOWN_LEADER_EPOCH),
    ):
        assert (await list_offsets(raw, "followed", current))[0] == error, current
        assert (await fetch(raw, "followed", 0, current)).error_code == error, current
        if current != -1:
            assert await offset_for_epoch(raw, "followed", current) == error, current
    # A fenced fetch names the leader (KIP-951), as a not-the-leader one does.
    fenced = await fetch(raw, "followed", 0, EPOCH - 1)
    assert (fenced.current_leader.leader_id, fenced.current_leader.leader_epoch) == (
        LEADER,
        EPOCH,
    )


async def test_the_debugging_replica_id_reads_a_followers_copy(raw: RawClient) -> None:
    assert await list_offsets(raw, "followed", replica_id=DEBUGGING) == (E.NONE, RECORDS, EPOCH)
    assert await list_offsets(raw, "followed", EPOCH, replica_id=DEBUGGING) == (
        E.NONE,
        RECORDS,
        EPOCH,
    )
    assert (await list_offsets(raw, "followed", EPOCH - 1, replica_id=DEBUGGING))[0] == (
        E.FENCED_LEADER_EPOCH
    )
    # A follower's broker id and a consumer need the leader.
    assert (await list_offsets(raw, "followed", replica_id=3))[0] == E.NOT_LEADER_OR_FOLLOWER
    assert (await list_offsets(raw, "followed"))[0] == E.NOT_LEADER_OR_FOLLOWER
    # No copy here to read.
    assert (await list_offsets(raw, "elsewhere", replica_id=DEBUGGING))[0] == (
        E.NOT_LEADER_OR_FOLLOWER
    )


async def test_a_partition_without_a_leader_is_not_led_here(raw: RawClient) -> None:
    assert await produce(raw, "leaderless", 0) == E.NOT_LEADER_OR_FOLLOWER
    assert (await fetch(raw, "leaderless", 0)).error_code == E.NOT_LEADER_OR_FOLLOWER
    assert (await list_offsets(raw, "leaderless"))[0] == E.NOT_LEADER_OR_FOLLOWER


async def test_a_topic_held_elsewhere_answers_per_partition(raw: RawClient) -> None:
    assert await produce(raw, "elsewhere", 0) == E.NOT_LEADER_OR_FOLLOWER
    assert (await fetch(raw, "elsewhere", 0)).error_code == E.NOT_LEADER_OR_FOLLOWER
    assert await produce(raw, "elsewhere", 1) == E.UNKNOWN_TOPIC_OR_PARTITION
    assert (await fetch(raw, "elsewhere", 1)).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert (await list_offsets(raw, "elsewhere"))[0] == E.NOT_LEADER_OR_FOLLOWER
    assert await produce(raw, "nowhere", 0) == E.UNKNOWN_TOPIC_OR_PARTITION


async def test_delete_records_needs_the_leader(raw: RawClient) -> None:
    assert await delete_records(raw, "followed") == E.NOT_LEADER_OR_FOLLOWER
    assert await delete_records(raw, "elsewhere") == E.NOT_LEADER_OR_FOLLOWER
    assert await delete_records(raw, "nowhere") == E.UNKNOWN_TOPIC_OR_PARTITION


async def test_delete_records_refuses_an_internal_topic(raw: RawClient) -> None:
    assert await delete_records(raw, "__consumer_offsets") == E.INVALID_TOPIC_EXCEPTION
    assert await delete_records(raw, "__transaction_state") == E.UNKNOWN_TOPIC_OR_PARTITION
