"""A node alone's group coordinator as the broker wires it, for the machines that drive it
(statemachine/test_classic_group_coordinator_machine.py, test_offset_expiry_machine.py):
``coordinator_alone`` over the machine's log, with its flusher and the leadership that
loads the table, on clocks only the machine moves."""

from __future__ import annotations

import attrs
import trio

from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import GroupCoordinator
from trio_broker.groups.own_offsets import coordinator_alone
from trio_broker.server.flusher import Flusher
from trio_broker.storage.memory import MemoryLog


@attrs.define
class Clocks:
    """The broker's wall clock (commit timestamps, expiry) and its monotonic one
    (timers), moved only by the machine."""

    wall_ms: int = 1_700_000_000_000
    monotonic_ms: int = 0


@attrs.define
class LoneBroker:
    """What a node alone's group coordinator uses of its broker."""

    clocks: Clocks
    config: BrokerConfig
    flusher: Flusher = attrs.field(factory=Flusher)

    def now_ms(self) -> int:
        return self.clocks.wall_ms


async def start_lone_coordinator(
    nursery: trio.Nursery, clocks: Clocks, log: MemoryLog, config: BrokerConfig
) -> tuple[GroupCoordinator, trio.CancelScope]:
    """Start the coordinator over ``log`` as the broker starts it: the flusher, the
    coordinator, then the leadership that loads its table. Cancelling the returned scope
    stops all three (a restart starts a new one over the same log)."""
    broker = LoneBroker(clocks, config)
    coordinator, own = coordinator_alone(broker, lambda: log, clock_ms=lambda: clocks.monotonic_ms)
    scope = trio.CancelScope()

    async def services(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            async with trio.open_nursery() as inner:
                await inner.start(broker.flusher.run)
                await inner.start(coordinator.run)
                await inner.start(own.run)
                task_status.started()

    await nursery.start(services)
    return coordinator, scope
