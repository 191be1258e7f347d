"""DescribeLogDirs: the broker's log directories, their partitions and their sizes.

One entry per log dir (``log.dirs``; one with ``--data-dir``), its absolute path as
Kafka gives it. A dir a disk error took offline (storage/log_dir_state.py) answers
KAFKA_STORAGE_ERROR with no partitions and unknown sizes, as Kafka's; an online one
lists each asked-for partition it holds: its size (the bytes of its segment files),
offset lag 0 and ``is_future_key`` false (no replica is being moved between directories), and
from v4 the file system's total and usable bytes. A null topic list asks for
every partition, the internal ``__consumer_offsets`` and ``__transaction_state`` ones
included, as in Kafka; partitions the broker does not hold are left out. DESCRIBE on the cluster is
required: refused, the answer is empty with CLUSTER_AUTHORIZATION_FAILED at the
top (v3+; earlier versions have no field for it and get the empty list only).

With ``--storage memory`` there is no directory: the one log dir is named
``MEMORY_LOG_DIR`` and its byte totals are -1 ("unknown" in the schema).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.log_protocol import Log

Resp = m.DescribeLogDirsResponse
DirResult = Resp.DescribeLogDirsResult
TopicResult = DirResult.DescribeLogDirsTopic
PartitionResult = TopicResult.DescribeLogDirsPartition

MEMORY_LOG_DIR = "(memory)"
UNKNOWN_BYTES = -1
#: The committed-offsets log: one partition, owned by the group coordinator.
OFFSETS_TOPIC, OFFSETS_PARTITION = "__consumer_offsets", 0
#: The transaction coordinator's log (trio_broker/transactions): alone one partition too.
TRANSACTIONS_TOPIC = "__transaction_state"


def _partition_logs(ctx: RequestContext) -> Iterator[tuple[str, int, Log]]:
    """(topic, partition, log) of every partition log the broker holds."""
    for name, topic in ctx.services.topics.topics.items():
        for index, log in enumerate(topic.logs):
            yield name, index, log
    offsets = ctx.services.groups.offsets
    # Alone the offsets log is the coordinator's own; a cluster's is a topic's replica.
    if offsets is not None and OFFSETS_TOPIC not in ctx.services.topics.topics:
        yield OFFSETS_TOPIC, OFFSETS_PARTITION, offsets.log
    # The same for the transaction log: alone the coordinator's own partition.
    if TRANSACTIONS_TOPIC not in ctx.services.topics.topics:
        for partition, table in ctx.services.transactions.tables.items():
            yield TRANSACTIONS_TOPIC, partition, table.log


def _topic_results(
    ctx: RequestContext, wanted: set[tuple[str, int]] | None, log_dir: str | None
) -> list[m.DescribeLogDirsResponse.DescribeLogDirsResult.DescribeLogDirsTopic]:
    """The partitions in ``log_dir`` (None: memory, all of them)."""
    sizes: dict[str, dict[int, int]] = {}  # topic -> partition -> bytes
    for name, index, log in _partition_logs(ctx):
        where = ctx.services.topics.log_dir_of(log)
        if log_dir is not None and (where is None or str(where) != log_dir):
            continue
        if wanted is None or (name, index) in wanted:
            sizes.setdefault(name, {})[index] = log.size_bytes
    return [
        TopicResult(name=name, partitions=[
            PartitionResult(partition_index=index, partition_size=size, offset_lag=0,
                            is_future_key=False)
            for index, size in sorted(partitions.items())
        ])
        for name, partitions in sorted(sizes.items())
    ]  # fmt: skip


def _log_dir_result(
    ctx: RequestContext, wanted: set[tuple[str, int]] | None, data_dir: str | None
) -> m.DescribeLogDirsResponse.DescribeLogDirsResult:
    result = DirResult(
        error_code=ErrorCode.NONE, log_dir=MEMORY_LOG_DIR, topics=[],
        total_bytes=UNKNOWN_BYTES, usable_bytes=UNKNOWN_BYTES, is_cordoned=False,
    )  # fmt: skip
    if data_dir is not None:
        result.log_dir = data_dir
        if not ctx.services.topics.dir_states.is_online(Path(data_dir)):
            # A disk error took the dir offline: as Kafka, its error and no partitions.
            result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            return result
        try:
            fs = os.statvfs(data_dir)
        except OSError:
            # A directory we cannot even stat is offline: Kafka lists no partitions then.
            result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            return result
        result.total_bytes = fs.f_blocks * fs.f_frsize
        result.usable_bytes = fs.f_bavail * fs.f_frsize  # what a non-root writer may use
    result.topics = _topic_results(ctx, wanted, data_dir)
    return result


@handles(m.ApiKey.DESCRIBE_LOG_DIRS)
async def handle_describe_log_dirs(
    ctx: RequestContext, request: m.DescribeLogDirsRequest
) -> m.DescribeLogDirsResponse:
    response = Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, results=[])
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER):
        response.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return response
    wanted = None
    if request.topics is not None:
        wanted = {(t.topic, p) for t in request.topics for p in t.partitions}
    log_dirs: list[str | None] = [str(d) for d in ctx.services.topics.log_dirs] or [None]
    response.results = [_log_dir_result(ctx, wanted, d) for d in log_dirs]
    return response
