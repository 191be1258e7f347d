"""The transaction coordinator's timers: the shell side of trio_broker/transactions.

One task in the root nursery. At start it finishes commits and aborts a crash
left between their Prepare and Complete records; then, every
transaction.abort.timed.out.transaction.cleanup.interval.ms, it aborts open
transactions past their timeout (fencing their producer) and retries any
unfinished end; every
transaction.remove.expired.transaction.cleanup.interval.ms it forgets idle
transactional ids (transactional.id.expiration.ms).

The coordinator keeps one table per led ``__transaction_state`` partition; a second
task loads each newly elected partition's table (and finishes what its previous leader
left) as soon as the partition's leadership reports it: a cluster's replica manager,
or alone the ``OwnPartition`` of its one partition, which waits for that table
(:meth:`TransactionTimers.wait_loaded`) before the broker takes clients. The timers act
on the loaded tables only.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator

log = logging.getLogger("trio_broker.transactions")


class TransactionTimers:
    def __init__(self, coordinator: PartitionedTransactionCoordinator, config: Any) -> None:
        self.coordinator = coordinator
        self.abort_interval_s = (
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        )
        self.expire_interval_s = (
            config.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
        )
        self._elected = trio.Event()
        #: Set after each round of loading (then replaced): what :meth:`wait_loaded`
        #: waits for.
        self._load_round = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.coordinator.on_elected = self._elected.set
            nursery.start_soon(self._load_elected, self.coordinator)
            task_status.started()
            await self._timers()

    async def _load_elected(self, coordinator: PartitionedTransactionCoordinator) -> None:
        while True:
            try:
                loaded = coordinator.load_pending()
            except Exception:  # one unreadable partition must not stop the others' loading
                log.exception("loading transaction coordinator tables")
                loaded = []
            for table in loaded:  # in the background: markers may wait for leaders
                assert self._nursery is not None
                self._nursery.start_soon(table.recover)
            self._load_round.set()
            self._load_round = trio.Event()
            await self._elected.wait()
            self._elected = trio.Event()
            coordinator.on_elected = self._elected.set

    async def wait_loaded(self, partition: int) -> bool:
        """Wait until an elected partition's table is loaded: True, or False when it is
        not led (any more) or could not be loaded (``load_pending`` logged why)."""
        while partition in self.coordinator.loading:
            await self._load_round.wait()
        return partition in self.coordinator.tables

    async def _timers(self) -> None:
        await self.coordinator.recover()
        next_expiry = trio.current_time() + self.expire_interval_s
        while True:
            await trio.sleep(self.abort_interval_s)
            await self.coordinator.abort_timed_out()
            await self.coordinator.recover()
            if trio.current_time() >= next_expiry:
                next_expiry = trio.current_time() + self.expire_interval_s
                await self.coordinator.expire_ids()

    def close(self) -> None:
        self.coordinator.close()
