"""Writing a transaction marker into a partition: the coordinator's one way in.

A marker is a control batch (trio_broker.protocol.records.build_control_batch) that
ends a producer's transaction in one partition. It is appended through the same path
as a produced batch: the producer state checks its epochs first, the log assigns its
offset, :meth:`ProducerStateRegistry.record_append` ends the transaction (commit:
it closes; abort: it joins the aborted list), the log is marked for the next group
commit, and long polls are woken (a read_committed fetch waiting at the LSO moves on).

Sync and trio-free: the caller (the transaction coordinator, or a test) awaits
``durability.wait_durable(log, offset)`` itself.
"""

from __future__ import annotations

from typing import Any

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import RecordBatchView, build_control_batch
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import TopicManager

__all__ = ["MarkerRejected", "append_txn_marker"]


class MarkerRejected(KafkaError):
    """The partition refuses the marker: ``MarkerRejected(error_code, message)``."""


def append_txn_marker(
    topics: TopicManager,
    producers: ProducerStateRegistry,
    durability: Any,
    appends: Any,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    coordinator_epoch: int,
    now_ms: int,
) -> tuple[Any, int]:
    """Append a commit or abort marker for ``producer_id``; return (log, marker offset).

    Raises :class:`MarkerRejected` with UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH
    (an epoch older than the producer's in this partition) or
    TRANSACTION_COORDINATOR_FENCED (an older coordinator epoch than the last marker's),
    and lets the log's StorageError (a KafkaError too) through. Nothing is written then.
    """
    log = topics.log(topic, partition)
    if log is None:
        raise MarkerRejected(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{partition}"
        )
    code, message = producers.check_marker(
        topic, partition, log, producer_id, producer_epoch, coordinator_epoch
    )
    if code != ErrorCode.NONE:
        raise MarkerRejected(code, message)
    buf = build_control_batch(
        producer_id,
        producer_epoch,
        committed=committed,
        coordinator_epoch=coordinator_epoch,
        timestamp=now_ms,
    )
    result = log.append(buf, now_ms=now_ms)
    # The log wrote the offsets into buf: the view is the batch as stored.
    producers.record_append(
        topic, partition, RecordBatchView(buf), result.base_offset, result.last_offset
    )
    durability.mark_dirty(log)
    appends.notify()
    return log, result.last_offset
