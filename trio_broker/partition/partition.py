"""One partition this broker leads, as the data path takes it (issue 29; Kafka's
``Partition``): its log, its producer and transaction state, and its leader term (ISR,
high watermark), found together by one lookup.

A :class:`Partition` is made in two places only, each one lookup
(``tests/unit/partition/test_one_append_path.py`` holds it):

- ``services/topics.py``'s ``Topic.leading``, for a partition of the topic catalogue:
  the per-partition guard (``handlers/topic_lookup.leading_partition``) and the
  marker writer (``services/txn_markers.py``) call it with this broker's term; the
  partition known here and led by this broker gives a :class:`Partition`, anything
  else the error to answer;
- :func:`coordinator_partition`, for the log a coordinator was elected with (a
  cluster's ``__consumer_offsets``/``__transaction_state``/``__share_group_state``
  partition, or a node alone's own log outside the catalogue, led by an ``OwnLog``):
  the term its leadership gives, no producer state.

Produce, the coordinators and the marker writer append to it
(``partition/append.py``'s ``append`` takes one) and Fetch reads it
(``partition/read.py``'s ``read``) without looking up the log, the term or the
producer state again: nothing outside ``partition/`` pairs a log with a term.

What a :class:`Partition` holds is owned elsewhere and only referred to here: the log by
the topic manager (``services/topics.py``), the term by the replication
(``services.leaders``: ``LocalReplication`` alone, the replica manager in a cluster),
the producer and transaction state by the producers' registry (``services/producers.py``,
the file I/O around ``state/producer.py`` and ``state/partition_txns.py``). The guard
keeps one per term and log on the topic (``Topic.led``) and makes another when either
changed; a handler holds one for a request only, and looks it up again for the next: a
term ends and a topic is deleted between requests.

Sans-I/O: no trio.
"""

from __future__ import annotations

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
]


class PartitionProducers(Producers, Protocol):
    """The producer and transaction state of a topic's partitions (``services.producers``)
    as a partition's append (``Producers``: the checks, the record of a write) and its
    read (the LSO, the aborted transactions) need them."""

    def last_stable_offset(
        self, topic: str, partition: int, log_: Log, high_watermark: int
    ) -> int: ...

    def aborted_between(
        self, topic: str, partition: int, log_: Log, from_offset: int, upper: int
    ) -> Sequence[AbortedTxn]: ...


@attrs.define(eq=False, slots=True)
class Partition:
    """A partition this broker leads, in one term of it (module docstring).

    Not frozen: a frozen attrs class sets its fields through ``object.__setattr__``,
    which a new term or log pays once more; nothing here assigns a field after."""

    #: The topic's name and the partition's index in it.
    topic: str
    index: int
    #: The partition's log (``topic.logs[index]``).
    log: Log
    #: This broker's leader term of the partition: leader epoch, ISR, high watermark.
    term: Term
    #: The producer and transaction state (the registry: it keeps each partition's).
    producers: PartitionProducers


class _NoProducers:
    """The producer state of a coordinator's own log: none. Its records carry no
    producer id (``append`` consults the producer state only for a client's batch and
    a marker) and no consumer reads it by Fetch with an isolation level, so the LSO is
    the high watermark and no transaction was aborted in it. A client's batch or a
    marker sent its way anyway is refused, not written."""

    def check(self, topic: str, partition: int, log_: Log, batch: object) -> object:
        raise AppendRejected(ErrorCode.INVALID_RECORD, f"{topic}-{partition} takes no client batch")

    def check_marker(
        self, topic: str, partition: int, log_: Log, producer_id: int, producer_epoch: int,
        coordinator_epoch: int,
    ) -> tuple[ErrorCode, str]:  # fmt: skip
        return ErrorCode.INVALID_RECORD, f"{topic}-{partition} takes no transaction marker"

    def record_append(
        self, topic: str, partition: int, batch: object, base_offset: int, last_offset: int,
        log_: Log | None = None,
    ) -> None:  # fmt: skip
        """Nothing to record (never reached: the checks refuse first)."""

    def last_stable_offset(self, topic: str, partition: int, log_: Log, high_watermark: int) -> int:
        return high_watermark

    def aborted_between(
        self, topic: str, partition: int, log_: Log, from_offset: int, upper: int
    ) -> Sequence[AbortedTxn]:
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


def coordinator_partition(leadership: Replication, topic: str, index: int, log: Log) -> Partition:
    """The partition a coordinator writes: ``log`` (the one it was elected with) in this
    broker's term of ``topic``-``index`` (:func:`led_term`), with no producer state.
    One lookup per write: a term ends between two writes. Raises
    :class:`~trio_broker.partition.append.NotLeader` (the coordinator answers
    NOT_COORDINATOR)."""
    return Partition(topic, index, log, led_term(leadership, topic, index), NO_PRODUCERS)
