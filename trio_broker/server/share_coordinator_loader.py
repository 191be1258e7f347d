"""The share coordinator's loading: the shell side of groups/share_coordinator.py.

In a cluster the replica manager tells the share coordinator when this broker starts
leading a ``__share_group_state`` partition; this task then replays that partition's
log into its table (``load_pending``), off the replica manager's path. Until it has,
the partition's keys answer COORDINATOR_LOAD_IN_PROGRESS.
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

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.coordinator.on_elected = self._elected.set
        task_status.started()
        while True:
            try:
                self.coordinator.load_pending()
            except Exception:  # one unreadable partition must not stop the others' loading
                log.exception("loading share coordinator tables")
            await self._elected.wait()
            self._elected = trio.Event()
            self.coordinator.on_elected = self._elected.set

    def close(self) -> None:
        self.coordinator.close()
