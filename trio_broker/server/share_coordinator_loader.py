"""The share coordinator's loading: the shell side of groups/share_coordinator.py.

The partitions' leadership (a cluster's replica manager, a node alone's
``OwnPartition``) tells the share coordinator when this broker starts leading a
``__share_group_state`` partition; this task then replays that partition's log into
its table (``load_pending``), off the leadership's path. Until it has, the partition's
keys answer COORDINATOR_LOAD_IN_PROGRESS; a node alone's ``OwnPartition`` waits for it
(:meth:`ShareCoordinatorLoader.wait_loaded`) before the broker takes clients.
"""

from __future__ import annotations

import logging

import trio

from trio_broker.groups.share_coordinator import PartitionedShareCoordinator

log = logging.getLogger("trio_broker.groups")


class ShareCoordinatorLoader:
    def __init__(self, coordinator: PartitionedShareCoordinator) -> None:
        self.coordinator = coordinator
        self._elected = trio.Event()
        #: Set after each round of loading (then replaced): what :meth:`wait_loaded`
        #: waits for.
        self._load_round = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.coordinator.on_elected = self._elected.set
        task_status.started()
        while True:
            try:
                self.coordinator.load_pending()
            except Exception:  # one unreadable partition must not stop the others' loading
                log.exception("loading share coordinator tables")
            self._load_round.set()
            self._load_round = trio.Event()
            await self._elected.wait()
            self._elected = trio.Event()
            self.coordinator.on_elected = self._elected.set

    async def wait_loaded(self, partition: int) -> bool:
        """Wait until an elected partition's table is loaded: True, or False when it is
        not led (any more) or could not be loaded (``load_pending`` logged why)."""
        while partition in self.coordinator.loading:
            await self._load_round.wait()
        return partition in self.coordinator.tables

    def close(self) -> None:
        self.coordinator.close()
