"""One partition this broker leads or follows, as the data path takes it (issue 29;
Kafka's ``Partition``, which every replica holds): its log, its producer and
transaction state, and its role: a leader term (ISR, high watermark) while it leads, a
follower's role (:class:`Follows`: the leader and leader epoch) while it follows, held
together by one long-lived object that goes from role to role.

A :class:`Partition` is constructed in one place, :func:`take_partition`
(``tests/unit/partition/test_one_append_path.py`` holds it), called by three:

- ``services/topics.py``'s ``Topic.make_leader``, for a partition of the topic
  catalogue, called where this broker takes the partition to lead and nowhere else (a
  node alone's ``LocalReplication.take`` when it opens the log; a cluster's
  ``ReplicaManager._become_leader``);
- ``Topic.make_follower``, called where a cluster's replica manager takes the
  partition to follow (``ReplicaManager._become_follower``, Kafka's makeFollower).
  The topic keeps one :class:`Partition` per partition for the life of its log
  (``Topic.partitions``), across roles, with the partition's own entry of the
  producer state (``services/producers.py``'s ``PartitionProducerState``): a new term
  on the same log, or a follower elected, puts the term in the object it holds (Kafka's
  makeLeader on an existing Partition); a term's end drops the term and keeps the
  object (``Topic.stop_leading``: its term :data:`NOT_LED`), which a follower's role
  takes next; a new log (the
  topic made again, the partition moved to another log dir) gets a new one in the role
  the old one had, and the cluster moving the partition away and the topic's deletion
  drop it. The per-partition guard (``handlers/topic_lookup.leading_partition``) and
  the marker writer (``services/txn_markers.py``) only look up a led one
  (``Topic.leading``: one without a term is not led), the replica fetcher the one it
  copies into (``Topic.replica``);
- :func:`coordinator_partition`, for the log a coordinator was elected with (a
  cluster's ``__consumer_offsets``/``__transaction_state``/``__share_group_state``
  partition, or a node alone's own log outside the catalogue, led by an ``OwnLog``):
  the term its leadership gives, no producer state. One :class:`Partition` per log for
  the log's life (kept by the log, weakly: a closed log's goes with it), made by its
  first write; each write looks up the term again (a term ends between two writes)
  and puts a new one in place of the old. What is left of issue 29 here: the
  coordinators hold logs, and their writes look the partition up, where Kafka's
  coordinators hold the partition the replica manager made when it took it.

A follower's log is written only through its :class:`Partition` too (Kafka's
``appendRecordsToFollowerOrFutureReplica``, ``truncateTo``,
``truncateFullyAndStartAt``): the replica fetcher calls :meth:`Partition.
append_as_follower`, :meth:`Partition.replica_appended`, :meth:`Partition.truncate_to`
and :meth:`Partition.truncate_fully_and_start_at`, which keep the partition's producer
state with the log (a snapshot at a roll, the state of cut records dropped); the log
keeps its leader epoch cache with its batches.

Produce, the coordinators and the marker writer append to it
(``partition/append.py``'s ``append`` takes one) and Fetch reads it
(``partition/read.py``'s ``read``) without looking up the log, the term or the
producer state again: nothing outside ``partition/`` pairs a log with a term.

The log is the topic manager's (``services/topics.py``), the term the replication's
(``services.leaders``: ``LocalReplication`` alone, the replica manager in a cluster),
the producer state's store the registry's (``services/producers.py``, the file I/O
around ``state/producer.py`` and ``state/partition_txns.py``): a :class:`Partition`
holds each, it does not load or end them. A handler holds one for a request's
synchronous step only, and looks it up again for the next (a term ends and a topic is
deleted between requests).

Sans-I/O: no trio.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import attrs

from trio_broker.partition.append import AppendRejected, NotLeader, Producers
from trio_broker.protocol.error_codes import ErrorCode

if TYPE_CHECKING:
    from trio_broker.partition.append import Replication, Term
    from trio_broker.state.partition_txns import AbortedTxn
    from trio_broker.storage.log_protocol import Log
    from trio_broker.storage.log_types import AppendResult

__all__ = [
    "NOT_LED",
    "NO_PRODUCERS",
    "Follows",
    "Partition",
    "PartitionProducers",
    "coordinator_partition",
    "led_term",
    "take_partition",
]


class PartitionProducers(Producers, Protocol):
    """One partition's producer and transaction state (its entry in
    ``services.producers``) as the partition's append (``Producers``: the checks, the
    record of a write) and its read (the LSO, the aborted transactions) need them."""

    def last_stable_offset(self, log_: Log, high_watermark: int) -> int: ...

    def aborted_between(self, log_: Log, from_offset: int, upper: int) -> Sequence[AbortedTxn]: ...

    # A follower's: the state follows the log it copies (``Partition.replica_appended``,
    # ``Partition.truncate_to``).

    def replica_appended(self, log_: Log, base_offsets: Sequence[int]) -> None: ...

    def replica_rolled(self, log_: Log, base_offsets: Sequence[int]) -> bool: ...

    def truncated(self, log_: Log) -> None: ...


class _NotLed:
    """The term of a :class:`Partition` this broker does not lead (a follower's, or one
    whose term ended): reading anything of it raises
    :class:`~trio_broker.partition.append.NotLeader`, as Kafka's ``leaderLogIfLocal``
    refuses a follower's ``appendRecordsToLeader``. A null term rather than None, so
    that the leader's path (``append``, ``read``) reads the partition's term in one
    attribute read, with no check: the guard hands on only a partition led in the term
    it checked (``Partition.term is term``, which this never is)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> object:
        raise NotLeader(
            "this broker does not lead the partition (it follows it, or its term ended)"
        )

    def __repr__(self) -> str:
        return "NOT_LED"


#: The term of every Partition this broker does not lead (:class:`_NotLed`).
NOT_LED: Term = cast("Term", _NotLed())


@attrs.frozen(slots=True)
class Follows:
    """A follower's role (Kafka's ``makeFollower``): the broker it copies the partition
    from and the leader epoch it follows in, as the cluster's state named them."""

    leader: int
    leader_epoch: int


@attrs.define(eq=False, slots=True)
class Partition:
    """A partition of this broker's, led here in :attr:`term` or followed (module
    docstring).

    Not frozen: the role changes over the object's life (``Topic.make_leader`` puts a
    leader term in place, ``Topic.make_follower`` a follower's role, ``Topic.
    stop_leading`` drops the term); its topic, index and log are fixed."""

    #: The topic's name and the partition's index in it.
    topic: str
    index: int
    #: The partition's log (``topic.logs[index]`` when made).
    log: Log
    #: The producer and transaction state of this partition (its entry in the registry).
    producers: PartitionProducers
    #: This broker's leader term of the partition, as the replication took it: leader
    #: epoch, ISR, high watermark; :data:`NOT_LED` while it does not lead it (a
    #: follower's, or one whose term ended), whose every read raises ``NotLeader``.
    term: Term
    #: The follower's role while it follows (:class:`Follows`), else None.
    follows: Follows | None = None

    @property
    def leader_term(self) -> Term | None:
        """The leader term, or None when this broker does not lead the partition."""
        term = self.term
        return None if term is NOT_LED else term

    # -- the follower's side (Kafka's ``Partition.appendRecordsToFollowerOrFutureReplica``
    # and ``truncateTo``/``truncateFullyAndStartAt``): the replica fetcher's only way
    # into the log. Each keeps the log's leader epoch cache (the log's own) and the
    # partition's producer state with it.

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, *, now_ms: int
    ) -> list[AppendResult]:
        """A follower's copy of its leader's batches (a fetch answer's records, every
        whole batch checked before any is stored, offsets and leader epochs as the
        leader wrote them: the epoch cache follows them). Not checked against the
        producer state: a follower keeps none between rolls (:meth:`replica_appended`)."""
        return self.log.append_replicated_batches(records, now_ms=now_ms)

    def rolled(self, appended: Sequence[AppendResult]) -> bool:
        """Whether :meth:`append_as_follower` began a segment with one of ``appended``:
        :meth:`replica_appended` then has a producer snapshot to stage. Cheap: the
        fetcher asks on the event loop and hands the snapshot to a worker thread only
        then."""
        return self.producers.replica_rolled(self.log, [result.base_offset for result in appended])

    def replica_appended(self, appended: Sequence[AppendResult]) -> None:
        """After :meth:`append_as_follower`: a batch that began a segment snapshots the
        producer state below it, as a leader's roll does. Blocking (it may read a
        segment's batch headers): the fetcher calls it off the event loop, when
        :meth:`rolled`."""
        self.producers.replica_appended(self.log, [result.base_offset for result in appended])

    def truncate_to(self, offset: int) -> int:
        """Cut the log to end at ``offset`` (agreeing with a new leader: the epoch cache
        is cut with it), and drop the producer state of what was cut (Kafka's
        ``truncateAndReload``: the snapshots past the new end go, the state is rebuilt
        from what is left). Returns the new log end. Blocking (files): off the loop."""
        end = self.log.truncate_to(offset)
        self.producers.truncated(self.log)
        return end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and start it at ``offset`` (the follower fell below its
        leader's log start); its producer state goes with what it held. Blocking."""
        self.log.truncate_fully_and_start_at(offset)
        self.producers.truncated(self.log)


class _NoProducers:
    """The producer state of a coordinator's own log: none. Its records carry no
    producer id (``append`` consults the producer state only for a client's batch and
    a marker) and no consumer reads it by Fetch with an isolation level, so the LSO is
    the high watermark and no transaction was aborted in it. A client's batch or a
    marker sent its way anyway is refused, not written."""

    def check(self, log_: Log, batch: object) -> object:
        raise AppendRejected(ErrorCode.INVALID_RECORD, "a coordinator's log takes no client batch")

    def check_marker(
        self, log_: Log, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> tuple[ErrorCode, str]:
        return ErrorCode.INVALID_RECORD, "a coordinator's log takes no transaction marker"

    def record_append(self, batch: object, base_offset: int, last_offset: int, log_: Log) -> None:
        """Nothing to record (never reached: the checks refuse first)."""

    def last_stable_offset(self, log_: Log, high_watermark: int) -> int:
        return high_watermark

    def aborted_between(self, log_: Log, from_offset: int, upper: int) -> Sequence[AbortedTxn]:
        return ()

    def replica_appended(self, log_: Log, base_offsets: Sequence[int]) -> None:
        """Nothing to snapshot: a coordinator's own log holds no producer's batch."""

    def replica_rolled(self, log_: Log, base_offsets: Sequence[int]) -> bool:
        return False

    def truncated(self, log_: Log) -> None:
        """Nothing to drop."""


#: The producer state of every coordinator's own partition (:class:`_NoProducers`).
NO_PRODUCERS: PartitionProducers = _NoProducers()


def led_term(leadership: Replication, topic: str, index: int) -> Term:
    """This broker's term of ``topic``-``index`` as ``leadership`` has it (a cluster's
    replica manager; a node alone's ``LocalReplication``, ``OwnLog`` or
    ``OwnPartition``, a cluster of one, which has a term for every partition it holds).

    Raises :class:`~trio_broker.partition.append.NotLeader` when this broker has no term
    there: it leads elsewhere or nowhere (a cluster's fact, as Kafka's
    ``NotLeaderOrFollowerException``, not a mode)."""
    term = leadership.leader_term(topic, index)
    if term is None:
        raise NotLeader(f"not the leader of {topic}-{index}")
    return term


def take_partition(
    topic: str, index: int, log: Log, producers: PartitionProducers, term: Term,
    follows: Follows | None = None,
) -> Partition:  # fmt: skip
    """The one place a :class:`Partition` is made: ``topic``-``index`` on ``log``, with
    its producer state, led here in ``term`` or followed (``term`` :data:`NOT_LED`,
    ``follows`` its role). Called where this broker takes a partition to lead or to follow (module
    docstring), nowhere else."""
    return Partition(topic, index, log, producers, term, follows)


#: The coordinators' partitions by their log (:func:`coordinator_partition`): weak keys,
#: so that a log closed and dropped (a resignation, a deleted topic) takes its
#: Partition with it, and two brokers in one process (the simulator) never share one.
_COORDINATOR_PARTITIONS: weakref.WeakKeyDictionary[Log, Partition] = weakref.WeakKeyDictionary()


def coordinator_partition(leadership: Replication, topic: str, index: int, log: Log) -> Partition:
    """The partition a coordinator writes: ``log`` (the one it was elected with) in this
    broker's term of ``topic``-``index`` (:func:`led_term`), with no producer state.

    A lookup: the one :class:`Partition` of ``log``, made by its first write; the term
    is looked up on each write (a term ends between two writes) and replaces the one
    the partition held if it is another. Raises
    :class:`~trio_broker.partition.append.NotLeader` (the coordinator answers
    NOT_COORDINATOR)."""
    term = led_term(leadership, topic, index)
    held = _COORDINATOR_PARTITIONS.get(log)
    if held is None or held.topic != topic or held.index != index:
        held = _COORDINATOR_PARTITIONS[log] = take_partition(topic, index, log, NO_PRODUCERS, term)
    elif held.term is not term:
        held.term = term
    return held
