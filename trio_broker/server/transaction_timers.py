"""The transaction coordinator's timers: the shell side of trio_broker/transactions.

One task in the root nursery. At start it finishes commits and aborts a crash
left between their Prepare and Complete records; then, every
transaction.abort.timed.out.transaction.cleanup.interval.ms, it aborts open
transactions past their timeout (fencing their producer) and retries any
unfinished end; every
transaction.remove.expired.transaction.cleanup.interval.ms it forgets idle
transactional ids (transactional.id.expiration.ms).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from trio_broker.transactions.coordinator import TransactionCoordinator

log = logging.getLogger("trio_broker.transactions")


class TransactionTimers:
    def __init__(self, coordinator: TransactionCoordinator, config: Any) -> None:
        self.coordinator = coordinator
        self.abort_interval_s = (
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        )
        self.expire_interval_s = (
            config.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
        )

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
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
