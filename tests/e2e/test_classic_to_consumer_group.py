"""Classic and consumer-protocol (KIP-848) groups side by side on one group id, with
real confluent-kafka members against a broker process:

- while the classic group has a member, a ConsumerGroupHeartbeat for its id is
  GROUP_ID_NOT_FOUND ("not a consumer group"), Kafka's answer when
  ``group.consumer.migration.policy`` forbids the online upgrade (not built here);
- once it is empty, a ``group.protocol=consumer`` member takes the id over and goes on
  from the classic group's committed offsets, as Kafka's coordinator deletes an empty
  classic group for the new one (``maybeDeleteEmptyClassicGroup``) and keeps its offsets;
- while that member is in, a classic JoinGroup for the id is INCONSISTENT_GROUP_PROTOCOL:
  ours, not Kafka's (Kafka 4 lets a classic member join a consumer group; that migration
  is not built here, docs/consumer-groups.md), kept here so that building it changes
  this test knowingly.
"""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tests.e2e import test_consumer_protocol as consumer_protocol
from tests.e2e.test_consumer_protocol import (
    HB,
    PARTITIONS,
    FastHeartbeatBroker,
    Member,
    make_topic,
    make_topic_more,
)
from tests.waits import wait_until
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

#: Records before the upgrade (read and committed by the classic member) and after it.
BEFORE, AFTER = 20, 20


#: A broker whose members heartbeat every second (test_consumer_protocol.py's).
broker_process = consumer_protocol.fast_heartbeat_broker


def consumer_heartbeat(conn: Any, group: str, topic: str) -> m.ConsumerGroupHeartbeatResponse:
    answer: m.ConsumerGroupHeartbeatResponse = conn.request(
        m.ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, HB(
            group_id=group, member_id=uuid.uuid4().hex, member_epoch=0,
            rebalance_timeout_ms=30_000, subscribed_topic_names=[topic], topic_partitions=[]),
    )  # fmt: skip
    return answer


def classic_join(conn: Any, group: str) -> m.JoinGroupResponse:
    Protocol = m.JoinGroupRequest.JoinGroupRequestProtocol
    answer: m.JoinGroupResponse = conn.request(m.ApiKey.JOIN_GROUP, 5, m.JoinGroupRequest(
        group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=30_000, member_id="",
        group_instance_id=None, protocol_type="consumer",
        protocols=[Protocol(name="range", metadata=b"")], reason=None))  # fmt: skip
    return answer


def test_an_empty_classic_group_becomes_a_consumer_group_with_its_offsets(
    broker_process: FastHeartbeatBroker,
) -> None:
    bootstrap = broker_process.bootstrap
    topic, group = f"upgrade-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, BEFORE)
    classic = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    classic.subscribe([topic])
    read: list[bytes] = []
    try:

        def classic_reads() -> bool:
            msg = classic.poll(0.2)
            if msg is not None and msg.error() is None and msg.value() is not None:
                read.append(msg.value())  # type: ignore[arg-type]
                classic.commit(message=msg, asynchronous=False)
            return len(read) >= BEFORE

        wait_until(classic_reads, f"the classic member to read {BEFORE} records")
        with broker_process.connect() as conn:
            refused = consumer_heartbeat(conn, group, topic)
        assert refused.error_code == ErrorCode.GROUP_ID_NOT_FOUND, refused
    finally:
        classic.close()

    make_topic_more(bootstrap, topic, BEFORE, AFTER)
    modern = Member(bootstrap, group, topic, "modern")
    try:
        wait_until(lambda: modern.step() or len(modern.read) >= AFTER, f"{AFTER} more records")
        # From the classic group's commits: only the records produced after them.
        assert sorted(modern.read) == sorted(f"r{i}" for i in range(BEFORE, BEFORE + AFTER))
        committed = modern.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        assert [tp.offset for tp in committed] == [(BEFORE + AFTER) // PARTITIONS] * PARTITIONS
        with broker_process.connect() as conn:
            joined = classic_join(conn, group)
        assert joined.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL, joined
    finally:
        modern.consumer.close()
