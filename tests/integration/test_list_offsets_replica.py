"""ListOffsets from a replica sees the whole log; a consumer sees what is committed.

An in-process broker leads partition 0 as a cluster's leader (a replica manager with a
follower, broker 2, in the ISR that has fetched nothing, so the high watermark stays
put), asked over a real socket:

- latest: a consumer (replica id -1) gets the HW, a follower (its broker id) and the
  debugging id -2 the log end, as Kafka's Partition.fetchOffsetForTimestamp with no
  isolation level for a replica;
- a search by timestamp finding a record at or past the HW is -1 for a consumer (not
  yet readable), that record for a replica;
- a new leader whose HW lags its term's start (KIP-207) refuses a consumer's latest
  (OFFSET_NOT_AVAILABLE, LEADER_NOT_AVAILABLE before v5) but not a replica's.

Before the fix a replica's latest got the HW, or OFFSET_NOT_AVAILABLE, and a consumer's
search found records above the HW.
"""

from __future__ import annotations

import trio

from tests.integration.raw_client import RawClient
from tests.integration.stand_in import stand_in_replica_manager
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import PartitionInfo, TopicInfo

TOPIC = "replica-offsets"
FOLLOWER = 2
EPOCH = 3
LATEST, SEARCH_FROM_0 = -1, 0


async def lead(broker: Broker, records_before: int) -> ReplicaManager:
    """Lead partition 0 in epoch 3 with ``records_before`` records already in the log
    (they came from an earlier leader: the term starts past the HW)."""
    me = broker.config.node_id
    topic = broker.topics.create(TOPIC, 1)
    log = broker.topics.log(TOPIC, 0)
    assert log is not None and topic.topic_id is not None
    for i in range(records_before):
        log.append(build_batch([(None, b"old %d" % i)], base_timestamp=1000), now_ms=0)
    manager = stand_in_replica_manager(broker)
    info = PartitionInfo((me, FOLLOWER), me, EPOCH, (me, FOLLOWER))
    manager.view.topics[TOPIC] = TopicInfo(TOPIC, topic.topic_id, {0: info})
    await manager._become_leader(TOPIC, 0, info)
    broker.replication = manager
    return manager


async def list_offsets(
    stream: trio.SocketStream, replica_id: int, timestamp: int, version: int = 7
) -> tuple[int, int, int]:
    """(error, offset, leader epoch) of partition 0."""
    Req = m.ListOffsetsRequest
    request = Req(
        replica_id=replica_id, isolation_level=0,
        topics=[Req.ListOffsetsTopic(name=TOPIC, partitions=[
            Req.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=timestamp)
        ])],
    )  # fmt: skip
    response = await RawClient(stream).call(m.ApiKey.LIST_OFFSETS, version, request)
    part = response.topics[0].partitions[0]
    return part.error_code, part.offset, part.leader_epoch


async def produce_acks1(stream: trio.SocketStream) -> None:
    Req = m.ProduceRequest
    batch = build_batch([(None, b"new")], base_timestamp=2000)
    request = Req(
        acks=1, timeout_ms=10_000,
        topic_data=[Req.TopicProduceData(name=TOPIC, partition_data=[
            Req.TopicProduceData.PartitionProduceData(index=0, records=bytes(batch))
        ])],
    )  # fmt: skip
    produced = await RawClient(stream).call(m.ApiKey.PRODUCE, 9, request)
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.NONE


async def test_a_replica_gets_the_log_end_and_a_consumer_the_high_watermark(
    broker: Broker,
) -> None:
    manager = await lead(broker, records_before=0)
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        await produce_acks1(stream)  # appended; the follower has not fetched it: HW 0
        assert manager.terms[TOPIC, 0].high_watermark == 0
        assert await list_offsets(stream, -1, LATEST) == (ErrorCode.NONE, 0, EPOCH)
        assert await list_offsets(stream, FOLLOWER, LATEST) == (ErrorCode.NONE, 1, EPOCH)
        assert await list_offsets(stream, -2, LATEST) == (ErrorCode.NONE, 1, EPOCH)
        # The record at offset 0 is not committed: a consumer's search does not find it.
        assert await list_offsets(stream, -1, SEARCH_FROM_0) == (ErrorCode.NONE, -1, -1)
        assert await list_offsets(stream, FOLLOWER, SEARCH_FROM_0) == (ErrorCode.NONE, 0, EPOCH)


async def test_a_lagging_new_leader_refuses_a_consumer_but_not_a_replica(
    broker: Broker,
) -> None:
    await lead(broker, records_before=3)  # the term starts at 3, its HW is 0 (KIP-207)
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        assert (await list_offsets(stream, -1, LATEST))[0] == ErrorCode.OFFSET_NOT_AVAILABLE
        assert (await list_offsets(stream, -1, LATEST, version=4))[0] == (
            ErrorCode.LEADER_NOT_AVAILABLE
        )
        assert (await list_offsets(stream, -1, SEARCH_FROM_0))[0] == (
            ErrorCode.OFFSET_NOT_AVAILABLE
        )
        assert await list_offsets(stream, FOLLOWER, LATEST) == (ErrorCode.NONE, 3, EPOCH)
        assert await list_offsets(stream, FOLLOWER, SEARCH_FROM_0) == (ErrorCode.NONE, 0, EPOCH)
