"""The first ShareFetch naming several share partitions gets one partition's records.

Kafka's partition leader loads a share partition's state from the share coordinator on
the first fetch naming it, one partition at a time, and answers as soon as one loaded
partition has records: a new member's first fetch of two partitions gets one
partition's records, the next fetch the other's (librdkafka's test 0179 counts on it).
After that every fetch reads every partition. Raw requests against a broker process.
"""

from __future__ import annotations

import uuid

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_share_fetch_bytes import (
    acquired,
    joined_member,
    produce_one_per_batch,
    share_fetch,
)


def test_a_first_fetch_gets_one_new_share_partition(broker_process: BrokerProcess) -> None:
    topic, group = f"share-load-{uuid.uuid4().hex[:8]}", f"share-load-{uuid.uuid4().hex[:8]}"
    bootstrap = broker_process.bootstrap
    with broker_process.connect() as conn:
        topic_id = joined_member(broker_process, conn, topic, group)
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
