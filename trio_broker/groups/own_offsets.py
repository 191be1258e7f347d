"""A node alone's ``__consumer_offsets``: a cluster of one for the group coordinator.

As Kafka's single broker is a replica set of one, a node alone has an offsets topic of
one partition, led by this broker from its start to its end, in
``<data_dir>/__consumer_offsets-0`` (every data dir written before stays valid), or a
``MemoryLog`` with ``--storage memory``. Its leadership is an
:class:`~trio_broker.services.own_partition.OwnPartition`, as is that of a node alone's
``__transaction_state``: run as a broker service right after the coordinator, it opens
the log and elects the coordinator through the same entry a cluster's replica manager
calls (:meth:`GroupCoordinator.elected`), then reports started once the table is
loaded, so that clients see the coordinator only after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trio_broker.groups.coordinator import GroupCoordinator, OffsetsLeaders, trio_clock_ms
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.services.own_partition import OWN_PARTITIONS, OwnPartition
from trio_broker.storage.log_protocol import Log


async def open_off_loop(open_log: Callable[[], Log]) -> Log:
    """Open a coordinator's own log in a worker thread (it may replay segments)."""
    return await trio.to_thread.run_sync(open_log)


def coordinator_alone(
    broker: Any, open_log: Callable[[], Log], *, clock_ms: Callable[[], int] = trio_clock_ms
) -> tuple[GroupCoordinator, OwnPartition]:
    """A node alone's group coordinator and the leadership of its one offsets partition:
    run both as services, the coordinator first."""
    own = OwnPartition(
        CONSUMER_OFFSETS, broker.config.node_id, open_log, run_off_loop=open_off_loop
    )
    coordinator = GroupCoordinator(
        broker, offsets_partitions=OWN_PARTITIONS, leaders=lambda: own, clock_ms=clock_ms
    )
    own.elect = coordinator.elected
    own.wait_loaded = lambda: coordinator.wait_loaded(0)
    return coordinator, own


if TYPE_CHECKING:  # mypy checks that it is a leadership the coordinator can use
    _OWN: type[OffsetsLeaders] = OwnPartition
