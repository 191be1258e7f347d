"""How often a share partition's leader reads its state from the share coordinator
(ReadShareGroupState; alone a direct call, counted here), against an in-process broker.

Kafka's leader reads a share partition's state when it first initializes it, keeps it,
and drops a group's share partitions when the group's last share session on the broker
ends (SharePartitionManager's onGroupEmpty), so that the next session reads them again
(the admin APIs may have reset or deleted the state meanwhile). Ours does the same: a
new session while another of the group is open reads nothing; the first one after the
group's sessions all ended reads each of its partitions once.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_acl_clients import connect
from trio_broker.handlers import share_persist
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

SF = m.ShareFetchRequest
PARTITIONS = 4


async def test_a_new_session_reads_the_state_only_when_the_group_had_none_here(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = broker.topics.create("idle", PARTITIONS)
    reads: list[Any] = []
    read_local = share_persist.read_local

    def counted(services: Any, key: Any, leader_epoch: int) -> Any:
        reads.append(key)
        return read_local(services, key, leader_epoch)

    monkeypatch.setattr(share_persist, "read_local", counted)

    def fetch(member: str, epoch: int) -> SF:
        return SF(group_id="g", member_id=member, share_session_epoch=epoch, max_wait_ms=0,
                  min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10,
                  topics=[SF.FetchTopic(topic_id=topic.topic_id, partitions=[
                      SF.FetchTopic.FetchPartition(partition_index=p, acknowledgement_batches=[])
                      for p in range(PARTITIONS)])],
                  forgotten_topics_data=[])  # fmt: skip

    async with connect(broker) as raw:

        async def reads_of(member: str, epoch: int) -> int:
            """The reads one ShareFetch cost."""
            before = len(reads)
            answer = await raw.call(m.ApiKey.SHARE_FETCH, 1, fetch(member, epoch))
            assert answer.error_code == ErrorCode.NONE, answer
            return len(reads) - before

        for member in ("m1", "m2"):
            answer = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
                group_id="g", member_id=member, member_epoch=0,
                subscribed_topic_names=["idle"]))  # fmt: skip
            assert answer.error_code == ErrorCode.NONE, answer
        # m1's session is the group's first here: each partition is read.
        assert await reads_of("m1", 0) == PARTITIONS
        # m2's opens beside it: nothing (Kafka's partitions stay cached while a session
        # of the group is open); nor do the sessions' next fetches.
        assert await reads_of("m2", 0) == 0
        assert await reads_of("m1", 1) == 0
        # m1 starts over while m2's session is open: nothing either.
        assert await reads_of("m1", 0) == 0
        # Both end: the next session of the group reads each partition again.
        assert await reads_of("m1", -1) == 0
        assert await reads_of("m2", -1) == 0
        assert await reads_of("m2", 0) == PARTITIONS
