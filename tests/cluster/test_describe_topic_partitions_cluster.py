"""DescribeTopicPartitions (API 75) in a three-broker cluster: the same view Metadata reads.

Real ZooKeeper, three ``trio-broker serve`` processes, raw requests to pick the broker
that answers. A topic of one replica a partition has two partitions on broker 1; after
broker 1 is killed, brokers 2 and 3 page through the topic two partitions at a time and
describe those two with leader -1, broker 1 offline and no partition error (Kafka leaves the
missing leader to the leader id, where Metadata answers LEADER_NOT_AVAILABLE). Each page
agrees with the same broker's Metadata on leaders, epochs, replicas and ISRs.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import NewTopic

from tests.cluster.test_cluster_admin import Cluster, admin_of, brokers  # noqa: F401 - fixture
from tests.cluster.test_cluster_e2e import eventually, every_broker_knows, every_broker_lists
from tests.cluster.test_cluster_faults import ConfiguredBroker
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(300)

TOPIC = "dtp"
ASSIGNMENT = [[1], [2], [3], [1]]  # partitions 0 and 3 go offline with broker 1
Req = m.DescribeTopicPartitionsRequest


def describe_all(broker: ConfiguredBroker, limit: int) -> tuple[list[Any], list[Any]]:
    """Every partition of TOPIC by following the cursor, and the cursors seen."""
    found, cursors, cursor = [], [], None
    with broker.connect() as conn:
        while True:
            request = Req(topics=[Req.TopicRequest(name=TOPIC)], response_partition_limit=limit,
                          cursor=cursor)  # fmt: skip
            answer = conn.request(m.ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, request)
            [topic] = answer.topics
            assert (topic.name, topic.error_code, topic.is_internal) == (TOPIC, 0, False)
            found += topic.partitions
            if answer.next_cursor is None:
                return found, cursors
            c = answer.next_cursor
            cursors.append((c.topic_name, c.partition_index))
            cursor = Req.Cursor(topic_name=c.topic_name, partition_index=c.partition_index)


def metadata_view(broker: ConfiguredBroker) -> dict[int, tuple[int, int, list[int], list[int]]]:
    with broker.connect() as conn:
        [topic] = conn.metadata(topics=[TOPIC], version=12).topics
    return {p.partition_index: (p.leader_id, p.leader_epoch, list(p.replica_nodes),
                                list(p.isr_nodes)) for p in topic.partitions}  # fmt: skip


def test_pages_agree_with_metadata_and_show_an_offline_partition(brokers: Cluster) -> None:  # noqa: F811
    every_broker_lists(brokers)
    admin = admin_of(brokers)
    [future] = admin.create_topics(
        [NewTopic(TOPIC, len(ASSIGNMENT), replica_assignment=ASSIGNMENT)]
    ).values()
    future.result(timeout=60)
    # Asked of every broker: a survivor that had not read the topic before broker 1's
    # kill would answer the pages below UNKNOWN_TOPIC_OR_PARTITION, not "not yet".
    every_broker_knows(
        brokers, TOPIC, len(ASSIGNMENT),
        until=lambda state: {p: v[0] for p, v in state.items()} == {0: 1, 1: 2, 2: 3, 3: 1},
        wanted="every partition led by its preferred replica",
    )  # fmt: skip
    brokers[1].kill9()
    for survivor in (2, 3):
        broker = brokers[survivor]
        seen: list[Any] = []

        def settled(broker: ConfiguredBroker = broker, seen: list[Any] = seen) -> bool:
            """Broker 1's loss has reached this broker's view, and a walk through the pages
            matches its Metadata (asked after: the view may move in between, then again)."""
            found, cursors = describe_all(broker, limit=2)
            view = metadata_view(broker)
            seen[:] = [found, cursors]
            # Leaderless in the view, and broker 1 gone from its live brokers: ci20 saw
            # the leaders go before the registration did (no offline replica yet).
            gone = all(p.offline_replicas == [1] for p in found if p.leader_id == -1)
            return view[0][0] == view[3][0] == -1 and gone and view == {
                p.partition_index: (p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes)
                for p in found
            }  # fmt: skip

        eventually(settled, f"broker {survivor}: pages as its Metadata, broker 1 gone")
        found, cursors = seen
        assert cursors == [(TOPIC, 2)]
        assert [p.partition_index for p in found] == [0, 1, 2, 3]
        assert [(p.error_code, p.leader_id, p.offline_replicas) for p in found] == [
            (ErrorCode.NONE, -1, [1]), (ErrorCode.NONE, 2, []),
            (ErrorCode.NONE, 3, []), (ErrorCode.NONE, -1, [1]),
        ]  # fmt: skip
