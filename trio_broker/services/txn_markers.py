"""Writing a transaction marker into a partition: the coordinator's one way in.

A marker is a control batch (trio_broker.protocol.records.build_control_batch) that
ends a producer's transaction in one partition. It is appended through the same path
as a produced batch (``partition/append.py``, as a coordinator's write): the producer
state checks its epochs first, the log assigns its offset, :meth:`ProducerStateRegistry.record_append` ends the transaction (commit:
it closes; abort: it joins the aborted list), the log is marked for the next group
commit, and long polls are woken (a read_committed fetch waiting at the LSO moves on).

Sync and trio-free: the caller (the transaction coordinator, or a test) awaits
``durability.wait_durable(log, offset)`` itself.
"""

from __future__ import annotations

from typing import Any

from trio_broker.partition.append import (
    Appended,
    AppendRejected,
    NotLeader,
    Origin,
    Replication,
    wait_acked,
)
from trio_broker.partition.append import append as partition_append
from trio_broker.partition.partition import Partition, led_term
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import build_control_batch
from trio_broker.replication.leader import AckState
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log_protocol import Log

__all__ = [
    "MarkerRejected",
    "append_marker_as_leader",
    "append_txn_marker",
    "complete_offsets_marker",
    "marker_committed",
    "write_marker_as_leader",
]


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
    *,
    leaders: Replication,
) -> tuple[Log, int]:
    """Append a commit or abort marker for ``producer_id``; return (log, marker offset).

    ``leaders``: this broker's replication, whose term of the partition the marker is
    written in (a node alone's coordinator writes its markers itself, in the local
    term of its ``LocalReplication``, a cluster of one: the broker binds it).

    Raises :class:`MarkerRejected` with UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH
    (an epoch older than the producer's in this partition) or
    TRANSACTION_COORDINATOR_FENCED (an older coordinator epoch than the last marker's),
    NOT_LEADER_OR_FOLLOWER when ``leaders`` has no term of it, and lets the log's
    StorageError (a KafkaError too) through. Nothing is written then.
    """
    if topics.log(topic, partition) is None:  # before the leadership: nothing to close
        raise MarkerRejected(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{partition}"
        )
    # The marker's checks and record go to the producer state the Partition holds (the
    # entry the replication took it with: the broker's registry, ``producers``).
    led = _led(topics, leaders, topic, partition)
    if isinstance(led, ErrorCode):
        raise MarkerRejected(led, f"cannot write a marker to {topic}-{partition}")
    appended = _append_marker(
        led, durability, appends, producer_id, producer_epoch, committed, coordinator_epoch,
        now_ms,
    )  # fmt: skip
    return appended.log, appended.last_offset


def _led(
    topics: TopicManager, leaders: Replication, topic: str, partition: int,
) -> Partition | ErrorCode:  # fmt: skip
    """The partition a marker goes to, found as the guard finds one (``Topic.leading``,
    the Partition taken in this broker's term: a lookup), or why not:
    NOT_LEADER_OR_FOLLOWER (no term here: the coordinator looks the leader up again
    and retries), then UNKNOWN_TOPIC_OR_PARTITION (led, but no such partition here)."""
    try:
        term = led_term(leaders, topic, partition)
    except NotLeader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    found = topics.get(topic)
    if found is None or not 0 <= partition < len(found.logs):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        led = found.leading(partition)
    except NotLeader:  # the term and the Partition are replaced together: never apart
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if led.term is not term:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return led


def _append_marker(
    led: Partition, durability: Any, appends: Any, producer_id: int, producer_epoch: int,
    committed: bool, coordinator_epoch: int, now_ms: int,
) -> Appended:  # fmt: skip
    buf = build_control_batch(
        producer_id,
        producer_epoch,
        committed=committed,
        coordinator_epoch=coordinator_epoch,
        timestamp=now_ms,
    )
    # The partition's write path checks the marker's epochs against the producer state,
    # and records it there once appended (the transaction ends in this partition).
    try:
        return partition_append(
            led, buf, origin=Origin.COORDINATOR, now_ms=now_ms, durability=durability,
            appends=appends,
        )  # fmt: skip
    except AppendRejected as exc:
        raise MarkerRejected(exc.error_code, str(exc)) from None


def append_marker_as_leader(
    services: Any, topic: str, partition: int, producer_id: int, producer_epoch: int,
    committed: bool, coordinator_epoch: int, now_ms: int,
) -> ErrorCode | Appended:  # fmt: skip
    """A partition's leader appends a marker in its leader epoch: the write, or the
    partition's error (:func:`_led`'s; the marker's epochs' and the log's). ``services``
    gives ``topics``, ``producers``, ``durability``, ``appends`` and ``leaders``."""
    led = _led(services.topics, services.leaders, topic, partition)
    if isinstance(led, ErrorCode):
        return led
    try:
        return _append_marker(
            led, services.durability, services.appends, producer_id, producer_epoch, committed,
            coordinator_epoch, now_ms,
        )  # fmt: skip
    except KafkaError as exc:
        return ErrorCode(exc.error_code)
    except OSError:
        return ErrorCode.KAFKA_STORAGE_ERROR


async def marker_committed(services: Any, written: Appended) -> ErrorCode:
    """NONE once an appended marker is synced and, in a cluster, below the high
    watermark: Kafka's leader appends markers with acks=-1."""
    acked = await wait_acked(
        written, -1, durability=services.durability, replication=services.leaders
    )
    error = acked.sync_error
    if error is not None:
        return ErrorCode(error.error_code) if isinstance(error, KafkaError) else (
            ErrorCode.KAFKA_STORAGE_ERROR
        )  # fmt: skip
    if acked.ok:
        return ErrorCode.NONE
    if acked.state is AckState.LEADERSHIP_LOST:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


async def complete_offsets_marker(
    services: Any, partition: int, producer_id: int, producer_epoch: int, committed: bool
) -> ErrorCode:
    """A marker for ``__consumer_offsets``-``partition`` in a cluster: its leader's group
    coordinator commits or drops the producer's staged offsets (replicated
    ``__consumer_offsets``); NOT_COORDINATOR when this broker does not lead it."""
    complete = getattr(services.groups, "complete_transaction_in_partition", None)
    if complete is None:  # a group coordinator without replicated offsets
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    try:
        await complete(partition, producer_id, producer_epoch, committed)
    except KafkaError as exc:
        return ErrorCode(exc.error_code)
    return ErrorCode.NONE


async def write_marker_as_leader(
    services: Any, topic: str, partition: int, producer_id: int, producer_epoch: int,
    committed: bool, coordinator_epoch: int, now_ms: int,
) -> ErrorCode:  # fmt: skip
    """One marker, written where this broker leads: appended and committed, or handed
    to the group coordinator for ``__consumer_offsets``; the partition's error code."""
    if topic == CONSUMER_OFFSETS:
        return await complete_offsets_marker(
            services, partition, producer_id, producer_epoch, committed
        )
    written = append_marker_as_leader(
        services, topic, partition, producer_id, producer_epoch, committed, coordinator_epoch,
        now_ms,
    )  # fmt: skip
    if isinstance(written, ErrorCode):
        return written
    return await marker_committed(services, written)
