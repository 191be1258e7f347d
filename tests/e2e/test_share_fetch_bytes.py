"""ShareFetch's MaxBytes, as Kafka 4.2 applies it (librdkafka's tests 0171 and 0180 pin it).

A share fetch reads each partition's log from where it next acquires, at most MaxBytes
split evenly among the request's partitions and MaxBytes in all; the first partition
with records returns at least one whole batch, however big; only offsets in the batches
read are acquired. MaxBytes 0 reads and acquires nothing. Raw requests against a broker
process, on single-record batches of 1000-byte values.
"""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_consumer_protocol import topic_id_of
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

SF = m.ShareFetchRequest
VALUE = b"x" * 1000


def produce_one_per_batch(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
        assert producer.flush(30) == 0  # one batch each


def share_fetch(conn: Any, group: str, epoch: int, topic_id: uuid.UUID, partitions: list[int],
                max_bytes: int, acks: dict[int, list[tuple[int, int, list[int]]]] | None = None,
                ) -> Any:  # fmt: skip
    def part(p: int) -> Any:
        return SF.FetchTopic.FetchPartition(partition_index=p, acknowledgement_batches=[
            SF.FetchTopic.FetchPartition.AcknowledgementBatch(
                first_offset=f, last_offset=la, acknowledge_types=t)
            for f, la, t in (acks or {}).get(p, [])])  # fmt: skip

    answer = conn.request(m.ApiKey.SHARE_FETCH, 1, SF(
        group_id=group, member_id="m1", share_session_epoch=epoch, max_wait_ms=0, min_bytes=1,
        max_bytes=max_bytes, max_records=500, batch_size=500,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[part(p) for p in partitions])],
        forgotten_topics_data=[]))  # fmt: skip
    assert answer.error_code == ErrorCode.NONE
    return answer


def acquired(answer: Any) -> dict[int, list[tuple[int, int, int]]]:
    """Each partition's acquired ranges (first, last, delivery count); errors fail."""
    found: dict[int, list[tuple[int, int, int]]] = {}
    for topic in answer.responses:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.NONE and p.acknowledge_error_code == ErrorCode.NONE
            found[p.partition_index] = [
                (a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records
            ]
    return {p: runs for p, runs in found.items() if runs}


def joined_member(broker_process: BrokerProcess, conn: Any, topic: str, group: str) -> uuid.UUID:
    """Make ``topic`` (two partitions), join member ``m1`` of share group ``group`` to it
    over ``conn``; the topic's id."""
    admin = AdminClient({"bootstrap.servers": broker_process.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=60)
    joined = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
        group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=[topic]))  # fmt: skip
    assert joined.error_code == ErrorCode.NONE
    topic_id: uuid.UUID = topic_id_of(conn, topic)
    return topic_id


def test_max_bytes_bounds_what_a_share_fetch_acquires(broker_process: BrokerProcess) -> None:
    topic, group = f"share-bytes-{uuid.uuid4().hex[:8]}", f"share-bytes-{uuid.uuid4().hex[:8]}"
    bootstrap = broker_process.bootstrap
    with broker_process.connect() as conn:
        topic_id = joined_member(broker_process, conn, topic, group)
        produce_one_per_batch(bootstrap, topic, 0, [VALUE] * 6 + [b"y" * 20_000])
        produce_one_per_batch(bootstrap, topic, 1, [VALUE] * 2)

        # 1500 bytes over two partitions: 750 each, yet the first partition with records
        # returns one whole batch; the request's bytes are then spent for the second.
        first = share_fetch(conn, group, 0, topic_id, [0, 1], 1500)
        assert acquired(first) == {0: [(0, 0, 1)]}
        # MaxBytes 1: still one batch a fetch, and this one acknowledges offset 0.
        second = share_fetch(conn, group, 1, topic_id, [0, 1], 1, acks={0: [(0, 0, [1])]})
        assert acquired(second) == {0: [(1, 1, 1)]}
        # MaxBytes 0: nothing read, nothing acquired, no error, and no partition in the
        # answer, as a Kafka 4.4 node answers it (its uniform strategy refuses to split 0).
        nothing = share_fetch(conn, group, 2, topic_id, [0, 1], 0)
        assert (nothing.error_code, nothing.responses) == (ErrorCode.NONE, [])
        # 4400 bytes: two of partition 0's ~1070-byte batches fit in its 2200, the whole
        # request's remainder then lets partition 1 have both of its own.
        both = acquired(share_fetch(conn, group, 3, topic_id, [0, 1], 4400))
        assert both == {0: [(2, 3, 1)], 1: [(0, 1, 1)]}
        # Released records are read again from the lowest one, within the bytes too.
        released = share_fetch(
            conn, group, 4, topic_id, [0, 1], 1, acks={0: [(1, 3, [2])], 1: [(0, 1, [1])]}
        )
        assert acquired(released) == {0: [(1, 1, 2)]}
        rest = acquired(share_fetch(conn, group, 5, topic_id, [0, 1], 1 << 20))
        assert rest == {0: [(2, 3, 2), (4, 6, 1)]}
        # A batch bigger than MaxBytes comes whole when it is the first with records.
        share_fetch(conn, group, 6, topic_id, [0, 1], 1 << 20, acks={0: [(1, 6, [1])]})
        produce_one_per_batch(bootstrap, topic, 0, [b"z" * 30_000])
        big = share_fetch(conn, group, 7, topic_id, [0, 1], 100)
        assert acquired(big) == {0: [(7, 7, 1)]}
        assert len(bytes(big.responses[0].partitions[0].records)) > 30_000
