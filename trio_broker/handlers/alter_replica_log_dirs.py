"""AlterReplicaLogDirs (34): move partitions between the broker's log dirs (JBOD).

Each asked-for partition moves to the named dir, one of ``log.dirs`` given by its
absolute path. Per partition, as Kafka answers: LOG_DIR_NOT_FOUND for a dir that is
not one of the broker's; UNKNOWN_TOPIC_OR_PARTITION for a partition nobody has;
REPLICA_NOT_AVAILABLE for one the cluster has but this broker holds no log of (Kafka
keeps NotLeaderOrFollower's old name here); KAFKA_STORAGE_ERROR when the destination dir
is offline (a disk error took it offline: storage/log_dir_state.py), the partition's own
dir is, or the move fails on disk. A partition already in that dir answers NONE with nothing to
do. Without ALTER on the cluster every partition gets CLUSTER_AUTHORIZATION_FAILED.

Kafka copies into a "future" log in the background while the current one serves, then
swaps. Here the move is done when the answer comes: every append so far is made
durable, then the log is closed, copied and swapped in durable renames
(storage/log_dirs.py) without yielding to the event loop, so no append can land in
the old copy after it was copied. Requests wait for the copy: fine for the partition
sizes this broker is for, and a crash at any step leaves exactly one whole copy.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.errors import StorageError
from trio_broker.storage.log import PartitionLog

Resp = m.AlterReplicaLogDirsResponse
TopicResult = Resp.AlterReplicaLogDirTopicResult
PartitionResult = TopicResult.AlterReplicaLogDirPartitionResult

log = logging.getLogger(__name__)


async def _move(ctx: RequestContext, topic: str, partition: int, log_dir: Path) -> ErrorCode:
    topics = ctx.services.topics
    partition_log = topics.log(topic, partition)
    if partition_log is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if not isinstance(partition_log, PartitionLog):  # memory storage: no dirs at all
        return ErrorCode.LOG_DIR_NOT_FOUND
    if partition_log.offline:
        return ErrorCode.KAFKA_STORAGE_ERROR
    if topics.log_dir_of(partition_log) == log_dir:
        return ErrorCode.NONE
    # No produce may wait on the old log's durability once it is closed: wait until
    # all of it is on disk, then move without yielding (no append in between).
    durability = ctx.services.durability
    while partition_log.durable_end_offset < partition_log.log_end_offset:
        await durability.wait_durable(partition_log, partition_log.log_end_offset - 1)
        partition_log = topics.log(topic, partition)
        if not isinstance(partition_log, PartitionLog):  # deleted meanwhile
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        topics.move_partition(topic, partition, log_dir)
    except (OSError, StorageError):
        log.exception("moving %s-%d to %s failed", topic, partition, log_dir)
        return ErrorCode.KAFKA_STORAGE_ERROR
    log.info("moved %s-%d to log dir %s", topic, partition, log_dir)
    return ErrorCode.NONE


@handles(m.ApiKey.ALTER_REPLICA_LOG_DIRS)
async def handle_alter_replica_log_dirs(
    ctx: RequestContext, request: m.AlterReplicaLogDirsRequest
) -> m.AlterReplicaLogDirsResponse:
    # As Kafka reads the request: one destination per partition, the last one named wins.
    wanted: dict[tuple[str, int], str] = {}
    for d in request.dirs:
        for t in d.topics:
            for p in t.partitions:
                wanted[(t.name, p)] = d.path
    allowed = authorized(ctx, Operation.ALTER, ResourceType.CLUSTER)
    log_dirs = set(ctx.services.topics.log_dirs)
    results: dict[str, list[PartitionResult]] = {}
    for (topic, partition), path in wanted.items():
        target = Path(path)  # absolute, as Kafka compares it with each dir's absolute path
        if not allowed:
            code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        elif target not in log_dirs:
            code = ErrorCode.LOG_DIR_NOT_FOUND
        elif not ctx.services.topics.dir_states.is_online(target):
            code = ErrorCode.KAFKA_STORAGE_ERROR  # as Kafka: never into an offline dir
        else:
            code = await _move(ctx, topic, partition, target)
        results.setdefault(topic, []).append(
            PartitionResult(partition_index=partition, error_code=code)
        )
    return Resp(
        throttle_time_ms=0,
        results=[TopicResult(topic_name=t, partitions=ps) for t, ps in results.items()],
    )
