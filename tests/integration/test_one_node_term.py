"""A node alone is a cluster of one (issue 29): the data path reads its term
(services/local_replication.py) and answers as a single node always has.

Over a real socket against the in-process broker: the leader epoch is 0 wherever it
is shown, the high watermark is the durable end (here the log end: an acks=-1 produce
is synced when answered), a batch keeps the producer's
partitionLeaderEpoch (no epoch cache entry), and Fetch checks no current leader epoch
while ListOffsets and OffsetForLeaderEpoch do (Kafka's rule: only -1 skips it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from tests.integration.test_admin_apis import RawClient, batch_at
from tests.wire_requests import fetch_request
from trio_broker.handlers import load_handlers
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import iter_batches
from trio_broker.server.broker import Broker

load_handlers()


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        yield RawClient(stream)


async def fetch(raw: RawClient, topic: str, current_leader_epoch: int) -> Any:
    req = fetch_request(topic, current_leader_epoch=current_leader_epoch, isolation_level=1)
    response = await raw.call(m.ApiKey.FETCH, 12, req)
    return response.responses[0].partitions[0]


async def offset_for_epoch(raw: RawClient, topic: str, epoch: int, current: int) -> Any:
    Req = m.OffsetForLeaderEpochRequest
    part = Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=epoch
    )
    req = Req(replica_id=-1, topics=[Req.OffsetForLeaderTopic(topic=topic, partitions=[part])])
    response = await raw.call(m.ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, req)
    return response.topics[0].partitions[0]


async def test_a_node_alone_answers_as_the_leader_of_a_cluster_of_one(
    raw: RawClient, broker: Broker
) -> None:
    await raw.create_topic("solo")
    assert await raw.produce("solo", 0, batch_at(1, 2, 3)) == 0  # acks=-1: synced, done

    # Fetch: any current leader epoch is taken (as a node alone always has); the high
    # watermark and the LSO are the durable end, the log end once synced.
    for current in (-1, 0, 3):
        part = await fetch(raw, "solo", current)
        assert (part.error_code, part.high_watermark, part.last_stable_offset) == (0, 3, 3)
        [batch] = list(iter_batches(bytes(part.records)))
        # The batch keeps the producer's partitionLeaderEpoch: nothing stamped it.
        assert (batch.base_offset, batch.partition_leader_epoch) == (0, -1)
    log = broker.topics.log("solo", 0)
    assert log is not None and list(log.epoch_cache.entries) == []

    # ListOffsets: the latest offset is the high watermark, in leader epoch 0.
    latest = await raw.list_offsets("solo", 0, -1, current_leader_epoch=0)
    assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, 3, 0)
    for current, error in (
        (1, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (-2, ErrorCode.FENCED_LEADER_EPOCH),
    ):
        fenced = await raw.list_offsets("solo", 0, -1, current_leader_epoch=current)
        assert fenced.error_code == error

    # OffsetForLeaderEpoch: epoch 0 ends at the log end; a current epoch other than 0
    # (and -1) is fenced or unknown.
    ends = await offset_for_epoch(raw, "solo", 0, 0)
    assert (ends.error_code, ends.leader_epoch, ends.end_offset) == (0, 0, 3)
    assert (await offset_for_epoch(raw, "solo", 0, -2)).error_code == (
        ErrorCode.FENCED_LEADER_EPOCH
    )
    assert (await offset_for_epoch(raw, "solo", 0, 2)).error_code == (
        ErrorCode.UNKNOWN_LEADER_EPOCH
    )
