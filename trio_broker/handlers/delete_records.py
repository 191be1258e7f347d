"""DeleteRecords: move a partition's log start offset forward (records below become unreadable).

The partition's leader answers. Offset -1 means "up to the high watermark"; an offset
beyond the high watermark (or below -1) is OFFSET_OUT_OF_RANGE (records not yet
committed cannot be deleted); one at or below the log start offset changes nothing.
An internal topic's partition (``__consumer_offsets``, ``__transaction_state``: a
cluster's coordinators' logs) is INVALID_TOPIC_EXCEPTION, as Kafka refuses it.

The answer waits, as Kafka's delayed DeleteRecords does, until the partition's low
watermark (the lowest log start over the leader and every replica on a live broker,
in the ISR or not) reaches the requested offset: followers move their log start when a
fetch answer tells them the leader's, and tell theirs back in their next fetch. Past the
request's timeout_ms the partition answers REQUEST_TIMED_OUT (its records below the
offset are gone on the leader all the same). A node alone is its only replica: it
answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.topic_lookup import find_topic, leading_partition
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import RESERVED_TOPICS
from trio_broker.storage.errors import LogError, StorageError

if TYPE_CHECKING:
    from trio_broker.services.topics import Topic

Resp = m.DeleteRecordsResponse
TopicResult = Resp.DeleteRecordsTopicResult
PartResult = TopicResult.DeleteRecordsPartitionResult
#: The request's "delete everything below the high watermark".
HIGH_WATERMARK = -1


def _delete(
    ctx: RequestContext, topic: Topic | None, name: str, missing: ErrorCode, partition: int,
    offset: int,
) -> tuple[int, int, ErrorCode]:  # fmt: skip
    """(requested offset, low watermark, error) for one partition, on the leader."""
    led = leading_partition(ctx, topic, name, partition, missing)
    if name in RESERVED_TOPICS and led != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        # Kafka cuts no coordinator's log on request, leader or not (checked once the
        # partition is known to exist: ReplicaManager.deleteRecordsOnLocalLog).
        return offset, -1, ErrorCode.INVALID_TOPIC_EXCEPTION
    if isinstance(led, ErrorCode):
        return offset, -1, led
    assert topic is not None  # the guard found the partition's log
    policy = topic.info.configs.get("cleanup.policy", "delete")
    if "delete" not in (p.strip() for p in policy.split(",")):
        # Kafka refuses to cut a compacted-only log: its records are kept by key, not by age.
        return offset, -1, ErrorCode.POLICY_VIOLATION
    log = led.log
    # The committed end: a leader's records above it may still be truncated away.
    high_watermark = led.term.high_watermark
    if offset == HIGH_WATERMARK:
        offset = high_watermark
    if offset < 0 or offset > high_watermark:
        return offset, -1, ErrorCode.OFFSET_OUT_OF_RANGE
    try:
        if offset > log.log_start_offset:
            log.delete_records(offset)
    except LogError as exc:
        return offset, -1, exc.error_code
    except OSError:
        return offset, -1, StorageError.error_code  # an OSError: a storage error
    low_watermark = ctx.services.leaders.low_watermark(name, partition)
    if low_watermark is None:
        return offset, -1, ErrorCode.NOT_LEADER_OR_FOLLOWER
    return offset, low_watermark, ErrorCode.NONE


@handles(m.ApiKey.DELETE_RECORDS)
async def handle_delete_records(
    ctx: RequestContext, request: m.DeleteRecordsRequest
) -> m.DeleteRecordsResponse | Deferred:
    leaders = ctx.services.leaders
    results: list[TopicResult] = []
    #: Partitions whose low watermark is still below the offset they were cut at.
    waiting: list[tuple[str, PartResult, int]] = []
    for wanted in request.topics:
        topic, name, missing = find_topic(ctx, wanted.name, None)
        allowed = authorized(ctx, Operation.DELETE, ResourceType.TOPIC, wanted.name)
        partitions: list[PartResult] = []
        for p in wanted.partitions:
            requested, low_watermark, error = (
                _delete(ctx, topic, name, missing, p.partition_index, p.offset)
                if allowed
                else (p.offset, -1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            )
            part = PartResult(
                partition_index=p.partition_index, low_watermark=low_watermark, error_code=error
            )
            partitions.append(part)
            if error == ErrorCode.NONE and low_watermark < requested:
                waiting.append((wanted.name, part, requested))
        results.append(TopicResult(name=wanted.name, partitions=partitions))
    response = Resp(throttle_time_ms=0, topics=results)
    if not waiting:
        return response
    done: set[int] = set()

    async def replicated() -> m.DeleteRecordsResponse:
        for i, (name, part, requested) in enumerate(waiting):
            low_watermark = await leaders.wait_low_watermark(name, part.partition_index, requested)
            if low_watermark is None:
                part.error_code, part.low_watermark = ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
            else:
                part.low_watermark = low_watermark
            done.add(i)
        return response

    def timed_out() -> m.DeleteRecordsResponse:
        # As Kafka's expired delayed DeleteRecords: the low watermark known at the cut.
        for i, (_, part, _) in enumerate(waiting):
            if i not in done:
                part.error_code = ErrorCode.REQUEST_TIMED_OUT
        return response

    return Deferred(replicated, timeout_s=max(request.timeout_ms, 0) / 1000, on_timeout=timed_out)
