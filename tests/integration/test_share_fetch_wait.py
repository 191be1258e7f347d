"""A long-polling ShareFetch (KIP-932) ends when a lock held in its partitions runs out,
with the record acquired again, not only at MaxWaitMs or on an append. In-process broker,
raw requests."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.test_acl_clients import connect
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)
SF = m.ShareFetchRequest
LOCK_MS = 500
MAX_WAIT_MS = 20_000


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", group_share_record_lock_duration_ms=LOCK_MS
    )


def fetch(member: str, topic_id: uuid.UUID, max_wait_ms: int) -> SF:
    return SF(group_id="g", member_id=member, share_session_epoch=0, max_wait_ms=max_wait_ms,
              min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10,
              topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
                  SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
              forgotten_topics_data=[])  # fmt: skip


def acquired(answer: Any) -> list[tuple[int, int, int]]:
    return [
        (a.first_offset, a.last_offset, a.delivery_count)
        for t in answer.responses
        for p in t.partitions
        for a in p.acquired_records
    ]


async def test_a_long_poll_ends_when_a_lock_runs_out(broker: Broker) -> None:
    topic = broker.topics.create("jobs", 1)
    async with connect(broker) as raw:
        for member in ("m1", "m2"):
            joined = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
                group_id="g", member_id=member, member_epoch=0, subscribed_topic_names=["jobs"]))  # fmt: skip
            assert joined.error_code == ErrorCode.NONE
        # acks=all: answered once synced, so below the high watermark (a node alone's
        # is its durable end) and acquirable by the next share fetch.
        produced = await raw.call(m.ApiKey.PRODUCE, 9, m.ProduceRequest(
            transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                m.ProduceRequest.TopicProduceData(name="jobs", partition_data=[
                    m.ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=bytes(build_batch([(None, b"job")])))])]))  # fmt: skip
        assert produced.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        first = await raw.call(m.ApiKey.SHARE_FETCH, 1, fetch("m1", topic.topic_id, 0))
        assert acquired(first) == [(0, 0, 1)]
        # m1 never acknowledges; m2's long poll gets the record once m1's lock runs out.
        started = time.monotonic()
        with trio.fail_after(MAX_WAIT_MS / 1000 / 2):
            second = await raw.call(
                m.ApiKey.SHARE_FETCH, 1, fetch("m2", topic.topic_id, MAX_WAIT_MS)
            )
        assert acquired(second) == [(0, 0, 2)]
        assert time.monotonic() - started >= LOCK_MS / 1000 / 2
