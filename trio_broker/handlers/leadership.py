"""Who may answer for a partition: its leader, in the epoch the client knows.

Kafka's guard for a per-partition request (``ReplicaManager.getPartitionOrError``, then
``Partition.getLocalLog``), written once for Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch and DeleteRecords (``topic_lookup.leading_partition``):

- a partition this broker holds no log of: NOT_LEADER_OR_FOLLOWER if the cluster's
  metadata has it (clients refresh their metadata), else UNKNOWN_TOPIC_OR_PARTITION
  (:func:`missing_partition_error`);
- a partition held here, asked with a leader epoch (KIP-320, -1: none): the epoch this
  replica knows, leader or follower, is compared first: the client behind is
  FENCED_LEADER_EPOCH, ahead UNKNOWN_LEADER_EPOCH;
- then a replica that does not lead answers NOT_LEADER_OR_FOLLOWER, unless the request
  may read a follower (ListOffsets from the debugging replica id -2).

The terms are read from ``services.leaders``: the replica manager in a cluster; a
broker that runs alone is a cluster of one (services/local_replication.py) and leads
every partition it holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from trio_broker.handlers.base import RequestContext
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import NO_LEADER

if TYPE_CHECKING:
    from trio_broker.partition.append import Term

__all__ = [
    "check_leader",
    "epoch_error",
    "fetch_leader_hints",
    "missing_partition_error",
    "produce_leader_hints",
]


def check_leader(
    ctx: RequestContext, topic: str, partition: int, current_leader_epoch: int = -1,
    *, fence_alone: bool = True,
) -> Term | ErrorCode:  # fmt: skip
    """This broker's term if it may answer for a partition it holds a log of; else the
    error, in the order of Kafka's ``Partition.getLocalLog(currentLeaderEpoch,
    requireLeader=true)``: a ``current_leader_epoch`` other than -1 is compared first
    with the epoch this replica knows (its term's as leader, the cluster's view of the
    partition as follower): older is FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH;
    then a replica that does not lead answers NOT_LEADER_OR_FOLLOWER (also while the
    partition has no leader: Kafka's hosted partition is then simply not the leader).

    A node alone leads every partition it holds (``services.leaders`` is a cluster of
    one, epoch 0). ``fence_alone`` False: its term does not check
    ``current_leader_epoch`` (its Fetch never has; its ListOffsets and
    OffsetForLeaderEpoch do)."""
    leaders = ctx.services.leaders
    term = leaders.leader_term(topic, partition)
    if term is not None:
        # Kafka's rule: only -1 (no epoch known) skips the check.
        if current_leader_epoch != -1 and (fence_alone or term.replicated):
            fenced = epoch_error(current_leader_epoch, term.leader_epoch)
            if fenced is not None:
                return fenced
        return term
    if current_leader_epoch != -1:
        info = leaders.partition(topic, partition)
        if info is not None:  # a follower knows the partition's epoch from the view
            fenced = epoch_error(current_leader_epoch, info.leader_epoch)
            if fenced is not None:
                return fenced
    return ErrorCode.NOT_LEADER_OR_FOLLOWER


def epoch_error(current_leader_epoch: int, known_epoch: int) -> ErrorCode | None:
    """KIP-320: the client's epoch behind the one this replica knows is fenced, ahead of
    it unknown (this replica is the one behind); None when they agree."""
    if current_leader_epoch < known_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if current_leader_epoch > known_epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return None


def missing_partition_error(
    ctx: RequestContext, name: str, partition: int,
    missing: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
) -> ErrorCode:  # fmt: skip
    """The error for a partition this broker holds no log of, as Kafka's
    ``ReplicaManager.getPartitionOrError``: NOT_LEADER_OR_FOLLOWER when the cluster's
    metadata has that partition (another broker holds it, or this broker has not made
    its copy yet: partitions just added), so clients refresh their metadata and go to
    the leader; else UNKNOWN_TOPIC_OR_PARTITION. ``missing`` UNKNOWN_TOPIC_ID (a topic
    id nobody knows, from :func:`~trio_broker.handlers.topic_lookup.find_topic`) stays."""
    if missing == ErrorCode.UNKNOWN_TOPIC_ID:
        return missing
    if ctx.services.leaders.partition(name, partition) is not None:  # never alone
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


T = TypeVar("T")

# KIP-951: answers that say "not the leader" also say who is, and where to reach it, so
# that a client moves without a Metadata round trip (Produce v10+, Fetch v12+ for the
# leader, v16+ for its endpoint).
PRODUCE_HINTS_FROM = 10
FETCH_HINTS_FROM = 12
FETCH_ENDPOINTS_FROM = 16


def _leader_of(
    ctx: RequestContext, name: str, topic_id: uuid.UUID, partition: int
) -> tuple[int, int]:
    """(leader id, leader epoch) as this broker knows them; (-1, -1) if unknown (a node
    alone: every partition it knows it leads, so it never answers "not the leader")."""
    leaders = ctx.services.leaders
    if not name:
        topic = leaders.view.topic_by_id(topic_id)
        name = "" if topic is None else topic.name
    info = leaders.partition(name, partition)
    if info is None or info.leader == NO_LEADER:
        return NO_LEADER, -1
    return info.leader, info.leader_epoch


def _endpoints(ctx: RequestContext, leaders: set[int], endpoint: Callable[..., T]) -> list[T]:
    if not leaders:  # the produce and fetch answers of a node alone: nothing to look up
        return []
    # The client's own listener (Kafka's rule, as in Metadata).
    listener = ctx.services.listener_name_for(ctx.client.connection_id)
    return [
        endpoint(node_id=b.broker_id, host=host, port=port, rack=b.rack)
        for b, host, port in ctx.services.leaders.view.brokers_on(listener)
        if b.broker_id in leaders
    ]


def produce_leader_hints(ctx: RequestContext, response: m.ProduceResponse) -> None:
    """Fill KIP-951's current leader into NOT_LEADER_OR_FOLLOWER answers, with endpoints."""
    if ctx.api_version < PRODUCE_HINTS_FROM:
        return
    Part = m.ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    leaders: set[int] = set()
    for topic in response.responses:
        for part in topic.partition_responses:
            if part.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER:
                continue
            leader, epoch = _leader_of(ctx, topic.name, topic.topic_id, part.index)
            if leader != NO_LEADER:
                part.current_leader = Part.LeaderIdAndEpoch(leader_id=leader, leader_epoch=epoch)
                leaders.add(leader)
    response.node_endpoints = _endpoints(ctx, leaders, m.ProduceResponse.NodeEndpoint)


def fetch_leader_hints(ctx: RequestContext, response: m.FetchResponse) -> None:
    """As :func:`produce_leader_hints`, for NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH."""
    if ctx.api_version < FETCH_HINTS_FROM:
        return
    Part = m.FetchResponse.FetchableTopicResponse.PartitionData
    moved = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)
    leaders: set[int] = set()
    for topic in response.responses:
        for part in topic.partitions:
            if part.error_code not in moved:
                continue
            leader, epoch = _leader_of(ctx, topic.topic, topic.topic_id, part.partition_index)
            if leader != NO_LEADER:
                part.current_leader = Part.LeaderIdAndEpoch(leader_id=leader, leader_epoch=epoch)
                leaders.add(leader)
    if ctx.api_version >= FETCH_ENDPOINTS_FROM:
        response.node_endpoints = _endpoints(ctx, leaders, m.FetchResponse.NodeEndpoint)
