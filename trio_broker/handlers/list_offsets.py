"""ListOffsets: a partition's earliest or latest offset, or the first offset at a time.

Special timestamps (Kafka's ListOffsetsRequest constants):

- -2 earliest: the log start offset.
- -1 latest: the high watermark; read_committed (isolation_level 1) gets the
  last stable offset instead: the first offset of the oldest open transaction.
  A request with a replica id (a follower, -2 debugging) gets the log end.
- -3 max timestamp (KIP-734, v7+): the record with the largest timestamp (the
  earliest one on a tie) and that timestamp. We find its batch from the batch
  headers, then decode that one batch for the exact record.
- -4 earliest local (KIP-405): the log start offset; nothing is tiered.
- -5 latest tiered (KIP-1005): -1/-1; nothing is tiered.

Any other timestamp asks for the first record whose timestamp is >= it: the
log finds the batch (batch granularity), and we decode that batch to answer
the exact record as Kafka does. None found is offset -1, timestamp -1, and so is a
record at or past what the asker may read (a consumer: the HW, or the LSO).

A new leader whose HW has not reached its term's start (KIP-207) answers a consumer's
latest, and a search that finds nothing it may read, OFFSET_NOT_AVAILABLE
(LEADER_NOT_AVAILABLE before v5, as Kafka).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.producer_state import prepare_producer_states
from trio_broker.handlers.topic_lookup import (
    FollowerCopy,
    find_topic,
    leading_partition,
    replica_partition,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import ProtocolError
from trio_broker.protocol.records import RecordBatchView, iter_batches
from trio_broker.storage.errors import LogError, StorageError
from trio_broker.storage.group_configs import AutoOffsetReset
from trio_broker.storage.log_protocol import Log

if TYPE_CHECKING:
    from trio_broker.services.topics import Topic

logger = logging.getLogger("trio_broker.list_offsets")

Resp = m.ListOffsetsResponse
TopicResp = Resp.ListOffsetsTopicResponse
PartResp = TopicResp.ListOffsetsPartitionResponse

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
READ_COMMITTED = 1
#: The replica id of a consumer's request (a follower sends its broker id).
CONSUMER_REPLICA_ID = -1
#: The replica id of a debugging tool: the one asker a follower answers too.
DEBUGGING_REPLICA_ID = -2


def _batch_at(partition_log: Log, offset: int) -> RecordBatchView | None:
    """The whole batch holding ``offset`` (read from the log), or None."""
    regions = partition_log.read(offset, 1, partition_log.log_end_offset, min_one=True)
    data = b"".join(r.read_bytes() for r in regions)
    for batch in iter_batches(data):
        if batch.last_offset >= offset:
            return batch
    return None


def _exact_at_or_after(
    partition_log: Log, base: int, batch_max: int, timestamp: int
) -> tuple[int, int]:
    """First record at or after ``base`` with a timestamp >= ``timestamp``, within its batch."""
    try:
        batch = _batch_at(partition_log, base)
        if batch is not None:
            for record in batch.records():
                offset, ts = batch.offset_of(record), batch.timestamp_of(record)
                if offset >= base and ts >= timestamp:
                    return offset, ts
    except (ProtocolError, LogError, OSError):
        # The log already vouched for this batch; fall back to its base offset.
        logger.warning("cannot decode the batch at offset %d", base, exc_info=True)
    return base, batch_max


def _max_timestamp(partition_log: Log) -> tuple[int, int]:
    best_ts, best_base = -1, -1
    log_start = partition_log.log_start_offset
    for base, header in partition_log.iter_batch_headers():
        batch = RecordBatchView(header)
        if batch.last_offset < log_start:
            continue
        if batch.max_timestamp > best_ts:  # strict: the earliest batch wins a tie
            best_ts, best_base = batch.max_timestamp, max(base, log_start)
    if best_base < 0:
        return -1, -1
    return _exact_at_or_after(partition_log, best_base, best_ts, best_ts)


def _lookup(partition_log: Log, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) for one partition; -1/-1 when no record qualifies."""
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return partition_log.log_start_offset, -1
    if timestamp == LATEST:
        return partition_log.log_end_offset, -1
    if timestamp == MAX_TIMESTAMP:
        return _max_timestamp(partition_log)
    if timestamp == LATEST_TIERED:
        return -1, -1
    found = partition_log.offset_for_timestamp(timestamp)
    if found is None:
        return -1, -1
    base, batch_max = found
    return _exact_at_or_after(partition_log, base, batch_max, timestamp)


def offset_for_reset(partition_log: Log, reset: AutoOffsetReset, now_ms: int) -> int:
    """Where a share group's new share partition starts (share.auto.offset.reset): the
    log start, the log end, or the first record no older than the duration (the log end
    when there is none, as Kafka falls back)."""
    if reset.kind == "earliest":
        return partition_log.log_start_offset
    if reset.kind == "by_duration":
        offset, _ = _lookup(partition_log, now_ms - reset.duration_ms)
        if offset >= 0:
            return offset
    return partition_log.log_end_offset


@handles(m.ApiKey.LIST_OFFSETS)
async def handle_list_offsets(
    ctx: RequestContext, request: m.ListOffsetsRequest
) -> m.ListOffsetsResponse:
    # Kafka answers a partition named twice with INVALID_REQUEST rather than guess.
    seen: dict[tuple[str, int], int] = {}
    for t in request.topics:
        for p in t.partitions:
            seen[t.name, p.partition_index] = seen.get((t.name, p.partition_index), 0) + 1
    if request.isolation_level == READ_COMMITTED:  # the LSO: producer state, off the loop
        await prepare_producer_states(
            ctx, ((t.name, None, [p.partition_index for p in t.partitions]) for t in request.topics)
        )
    responses: list[TopicResp] = []
    for wanted in request.topics:
        topic, name, missing = find_topic(ctx, wanted.name, None)
        partitions: list[PartResp] = []
        allowed = authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, wanted.name)
        for p in wanted.partitions:
            out = PartResp(
                partition_index=p.partition_index, error_code=ErrorCode.NONE, timestamp=-1,
                offset=-1, leader_epoch=-1,
            )  # fmt: skip
            partitions.append(out)
            # Kafka's order: a topic the principal may not describe is refused whole,
            # before its duplicates are looked for.
            if not allowed:
                out.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif seen[wanted.name, p.partition_index] > 1:
                out.error_code = ErrorCode.INVALID_REQUEST
            else:
                _list_offset(ctx, request, topic, name, missing, p, out)
        responses.append(TopicResp(name=wanted.name, partitions=partitions))
    return Resp(throttle_time_ms=0, topics=responses)


def _list_offset(
    ctx: RequestContext, request: m.ListOffsetsRequest, topic: Topic | None, name: str,
    missing: ErrorCode, p: m.ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition,
    out: PartResp,
) -> None:  # fmt: skip
    """One partition's answer, written into ``out`` (Kafka's fetchOffsetForTimestamp)."""
    current = p.current_leader_epoch if ctx.api_version >= 4 else -1
    # The leader answers (alone: this broker, epoch 0); the debugging replica id may
    # read a follower's copy too (Kafka: fetchOnlyFromLeader is false for it alone).
    found = (
        replica_partition(ctx, topic, name, p.partition_index, missing, current)
        if request.replica_id == DEBUGGING_REPLICA_ID
        else leading_partition(ctx, topic, name, p.partition_index, missing, current)
    )
    if isinstance(found, ErrorCode):
        out.error_code = found
        return
    assert topic is not None  # the guard found the partition's log
    partition_log = topic.logs[p.partition_index]
    # The epoch this replica knows: a leader's term's, a follower copy's from the view.
    leader_epoch = (
        found.leader_epoch if isinstance(found, FollowerCopy) else found.term.leader_epoch
    )
    # A consumer (replica id -1) sees up to the high watermark (the last stable
    # offset for read_committed); a new leader shows it none until the HW has
    # reached its term's start (KIP-207), so it never goes back. A replica or the
    # debugging id sees the whole log: the log end, no KIP-207 check (Kafka's
    # fetchOffsetForTimestamp without an isolation level).
    lag_error = None
    if request.replica_id == CONSUMER_REPLICA_ID:
        assert not isinstance(found, FollowerCopy)  # a consumer's guard needs the leader
        visible = found.term.visible_high_watermark()
        if visible is None:
            # v5 brought OFFSET_NOT_AVAILABLE; older clients retry this one.
            lag_error = (
                ErrorCode.OFFSET_NOT_AVAILABLE
                if ctx.api_version >= 5
                else ErrorCode.LEADER_NOT_AVAILABLE
            )
            visible = found.term.high_watermark
        if request.isolation_level == READ_COMMITTED:
            visible = ctx.services.producers.last_stable_offset(
                topic.name, p.partition_index, partition_log, visible
            )
    else:
        visible = partition_log.log_end_offset
    if p.timestamp == LATEST:
        if lag_error is not None:
            out.error_code = lag_error
            return
        out.offset, out.timestamp, out.leader_epoch = visible, -1, leader_epoch
        return
    try:
        out.offset, out.timestamp = _lookup(partition_log, p.timestamp)
    except LogError as exc:
        out.error_code = exc.error_code
        return
    except (OSError, ProtocolError):
        out.error_code = StorageError.error_code  # an OSError: a storage error
        return
    if p.timestamp not in (EARLIEST, EARLIEST_LOCAL, LATEST_TIERED) and (
        out.offset < 0 or out.offset >= visible
    ):
        # A search found nothing the asker may read (a record at or past the HW
        # is not a consumer's yet): none, or the KIP-207 error while it lags.
        out.offset, out.timestamp = -1, -1
        if lag_error is not None:
            out.error_code = lag_error
        return
    if out.offset >= 0:
        out.leader_epoch = leader_epoch
