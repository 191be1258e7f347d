"""The partition guard's answers where a follower is needed (issue 29), with real brokers:
three ``trio-broker serve`` processes, topic ``guarded`` on brokers 1 (leader) and 2
(follower), none on broker 3. The same rules, one by one, are in
tests/integration/test_partition_guard_answers.py; here each answer comes from a real
replica's state (its follower role, the epoch its view knows, its copy):

- the follower compares a client's leader epoch with its own first: ahead of it is
  UNKNOWN_LEADER_EPOCH, in Fetch, ListOffsets and OffsetForLeaderEpoch (before: NOT_LEADER_OR_FOLLOWER);
  in its epoch, NOT_LEADER_OR_FOLLOWER, which Fetch answers with the leader (KIP-951);
- the follower answers ListOffsets from the debugging replica id (-2) from its own copy,
  the log end (before: NOT_LEADER_OR_FOLLOWER), and a consumer's not at all;
- broker 3, which holds no copy: partition 0 is NOT_LEADER_OR_FOLLOWER, partition 1
  (which the cluster does not have) UNKNOWN_TOPIC_OR_PARTITION (before: NOT_LEADER_OR_FOLLOWER).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.test_cluster_admin import (
    Cluster,
    admin_of,
    create,
    partitions_epoch,
    start_cluster,
)
from tests.cluster.test_cluster_e2e import eventually
from tests.e2e.conftest import RawConnection
from tests.wire_requests import fetch_request
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

TOPIC = "guarded"
LEADER, FOLLOWER, NO_COPY = 1, 2, 3
RECORDS = 3
CONSUMER, DEBUGGING = -1, -2
E = ErrorCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, module_zookeeper: str) -> Iterator[Cluster]:
    yield from start_cluster(tmp_path_factory.mktemp("guard"), module_zookeeper)


def list_offsets(
    conn: RawConnection, current: int = -1, replica_id: int = CONSUMER
) -> tuple[int, int]:
    Req = m.ListOffsetsRequest
    part = Req.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, timestamp=-1, current_leader_epoch=current
    )
    request = Req(replica_id=replica_id, isolation_level=0,
                  topics=[Req.ListOffsetsTopic(name=TOPIC, partitions=[part])])  # fmt: skip
    answer = conn.request(m.ApiKey.LIST_OFFSETS, 7, request).topics[0].partitions[0]
    return answer.error_code, answer.offset


def fetch(conn: RawConnection, current: int) -> Any:
    request = fetch_request(TOPIC, current_leader_epoch=current)
    return conn.request(m.ApiKey.FETCH, 12, request).responses[0].partitions[0]


def offset_for_epoch(conn: RawConnection, current: int, epoch: int) -> int:
    Req = m.OffsetForLeaderEpochRequest
    part = Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=epoch
    )
    request = Req(replica_id=-1, topics=[Req.OffsetForLeaderTopic(topic=TOPIC, partitions=[part])])
    response = conn.request(m.ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, request)
    return int(response.topics[0].partitions[0].error_code)


def produce(conn: RawConnection, partition: int) -> int:
    body = conn.produce_body(TOPIC, build_batch([(None, b"r%d" % i) for i in range(RECORDS)]))
    body.topic_data[0].partition_data[0].index = partition
    return int(
        conn.request(m.ApiKey.PRODUCE, 9, body).responses[0].partition_responses[0].error_code
    )


def test_a_follower_and_a_broker_without_a_copy_answer_as_kafka(cluster: Cluster) -> None:
    create(cluster, admin_of(cluster), TOPIC, [LEADER, FOLLOWER])
    epoch = partitions_epoch(cluster[LEADER], TOPIC)
    with cluster[LEADER].connect() as conn:
        # Every broker names the leader from the cluster's view before the leader has
        # started its term (a flush in a worker thread first); until then it answers
        # NOT_LEADER_OR_FOLLOWER (ci11: the produce below got it on a busy machine).
        eventually(lambda: list_offsets(conn)[0] == E.NONE, "the leader answers as leader")
        assert produce(conn, 0) == E.NONE  # acks=all: the follower has the records
    with cluster[FOLLOWER].connect() as conn:
        eventually(
            lambda: list_offsets(conn, replica_id=DEBUGGING) == (E.NONE, RECORDS),
            "the follower's copy answers the debugging replica id with its log end",
        )
        assert list_offsets(conn, epoch, replica_id=DEBUGGING) == (E.NONE, RECORDS)
        assert list_offsets(conn, epoch + 1, replica_id=DEBUGGING)[0] == E.UNKNOWN_LEADER_EPOCH
        assert list_offsets(conn)[0] == E.NOT_LEADER_OR_FOLLOWER
        assert list_offsets(conn, replica_id=LEADER)[0] == E.NOT_LEADER_OR_FOLLOWER
        assert list_offsets(conn, epoch)[0] == E.NOT_LEADER_OR_FOLLOWER
        assert list_offsets(conn, epoch + 1)[0] == E.UNKNOWN_LEADER_EPOCH
        assert offset_for_epoch(conn, epoch, epoch) == E.NOT_LEADER_OR_FOLLOWER
        assert offset_for_epoch(conn, epoch + 1, epoch) == E.UNKNOWN_LEADER_EPOCH
        assert fetch(conn, epoch + 1).error_code == E.UNKNOWN_LEADER_EPOCH
        in_epoch = fetch(conn, epoch)
        assert in_epoch.error_code == E.NOT_LEADER_OR_FOLLOWER
        assert (in_epoch.current_leader.leader_id, in_epoch.current_leader.leader_epoch) == (
            LEADER,
            epoch,
        )
    with cluster[NO_COPY].connect() as conn:
        assert produce(conn, 0) == E.NOT_LEADER_OR_FOLLOWER
        assert produce(conn, 1) == E.UNKNOWN_TOPIC_OR_PARTITION
        assert list_offsets(conn, replica_id=DEBUGGING)[0] == E.NOT_LEADER_OR_FOLLOWER
    with cluster[LEADER].connect() as conn:
        assert list_offsets(conn, epoch) == (E.NONE, RECORDS)
        assert offset_for_epoch(conn, epoch, epoch) == E.NONE
