"""Internal topics in a cluster: which partition holds a key, who owns it, and writes
that count.

Kafka keeps group offsets in ``__consumer_offsets`` and transaction state in
``__transaction_state``, each a replicated topic of several partitions. The
coordinator of a group (or transactional id) is the broker that leads the partition
its key hashes to; when leadership moves, the new leader rebuilds the coordinator's
table from that partition's log. Three pieces serve the group coordinator and the
transaction coordinator alike:

- :func:`partition_for`: the partition a key belongs to, with Kafka's own hash, so
  that a group lands on the partition a Kafka broker would put it in;
- :class:`LeadershipListener`: what an internal topic's owner is told by the replica
  manager (``cluster/replica_manager.py``) when this broker starts or stops leading one
  of the topic's partitions;
- :func:`append_committed`: append one record batch as the partition's leader and wait
  until it counts: synced here and below the partition's high watermark (in a cluster
  every ISR member has it, and ``min.insync.replicas`` held), Kafka's acks=all for its
  internal writes. A node alone writes its coordinators' own logs through an
  ``OwnLog`` (``services/local_replication.py``): a cluster of one, where synced is
  committed.

No trio here: the waiting is done by the durability and replication objects passed in.
"""

from __future__ import annotations

from typing import Any, Protocol

from trio_broker.partition.append import (
    Appended,
    NotLeader,
    Origin,
    Replication,
    wait_acked,
)
from trio_broker.partition.append import append as partition_append
from trio_broker.partition.partition import coordinator_partition
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.replication.leader import AckState
from trio_broker.storage.log_protocol import Log

__all__ = [
    "LeadershipListener",
    "NotCommitted",
    "append_as_leader",
    "append_committed",
    "java_string_hash",
    "partition_for",
    "wait_counted",
]

CONSUMER_OFFSETS = "__consumer_offsets"
TRANSACTION_STATE = "__transaction_state"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (a signed 32-bit int over UTF-16 code units)."""
    h = 0
    raw = text.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode()) % partitions`` (abs of MIN_VALUE is 0)."""
    if partitions <= 0:
        raise ValueError("an internal topic has at least one partition")
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class LeadershipListener(Protocol):
    """An internal topic's owner (group or transaction coordinator), told by the replica
    manager about this broker's leadership of the topic's partitions. Both calls are
    synchronous and must not block: loading a partition's table from its log is the
    listener's own (background) work."""

    def elected(self, partition: int, leader_epoch: int, log: Log) -> None:
        """This broker now leads ``partition`` in ``leader_epoch``; ``log`` is its log.
        Called again, without :meth:`resigned` in between, when a new epoch of its
        leadership begins (an ISR change by the controller, a reassignment)."""

    def resigned(self, partition: int) -> None:
        """This broker no longer leads ``partition`` (another leads it, or none)."""


class NotCommitted(KafkaError):
    """The write may be lost: the caller answers the client with ``error_code`` (usually
    NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, so that it looks up and retries)."""


def _failed_write_error(exc: BaseException) -> ErrorCode:
    """A coordinator's failed internal write as Kafka answers it: a storage error (the
    disk failed: KAFKA_STORAGE_ERROR, an OSError) NOT_COORDINATOR, as the group
    coordinator and the transaction state manager map KafkaStorageException, so that
    the client looks the coordinator up again; anything else COORDINATOR_NOT_AVAILABLE."""
    if isinstance(exc, OSError) or (
        isinstance(exc, KafkaError) and exc.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    ):
        return ErrorCode.NOT_COORDINATOR
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


async def append_committed(
    log: Log,
    batch: bytearray,
    *,
    now_ms: int,
    durability: Any,
    replication: Replication,
    topic: str = "",
    partition: int = 0,
) -> Appended:
    """Append ``batch`` to ``log`` and return once the write counts (module docstring).

    ``replication``: the broker's (``services.leaders``) in a cluster, or the
    ``OwnLog`` of a log this broker keeps for itself. This broker must lead
    ``topic``-``partition`` (NOT_COORDINATOR otherwise); a cluster's term stamps its
    leader epoch on the batch. Raises :class:`NotCommitted` when the write did not count; the
    record may still be in the log (as with a timed-out produce), so callers apply
    their table change only after a normal return.
    """
    appended = append_as_leader(
        log, batch, now_ms=now_ms, durability=durability, replication=replication,
        topic=topic, partition=partition,
    )  # fmt: skip
    await wait_counted(
        log, appended.last_offset, durability=durability, replication=replication,
        topic=topic, partition=partition,
    )  # fmt: skip
    return appended


def append_as_leader(
    log: Log,
    batch: bytearray,
    *,
    now_ms: int,
    durability: Any,
    replication: Replication,
    topic: str = "",
    partition: int = 0,
    messages: int = 1,
) -> Appended:
    """The first half of :func:`append_committed`, for callers that must append in
    request order now and wait later: the partition's append as a coordinator
    (``partition/append.py``: a cluster's leader epoch, the log marked dirty for the
    flusher), to the :class:`~trio_broker.partition.partition.Partition` that
    ``replication`` gives ``log`` (``coordinator_partition``: the log's one Partition,
    its term looked up on each write). Raises :class:`NotCommitted` (nothing was
    appended); the caller waits with :func:`wait_counted`."""
    try:
        led = coordinator_partition(replication, topic, partition, log)
    except NotLeader as exc:
        raise NotCommitted(ErrorCode.NOT_COORDINATOR, str(exc)) from None
    try:
        return partition_append(
            led, batch, origin=Origin.COORDINATOR, now_ms=now_ms, durability=durability,
            messages=messages,
        )  # fmt: skip
    except (KafkaError, OSError) as exc:
        raise NotCommitted(_failed_write_error(exc), f"append failed: {exc}") from exc


async def wait_counted(
    log: Log,
    last_offset: int,
    *,
    durability: Any,
    replication: Replication,
    topic: str = "",
    partition: int = 0,
) -> None:
    """The second half of :func:`append_committed`: wait until ``log`` is synced through
    ``last_offset`` and the high watermark passed it (a node alone's: synced). Raises
    :class:`NotCommitted` (NOT_COORDINATOR once leadership moved or the sync failed,
    else COORDINATOR_NOT_AVAILABLE, which Kafka's coordinators answer for an internal
    write not replicated in time too)."""
    written = Appended(log, topic, partition, last_offset, last_offset)
    acked = await wait_acked(written, -1, durability=durability, replication=replication)
    if acked.sync_error is not None:
        raise NotCommitted(
            _failed_write_error(acked.sync_error), f"sync failed: {acked.sync_error}"
        ) from acked.sync_error
    if acked.state is AckState.LEADERSHIP_LOST:
        raise NotCommitted(ErrorCode.NOT_COORDINATOR, "leadership moved before the commit")
    if not acked.ok:
        raise NotCommitted(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, f"not committed: {acked.state.name.lower()}"
        )
