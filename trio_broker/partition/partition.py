"""One partition this broker leads, as the data path takes it (issue 29; Kafka's
``Partition``): its log, its producer and transaction state, and its leader term (ISR,
high watermark), held together by one long-lived object.

A :class:`Partition` is constructed in one place, :func:`take_partition`
(``tests/unit/partition/test_one_append_path.py`` holds it), called by two:

- ``services/topics.py``'s ``Topic.make_leader``, for a partition of the topic
  catalogue, called where this broker takes the partition to lead and nowhere else (a
  node alone's ``LocalReplication.take`` when it opens the log; a cluster's
  ``ReplicaManager._become_leader``). The topic keeps one :class:`Partition` per
  partition for the life of its log (``Topic.partitions``), with the partition's own
  entry of the producer state (``services/producers.py``'s ``PartitionProducerState``);
  a new term on the same log replaces the one it holds (the same object), a new log
  (the topic made again, the partition moved to another log dir) gets a new one, and
  the term's end and the topic's deletion drop it. The per-partition guard
  (``handlers/topic_lookup.leading_partition``) and the marker writer
  (``services/txn_markers.py``) only look it up (``Topic.leading``);
- :func:`coordinator_partition`, for the log a coordinator was elected with (a
  cluster's ``__consumer_offsets``/``__transaction_state``/``__share_group_state``
  partition, or a node alone's own log outside the catalogue, led by an ``OwnLog``):
  the term its leadership gives, no producer state. One :class:`Partition` per log for
  the log's life (kept by the log, weakly: a closed log's goes with it), made by its
  first write; each write looks up the term again (a term ends between two writes)
  and puts a new one in place of the old. What is left of issue 29 here: the
  coordinators hold logs, and their writes look the partition up, where Kafka's
  coordinators hold the partition the replica manager made when it took it.

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
from typing import TYPE_CHECKING, Protocol

import attrs

from trio_broker.partition.append import AppendRejected, NotLeader, Producers
from trio_broker.protocol.error_codes import ErrorCode

if TYPE_CHECKING:
    from trio_broker.partition.append import Replication, Term
    from trio_broker.state.partition_txns import AbortedTxn
    from trio_broker.storage.log_protocol import Log

__all__ = [
    "NO_PRODUCERS",
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


@attrs.define(eq=False, slots=True)
class Partition:
    """A partition of this broker's, led here in :attr:`term` (module docstring).

    Not frozen: the term (and the producer state's entry with it) is replaced when the
    leadership changes (``Topic.make_leader``), the rest is fixed for the object's
    life."""

    #: The topic's name and the partition's index in it.
    topic: str
    index: int
    #: The partition's log (``topic.logs[index]`` when made).
    log: Log
    #: The producer and transaction state of this partition (its entry in the registry).
    producers: PartitionProducers
    #: This broker's leader term of the partition, as the replication took it: leader
    #: epoch, ISR, high watermark.
    term: Term


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
    topic: str, index: int, log: Log, producers: PartitionProducers, term: Term
) -> Partition:
    """The one place a :class:`Partition` is made: ``topic``-``index`` on ``log``, with
    its producer state, led here in ``term``. Called where this broker takes a
    partition to lead (module docstring), nowhere else."""
    return Partition(topic, index, log, producers, term)


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
