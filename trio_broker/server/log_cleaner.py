"""The log cleaner task: compacts the dirtiest compacted log, one pass at a time, off the loop.

Every ``log.cleaner.backoff.ms`` it looks at every compacted partition log (and the
committed-offsets log), rolls an idle active segment older than ``segment.ms`` (the
cleaner never touches the active segment, so a quiet log would otherwise never get
cleaned), and runs one pass (:func:`trio_broker.storage.cleaner.clean_log`) over the
log that needs it most in a worker thread, rate-limited by
``log.cleaner.io.max.bytes.per.second``. At shutdown the pass stops between two
batches: the half-written ``.cleaned`` file is removed, nothing was swapped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterable

import trio

from trio_broker.storage.cleaner import (
    CleaningPlan,
    CleaningStopped,
    CleanResult,
    Throttler,
    TransactionFacts,
    clean_log,
    plan_for,
)
from trio_broker.storage.errors import StorageError
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_protocol import Log

log = logging.getLogger(__name__)

#: What a key costs Kafka's key map (SkimpyOffsetMap: MD5 hash + offset).
KEY_MAP_BYTES_PER_KEY = 24


class LogCleaner:
    """The cleaner task of the root nursery (see docs/compaction.md)."""

    def __init__(
        self,
        logs: Callable[[], Iterable[Log]],
        now_ms: Callable[[], int],
        *,
        backoff_ms: int,
        io_max_bytes_per_second: float,
        transaction_facts: Callable[[PartitionLog], Awaitable[TransactionFacts | None]]
        | None = None,
        dedupe_buffer_size: int = 134_217_728,
        forget_aborted: Callable[[PartitionLog, list[tuple[int, int]]], None] | None = None,
    ) -> None:
        self._logs = logs
        #: A partition's transaction state (LSO, aborted list), read before a pass (its
        #: producer state loaded off the loop if need be): transactional data is then cleaned by Kafka's rules.
        self._transaction_facts = transaction_facts
        #: Told, on the event loop after a pass, the aborted transactions whose data is
        #: gone, before a later pass removes their markers (the fetch path's list).
        self._forget_aborted = forget_aborted
        self._now_ms = now_ms
        self.backoff_ms = backoff_ms
        self.io_max_bytes_per_second = io_max_bytes_per_second
        #: The key map's bound (log.cleaner.dedupe.buffer.size), in keys: Kafka's map
        #: spends 24 bytes a key (a 16-byte hash and an 8-byte offset).
        self.max_keys = max(1, dedupe_buffer_size // KEY_MAP_BYTES_PER_KEY)
        #: set at shutdown: the pass in the worker thread stops at its next batch.
        self._stop = threading.Event()
        #: log -> the earliest delete horizon of a tombstone a pass kept.
        self._horizons: dict[PartitionLog, int] = {}
        self.passes = 0
        self.last_result: CleanResult | None = None
        #: set after every pass (tests and the bench wait on it).
        self.pass_done = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self.clean_once()
                await trio.sleep(self.backoff_ms / 1000)
        finally:
            self._stop.set()

    async def _run_pass(self, work: Callable[[], CleanResult | None]) -> CleanResult | None:
        """``work`` in a worker thread; a cancellation (shutdown) asks it to stop and waits.

        The thread is never abandoned: the logs it reads are closed only after it ends.
        """
        finished = False

        async def stop_when_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not finished:
                    self._stop.set()

        result: CleanResult | None = None
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_cancelled)
            try:
                result = await trio.to_thread.run_sync(work)
            except Exception as exc:  # raised below, outside the nursery: not in a group
                error = exc
            finally:
                finished = True
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return result

    def _candidates(self) -> list[PartitionLog]:
        return [
            lg
            for lg in self._logs()
            if isinstance(lg, PartitionLog) and lg.config.compact and not lg.closed
        ]

    async def clean_once(self) -> CleanResult | None:
        """Roll idle segments, then one pass over the dirtiest log that is due (if any)."""
        now = self._now_ms()
        for gone in [lg for lg in self._horizons if lg.closed]:
            del self._horizons[gone]
        best: tuple[float, PartitionLog, CleaningPlan] | None = None
        for partition_log in self._candidates():
            if partition_log.offline:
                continue
            active = partition_log.active_segment()
            first = active.first_batch_timestamp
            idle_ms = now - first if first is not None else 0
            config = partition_log.config
            if active.size > 0 and idle_ms > min(config.segment_ms, config.max_compaction_lag_ms):
                try:
                    partition_log.roll(now)  # on the loop: rolls belong to the appending thread
                    # Only fully synced segments are cleanable; no append will flush this one.
                    await trio.to_thread.run_sync(partition_log.flush)
                except (OSError, StorageError):
                    log.exception("rolling %s for the cleaner failed", partition_log.directory)
                    continue
            horizon = self._horizons.get(partition_log)
            due = horizon is not None and now >= horizon
            plan = plan_for(partition_log, now, tombstones_due=due)
            if plan is None:
                continue
            score = 2.0 if plan.forced else plan.dirty_ratio
            if best is None or score > best[0]:
                best = (score, partition_log, plan)
        if best is None:
            return None
        _, target, chosen = best
        throttler = Throttler(self.io_max_bytes_per_second, stop=self._stop)
        txns = None
        if self._transaction_facts is not None:
            txns = await self._transaction_facts(target)
            if target.closed:  # deleted while the producer state loaded
                return None
        try:
            result = await self._run_pass(
                lambda: clean_log(
                    target,
                    now,
                    plan=chosen,
                    throttler=throttler,
                    stop=self._stop,
                    txns=txns,
                    max_keys=self.max_keys,
                )
            )
        except CleaningStopped:
            return None
        except Exception:
            # A damaged segment, a disk error, a log deleted under the pass: log it and
            # go on with the other logs; the broker keeps serving.
            log.exception("cleaning %s failed", target.directory)
            return None
        if result is not None:
            # Closes the replaced segments' descriptors once file.delete.delay.ms is over
            # (the offsets log has no retention task of its own to do it).
            try:
                target.apply_retention(
                    self._now_ms(), txns.high_watermark if txns is not None else None
                )
            except (OSError, StorageError):
                log.exception("retention after cleaning %s failed", target.directory)
            if result.aborts_without_data and self._forget_aborted is not None:
                self._forget_aborted(target, result.aborts_without_data)
            self.passes += 1
            self.last_result = result
            if result.next_horizon is not None:
                self._horizons[target] = result.next_horizon
            else:
                self._horizons.pop(target, None)
            log.info(
                "cleaned %s: %d segments -> %d, %d -> %d bytes, %d records dropped in %.3f s",
                target.directory,
                result.segments_in,
                result.segments_out,
                result.bytes_read,
                result.bytes_written,
                result.records_dropped,
                result.seconds,
            )
        self.pass_done.set()
        self.pass_done = trio.Event()
        return result
