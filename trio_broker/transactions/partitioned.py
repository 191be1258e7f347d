"""The transaction coordinator of every broker: one table per led partition.

A transactional id belongs to partition ``partition_for(id, n)`` of
``__transaction_state``, and its coordinator is that partition's leader, as in Kafka.
In a cluster the topic is replicated (n = transaction.state.log.num.partitions); a node
alone is a cluster of one, with n = 1 and the one partition in its own file
(``<data_dir>/__transaction_state-0``), led from start to end by its ``OwnPartition``
(services/own_partition.py). This broker keeps one :class:`TransactionCoordinator` per
partition it leads, each writing only to its own partition's log (through
``append_committed``: synced and below the high watermark) and stamping its markers with
the partition's leader epoch as coordinator epoch.

The partition's leadership (the replica manager, or alone the ``OwnPartition``) tells
:class:`PartitionedTransactionCoordinator` (a ``LeadershipListener``) when leadership
comes and goes:

- ``elected``: the partition is *loading* (its ids answer COORDINATOR_LOAD_IN_PROGRESS)
  until the shell (server/transaction_timers.py) calls :meth:`load_pending`, which
  replays the log into a fresh table and then finishes the Prepare* transactions the
  previous leader left (``recover``);
- ``resigned``: the table is dropped; its ids answer NOT_COORDINATOR from then on, and a
  write in flight fails with NOT_COORDINATOR (``append_committed`` sees the term gone).

The handlers call it as one coordinator; each call routes to the id's table.
Sans-I/O: no trio; the loading and the timers are the shell's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from trio_broker.partition.append import Replication
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.internal_topics import TRANSACTION_STATE, partition_for
from trio_broker.storage.log_protocol import Log
from trio_broker.transactions.coordinator import InitResult, MarkerSender, TransactionCoordinator
from trio_broker.transactions.state import TopicPartition, TxnMetadata

__all__ = ["PartitionedTransactionCoordinator"]

log = logging.getLogger("trio_broker.transactions")


class Leaders(Replication, Protocol):
    """What the tables write through and the routing asks: in a cluster the replica
    manager once the broker joined, ``LeadsNothing`` before and after
    (``services/local_replication.py``); alone the ``OwnPartition`` of its one partition
    (``services/own_partition.py``)."""

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """The partition's replicas and leader, as FindCoordinator answers them."""
        ...

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """Elected to lead the partition, its listeners not told yet."""
        ...


class TableFactory(Protocol):
    """Makes the table of one led ``__transaction_state`` partition (not loaded yet)."""

    def __call__(
        self, partition: int, leader_epoch: int, log: Log, replication: Leaders,
        send_markers: MarkerSender | None, /,
    ) -> TransactionCoordinator: ...  # fmt: skip


class Verifier(Protocol):
    """KIP-890's question to the coordinator of ``transactional_id``, which leads
    ``__transaction_state``-``txn_partition``: each partition's error (NONE: in the
    producer's ongoing transaction)."""

    async def __call__(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: list[TopicPartition], txn_partition: int, /,
    ) -> dict[TopicPartition, ErrorCode]: ...  # fmt: skip


#: The coordinator could not answer now: Produce answers NOT_ENOUGH_REPLICAS, which
#: every client retries (as Kafka's leader does for these).
UNVERIFIED_RETRIABLE = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT,
})  # fmt: skip


@attrs.frozen
class _Loading:
    leader_epoch: int
    log: Log


class PartitionedTransactionCoordinator:
    def __init__(self, num_partitions: int, make_table: TableFactory, leaders: Leaders) -> None:
        #: transaction.state.log.num.partitions in a cluster, fixed for its life (as in
        #: Kafka, changing it moves ids to other partitions and loses their state); 1 on
        #: a node alone.
        self.num_partitions = num_partitions
        #: A table over a led partition's log, not loaded yet.
        self.make_table = make_table
        #: Who leads the partitions (the tables write through it): alone its
        #: ``OwnPartition`` from start to end; in a cluster ``LeadsNothing`` until the
        #: broker joins, then the replica manager (cluster/broker_node.py), with which
        #: the marker channel's ``send`` is set.
        self.replication: Leaders = leaders
        self.send_markers: MarkerSender | None = None
        #: Set with them: asks another broker's coordinator (AddPartitionsToTxn v4,
        #: verify_only) whether partitions are in a transaction.
        self.ask_coordinator: Verifier | None = None
        #: Led partitions whose tables are loaded: partition -> table.
        self.tables: dict[int, TransactionCoordinator] = {}
        #: Led partitions waiting for :meth:`load_pending`.
        self.loading: dict[int, _Loading] = {}
        #: The shell's wake-up: something is waiting to load.
        self.on_elected: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ LeadershipListener

    def elected(self, partition: int, leader_epoch: int, log_: Log) -> None:
        table = self.tables.get(partition)
        if table is not None and table.log is log_:
            # A new epoch of a leadership this broker held all along (an ISR change,
            # a reassignment): the table is current; markers carry the new epoch.
            table.coordinator_epoch = leader_epoch
            return
        self.tables.pop(partition, None)
        self.loading[partition] = _Loading(leader_epoch, log_)
        self.on_elected()

    def resigned(self, partition: int) -> None:
        self.loading.pop(partition, None)
        if self.tables.pop(partition, None) is not None:
            log.info("no longer the transaction coordinator of __transaction_state-%d",
                     partition)  # fmt: skip

    def load_pending(self) -> list[TransactionCoordinator]:
        """Load the table of every partition elected since the last call; returns them.
        The shell then runs each one's ``recover``: it finishes the commits and aborts
        the partition's previous leader left (their ids answer CONCURRENT_TRANSACTIONS
        meanwhile)."""
        loaded = []
        while self.loading:
            partition, pending = next(iter(self.loading.items()))
            del self.loading[partition]
            table = self.make_table(partition, pending.leader_epoch, pending.log,
                                    self.replication, self.send_markers)  # fmt: skip
            records = table.load()
            self.tables[partition] = table
            loaded.append(table)
            log.info("transaction coordinator of __transaction_state-%d (epoch %d): %d ids "
                     "from %d records", partition, pending.leader_epoch, len(table.all()),
                     records)  # fmt: skip
        return loaded

    # ------------------------------------------------------------------ routing

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def table_for(self, transactional_id: str) -> TransactionCoordinator | ErrorCode:
        """The id's table, or why this broker cannot answer for it."""
        partition = self.partition_of(transactional_id)
        table = self.tables.get(partition)
        if table is not None:
            return table
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if self.replication.about_to_lead(TRANSACTION_STATE, partition):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS  # elected, not told yet
        return ErrorCode.NOT_COORDINATOR

    # ------------------------------------------------------------------ the handlers' calls

    def get(self, transactional_id: str) -> TxnMetadata | None:
        table = self.table_for(transactional_id)
        return None if isinstance(table, ErrorCode) else table.get(transactional_id)

    def all(self) -> list[TxnMetadata]:
        return [meta for table in list(self.tables.values()) for meta in table.all()]

    def is_pending(self, transactional_id: str) -> bool:
        table = self.table_for(transactional_id)
        return not isinstance(table, ErrorCode) and table.is_pending(transactional_id)

    def partition_in_transaction(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> int:
        """Produce's check after :meth:`verify_batches`. The producer's coordinator is
        here: its table answers (the partition is in its ongoing transaction, or
        INVALID_PRODUCER_EPOCH / INVALID_TXN_STATE). This broker coordinates every id (a
        node alone) and knows no such producer: it is in no transaction,
        INVALID_TXN_STATE. Else another broker coordinates it: a batch that begins the
        producer's transaction in the partition was verified with it already
        (produce.py asks first); later ones find it open in the partition's producer
        state, which also refuses fenced epochs."""
        for table in self.tables.values():
            if table.coordinates_producer(producer_id):
                return table.partition_in_transaction(producer_id, producer_epoch, topic, partition)
        if len(self.tables) == self.num_partitions:
            return int(ErrorCode.INVALID_TXN_STATE)
        return int(ErrorCode.NONE)

    async def verify_batches(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: list[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:  # fmt: skip
        """KIP-890's verification for a partition leader about to append the first
        transactional batch of a producer's transaction: the id's coordinator (this
        broker's table, or another broker's) says whether each partition was added to
        the ongoing transaction. Per partition: NONE; INVALID_PRODUCER_EPOCH for a fenced
        producer; INVALID_TXN_STATE when not added; NOT_ENOUGH_REPLICAS (retriable) when
        the coordinator cannot answer now."""
        txn_partition = self.partition_of(transactional_id)
        table = self.tables.get(txn_partition)
        if table is not None:
            answers = {
                tp: table.verify_partition(transactional_id, producer_id, producer_epoch, tp)
                for tp in partitions
            }
        elif self.ask_coordinator is None:
            answers = dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        else:
            answers = await self.ask_coordinator(
                transactional_id, producer_id, producer_epoch, partitions, txn_partition
            )
        return {tp: _for_produce(answers.get(tp, ErrorCode.NETWORK_EXCEPTION))
                for tp in partitions}  # fmt: skip

    def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> ErrorCode:
        table = self.table_for(transactional_id)
        if isinstance(table, ErrorCode):
            return table
        return table.verify_partition(transactional_id, producer_id, producer_epoch, tp)

    async def init_producer_id(
        self, transactional_id: str, producer_id: int, producer_epoch: int, timeout_ms: int,
        fenced_error: ErrorCode,
    ) -> InitResult:  # fmt: skip
        table = self.table_for(transactional_id)
        if isinstance(table, ErrorCode):
            return InitResult(table)
        return await table.init_producer_id(
            transactional_id, producer_id, producer_epoch, timeout_ms, fenced_error
        )

    async def add_to_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Iterable[TopicPartition], groups: Iterable[str], fenced_error: ErrorCode,
    ) -> ErrorCode:  # fmt: skip
        table = self.table_for(transactional_id)
        if isinstance(table, ErrorCode):
            return table
        return await table.add_to_transaction(
            transactional_id, producer_id, producer_epoch, partitions, groups, fenced_error
        )

    async def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
        fenced_error: ErrorCode,
    ) -> ErrorCode:  # fmt: skip
        table = self.table_for(transactional_id)
        if isinstance(table, ErrorCode):
            return table
        return await table.end_transaction(
            transactional_id, producer_id, producer_epoch, committed, fenced_error
        )

    # ------------------------------------------------------------------ timers (the shell calls)

    async def recover(self) -> int:
        return sum([await table.recover() for table in list(self.tables.values())])

    async def abort_timed_out(self) -> int:
        return sum([await table.abort_timed_out() for table in list(self.tables.values())])

    async def expire_ids(self) -> int:
        return sum([await table.expire_ids() for table in list(self.tables.values())])

    def close(self) -> None:
        """The logs are the topic manager's (alone, the ``OwnPartition``'s): nothing to
        close here."""
        self.tables.clear()
        self.loading.clear()


def _for_produce(error: ErrorCode) -> ErrorCode:
    if error in UNVERIFIED_RETRIABLE:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if error == ErrorCode.PRODUCER_FENCED:  # what producers expect on Produce
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error
