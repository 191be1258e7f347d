"""A node alone's ``__consumer_offsets``: a cluster of one for the group coordinator.

As Kafka's single broker is a replica set of one, a node alone has an offsets topic of
one partition, led by this broker from its start to its end. It is kept outside the
topic catalogue, in ``<data_dir>/__consumer_offsets-0`` (every data dir written before
stays valid), or a ``MemoryLog`` with ``--storage memory``. :class:`OwnOffsets` is that
topic's replica manager: run as a broker service right after the coordinator, it opens
the log and elects the coordinator through the same entry a cluster's replica manager
calls (:meth:`GroupCoordinator.elected`), then reports started once the table is loaded,
so that clients see the coordinator only after. Writes go through it as through a
cluster's leadership: the log's ``OwnLog`` (the term is this broker's, the high
watermark the log end, a write counts once synced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trio_broker.groups.coordinator import GroupCoordinator, OffsetsLeaders, trio_clock_ms
from trio_broker.replication.leader import AckState
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.local_replication import LOCAL_LEADER_EPOCH, LocalTerm, OwnLog
from trio_broker.storage.log_protocol import Log

#: A node alone's ``__consumer_offsets`` has one partition: every group is in it.
OWN_OFFSETS_PARTITIONS = 1


class OwnOffsets:
    """The leadership of a node alone's ``__consumer_offsets-0`` (module docstring)."""

    def __init__(self, broker_id: int, open_log: Callable[[], Log]) -> None:
        self.broker_id = broker_id
        self._open_log = open_log
        #: Set by :func:`coordinator_alone`: the coordinator this leadership elects.
        self.coordinator: GroupCoordinator | None = None
        self._own: OwnLog | None = None
        me = (broker_id,)
        self._info = PartitionInfo(me, broker_id, LOCAL_LEADER_EPOCH, me)

    @property
    def log(self) -> Log | None:
        return None if self._own is None else self._own.log

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        coordinator = self.coordinator
        assert coordinator is not None, "made by coordinator_alone"
        log_ = await trio.to_thread.run_sync(self._open_log)
        self._own = OwnLog(self.broker_id, log_)
        coordinator.elected(0, LOCAL_LEADER_EPOCH, log_)
        if not await coordinator.wait_loaded(0):
            # A broker alone without its offsets is not started (as before this path).
            raise RuntimeError(f"could not load {CONSUMER_OFFSETS}-0 (see the log)")
        task_status.started()
        await trio.sleep_forever()

    def close(self) -> None:
        if self._own is not None:
            self._own.log.close()
            self._own = None

    # OffsetsLeaders

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return self._info if topic == CONSUMER_OFFSETS and partition == 0 else None

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """Led from the start: nothing is on its way."""
        return False

    def leader_term(self, topic: str, partition: int) -> LocalTerm | None:
        return None if self._own is None else self._own.leader_term(topic, partition)

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        # The ISR is this broker: a write is committed once in its log.
        return AckState.DONE


def coordinator_alone(
    broker: Any, open_log: Callable[[], Log], *, clock_ms: Callable[[], int] = trio_clock_ms
) -> tuple[GroupCoordinator, OwnOffsets]:
    """A node alone's group coordinator and the leadership of its one offsets partition:
    run both as services, the coordinator first."""
    own = OwnOffsets(broker.config.node_id, open_log)
    coordinator = GroupCoordinator(
        broker, offsets_partitions=OWN_OFFSETS_PARTITIONS, leaders=lambda: own, clock_ms=clock_ms
    )
    own.coordinator = coordinator
    return coordinator, own


if TYPE_CHECKING:  # mypy checks that it is a leadership the coordinator can use
    _OWN: type[OffsetsLeaders] = OwnOffsets
