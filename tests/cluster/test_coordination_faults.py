"""ZooKeeper failing, as the in-memory twin models it (kazoo's SUSPENDED, LOST, CONNECTED).

A broken connection fires every watch and makes operations wait; reconnecting in time
keeps the session, its ephemerals and the controller; a session the server expired
meanwhile is learned on reconnection (waiting operations fail with SessionLost, the
session-lost event fires), and the membership tasks register again and elect a controller
in a new epoch. tests/cluster/test_zookeeper_faults.py does the same to real processes.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from harness import registration

from tests.waits import eventually
from trio_broker.cluster.coordination import (
    MemoryCoordination,
    MemoryZooKeeper,
    SessionLost,
    Znode,
)
from trio_broker.cluster.membership import run_membership
from trio_broker.cluster.zk_layout import BROKER_IDS, CONTROLLER
from trio_broker.services.cluster_view import ClusterView


async def test_a_broken_connection_fires_watches_and_holds_operations() -> None:
    server = MemoryZooKeeper()
    coord, other = MemoryCoordination(server), MemoryCoordination(server)
    await coord.create("/mine", b"1", ephemeral=True)
    _, changed = await coord.get_and_watch("/mine")
    _, children_changed = await coord.children_and_watch("/")
    lost = coord.session_lost()
    coord.disconnect()
    assert changed.is_set() and children_changed.is_set()  # as kazoo on SUSPENDED
    answers: list[Znode | None] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            answers.append(await coord.get("/mine"))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [], "answered while disconnected"
        assert await other.get("/mine") == Znode(b"1", 0)  # the session lives on
        coord.reconnect()
    assert answers == [Znode(b"1", 0)]
    assert not lost.is_set()


async def test_a_session_expired_while_disconnected_is_learned_on_reconnection() -> None:
    server = MemoryZooKeeper()
    coord, other = MemoryCoordination(server), MemoryCoordination(server)
    await coord.create("/mine", b"1", ephemeral=True)
    lost = coord.session_lost()
    coord.disconnect()
    coord.expire_session()
    assert await other.get("/mine") is None  # the server dropped the ephemeral
    assert not lost.is_set(), "a disconnected client cannot know yet"
    failures: list[BaseException] = []
    async with trio.open_nursery() as nursery:

        async def write() -> None:
            try:
                await coord.create("/late", b"x")
            except SessionLost as exc:
                failures.append(exc)

        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        coord.reconnect()
    assert len(failures) == 1 and lost.is_set()
    assert await other.get("/late") is None, "a request of the expired session went through"
    await coord.create("/mine", b"2", ephemeral=True)  # the new session works
    assert await other.get("/mine") == Znode(b"2", 0)


@pytest.fixture
def brokers() -> tuple[MemoryZooKeeper, dict[int, MemoryCoordination], dict[int, ClusterView]]:
    server = MemoryZooKeeper()
    coords = {b: MemoryCoordination(server) for b in (1, 2, 3)}
    return server, coords, {b: ClusterView(b) for b in (1, 2, 3)}


async def test_membership_rides_out_a_zookeeper_outage_and_an_expiry(
    brokers: tuple[MemoryZooKeeper, dict[int, MemoryCoordination], dict[int, ClusterView]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # On virtual time (the in-memory ZooKeeper has no threads): the outage lasts exactly
    # its second, and the second after the reconnect gives every membership task's
    # retries their turn, however busy the machine.
    server, coords, views = brokers
    async with trio.open_nursery() as nursery:
        for b in (1, 2, 3):
            await nursery.start(run_membership, coords[b], registration(b), views[b])
            await eventually(lambda b=b: views[b].controller_id == 1, f"{b} sees controller 1")
        await eventually(lambda: all(set(v.brokers) == {1, 2, 3} for v in views.values()), "all")

        # ZooKeeper away for less than the session: nothing changes.
        for coord in coords.values():
            coord.disconnect()
        await trio.sleep(1.0)
        for coord in coords.values():
            coord.reconnect()
        await trio.sleep(1.0)  # a window in which nothing may change (virtual seconds)
        assert all(v.controller_id == 1 and v.controller_epoch == 1 for v in views.values())
        assert all(set(v.brokers) == {1, 2, 3} for v in views.values())

        # Away past the session: the server expires every session meanwhile.
        for coord in coords.values():
            coord.disconnect()
            coord.expire_session()
        assert not any(path.startswith(BROKER_IDS + "/") for path in server.nodes)
        assert CONTROLLER not in server.nodes
        for coord in coords.values():
            coord.reconnect()
        await eventually(
            lambda: (
                all(set(v.brokers) == {1, 2, 3} for v in views.values())
                and len({(v.controller_id, v.controller_epoch) for v in views.values()}) == 1
                and views[1].controller_epoch == 2
                and views[1].controller_id in (1, 2, 3)
            ),
            "all registered again, one controller in epoch 2",
        )
        nursery.cancel_scope.cancel()
