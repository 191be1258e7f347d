"""A stalled event loop does not fence a broker whose ZooKeeper connection is back.

``_fence_while_cut_off`` (cluster/broker_node.py) ends every term once ZooKeeper has
been out of reach for a session timeout, timed by the loop's clock from the moment the
loop learns of the disconnect. kazoo reports each change from its own thread; the loop
runs the hand-over when it next can. A loop stall (issue 28) can therefore pass the
deadline while kazoo is connected again and its word waits in the queue: the old code
fenced the broker then, ending every term for a connection that was up. Under a mock
clock with stand-ins for the coordination (its connection reports) and the replica
manager (its fence).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from trio_broker.cluster.broker_node import _fence_while_cut_off

SESSION_S = 4.0


class Coordination:
    """ZooKeeperCoordination's connection reports, driven by the test."""

    def __init__(self) -> None:
        self.disconnected_since: float | None = None
        self.kazoo_connected = True  # what kazoo's thread knows now
        self._changed = trio.Event()

    def connection_changed(self) -> trio.Event:
        return self._changed

    def connected(self) -> bool:
        return self.kazoo_connected

    def hand_over(self, connected: bool) -> None:
        """The loop runs kazoo's report (as ZooKeeperCoordination._on_connection)."""
        if connected:
            self.disconnected_since = None
        elif self.disconnected_since is None:
            self.disconnected_since = trio.current_time()
        self._changed.set()
        self._changed = trio.Event()


class View:
    broker_id = 1
    brokers: dict[int, object] = {}  # no peers: the fenced broker's probe asks no one


class Manager:
    def __init__(self) -> None:
        self.view = View()
        self.dropped_by_peers = False
        self.fenced = False
        self.fences: list[bool] = []
        self._view = trio.Event()

    def fence(self, fenced: bool) -> None:
        self.fences.append(fenced)
        self.fenced = fenced

    def view_event(self) -> trio.Event:
        return self._view


async def run(
    coord: Coordination, manager: Manager, scenario: Callable[[], Awaitable[None]]
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_fence_while_cut_off, coord, manager, SESSION_S)
        await scenario()
        nursery.cancel_scope.cancel()


async def test_a_reconnect_queued_behind_a_stall_does_not_fence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    coord, manager = Coordination(), Manager()

    async def scenario() -> None:
        await trio.sleep(1)
        coord.kazoo_connected = False
        coord.hand_over(False)  # the loop learns of the disconnect
        await trio.sleep(0.7 * SESSION_S)
        coord.kazoo_connected = True  # kazoo is back; the loop is stalled meanwhile,
        await trio.sleep(0.5 * SESSION_S)  # past the deadline, before the hand-over
        coord.hand_over(True)
        await trio.sleep(2 * SESSION_S)

    await run(coord, manager, scenario)
    assert True not in manager.fences


async def test_a_broker_cut_off_for_a_session_timeout_is_fenced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    coord, manager = Coordination(), Manager()

    async def scenario() -> None:
        await trio.sleep(1)
        coord.kazoo_connected = False
        coord.hand_over(False)
        await trio.sleep(SESSION_S + 0.5)
        assert manager.fenced
        coord.kazoo_connected = True
        coord.hand_over(True)
        await trio.sleep(2 * SESSION_S)  # the view settles (no change for 0.5 s)

    await run(coord, manager, scenario)
    assert manager.fences == [False, True, False]
