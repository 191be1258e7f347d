"""Idempotent producers' state on disk: the registry of partitions and the producer ids.

The rules themselves are pure and live in :mod:`trio_broker.state.producer` (sequence
windows, verdicts, the per-partition :class:`~trio_broker.state.producer.ProducerStateManager`
and its snapshot codec, the InitProducerId decision). This module is the small amount of
file I/O around them: :class:`ProducerIdAllocator` (persisted id blocks) and
:class:`ProducerStateRegistry` (one manager per partition log, snapshots beside the log
at every segment roll and clean shutdown, rebuild from the latest one and the batch
headers after it). docs/idempotence.md tells the whole story.

A service rather than part of ``storage/``: the registry is built on the rules of
``state/``, which sits above ``storage/`` in the layers (pyproject.toml), and the
allocator raises the same :class:`~trio_broker.state.producer.SnapshotError` as the
snapshot codec. Sync and trio-free like the rest of ``services/``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import takewhile
from pathlib import Path
from typing import Any

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import ProtocolError
from trio_broker.protocol.records import RecordBatchView, iter_batches, read_control_marker
from trio_broker.state.partition_txns import AbortedTxn
from trio_broker.state.producer import (
    APPEND,
    Duplicate,
    ProducerStateManager,
    Reject,
    SnapshotError,
    Verdict,
)
from trio_broker.storage.durable import write_file_atomically
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.log_snapshots import snapshot_offsets, snapshot_path

__all__ = [
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "EXPIRATION_CHECK_INTERVAL_MS",
    "PRODUCER_ID_BLOCK_SIZE",
    "PRODUCER_ID_FILE",
    "SNAPSHOT_FILE",
    "PartitionProducerState",
    "ProducerIdAllocator",
    "ProducerStateRegistry",
    "ProducerStateStatistics",
    "latest_snapshot",
    "log_directory",
    "read_batch_headers",
]

log = logging.getLogger("trio_broker.producer")

#: Kafka's producer.id.expiration.ms: state of a producer silent this long is dropped.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
#: Kafka's producer.id.expiration.check.interval.ms.
EXPIRATION_CHECK_INTERVAL_MS = 600_000
#: Producer ids reserved per write of the id block file.
PRODUCER_ID_BLOCK_SIZE = 1000

#: Where versions before the per-roll snapshots kept the clean shutdown's snapshot: still
#: read (at the offset it names), removed by the next clean shutdown.
SNAPSHOT_FILE = "producer_state.json"
PRODUCER_ID_FILE = "producer_id_block.json"


class ProducerIdAllocator:
    """Producer ids that never repeat, across restarts too.

    With a file, ids are reserved a block at a time: the block's end is written
    (atomically, fsynced) *before* any id from it is handed out, so a crash at
    worst skips the rest of a block. Without a file (memory mode) it just counts.
    """

    def __init__(self, path: Path | None, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        self.path = path
        self.block_size = block_size
        self._next = 0
        #: Ids below this are reserved on disk; None until the file was read.
        self._block_end: int | None = None if path is not None else 2**63 - 1
        #: Cluster mode: blocks come from ZooKeeper (offer_block), the next one waits here.
        self._cluster = False
        self._spare: tuple[int, int] | None = None
        #: Cluster mode: called when ``needs_block`` turns true (the claiming task waits
        #: for it rather than polling).
        self.on_needs_block: Callable[[], None] = lambda: None

    def use_cluster_blocks(self) -> None:
        """Ids unique in the whole cluster: only from blocks that :meth:`offer_block` gives
        (claimed in ZooKeeper's ``/latest_producer_id_block``), none from the local file."""
        self._cluster, self.path = True, None
        self._next = self._block_end = 0

    @property
    def needs_block(self) -> bool:
        """Cluster mode: fewer than half a block left and none waiting."""
        if not self._cluster or self._spare is not None:
            return False
        assert self._block_end is not None
        return self._block_end - self._next < self.block_size // 2

    def offer_block(self, start: int, end: int) -> None:
        """A block of ids [start, end) this broker claimed in the cluster."""
        assert self._cluster and self._block_end is not None
        if self._next >= self._block_end:
            self._next, self._block_end = start, end
        else:
            self._spare = (start, end)

    def _reserved_end(self) -> int:
        # Read lazily, so that a bad file fails InitProducerId (which can say so)
        # rather than the produce path, which builds the registry too.
        if self._block_end is None:
            assert self.path is not None
            start = 0
            if self.path.exists():
                try:
                    start = int(json.loads(self.path.read_bytes())["next_block_start"])
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    # Guessing would risk reissuing ids: the operator has to look.
                    raise SnapshotError(
                        f"{self.path}: unreadable producer id block: {exc}"
                    ) from None
                if start < 0:
                    raise SnapshotError(f"{self.path}: negative producer id block {start}")
            self._next = self._block_end = start
        return self._block_end

    @property
    def issued_below(self) -> int:
        """Every id this broker ever handed out is below this (may include unused ids)."""
        if self._cluster:
            assert self._block_end is not None
            return max(self._block_end, self._spare[1] if self._spare else 0)
        end = self._reserved_end()
        return end if self.path is not None else self._next

    def allocate(self) -> int:
        """The next id; raises OSError or SnapshotError if its block cannot be reserved."""
        # Read the reserved end first: its first read also moves _next up to it.
        end = self._reserved_end()
        if self._cluster and self._next >= end:
            if self._spare is None:
                raise SnapshotError("no producer id block claimed in ZooKeeper yet")
            (self._next, end), self._spare = self._spare, None
            self._block_end = end
        if self._next >= end:
            assert self.path is not None
            end = self._next + self.block_size
            write_file_atomically(self.path, json.dumps({"next_block_start": end}).encode())
            self._block_end = end
        pid = self._next
        self._next += 1
        if self._cluster and self.needs_block:
            self.on_needs_block()
        return pid


@attrs.define
class ProducerStateStatistics:
    """Counters since start, for operators and tests."""

    appended: int = 0
    duplicates: int = 0
    rejected: dict[ErrorCode, int] = attrs.field(factory=dict)
    partitions_loaded: int = 0


@attrs.define(eq=False)
class _PartitionSlot:
    #: The log the state belongs to; compared by identity to notice a recreated topic.
    log: Log
    manager: ProducerStateManager
    #: The log's directory (snapshots beside its segments); None for a memory log.
    directory: Path | None
    #: The log start offset the state was last truncated to.
    log_start_offset: int


class PartitionProducerState:
    """One partition's entry in the registry (``partition/partition.py``'s
    ``PartitionProducers``): its producer and transaction state as the partition's
    append and read take it, the partition named once, here, not by every call. The
    registry stays the store (it loads, snapshots, forgets and reloads a partition's
    state as its log changes); the :class:`~trio_broker.partition.partition.Partition`
    keeps this entry for its life (``ProducerStateRegistry.entry``)."""

    __slots__ = ("index", "registry", "topic")

    def __init__(self, registry: ProducerStateRegistry, topic: str, index: int) -> None:
        self.registry = registry
        self.topic = topic
        self.index = index

    def check(self, log_: Log, batch: Any) -> Verdict:
        return self.registry.check(self.topic, self.index, log_, batch)

    def check_marker(
        self, log_: Log, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> tuple[ErrorCode, str]:
        return self.registry.check_marker(
            self.topic, self.index, log_, producer_id, producer_epoch, coordinator_epoch
        )

    def record_append(self, batch: Any, base_offset: int, last_offset: int, log_: Log) -> None:
        self.registry.record_append(self.topic, self.index, batch, base_offset, last_offset, log_)

    # The read's two: the registry's manager asked directly, not through the registry's
    # method of the same name (a Fetch asks the LSO of every partition it reads: one
    # Python call fewer each, what the entry would otherwise add).

    def last_stable_offset(self, log_: Log, high_watermark: int) -> int:
        manager = self.registry.manager(self.topic, self.index, log_)
        return manager.txns.last_stable_offset(high_watermark, log_.log_start_offset)

    def aborted_between(self, log_: Log, from_offset: int, upper: int) -> list[AbortedTxn]:
        manager = self.registry.manager(self.topic, self.index, log_)
        return manager.txns.aborted_between(from_offset, upper)

    # A follower's (``Partition.replica_appended``, ``Partition.truncate_to``).

    def replica_appended(self, log_: Log, base_offsets: Sequence[int]) -> None:
        self.registry.replica_appended(self.topic, self.index, log_, base_offsets)

    def replica_rolled(self, log_: Log, base_offsets: Sequence[int]) -> bool:
        return self.registry.replica_rolled(log_, base_offsets)

    def truncated(self, log_: Log) -> None:
        self.registry.discard_snapshot(self.topic, self.index, log_)


class ProducerStateRegistry:
    """One :class:`ProducerStateManager` per partition log, plus the producer id allocator.

    Managers are created when a partition's state is first needed: from the latest
    usable snapshot beside the log, then by replaying the batch headers the log holds
    beyond it, in a worker thread (:meth:`prepare`, which the handlers await first). Each segment roll stages a
    snapshot at the new segment's base offset, which the log's next flush writes once
    everything below it is durable (storage/log_snapshots.py); :meth:`close` writes one
    at each log's end (clean shutdown). So a kill -9 loses no producer whose batches
    retention deleted, as in Kafka (UnifiedLog.roll takes a snapshot; recovery loads
    the latest one and replays the log after it).
    """

    def __init__(
        self,
        data_dir: Path | None,
        now_ms: Callable[[], int],
        *,
        expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        read_headers: Callable[[Log, int], Iterator[RecordBatchView]] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.now_ms = now_ms
        self.expiration_ms = expiration_ms
        self.allocator = ProducerIdAllocator(
            None if data_dir is None else data_dir / PRODUCER_ID_FILE
        )
        self._read_headers = read_headers or read_batch_headers
        self._partitions: dict[tuple[str, int], _PartitionSlot] = {}
        #: States :meth:`prepare` loaded in a worker thread, with the partition's
        #: generation then: the event loop installs one when it first needs the state.
        self._prepared: dict[tuple[str, int], tuple[int, _PartitionSlot]] = {}
        #: Bumped by :meth:`forget`: a state prepared before it is stale.
        self._generations: dict[tuple[str, int], int] = {}
        #: One load of a partition at a time: a second request for it waits for the
        #: first's state rather than reading the log again (others load meanwhile).
        self._load_locks: dict[tuple[str, int], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._next_expiry_check = now_ms() + EXPIRATION_CHECK_INTERVAL_MS
        self._stats = ProducerStateStatistics()

    def entry(self, topic: str, partition: int) -> PartitionProducerState:
        """``topic``-``partition``'s entry, for its :class:`~trio_broker.partition.
        partition.Partition` to keep (made once per partition, by the topic)."""
        return PartitionProducerState(self, topic, partition)

    # ------------------------------------------------------------------ produce path

    def check(self, topic: str, partition: int, log_: Log, batch: Any) -> Verdict:
        if batch.producer_id < 0:
            return APPEND
        manager = self.manager(topic, partition, log_)
        self._maybe_expire()
        verdict = manager.check(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence
        )
        if isinstance(verdict, Duplicate):
            self._stats.duplicates += 1
        elif isinstance(verdict, Reject):
            rejected = self._stats.rejected
            rejected[verdict.error_code] = rejected.get(verdict.error_code, 0) + 1
        return verdict

    def check_marker(
        self,
        topic: str,
        partition: int,
        log_: Log,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> tuple[ErrorCode, str]:
        """May a transaction marker with these epochs go into the partition?"""
        return self.manager(topic, partition, log_).check_marker(
            producer_id, producer_epoch, coordinator_epoch
        )

    def in_open_transaction(
        self, topic: str, partition: int, log_: Log, producer_id: int, epoch: int
    ) -> bool:
        """Has the producer, in this epoch, a transaction open in the partition already
        (a transactional batch appended since its last marker)?"""
        manager = self.manager(topic, partition, log_)
        entry = manager.producers.get(producer_id)
        return producer_id in manager.txns.ongoing and entry is not None and entry.epoch == epoch

    def record_append(
        self,
        topic: str,
        partition: int,
        batch: Any,
        base_offset: int,
        last_offset: int,
        log_: Log | None = None,
    ) -> None:
        """THE hook every appended batch passes through, data and transaction markers.

        ``batch`` is the whole batch (a marker's commit/abort is in its record key).
        ``log_``: the log it went to, if a first batch of a new segment (any producer id)
        should snapshot the state there (the write path passes it).
        """
        if (
            isinstance(log_, PartitionLog)
            and base_offset > 0
            and log_.active_segment().base_offset == base_offset
        ):
            self._snapshot_at_roll(topic, partition, log_, base_offset)
        if batch.producer_id < 0:
            return
        slot = self._partitions.get((topic, partition))
        if slot is None:  # check() always runs first; a missing manager is a broker bug
            raise RuntimeError(f"no producer state for {topic}-{partition}")
        if batch.is_control:
            marker = read_control_marker(batch)  # append_txn_marker built it: it is one
            slot.manager.append_marker(
                batch.producer_id,
                batch.producer_epoch,
                marker.coordinator_epoch,
                marker.committed,
                base_offset,
                batch.max_timestamp,
            )
            return
        self._stats.appended += 1
        slot.manager.append(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
            base_offset,
            last_offset,
            batch.max_timestamp,
            is_transactional=batch.is_transactional,
        )

    def _snapshot_at_roll(self, topic: str, partition: int, log_: PartitionLog, base: int) -> None:
        """The batch at ``base`` began a segment: stage the state as it was before it.

        Like Kafka's UnifiedLog.roll (a snapshot named by the new segment's base
        offset). A batch of producer id -1 may be the first the registry sees of the
        partition since start: the state is built now (the replay includes that batch,
        which changes nothing), so that what the older segments held of producers is
        in a snapshot before retention can delete them.
        """
        manager = self.manager(topic, partition, log_)
        log_.stage_producer_snapshot(base, manager.to_snapshot(next_offset=base))

    def replica_appended(
        self, topic: str, partition: int, log_: Log, base_offsets: Sequence[int]
    ) -> None:
        """A follower appended batches at ``base_offsets`` (replica_fetcher.py). One that
        began the active segment snapshots the state as it was below it, as a leader's
        roll does (Kafka's follower rolls through the same UnifiedLog.roll): a follower
        killed after retention deleted older segments, then elected, still knows the
        producers those segments held. A follower keeps no state between rolls (it checks
        no batch): the state is rebuilt from the latest snapshot and the segment after it
        (one segment's headers per roll), and not kept (the leader it becomes rebuilds)."""
        if not self.replica_rolled(log_, base_offsets):
            return
        assert isinstance(log_, PartitionLog)  # replica_rolled: only a file log rolls here
        rolled_at = log_.active_segment().base_offset
        manager = self._load(log_, below=rolled_at).manager
        log_.stage_producer_snapshot(rolled_at, manager.to_snapshot(next_offset=rolled_at))

    def replica_rolled(self, log_: Log, base_offsets: Sequence[int]) -> bool:
        """Whether a follower's batches at ``base_offsets`` began the active segment of a
        file log: then :meth:`replica_appended` has a snapshot to stage. Cheap (no read),
        so that the fetcher hands :meth:`replica_appended` to a worker thread only at a
        roll, not after every fetch (a hop costs about 50 us of CPU)."""
        if not isinstance(log_, PartitionLog):
            return False
        rolled_at = log_.active_segment().base_offset
        return rolled_at > 0 and rolled_at in base_offsets

    # ------------------------------------------------------------------ fetch path

    def last_stable_offset(self, topic: str, partition: int, log_: Log, high_watermark: int) -> int:
        """The LSO: read_committed consumers see the partition below it."""
        manager = self.manager(topic, partition, log_)
        return manager.txns.last_stable_offset(high_watermark, log_.log_start_offset)

    def aborted_between(
        self, topic: str, partition: int, log_: Log, from_offset: int, upper: int
    ) -> list[AbortedTxn]:
        """Aborted transactions overlapping [from_offset, upper), for a read_committed fetch."""
        return self.manager(topic, partition, log_).txns.aborted_between(from_offset, upper)

    def active_producers(self, topic: str, partition: int, log_: Log) -> frozenset[int]:
        """The producer ids the partition's state holds once the expired ones are removed
        (as the periodic expiry would): the cleaner keeps the last batches of these
        only, as Kafka's keeps those of ``UnifiedLog.lastRecordsOfActiveProducers``."""
        manager = self.manager(topic, partition, log_)
        manager.remove_expired(self.now_ms(), self.expiration_ms)
        return frozenset({*manager.producers, *manager.txns.markers})

    def forget_aborted(
        self, topic: str, partition: int, log_: Log, gone: list[tuple[int, int]]
    ) -> None:
        """Drop aborted entries whose data the cleaner removed (PartitionTransactions.
        forget_aborted). The snapshots on disk still have them: they go, and the state
        as it is now is staged for the next flush, so that a restart after a crash does
        not bring them back (nor forgets the producers)."""
        manager = self.manager(topic, partition, log_)
        manager.txns.forget_aborted(gone)
        if isinstance(log_, PartitionLog):
            (log_.directory / SNAPSHOT_FILE).unlink(missing_ok=True)
            log_.delete_producer_snapshots()
            end = log_.log_end_offset
            log_.stage_producer_snapshot(end, manager.to_snapshot(next_offset=end))

    def forget(self, topic: str, partition: int) -> None:
        """Drop a partition's state: it is rebuilt from the log when next needed (a
        replica that becomes leader has appended batches it never checked)."""
        key = (topic, partition)
        self._partitions.pop(key, None)
        self._prepared.pop(key, None)
        self._generations[key] = self._generations.get(key, 0) + 1

    def discard_snapshot(self, topic: str, partition: int, log_: Log) -> None:
        """The log was truncated (a follower agreeing with a new leader): snapshots past
        its new end describe batches that are gone and go (Kafka's truncateAndReload);
        the state is rebuilt from the latest one left and the log after it."""
        self.forget(topic, partition)
        if isinstance(log_, PartitionLog):
            (log_.directory / SNAPSHOT_FILE).unlink(missing_ok=True)
            log_.delete_producer_snapshots(above=log_.log_end_offset)

    def loaded(self, topic: str, partition: int, log_: Log) -> bool:
        """Whether the partition's state is at hand (else :meth:`prepare` it off the loop)."""
        key = (topic, partition)
        slot = self._partitions.get(key)
        if slot is not None and slot.log is log_:
            return True
        ready = self._prepared.get(key)
        return ready is not None and ready[1].log is log_

    def prepare(self, topic: str, partition: int, log_: Log) -> None:
        """Load the partition's state (latest snapshot, the headers after it: up to a
        segment) in a worker thread, before the event loop needs it (as Kafka's
        LogLoader does at partition open); :meth:`manager` installs it and replays what
        was appended meanwhile. The thread only reads the log, as the cleaner's does."""
        key = (topic, partition)
        with self._locks_lock:
            lock = self._load_locks.setdefault(key, threading.Lock())
        with lock:
            if self.loaded(topic, partition, log_):
                return
            generation = self._generations.get(key, 0)
            self._prepared[key] = (generation, self._load(log_))

    def manager(self, topic: str, partition: int, log_: Log) -> ProducerStateManager:
        key = (topic, partition)
        slot = self._partitions.get(key)
        # A deleted and recreated topic has a new log object: its old state must go.
        if slot is None or slot.log is not log_:
            slot = self._partitions[key] = self._install(key, log_)
        # Retention or DeleteRecords may have moved the log start since the last batch;
        # comparing first keeps the common case to one attribute read.
        start = log_.log_start_offset
        if start != slot.log_start_offset:
            slot.manager.truncate_head(start)
            slot.log_start_offset = start
        return slot.manager

    # ------------------------------------------------------------------ lifecycle

    def _install(self, key: tuple[str, int], log_: Log) -> _PartitionSlot:
        """The state :meth:`prepare` loaded, brought up to the log end (the batches
        appended since: few); else (not prepared, or stale) loaded here, on the loop."""
        ready = self._prepared.pop(key, None)
        if ready is not None:
            generation, slot = ready
            current = slot.manager
            if (
                generation == self._generations.get(key, 0)
                and slot.log is log_
                and log_.log_start_offset <= current.next_offset <= log_.log_end_offset
            ):
                return self._load(log_, base=current)
        return self._load(log_)

    def _load(
        self, log_: Log, below: int | None = None, base: ProducerStateManager | None = None
    ) -> _PartitionSlot:
        """The state from the latest snapshot and the log after it, up to the log end
        (or to the batch at ``below``: a follower's segment roll). ``base``: a state
        loaded earlier from this log, replayed on from its next offset instead."""
        directory = log_directory(log_)
        start = log_.log_start_offset
        end = log_.log_end_offset if below is None else below
        manager = ProducerStateManager(next_offset=start)
        if base is not None:
            manager = base
        elif directory is not None:
            manager = self._latest_snapshot(directory, start, end) or manager
        manager.truncate_head(start)
        replay_from = manager.next_offset
        if replay_from < end:
            # The first header read may be a batch that straddles replay_from (the log
            # start can sit inside a batch); one wholly below it is already counted.
            manager.replay(
                h
                for h in takewhile(
                    lambda h: h.base_offset < end, self._read_headers(log_, replay_from)
                )
                if h.base_offset + h.last_offset_delta >= replay_from
            )
        manager.next_offset = max(manager.next_offset, end)
        manager.remove_expired(self.now_ms(), self.expiration_ms)
        if base is None:
            self._stats.partitions_loaded += 1
        return _PartitionSlot(log_, manager, directory, start)

    def _latest_snapshot(
        self, directory: Path, start: int, end: int
    ) -> ProducerStateManager | None:
        """The newest usable snapshot in ``directory``, deleting those it cannot use.

        A snapshot past the log's end describes batches the log lost (a truncation, or
        an older version's clean-shutdown snapshot after an unclean tail cut). One below
        the log start is stale too (Kafka's truncateAndReload deletes such snapshots):
        the markers that ended its open transactions may be among the deleted records,
        and producers are no longer forgotten at the log start, so such a transaction
        would hold the LSO forever. An unreadable one is logged and the next older one
        tried (Kafka's loadFromSnapshot).
        """
        now = self.now_ms()
        candidates: list[tuple[int, Path, ProducerStateManager | None]] = [
            (offset, snapshot_path(directory, offset), None)
            for offset in snapshot_offsets(directory)
        ]
        legacy = directory / SNAPSHOT_FILE
        if legacy.exists():
            try:
                parsed = ProducerStateManager.from_snapshot(legacy.read_bytes(), now_ms=now)
            except (OSError, SnapshotError) as exc:
                log.warning("%s: %s; not used", legacy, exc)
            else:
                candidates.append((parsed.next_offset, legacy, parsed))
        for offset, path, known in sorted(candidates, key=lambda c: c[0], reverse=True):
            if not start <= offset <= end:
                path.unlink(missing_ok=True)
                continue
            try:
                loaded = known or ProducerStateManager.from_snapshot(path.read_bytes(), now_ms=now)
            except (OSError, SnapshotError) as exc:
                log.warning("%s: %s; trying an older snapshot", path, exc)
                continue
            if start <= loaded.next_offset <= end:
                return loaded
        return None

    def statistics(self) -> ProducerStateStatistics:
        return attrs.evolve(self._stats, rejected=dict(self._stats.rejected))

    def _maybe_expire(self) -> None:
        now = self.now_ms()
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + EXPIRATION_CHECK_INTERVAL_MS
        for slot in self._partitions.values():
            slot.manager.remove_expired(now, self.expiration_ms)

    def close(self) -> None:
        """Snapshot every partition's state at its log's end (clean shutdown, after the
        logs closed); errors are logged, not raised."""
        for (topic, partition), slot in self._partitions.items():
            # No directory: memory mode, or the topic was deleted meanwhile.
            if slot.directory is None or not slot.directory.is_dir():
                continue
            end = slot.log.log_end_offset
            try:
                write_file_atomically(
                    snapshot_path(slot.directory, end), slot.manager.to_snapshot(next_offset=end)
                )
                (slot.directory / SNAPSHOT_FILE).unlink(missing_ok=True)
                if isinstance(slot.log, PartitionLog):
                    slot.log.prune_producer_snapshots()
            except OSError:
                log.exception("cannot snapshot producer state of %s-%d", topic, partition)
        self._partitions.clear()
        self._prepared.clear()

    @classmethod
    def attached_to(cls, broker: Any) -> ProducerStateRegistry:
        """The broker's registry (its ``producers`` field)."""
        registry: ProducerStateRegistry = broker.producers
        return registry

    @staticmethod
    def close_attached(broker: Any) -> None:
        broker.producers.close()


def latest_snapshot(directory: Path) -> Path | None:
    """The newest producer state snapshot file in a log's directory (tests, tools)."""
    offsets = snapshot_offsets(directory)
    return snapshot_path(directory, offsets[-1]) if offsets else None


def log_directory(log_: Log) -> Path | None:
    """A file-backed log's directory, None for an in-memory log."""
    return log_.directory if isinstance(log_, PartitionLog) else None


def read_batch_headers(log_: Log, from_offset: int) -> Iterator[RecordBatchView]:
    """Batch headers of ``log_`` from the batch holding ``from_offset`` to the end.

    Only the 61-byte headers are read for data batches: replaying producer state never
    needs their records. A control batch (a transaction marker, one small record) is
    read whole: whether it commits or aborts is in its record key.
    """
    for base_offset, header in log_.iter_batch_headers(from_offset):
        view = RecordBatchView(header)
        if view.is_control:
            whole = read_whole_batch(log_, base_offset)
            if whole is not None:
                view = whole
        yield view


def read_whole_batch(log_: Log, base_offset: int) -> RecordBatchView | None:
    """The complete batch starting at ``base_offset``, None if it cannot be read."""
    try:
        regions = log_.read(base_offset, 1, log_.log_end_offset, min_one=True)
        data = b"".join(r.read_bytes() for r in regions)
        for batch in iter_batches(data):
            if batch.base_offset == base_offset:
                return batch
    except (OSError, ProtocolError) as exc:
        log.warning("cannot read the control batch at offset %d: %s", base_offset, exc)
    return None
