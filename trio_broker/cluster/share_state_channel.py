"""Requests to another broker's share coordinator: ReadShareGroupState,
WriteShareGroupState, InitializeShareGroupState and DeleteShareGroupState (KIP-932),
over the inter-broker connections; and, for a share group's coordinator that holds no
replica of a topic, ListOffsets to the data partition's leader (the group's lag).

A share partition's leader reads its state from, and writes it to, the leader of its
``__share_group_state`` partition (``handlers/share_persist.py``), and the group's
coordinator resets and deletes it there and reads its summary (the admin APIs); when
that is another broker, these requests carry it (``handlers/share_group_state.py`` answers them). One
connection per broker, one request at a time on it: trio's lock is fair, so the
snapshots of a share partition reach its coordinator in the order its leader took them.
A broker that cannot be reached answers COORDINATOR_NOT_AVAILABLE for every key (the
leader's client fetches or acknowledges again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trio_broker.cluster.broker_client import BrokerConnectionError
from trio_broker.cluster.peer_clients import PeerClients
from trio_broker.groups.share_coordinator import StateWrite
from trio_broker.groups.share_state import ShareKey, ShareSnapshot, StateBatch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import RecordState

__all__ = ["ShareStateChannel"]

log = logging.getLogger("trio_broker.groups")

#: Version 0 of the APIs, the one whose layout tools/message_json holds (from Kafka's
#: message files of October 2024): only these brokers talk to each other with it.
STATE_API_VERSION = 0
#: A write waits for the HW at the coordinator: as long as an acknowledgement may.
REQUEST_TIMEOUT_S = 15.0

#: ListOffsets as a consumer asks it: version 5 has OFFSET_NOT_AVAILABLE (a new leader
#: whose high watermark has not reached its term yet).
LIST_OFFSETS_VERSION = 5
EARLIEST_TIMESTAMP, LATEST_TIMESTAMP = -2, -1

Write = m.WriteShareGroupStateRequest


class ShareStateChannel:
    def __init__(self, replication: Any) -> None:
        #: The replica manager: the view (who is where) and the inter-broker streams.
        self.replication = replication
        self._peers = PeerClients(replication, "share-state")

    async def read(
        self, coordinator: int, key: ShareKey, leader_epoch: int
    ) -> tuple[ErrorCode, ShareSnapshot | None]:
        Read = m.ReadShareGroupStateRequest
        request = Read(group_id=key.group_id, topics=[Read.ReadStateData(
            topic_id=key.topic_id,
            partitions=[Read.ReadStateData.PartitionData(
                partition=key.partition, leader_epoch=leader_epoch,
            )],
        )])  # fmt: skip
        response = await self._call(coordinator, m.ApiKey.READ_SHARE_GROUP_STATE, request)
        if response is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        for result in response.results:
            for part in result.partitions:
                if (result.topic_id, part.partition) != (key.topic_id, key.partition):
                    continue
                if part.error_code != ErrorCode.NONE:
                    return ErrorCode(part.error_code), None
                if part.start_offset < 0:
                    return ErrorCode.NONE, None  # no state yet
                batches = tuple(
                    StateBatch(
                        b.first_offset,
                        b.last_offset,
                        RecordState(b.delivery_state),
                        b.delivery_count,
                    )
                    for b in part.state_batches
                )
                return ErrorCode.NONE, ShareSnapshot(
                    part.start_offset, batches, state_epoch=part.state_epoch
                )
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, None

    async def write(
        self, coordinator: int, group_id: str, writes: Sequence[StateWrite]
    ) -> dict[ShareKey, ErrorCode]:
        Part = Write.WriteStateData.PartitionData
        request = _request(Write, Write.WriteStateData, group_id, [(w.key.topic_id, Part(
            partition=w.key.partition, state_epoch=w.snapshot.state_epoch,
            leader_epoch=w.leader_epoch, start_offset=w.snapshot.start_offset,
            state_batches=[Part.StateBatch(
                first_offset=b.first_offset, last_offset=b.last_offset,
                delivery_state=int(b.delivery_state), delivery_count=b.delivery_count,
            ) for b in w.snapshot.batches],
        )) for w in writes])  # fmt: skip
        response = await self._call(coordinator, m.ApiKey.WRITE_SHARE_GROUP_STATE, request)
        return _answers(group_id, [w.key for w in writes], response)

    async def initialize(
        self, coordinator: int, group_id: str, writes: Sequence[StateWrite]
    ) -> dict[ShareKey, ErrorCode]:
        """InitializeShareGroupState: each share partition starts over at its snapshot's
        start offset, in its state epoch."""
        Init = m.InitializeShareGroupStateRequest
        Part = Init.InitializeStateData.PartitionData
        request = _request(Init, Init.InitializeStateData, group_id, [(w.key.topic_id, Part(
            partition=w.key.partition, state_epoch=w.snapshot.state_epoch,
            start_offset=w.snapshot.start_offset,
        )) for w in writes])  # fmt: skip
        response = await self._call(coordinator, m.ApiKey.INITIALIZE_SHARE_GROUP_STATE, request)
        return _answers(group_id, [w.key for w in writes], response)

    async def delete(self, coordinator: int, keys: Sequence[ShareKey]) -> dict[ShareKey, ErrorCode]:
        """DeleteShareGroupState of ``keys`` (one request per group)."""
        Delete = m.DeleteShareGroupStateRequest
        answers: dict[ShareKey, ErrorCode] = {}
        for group_id in dict.fromkeys(key.group_id for key in keys):
            of_group = [key for key in keys if key.group_id == group_id]
            request = _request(Delete, Delete.DeleteStateData, group_id, [
                (key.topic_id, Delete.DeleteStateData.PartitionData(partition=key.partition))
                for key in of_group
            ])  # fmt: skip
            response = await self._call(coordinator, m.ApiKey.DELETE_SHARE_GROUP_STATE, request)
            answers.update(_answers(group_id, of_group, response))
        return answers

    async def partition_offsets(
        self, leader: int, topic: str, partition: int
    ) -> tuple[ErrorCode, int, int]:
        """The data partition's log start offset and high watermark, asked of its
        ``leader`` as a consumer asks (ListOffsets, earliest then latest): what a share
        group's coordinator that holds no replica of the topic counts the group's lag
        from, as Kafka's asks the leader for the latest offset. (NONE, start, end), or
        the error with -1s (LEADER_NOT_AVAILABLE for a leader that cannot be reached)."""
        Request = m.ListOffsetsRequest
        found = []
        for timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            request = Request(replica_id=-1, isolation_level=0, topics=[Request.ListOffsetsTopic(
                name=topic, partitions=[Request.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=timestamp,
                )],
            )])  # fmt: skip
            response = await self._call(
                leader, m.ApiKey.LIST_OFFSETS, request, LIST_OFFSETS_VERSION
            )
            if response is None:
                return ErrorCode.LEADER_NOT_AVAILABLE, -1, -1
            answers = [p for t in response.topics for p in t.partitions]
            if len(answers) != 1:
                return ErrorCode.UNKNOWN_SERVER_ERROR, -1, -1
            if (error := ErrorCode(answers[0].error_code)) is not ErrorCode.NONE:
                return error, -1, -1
            found.append(int(answers[0].offset))
        return ErrorCode.NONE, found[0], found[1]

    async def _call(
        self, broker_id: int, api_key: int, request: Any, version: int = STATE_API_VERSION
    ) -> Any:
        client = self._peers.client(broker_id)
        if client is None:
            return None
        broker_client, lock = client
        async with lock:
            try:
                return await broker_client.call(api_key, version, request, REQUEST_TIMEOUT_S)
            except BrokerConnectionError as exc:
                log.info("share state request %d to broker %d: %s", api_key, broker_id, exc)
                self._peers.forget(broker_id)
                return None

    async def close(self) -> None:
        await self._peers.close()


def _request(
    request_type: Any, topic_type: Any, group_id: str, parts: Sequence[tuple[Any, Any]]
) -> Any:
    """A Write/Initialize/DeleteShareGroupState request (their topics have one shape: a
    topic id and its partitions) of ``parts``, (topic id, partition data)."""
    by_topic: dict[Any, list[Any]] = {}
    for topic_id, part in parts:
        by_topic.setdefault(topic_id, []).append(part)
    return request_type(group_id=group_id, topics=[
        topic_type(topic_id=topic_id, partitions=partitions)
        for topic_id, partitions in by_topic.items()
    ])  # fmt: skip


def _answers(group_id: str, keys: Sequence[ShareKey], response: Any) -> dict[ShareKey, ErrorCode]:
    """Each key's error in a Write/Initialize/DeleteShareGroupState response (their
    results have one shape); COORDINATOR_NOT_AVAILABLE for a key it does not answer, or
    for all without a response (the broker could not be reached)."""
    answers = dict.fromkeys(keys, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    for result in response.results if response is not None else ():
        for part in result.partitions:
            key = ShareKey(group_id, result.topic_id, part.partition)
            if key in answers:
                answers[key] = ErrorCode(part.error_code)
    return answers
