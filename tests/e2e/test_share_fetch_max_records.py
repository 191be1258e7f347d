"""ShareFetch's MaxRecords is a soft limit, as in Kafka 4.2's default (batch-optimized)
acquire mode: new records are acquired to the end of the log batch holding the last one
MaxRecords allows, so a batch goes to one member whole.

Raw requests against a broker process; the batches are written with raw Produce
requests, so their bounds are known: offsets 0-4, then 5-9, then 10 alone.
"""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_consumer_protocol import topic_id_of
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

SF = m.ShareFetchRequest
Topic = m.ProduceRequest.TopicProduceData


def produce_batch(conn: Any, topic: str, count: int) -> int:
    """One batch of ``count`` records to partition 0; its base offset. acks=all: answered
    once synced, so below the high watermark (a node alone's is its durable end) and
    acquirable by the next share fetch."""
    batch = build_batch([(None, b"v%d" % i) for i in range(count)])
    answer = conn.request(m.ApiKey.PRODUCE, 9, m.ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[Topic(name=topic, partition_data=[
            Topic.PartitionProduceData(index=0, records=bytes(batch))])]))  # fmt: skip
    part = answer.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.NONE, part
    base: int = part.base_offset
    return base


def fetch(
    conn: Any, group: str, topic_id: uuid.UUID, epoch: int, max_records: int
) -> list[tuple[int, int, int]]:
    answer = conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id="m1", share_session_epoch=epoch, max_wait_ms=0, min_bytes=1,
        max_bytes=1 << 20, max_records=max_records, batch_size=max_records,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[
            SF.FetchTopic.FetchPartition(partition_index=0, acknowledgement_batches=[])])],
        forgotten_topics_data=[]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE, answer
    runs = []
    for topic in answer.responses:
        for part in topic.partitions:
            assert part.error_code == ErrorCode.NONE, part
            runs += [(a.first_offset, a.last_offset, a.delivery_count)
                     for a in part.acquired_records]  # fmt: skip
    return runs


def test_max_records_takes_the_last_batch_whole(broker_process: BrokerProcess) -> None:
    topic, group = f"share-max-{uuid.uuid4().hex[:8]}", f"share-max-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker_process.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
    with broker_process.connect() as conn:
        joined = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=[topic]))  # fmt: skip
        assert joined.error_code == ErrorCode.NONE  # the share partition starts at 0
        topic_id = topic_id_of(conn, topic)
        assert [produce_batch(conn, topic, n) for n in (5, 5, 1)] == [0, 5, 10]
        # MaxRecords 3 stops inside the first batch: the batch is acquired whole.
        assert fetch(conn, group, topic_id, 0, 3) == [(0, 4, 1)]
        # MaxRecords 2 of the second batch: all five; then the third batch, one record.
        assert fetch(conn, group, topic_id, 1, 2) == [(5, 9, 1)]
        assert fetch(conn, group, topic_id, 2, 1) == [(10, 10, 1)]
        produce_batch(conn, topic, 4)  # 11-14
        # A limit at a batch's last record acquires just that far.
        assert fetch(conn, group, topic_id, 3, 4) == [(11, 14, 1)]
