"""The one way a leader writes to a partition's log, and what its acks wait for.

Kafka sends every write through ``ReplicaManager.appendRecords(requiredAcks, origin)``
into ``Partition.appendRecordsToLeader``; here :func:`append` is that entry, in two
halves as a pipelined produce needs them (append now, in request order; wait later):

- :func:`append` (synchronous), on a :class:`~trio_broker.partition.partition.Partition`
  (log, term and producer state found by one lookup): the producer state's checks (a
  client's sequence and epoch; a marker's epochs), the log's append with this
  broker's leader epoch, the
  producer state's record of it, the log marked dirty for the group commit, and the
  long polls on the partition woken. Returns an :class:`Appended`.
- :func:`wait_acked` (awaited by the caller's deferred work): acks=0/1 need nothing;
  acks=-1 needs the fsync covering the write (the flusher's ``wait_durable``) and the
  high watermark past it (``wait_committed``; a node alone's is its durable end).

The other way into a log, a follower's copy of its leader's batches, is the follower's
``Partition.append_as_follower`` (``partition/partition.py``; the replica fetcher calls it).
``tests/unit/partition/test_one_append_path.py`` keeps every other ``log.append(`` out.

Errors are left to the caller to name, since they differ by API (a produce answers
NOT_LEADER_OR_FOLLOWER where a coordinator answers NOT_COORDINATOR): :class:`NotLeader`
and :class:`AppendRejected` mean nothing was appended; the log's own errors
(``StorageError``, ``OSError``) pass through.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import RecordBatchView, read_control_marker
from trio_broker.replication.leader import AckState
from trio_broker.replication.replica_rules import LeaderTerm
from trio_broker.state.producer import Duplicate, Reject
from trio_broker.storage.log_protocol import Log

__all__ = [
    "Acked",
    "AppendRejected",
    "Appended",
    "LedPartition",
    "NotLeader",
    "Origin",
    "Replication",
    "Term",
    "append",
    "wait_acked",
]


class Origin(enum.Enum):
    """Who writes (Kafka's ``AppendOrigin``; a follower's ``Replication`` has its own
    path, ``Partition.append_as_follower``)."""

    #: A producer's batch: its sequence and epoch are checked, a retry is not written twice.
    CLIENT = "client"
    #: A coordinator's internal records (offsets, transaction state) or a transaction
    #: marker (a control batch: its producer and coordinator epochs are checked).
    COORDINATOR = "coordinator"


# A module global: an enum member looked up on its class costs a descriptor call per
# produced batch (partition/read.py measured it).
_CLIENT = Origin.CLIENT


class Durability(Protocol):
    def mark_dirty(self, log: Log, messages: int = 1) -> None: ...
    async def wait_durable(self, log: Log, offset: int) -> None: ...


class Appends(Protocol):
    def notify(self, topic: str, partition: int) -> None: ...


class Producers(Protocol):
    """One partition's producer and transaction state, as its append takes it (the
    partition's own entry: ``services/producers.py``'s ``PartitionProducerState``)."""

    def check(self, log_: Log, batch: Any) -> Any: ...

    def check_marker(
        self, log_: Log, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> tuple[ErrorCode, str]: ...

    def record_append(self, batch: Any, base_offset: int, last_offset: int, log_: Log) -> None: ...


class Term(LeaderTerm, Protocol):
    """A leader term of one partition as the data path reads it: a cluster's
    (``replication/leader.py``'s ``LeaderPartition``) or a node alone's, a cluster of one
    (``services/local_replication.py``'s ``LocalTerm``). Both take a replica's fetch by
    the same rules (``replication/replica_rules.py``'s ``LeaderTerm``): the data path
    never asks which one it holds."""

    @property
    def broker_id(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def replicas(self) -> tuple[int, ...]: ...
    @property
    def isr(self) -> frozenset[int]: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def effective_min_insync_replicas(self) -> int: ...
    @property
    def replicated(self) -> bool:
        """True in a cluster. False for a node alone, which keeps what it has always
        done: a batch keeps the producer's partitionLeaderEpoch (no epoch cache entry),
        acks=-1 waits for nothing past the fsync, Fetch checks no current leader epoch."""
        ...

    def visible_high_watermark(self) -> int | None: ...


class LedPartition(Protocol):
    """What :func:`append` takes of a partition: ``partition/partition.py``'s
    ``Partition``, written here as a protocol so that this module imports nothing of
    it (no cycle, not even for the type checker)."""

    @property
    def topic(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def log(self) -> Log: ...
    @property
    def term(self) -> Term: ...
    @property
    def producers(self) -> Producers: ...


class Replication(Protocol):
    def leader_term(self, topic: str, partition: int) -> Term | None: ...
    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState: ...


class NotLeader(Exception):
    """In a cluster, this broker does not lead the partition now; nothing was appended."""


class AppendRejected(KafkaError):
    """The producer state refuses the batch: ``AppendRejected(error_code, message)``;
    nothing was appended."""


@attrs.frozen
class Appended:
    """A write in the log (or, ``duplicate``, a producer's retry of one already there)."""

    log: Log
    topic: str
    partition: int
    base_offset: int
    #: The offset the acks wait for: synced past it, and the high watermark past it.
    last_offset: int
    log_append_time: int = -1
    #: Written as a cluster's leader (stamped with its epoch), so that a produce timing
    #: out may say the high watermark did not pass it. False on a broker alone.
    replicated: bool = False
    #: A retried batch: not written again, its offsets are the original's.
    duplicate: bool = False


def append(
    partition: LedPartition,
    batch: bytearray | memoryview,
    *,
    origin: Origin,
    now_ms: int,
    durability: Durability | None,
    appends: Appends | None = None,
    log_append_time: bool = False,
    messages: int = 1,
) -> Appended:
    """Write one record batch to ``partition``, led here (module docstring).

    ``partition``: the log, this broker's term (a cluster's stamps its leader epoch on
    the batch) and the producer state, found together by one lookup
    (``partition/partition.py``). The producer state is consulted for a client's batch
    (``Origin.CLIENT``: its sequence and epoch) and a marker (a control batch: its
    epochs), not for a coordinator's own records, which carry no producer id.
    ``appends``: the long polls to wake (None: nobody reads this log by Fetch).
    ``messages``: records the write holds, for ``flush.messages``.
    ``durability``: the group commit that will sync the log; None for a log no flusher
    keeps (a store used on its own, by a tool or a test, syncs when it closes).
    """
    log = partition.log
    topic = partition.topic
    index = partition.index
    term = partition.term
    # A cluster's leader stamps its epoch on the batch (and in its epoch cache); a node
    # alone's write keeps the producer's partitionLeaderEpoch (``Term.replicated``).
    leader_epoch = term.leader_epoch if term.replicated else None
    producers: Producers | None = None
    view = RecordBatchView(batch)
    if origin is _CLIENT:
        producers = partition.producers
        verdict = producers.check(log, view)
        if isinstance(verdict, Reject):
            raise AppendRejected(verdict.error_code, verdict.message)
        if isinstance(verdict, Duplicate):
            original = verdict.original_base_offset
            return Appended(
                log, topic, index, original, original,
                replicated=leader_epoch is not None, duplicate=True,
            )  # fmt: skip
    elif view.is_control:
        producers = partition.producers
        marker = read_control_marker(view)
        code, message = producers.check_marker(
            log, view.producer_id, view.producer_epoch, marker.coordinator_epoch
        )
        if code != ErrorCode.NONE:
            raise AppendRejected(code, message)
    if leader_epoch is None:
        result = log.append(batch, now_ms=now_ms, log_append_time=log_append_time)
    else:  # the leader stamps its epoch on the batch (and in its epoch cache)
        result = log.append(
            batch, now_ms=now_ms, log_append_time=log_append_time, leader_epoch=leader_epoch
        )
    if producers is not None:
        # The log wrote the offsets into the buffer: the view is the batch as stored.
        producers.record_append(
            view, result.base_offset, result.last_offset, log
        )  # the log: a batch that began a segment snapshots the state there
    if durability is not None:
        durability.mark_dirty(log, messages)
    if appends is not None:
        appends.notify(topic, index)
    return Appended(
        log, topic, index, result.base_offset, result.last_offset,
        log_append_time=result.log_append_time, replicated=leader_epoch is not None,
    )  # fmt: skip


@attrs.frozen
class Acked:
    """How an acked write ended: ``state`` DONE, or why not. ``sync_error``: the fsync
    failed (a ``StorageError``, or the ``OSError`` of a bare log), the write may be lost;
    ``state`` NOT_ENOUGH_REPLICAS_AFTER_APPEND or LEADERSHIP_LOST: the high watermark
    did not pass it."""

    state: AckState
    sync_error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.state is AckState.DONE


DONE = Acked(AckState.DONE)


def acked_at_once(appended: Appended, acks: int, *, fsync: bool = True) -> bool:
    """Whether :func:`wait_acked` would answer DONE without waiting: acks 0 and 1, or a
    write that is not ``replicated`` (a node alone's term waits for nothing past the
    fsync, ``Term.replicated``) and is synced already or needs no sync (``fsync``).
    Lets a handler answer such a write at once instead of deferring the answer."""
    if acks != -1:
        return True
    if appended.replicated:
        return False
    return not fsync or appended.log.durable_end_offset > appended.last_offset


async def wait_acked(
    appended: Appended,
    acks: int,
    *,
    durability: Durability,
    replication: Replication,
    fsync: bool = True,
) -> Acked:
    """Wait until ``appended`` may be acknowledged with ``acks`` (0 and 1: at once).

    ``fsync``: acks=-1 waits for the covering fsync first (``acks.all.fsync``; the
    coordinators always sync). The write then waits for the partition's high watermark
    (``replication.wait_committed``): a cluster's leader waits for its ISR, a node
    alone's term (its ISR itself, its HW the durable end) answers at once, and a
    clustered broker that left leads nothing (LEADERSHIP_LOST).
    """
    if acks != -1:
        return DONE
    if fsync:
        try:
            await durability.wait_durable(appended.log, appended.last_offset)
        except (KafkaError, OSError) as exc:
            return Acked(AckState.WAITING, sync_error=exc)
    state = await replication.wait_committed(
        appended.topic, appended.partition, appended.last_offset
    )
    return DONE if state is AckState.DONE else Acked(state)
