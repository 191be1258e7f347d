"""DeleteRecords: move a partition's log start offset forward (records below become unreadable).

Offset -1 means "up to the high watermark". An offset beyond the high watermark
(or below -1) is OFFSET_OUT_OF_RANGE; one at or below the log start offset
changes nothing. Kafka waits for followers to catch up before answering; with
no followers the new low watermark is known at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.errors import LogError, StorageError

if TYPE_CHECKING:
    from trio_broker.services.topics import Topic

Resp = m.DeleteRecordsResponse
TopicResult = Resp.DeleteRecordsTopicResult
PartResult = TopicResult.DeleteRecordsPartitionResult
#: The request's "delete everything below the high watermark".
HIGH_WATERMARK = -1


def _delete(topic: Topic | None, partition: int, offset: int) -> tuple[int, ErrorCode]:
    """(low watermark, error) for one partition."""
    if topic is None or not 0 <= partition < len(topic.logs):
        return -1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    policy = topic.info.configs.get("cleanup.policy", "delete")
    if "delete" not in (p.strip() for p in policy.split(",")):
        # Kafka refuses to cut a compacted-only log: its records are kept by key, not by age.
        return -1, ErrorCode.POLICY_VIOLATION
    log = topic.logs[partition]
    high_watermark = log.log_end_offset
    if offset == HIGH_WATERMARK:
        offset = high_watermark
    if offset < 0 or offset > high_watermark:
        return -1, ErrorCode.OFFSET_OUT_OF_RANGE
    try:
        if offset > log.log_start_offset:
            log.delete_records(offset)
    except LogError as exc:
        return -1, exc.error_code
    except OSError:
        return -1, StorageError.error_code  # an OSError: a storage error
    return log.log_start_offset, ErrorCode.NONE


@handles(m.ApiKey.DELETE_RECORDS)
async def handle_delete_records(
    ctx: RequestContext, request: m.DeleteRecordsRequest
) -> m.DeleteRecordsResponse:
    topics = ctx.services.topics
    results: list[TopicResult] = []
    for wanted in request.topics:
        topic = topics.get(wanted.name)
        allowed = authorized(ctx, Operation.DELETE, ResourceType.TOPIC, wanted.name)
        partitions: list[PartResult] = []
        for p in wanted.partitions:
            low_watermark, error = (
                _delete(topic, p.partition_index, p.offset)
                if allowed
                else (-1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            )
            partitions.append(
                PartResult(
                    partition_index=p.partition_index, low_watermark=low_watermark, error_code=error
                )
            )
        results.append(TopicResult(name=wanted.name, partitions=partitions))
    return Resp(throttle_time_ms=0, topics=results)
