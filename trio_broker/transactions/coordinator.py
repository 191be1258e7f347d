"""The transaction coordinator's table: the transactional ids of one led partition of
``__transaction_state`` and its durable log.

Every broker's coordinator is ``transactions/partitioned.py``'s, one table per
``__transaction_state`` partition it leads: in a cluster those of the replicated topic,
on a node alone the one partition of a cluster of one, ``<data_dir>/__transaction_state-0``
(``open_transaction_log``; a ``MemoryLog`` with ``--storage memory``), which it leads
from start to end (``services/own_partition.py``). Every change of a transactional id's
metadata is one record in the partition's log, written and made durable (committed)
*before* the table changes and before the client is answered. When the partition is
elected the log is replayed (the last record per id wins; a null value deletes the id)
and :meth:`recover` finishes any commit or abort that a crash (or the previous leader)
left between its Prepare and Complete records.

EndTxn's path: PrepareCommit/PrepareAbort durable -> one marker per partition
(``write_marker``, the partition side's ``append_txn_marker``) and each marker
durable -> the groups of AddOffsetsToTxn commit or drop their staged offsets ->
CompleteCommit/CompleteAbort durable -> answer. On one node the markers are
local appends, so answering after them costs an fsync and no network.

Its writes count once below the partition's high watermark (``append_committed``;
alone, once synced), its markers carry the partition's leader epoch as coordinator
epoch (0 alone); in a cluster they go to the partitions' leaders through
``send_markers``.

Sans-I/O like the handlers: no trio here. The async methods await only the
durability service and the group coordinator; the shell (server/) runs the
timer that calls :meth:`abort_timed_out`, :meth:`expire_ids` and :meth:`recover`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import attrs

from trio_broker.partition.append import Replication
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import build_batch
from trio_broker.services.internal_topics import TRANSACTION_STATE, NotCommitted, append_committed
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.own_log import open_compacted_log
from trio_broker.storage.replay import replay_table
from trio_broker.transactions import state as st
from trio_broker.transactions.log_format import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from trio_broker.transactions.state import TopicPartition, TxnMetadata, TxnState

log = logging.getLogger("trio_broker.transactions")

#: A node alone's log under the data dir (Kafka's topic name, partition 0).
TRANSACTION_LOG_NAME = "__transaction_state-0"
#: A table's default coordinator epoch: a node alone's, whose one partition is led in
#: epoch 0 from start to end (``LOCAL_LEADER_EPOCH``).
COORDINATOR_EPOCH = 0
#: A marker append refused with these needs no retry: nothing is left to close there.
MARKER_NOT_NEEDED = frozenset(
    {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH}
)


class MarkerWriter(Protocol):
    """``trio_broker.services.txn_markers.append_txn_marker``'s signature."""

    def __call__(
        self, topics: Any, producers: Any, durability: Any, appends: Any, topic: str,
        partition: int, producer_id: int, producer_epoch: int, committed: bool,
        coordinator_epoch: int, now_ms: int,
    ) -> tuple[Log, int]: ...  # fmt: skip


@attrs.frozen
class InitResult:
    error: ErrorCode
    producer_id: int = st.NO_PRODUCER_ID
    producer_epoch: int = st.NO_PRODUCER_EPOCH


class CoordinatorUnavailable(Exception):
    """The transaction log could not be written: answer ``error_code``
    (COORDINATOR_NOT_AVAILABLE; NOT_COORDINATOR once this broker stopped leading the
    id's ``__transaction_state`` partition in a cluster)."""

    def __init__(
        self, message: str, error_code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
    ) -> None:
        super().__init__(message)
        self.error_code = error_code


class MarkerSender(Protocol):
    """In a cluster (``cluster/txn_marker_channel.py``): write the markers of ``prepared``
    to every partition's leader (the groups' ``__consumer_offsets`` partitions too) and
    return once each is committed there, or raise CoordinatorUnavailable."""

    async def __call__(
        self, prepared: TxnMetadata, committed: bool, coordinator_epoch: int, txn_partition: int
    ) -> None: ...


#: Kafka's transaction.state.log.segment.bytes default.
TRANSACTION_LOG_SEGMENT_BYTES = 100 * 1024 * 1024


def open_transaction_log(data_dir: Path | None, config: LogConfig) -> Log:
    """A node alone's ``__transaction_state-0``: ``<data_dir>/__transaction_state-0``, or
    a ``MemoryLog`` if ``data_dir`` is None. Compacted like the offsets log (an expired
    id's tombstone goes after delete.retention.ms)."""
    return open_compacted_log(data_dir, TRANSACTION_LOG_NAME, config, TRANSACTION_LOG_SEGMENT_BYTES)


class TransactionCoordinator:
    def __init__(
        self,
        txn_log: Log,
        *,
        topics: Any,
        producers: Any,
        durability: Any,
        appends: Any,
        groups: Any,
        allocate_producer_id: Callable[[], int],
        write_marker: MarkerWriter,
        now_ms: Callable[[], int],
        max_timeout_ms: int = 900_000,
        expiration_ms: int = 604_800_000,
        replication: Replication,
        txn_partition: int = 0,
        coordinator_epoch: int = COORDINATOR_EPOCH,
        send_markers: MarkerSender | None = None,
        owns_log: bool = True,
    ) -> None:
        self.log = txn_log
        self.topics = topics
        self.producers = producers
        self.durability = durability
        self.appends = appends
        #: The group coordinator (``complete_transaction``), or None (no AddOffsetsToTxn).
        self.groups = groups
        self.allocate_producer_id = allocate_producer_id
        self.write_marker = write_marker
        self.now_ms = now_ms
        self.max_timeout_ms = max_timeout_ms
        self.expiration_ms = expiration_ms
        #: What the table's writes count through, this table being that of
        #: ``__transaction_state`` partition ``txn_partition``, whose leader epoch is the
        #: coordinator epoch markers carry: in a cluster the replica manager, on a node
        #: alone its ``OwnPartition`` (synced is committed; epoch 0). The broker's tables
        #: do not own their logs (``owns_log`` False: the topic manager's, or the
        #: ``OwnPartition``'s); a table made alone in a test may.
        self.replication = replication
        self.txn_partition = txn_partition
        self.coordinator_epoch = coordinator_epoch
        self.send_markers = send_markers
        self.owns_log = owns_log
        self._table: dict[str, TxnMetadata] = {}
        #: producer id -> transactional id, for the partition side's question.
        self._by_producer: dict[int, str] = {}
        #: Ids with a log write or marker round in flight: others get CONCURRENT_TRANSACTIONS.
        self._pending: set[str] = set()
        #: (id, producer id, epoch) of an unfinished end -> each partition's appended
        #: marker (log, offset), None if not needed: a retry by recover() appends no
        #: marker twice and still waits for every one to be durable.
        self._markers_appended: dict[
            tuple[str, int, int], dict[TopicPartition, tuple[Log, int] | None]
        ] = {}

    def close(self) -> None:
        if self.owns_log:
            self.log.close()

    def coordinates_producer(self, producer_id: int) -> bool:
        """Whether the producer id is that of one of this table's transactional ids."""
        return producer_id in self._by_producer

    # ------------------------------------------------------------------ replay

    def load(self) -> int:
        """Replay the log into the table; returns how many records were read."""

        def decode(key: bytes, value: bytes | None) -> tuple[str, TxnMetadata | None]:
            transactional_id = decode_key(key)
            return transactional_id, (
                None if value is None else decode_value(transactional_id, value)
            )

        def apply(entry: tuple[str, TxnMetadata | None], _offset: int) -> None:
            self._set(*entry)

        return replay_table(self.log, decode, apply, log, "transaction")

    # ------------------------------------------------------------------ queries

    def get(self, transactional_id: str) -> TxnMetadata | None:
        return self._table.get(transactional_id)

    def all(self) -> list[TxnMetadata]:
        return list(self._table.values())

    def is_pending(self, transactional_id: str) -> bool:
        return transactional_id in self._pending

    def partition_in_transaction(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> int:
        """The ``Transactions`` protocol (handlers/base.py): may this batch be appended?"""
        transactional_id = self._by_producer.get(producer_id)
        meta = None if transactional_id is None else self._table.get(transactional_id)
        return int(st.partition_error(meta, producer_epoch, (topic, partition)))

    def verify_partition(
        self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition
    ) -> ErrorCode:
        return st.verify_partition(self._table.get(transactional_id), producer_id,
                                   producer_epoch, tp)  # fmt: skip

    # ------------------------------------------------------------------ the table and the log

    def _set(self, transactional_id: str, meta: TxnMetadata | None) -> None:
        old = self._table.pop(transactional_id, None)
        if old is not None and self._by_producer.get(old.producer_id) == transactional_id:
            del self._by_producer[old.producer_id]
        if meta is not None:
            self._table[transactional_id] = meta
            self._by_producer[meta.producer_id] = transactional_id

    async def _write(self, transactional_id: str, meta: TxnMetadata | None) -> None:
        """Append one record, wait until it is durable (in a cluster: committed, below
        the partition's high watermark), then make it current."""
        now = self.now_ms()
        value = None if meta is None else encode_value(meta)
        batch = build_batch([(encode_key(transactional_id), value)], base_timestamp=now)
        try:
            # Alone: synced; in a cluster also below the high watermark. The log rewrites
            # the batch's offsets in place: it stays a bytearray.
            await append_committed(
                self.log, batch, now_ms=now, durability=self.durability,
                replication=self.replication, topic=TRANSACTION_STATE,
                partition=self.txn_partition,
            )  # fmt: skip
        except NotCommitted as exc:
            # The record may or may not survive a crash: the table keeps the old state
            # and the client is told to retry.
            log.error("%s: transaction log write not committed: %s", transactional_id, exc)
            raise CoordinatorUnavailable(str(exc), exc.error_code) from exc
        self._set(transactional_id, meta)

    # ------------------------------------------------------------------ InitProducerId

    async def init_producer_id(
        self, transactional_id: str, producer_id: int, producer_epoch: int, timeout_ms: int,
        fenced_error: ErrorCode,
    ) -> InitResult:  # fmt: skip
        current = self._table.get(transactional_id)
        decision = st.decide_init(
            current, transactional_id=transactional_id,
            pending=transactional_id in self._pending, producer_id=producer_id,
            producer_epoch=producer_epoch, timeout_ms=timeout_ms,
            max_timeout_ms=self.max_timeout_ms, now_ms=self.now_ms(),
            fresh_id=self.allocate_producer_id, fenced_error=fenced_error,
        )  # fmt: skip
        if decision.target is None:
            if decision.error != ErrorCode.NONE or current is None:
                return InitResult(decision.error)
            return InitResult(ErrorCode.NONE, current.producer_id, current.producer_epoch)
        if decision.fence_and_abort:
            # Answer CONCURRENT_TRANSACTIONS once the previous producer's transaction
            # is aborted under the bumped epoch; the client retries and gets the next.
            try:
                await self._fence_and_abort(decision.target)
            except (CoordinatorUnavailable, OSError) as exc:
                log.warning("%s: abort of the fenced transaction unfinished: %s",
                            transactional_id, exc)  # fmt: skip
            return InitResult(decision.error)
        target = decision.target
        try:
            await self._guarded(transactional_id, self._write(transactional_id, target))
        except CoordinatorUnavailable as exc:
            return InitResult(exc.error_code)
        return InitResult(ErrorCode.NONE, target.producer_id, target.producer_epoch)

    async def _guarded(self, transactional_id: str, work: Any) -> None:
        """Run ``work`` with the id pending; the pending mark goes even on cancellation."""
        self._pending.add(transactional_id)
        try:
            await work
        finally:
            self._pending.discard(transactional_id)

    async def _fence_and_abort(self, fencing: TxnMetadata) -> None:
        """PrepareEpochFence (memory only, as in Kafka) then a full abort with its epoch."""
        transactional_id = fencing.transactional_id
        previous = self._table[transactional_id]
        self._pending.add(transactional_id)
        try:
            self._set(transactional_id, fencing)  # the old epoch is refused from now on
            prepared = st.prepare_abort_fenced(fencing, self.now_ms())
            try:
                await self._write(transactional_id, prepared)
            except CoordinatorUnavailable:
                self._set(transactional_id, previous)
                return
            await self._complete(prepared)
        finally:
            self._pending.discard(transactional_id)

    # ------------------------------------------------------------------ the open transaction

    async def add_to_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Iterable[TopicPartition], groups: Iterable[str], fenced_error: ErrorCode,
    ) -> ErrorCode:  # fmt: skip
        """AddPartitionsToTxn / AddOffsetsToTxn: NONE once the partitions are durably in."""
        decision = st.decide_add(
            self._table.get(transactional_id), pending=transactional_id in self._pending,
            producer_id=producer_id, producer_epoch=producer_epoch, partitions=partitions,
            groups=groups, now_ms=self.now_ms(), fenced_error=fenced_error,
        )  # fmt: skip
        if decision.target is not None:
            try:
                await self._guarded(
                    transactional_id, self._write(transactional_id, decision.target)
                )
            except CoordinatorUnavailable as exc:
                return exc.error_code
        return decision.error

    async def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
        fenced_error: ErrorCode,
    ) -> ErrorCode:  # fmt: skip
        decision = st.decide_end(
            self._table.get(transactional_id), pending=transactional_id in self._pending,
            producer_id=producer_id, producer_epoch=producer_epoch, committed=committed,
            now_ms=self.now_ms(), fenced_error=fenced_error,
        )  # fmt: skip
        prepared = decision.target
        if prepared is None:
            return decision.error
        self._pending.add(transactional_id)
        try:
            try:
                await self._write(transactional_id, prepared)
            except CoordinatorUnavailable as exc:
                return exc.error_code
            try:
                await self._complete(prepared)
            except (CoordinatorUnavailable, OSError) as exc:
                # The outcome is decided and durable: recover() finishes it; the
                # client's retry gets CONCURRENT_TRANSACTIONS until then.
                log.warning("%s: end of transaction unfinished: %s", transactional_id, exc)
                if isinstance(exc, CoordinatorUnavailable):
                    return exc.error_code
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
        finally:
            self._pending.discard(transactional_id)
        return ErrorCode.NONE

    async def _complete(self, prepared: TxnMetadata) -> None:
        """Markers to every partition, the groups, then CompleteCommit/CompleteAbort.

        Raises CoordinatorUnavailable when a step cannot be done now (a storage
        error); the id stays in its Prepare state and :meth:`recover` retries,
        without appending again the markers already appended.
        """
        committed = prepared.state == TxnState.PREPARE_COMMIT
        outcome = "commit" if committed else "abort"
        if self.send_markers is not None:  # a cluster: the partitions' leaders write them
            try:
                await self.send_markers(
                    prepared, committed, self.coordinator_epoch, self.txn_partition
                )
            except (KafkaError, OSError) as exc:
                raise CoordinatorUnavailable(f"{outcome} not finished: {exc}") from exc
            await self._write(prepared.transactional_id, st.complete(prepared, self.now_ms()))
            return
        key = (prepared.transactional_id, prepared.producer_id, prepared.producer_epoch)
        appended = self._markers_appended.setdefault(key, {})
        try:
            for topic, partition in sorted(prepared.partitions - appended.keys()):
                try:
                    appended[topic, partition] = self.write_marker(
                        self.topics, self.producers, self.durability, self.appends, topic,
                        partition, prepared.producer_id, prepared.producer_epoch, committed,
                        self.coordinator_epoch, self.now_ms(),
                    )  # fmt: skip
                except KafkaError as exc:
                    if exc.error_code not in MARKER_NOT_NEEDED:
                        raise
                    # The partition is gone (a deleted topic) or holds a newer epoch of
                    # the producer: there is no transaction of ours left to close there.
                    log.warning("%s: no %s marker for %s-%d: %s", prepared.transactional_id,
                                outcome, topic, partition, exc)  # fmt: skip
                    appended[topic, partition] = None
            for written in appended.values():
                if written is not None:
                    await self.durability.wait_durable(*written)
            for group_id in sorted(prepared.groups):
                await self.groups.complete_transaction(
                    group_id, prepared.producer_id, prepared.producer_epoch, committed
                )
        except (KafkaError, OSError) as exc:
            raise CoordinatorUnavailable(f"{outcome} not finished: {exc}") from exc
        await self._write(prepared.transactional_id, st.complete(prepared, self.now_ms()))
        del self._markers_appended[key]

    # ------------------------------------------------------------------ timers (the shell calls)

    async def recover(self) -> int:
        """Finish transactions left in PrepareCommit/PrepareAbort (a restart, a failed step)."""
        finished = 0
        for meta in list(self._table.values()):
            tid = meta.transactional_id
            if tid in self._pending or meta.state not in (
                TxnState.PREPARE_COMMIT,
                TxnState.PREPARE_ABORT,
            ):
                continue
            try:
                await self._guarded(tid, self._complete(meta))
                finished += 1
            except (CoordinatorUnavailable, OSError) as exc:
                log.warning("%s: cannot complete the transaction yet: %s", tid, exc)
        return finished

    async def abort_timed_out(self) -> int:
        """Abort Ongoing transactions past their timeout; their producer's epoch is fenced."""
        aborted = 0
        # Oldest first (it holds the partitions' last stable offset back longest), then
        # by id: the order of the markers does not depend on which id was written last.
        for meta in sorted(self._table.values(), key=lambda m: (m.start_ms, m.transactional_id)):
            tid = meta.transactional_id
            if tid in self._pending or not st.timed_out(meta, self.now_ms()):
                continue
            log.info("%s: transaction timed out after %d ms; aborting", tid, meta.timeout_ms)
            try:
                await self._fence_and_abort(st.fence_for_timeout(meta, self.now_ms()))
                aborted += 1
            except (CoordinatorUnavailable, OSError) as exc:
                log.warning("%s: cannot abort the timed-out transaction yet: %s", tid, exc)
        return aborted

    async def expire_ids(self) -> int:
        """Forget ids idle longer than transactional.id.expiration.ms (a tombstone each)."""
        expired = 0
        for meta in list(self._table.values()):
            tid = meta.transactional_id
            if tid in self._pending or not st.expired(meta, self.now_ms(), self.expiration_ms):
                continue
            try:
                await self._guarded(tid, self._write(tid, None))
                expired += 1
            except CoordinatorUnavailable:
                break
        return expired
