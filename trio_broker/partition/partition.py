"""One partition this broker leads, as the data path takes it (issue 29; Kafka's
``Partition``): its log, its producer and transaction state, and its leader term (ISR,
high watermark), found together by one lookup.

The lookup is the per-partition guard, ``handlers/topic_lookup.leading_partition``:
the partition known here and led by this broker gives a :class:`Partition`, anything
else the error to answer. Produce appends to it and Fetch reads it
(``partition/read.py``'s ``read`` takes one) without looking up the log, the term or
the producer state again.

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

from trio_broker.partition.append import Producers

if TYPE_CHECKING:
    from trio_broker.partition.append import Term
    from trio_broker.state.partition_txns import AbortedTxn
    from trio_broker.storage.log_protocol import Log

__all__ = ["Partition", "PartitionProducers"]


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

    @property
    def leader_epoch_to_stamp(self) -> int | None:
        """The epoch a leader's write is stamped with: its term's in a cluster, None
        for a node alone's (its batches keep the producer's partitionLeaderEpoch)."""
        term = self.term
        return term.leader_epoch if term.replicated else None
