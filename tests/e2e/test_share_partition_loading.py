"""The first ShareFetch naming several share partitions gets one partition's records.

Kafka's partition leader loads a share partition's state from the share coordinator on
the first fetch naming it, one partition at a time, and answers as soon as one loaded
partition has records: a new member's first fetch of two partitions gets one
partition's records, the next fetch the other's (librdkafka's test 0179 counts on it).
After that every fetch reads every partition. Raw requests against a broker process.
"""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_consumer_protocol import topic_id_of
from tests.e2e.test_share_fetch_bytes import acquired, produce_one_per_batch, share_fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode


def test_a_first_fetch_gets_one_new_share_partition(broker_process: BrokerProcess) -> None:
    topic, group = f"share-load-{uuid.uuid4().hex[:8]}", f"share-load-{uuid.uuid4().hex[:8]}"
    bootstrap = broker_process.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    with broker_process.connect() as conn:
        joined = conn.request(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=[topic]))  # fmt: skip
        assert joined.error_code == ErrorCode.NONE
        topic_id = topic_id_of(conn, topic)
        for partition in (0, 1):
            produce_one_per_batch(bootstrap, topic, partition, [b"a", b"b"])

        assert acquired(share_fetch(conn, group, 0, topic_id, [0, 1], 1 << 20)) == {0: [(0, 1, 1)]}
        assert acquired(share_fetch(conn, group, 1, topic_id, [0, 1], 1 << 20)) == {1: [(0, 1, 1)]}
        # Both loaded: records of both come in one fetch.
        for partition in (0, 1):
            produce_one_per_batch(bootstrap, topic, partition, [b"c"])
        assert acquired(share_fetch(conn, group, 2, topic_id, [0, 1], 1 << 20)) == {
            0: [(2, 2, 1)],
            1: [(2, 2, 1)],
        }
