"""Find the topic a request's entry names (by id in the versions that use ids), and
whether this broker may answer for one of its partitions (:func:`leading_partition`,
the guard every per-partition API shares; the rules are in ``leadership.py``)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import attrs

from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.leadership import check_leader, epoch_error, missing_partition_error
from trio_broker.partition.partition import Partition
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import ApiKey
from trio_broker.protocol.schema import uses_topic_ids
from trio_broker.services.topics import RESERVED_TOPICS

if TYPE_CHECKING:
    from trio_broker.services.topics import Topic


def find_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> tuple[Topic | None, str, ErrorCode]:
    """(the topic or None, its name for the answer and the ACL check, the error if missing).

    An unknown topic id has no name: the name is then "" (and stays UNKNOWN_TOPIC_ID).
    A known topic (by id or name) without the partition asked for is
    UNKNOWN_TOPIC_OR_PARTITION, as in Kafka: the id was found, the partition was not.
    In a cluster, a topic this broker holds no replica of is still the cluster's: it is
    answered under the name the cluster's view gives it, and each of its partitions as
    :func:`missing_partition_error` says (NOT_LEADER_OR_FOLLOWER for one the cluster
    has, so clients refresh their metadata and go to the leader).
    """
    topics = ctx.services.topics
    by_id = uses_topic_ids(ctx.header.api_key, ctx.api_version)
    if by_id:
        topic = topics.by_id.get(topic_id) if topic_id is not None else None
        missing = (
            ErrorCode.UNKNOWN_TOPIC_ID if topic is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
    else:
        topic = topics.get(name or "")
        missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if topic is not None:
        return topic, topic.name, missing
    own = _own_internal_topic(ctx, None if by_id else name, topic_id if by_id else None)
    if own is not None:
        return own, own.name, missing
    if by_id and topic_id is not None:
        held = ctx.services.leaders.view.topic_by_id(topic_id)
        if held is not None:  # a node alone holds every topic it has: only in a cluster
            return None, held.name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return None, name or "", missing


def _own_internal_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> Topic | None:
    """A node alone's internal topic (services/own_partition.py) of that name or id, to
    read, once Metadata lists it (before its first record it does not exist yet, as in
    Kafka). Never to Produce to: its log is its coordinator's alone (Kafka lets its own
    admin client append to an internal topic; here the coordinator would not see it)."""
    if ctx.header.api_key == ApiKey.PRODUCE:
        return None
    for own in ctx.services.own_internal_topics.values():
        if (own.topic == name or (name is None and topic_id == own.topic_id)) and own.listed():
            return own.as_topic()
    return None


def leading_partition(
    ctx: RequestContext, topic: Topic | None, name: str, partition: int,
    missing: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    current_leader_epoch: int = -1, *, fence_alone: bool = True,
) -> Partition | ErrorCode:  # fmt: skip
    """The one guard of every per-partition API (Produce, Fetch, ListOffsets,
    OffsetForLeaderEpoch, DeleteRecords) for a partition of a topic :func:`find_topic`
    gave (``topic``, ``name``, ``missing``), and the one lookup of what the data path
    needs of it: the :class:`Partition` (its log, this broker's term, its producer
    state) when this broker holds the partition and leads it (in
    ``current_leader_epoch``: :func:`check_leader`), else the error to answer, in
    Kafka's order: the partition unknown here (:func:`missing_partition_error`), then its
    log offline (KAFKA_STORAGE_ERROR: a disk error took its log dir offline, Kafka's
    ``HostedPartition.Offline``; storage/log_dir_state.py), then a leader epoch that
    differs, then not the leader."""
    if topic is None or not 0 <= partition < len(topic.logs):
        return missing_partition_error(ctx, name, partition, missing)
    log = topic.logs[partition]
    if log.offline:
        # The disk may work again: probe the dir in the background (the flusher's
        # back-off, once a second per dir); this request still gets the error.
        ctx.services.durability.recover_soon(log)
        return ErrorCode.KAFKA_STORAGE_ERROR
    own = (
        ctx.services.own_internal_topics.get(topic.name) if topic.name in RESERVED_TOPICS else None
    )
    if own is not None and own.as_topic() is topic:
        # A node alone's internal partition, led by its OwnPartition from start to end,
        # not by the data path's replication: its own term, fenced as a node alone's.
        own_led = topic.partitions[partition]
        if current_leader_epoch != -1 and fence_alone:
            fenced = epoch_error(current_leader_epoch, own_led.term.leader_epoch)
            if fenced is not None:
                return fenced
        return own_led
    term = check_leader(ctx, topic.name, partition, current_leader_epoch, fence_alone=fence_alone)
    if isinstance(term, ErrorCode):
        return term
    # The Partition the replication took with this term (Topic.make_leader): a plain
    # lookup. None, a follower's (no term), or another term's, only if the term and the
    # Partition ever parted (they are replaced together): not led here, as Kafka
    # answers for a partition it has no leader Partition of.
    led = topic.partitions.get(partition)
    if led is None or led.term is not term:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return led


@attrs.frozen
class FollowerCopy:
    """A partition this broker holds as a follower, for the one request that may read
    it there (ListOffsets from the debugging replica id: Kafka's
    ``fetchOnlyFromLeader`` false). ``leader_epoch``: the partition's, as this replica
    knows it."""

    leader_epoch: int


def replica_partition(
    ctx: RequestContext, topic: Topic | None, name: str, partition: int,
    missing: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    current_leader_epoch: int = -1,
) -> Partition | FollowerCopy | ErrorCode:  # fmt: skip
    """:func:`leading_partition` without its last rule (Kafka's ``getLocalLog`` with
    ``requireLeader`` false): a partition held here as a follower, in the leader epoch
    the client names, is read from this broker's copy (:class:`FollowerCopy`)."""
    found = leading_partition(ctx, topic, name, partition, missing, current_leader_epoch)
    if found is not ErrorCode.NOT_LEADER_OR_FOLLOWER or topic is None:
        return found
    if not 0 <= partition < len(topic.logs):  # the cluster has it; this broker does not
        return found
    info = ctx.services.leaders.partition(topic.name, partition)
    return FollowerCopy(leader_epoch=-1 if info is None else info.leader_epoch)
