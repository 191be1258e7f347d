"""Broker registration, the broker list and controller election, over ZooKeeper.

Each scenario runs twice: against a real ZooKeeper server (Debian's package, started
by conftest.py) through kazoo, and against the in-memory stand-in that the
deterministic simulation will use, so the two cannot drift apart.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import pytest
import trio
from harness import Clients, Member, cluster, registration

from tests.waits import eventually
from trio_broker.cluster.coordination import (
    MemoryCoordination,
    MemoryZooKeeper,
    SessionLost,
)
from trio_broker.cluster.membership import BrokerIdInUse, run_membership
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    TopicAssignment,
    partition_state_path,
    topic_path,
)
from trio_broker.services.cluster_view import BrokerInfo, ClusterView


async def test_three_brokers_see_each_other_and_agree_on_one_controller(clients: Clients) -> None:
    async with cluster(clients, 1, 2, 3) as members:
        views = [m.view for m in members.values()]
        await eventually(
            lambda: all(set(v.brokers) == {1, 2, 3} for v in views), "all list 1, 2 and 3"
        )
        await eventually(lambda: all(v.controller_id == 1 for v in views), "1 is controller")
        assert [v.is_controller for v in views] == [True, False, False]
        # /controller and /controller_epoch are two znodes, read by two watches: the
        # epoch may reach a view a moment after the controller's id.
        await eventually(
            lambda: {v.controller_epoch for v in views} == {1}, "every view at epoch 1"
        )
        assert members[3].view.brokers[2] == BrokerInfo(
            2, "127.0.0.1", 19002, "r2", (("PLAINTEXT", "127.0.0.1", 19002),)
        )
        await members[3].stop()  # its session closes: the others drop it
        await eventually(
            lambda: set(views[0].brokers) == {1, 2} == set(views[1].brokers), "3 is gone"
        )


async def test_brokers_started_at_once_agree_and_act_on_a_new_topic(clients: Clients) -> None:
    """``trio-broker cluster up`` starts its brokers side by side: they race to register
    (the parents of ``/brokers/ids`` included) and to claim ``/controller`` while the
    others are still registering. Every view must still list all three and name one
    controller in epoch 1, and that controller must give a topic created right after a
    leader (a CI run with side-by-side test clusters once saw a topic never created)."""
    members = {b: Member(clients, b) for b in (1, 2, 3)}
    views = [m.view for m in members.values()]
    async with trio.open_nursery() as nursery:
        for member in members.values():
            member.nursery = nursery
            nursery.start_soon(member.run)  # no waiting in between: all at once
        await eventually(lambda: all(set(v.brokers) == {1, 2, 3} for v in views), "all listed")
        await eventually(
            lambda: (
                len({(v.controller_id, v.controller_epoch) for v in views}) == 1
                and views[0].controller_id in (1, 2, 3)
                and views[0].controller_epoch == 1
            ),
            "one controller in epoch 1 in every view",
        )
        assert [v.is_controller for v in views].count(True) == 1
        async with clients.client() as coord:
            assignment = TopicAssignment(uuid.uuid4(), {0: (1, 2)})
            await coord.create(topic_path("new"), assignment.encode())
            state = partition_state_path("new", 0)
            await eventually(lambda: all("new" in v.topics for v in views), "every view has it")
            await eventually(
                lambda: all(v.topics["new"].partitions[0].leader == 1 for v in views),
                f"{state} written with leader 1, seen by every broker",
            )
        nursery.cancel_scope.cancel()


async def test_a_new_controller_with_a_higher_epoch_when_the_controller_goes(
    clients: Clients,
) -> None:
    async with cluster(clients, 1, 2, 3) as members:
        await eventually(lambda: members[3].view.controller_id == 1, "3 sees controller 1")
        await members[1].stop()
        v2, v3 = members[2].view, members[3].view
        await eventually(
            lambda: (
                v2.controller_id in (2, 3)
                and v2.controller_id == v3.controller_id
                and v2.controller_epoch == 2 == v3.controller_epoch
            ),
            "2 and 3 agree on a new controller in epoch 2",
        )
        assert [v2.is_controller, v3.is_controller].count(True) == 1
        assert set(v2.brokers) == {2, 3}


async def test_a_second_broker_with_the_same_id_is_refused(clients: Clients) -> None:
    async with cluster(clients, 1), clients.client() as coord:
        with pytest.raises(BrokerIdInUse, match="broker id 1 is registered"):
            await run_membership(coord, registration(1), ClusterView(1))


class _RegistrationReplyLost:
    """A coordination client whose first ephemeral create succeeds on the server but whose
    reply never comes back (the connection dropped): the caller sees ConnectionLoss."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lost_replies = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await self.inner.create(path, data, ephemeral=ephemeral)
        if ephemeral and path.startswith(BROKER_IDS) and not self.lost_replies:
            self.lost_replies += 1
            raise SessionLost(f"{path}: ConnectionLoss")


async def test_a_registration_whose_reply_was_lost_is_our_own(clients: Clients) -> None:
    """The retry of a registration whose reply was lost finds the znode there. It is this
    session's own: the broker is registered. Before, it took it for another live broker
    with its id and exited with BrokerIdInUse (or, re-registering after a session
    expiry, waited forever for its own znode to go)."""
    async with clients.client() as inner:
        coord = _RegistrationReplyLost(inner)
        view = ClusterView(1)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(60):
                await nursery.start(partial(run_membership, coord, registration(1), view))
            assert coord.lost_replies == 1
            await eventually(lambda: set(view.brokers) == {1}, "registered")
            nursery.cancel_scope.cancel()


async def test_a_restart_waits_for_its_previous_runs_registration_to_go(
    clients: Clients,
) -> None:
    """kill -9 leaves the broker's session alive until ZooKeeper expires it; a restart
    within that time finds its own old registration. It waits for it to go (the CI run
    that restarted a follower 4 s after kill -9 saw the broker exit instead), and a
    registration that stays past the wait is still a live broker with the same id."""
    async with clients.client() as previous_life, clients.client() as coord:
        await previous_life.create(f"{BROKER_IDS}/1", registration(1).encode(), ephemeral=True)
        view = ClusterView(1)
        async with trio.open_nursery() as nursery:

            async def expire_later() -> None:
                await trio.sleep(1.0)
                await previous_life.stop()  # as ZooKeeper expiring that session would

            nursery.start_soon(expire_later)
            started = trio.current_time()
            await nursery.start(
                lambda task_status: run_membership(
                    coord, registration(1), view, stale_registration_wait_s=20.0,
                    task_status=task_status,
                )
            )  # fmt: skip
            assert trio.current_time() - started >= 1.0
            await eventually(lambda: set(view.brokers) == {1}, "registered in the end")
            nursery.cancel_scope.cancel()
    async with cluster(clients, 2), clients.client() as coord:
        started = trio.current_time()
        with pytest.raises(BrokerIdInUse, match="broker id 2 is registered"):
            await run_membership(coord, registration(2), ClusterView(2),
                                 stale_registration_wait_s=1.5)  # fmt: skip
        assert trio.current_time() - started >= 1.5


async def test_an_unreadable_registration_is_skipped(clients: Clients) -> None:
    async with cluster(clients, 1, 2) as members, clients.client() as coord:
        await coord.create(f"{BROKER_IDS}/7", b"{not json")
        await coord.create(f"{BROKER_IDS}/8", b'{"host": "h", "port": "x"}')
        await coord.create(f"{BROKER_IDS}/9", registration(9).encode())
        await eventually(lambda: set(members[1].view.brokers) == {1, 2, 9}, "9 listed")
        await coord.delete(f"{BROKER_IDS}/9")
        await eventually(lambda: set(members[1].view.brokers) == {1, 2}, "9 gone")


async def test_an_expired_session_registers_again_and_gives_up_the_controller() -> None:
    server = MemoryZooKeeper()
    coords = {b: MemoryCoordination(server) for b in (1, 2)}
    views = {b: ClusterView(b) for b in (1, 2)}
    async with trio.open_nursery() as nursery:
        for b in (1, 2):
            await nursery.start(run_membership, coords[b], registration(b), views[b])
            await eventually(lambda b=b: views[b].controller_id == 1, f"{b} sees controller 1")
        coords[1].expire_session()  # ZooKeeper dropped broker 1's session
        # Both race for the controller (broker 1 on its new session): a new election.
        await eventually(
            lambda: (
                views[1].controller_epoch == 2 == views[2].controller_epoch
                and views[1].controller_id == views[2].controller_id != -1
            ),
            "a controller elected in epoch 2, seen by both",
        )
        await eventually(lambda: set(views[2].brokers) == {1, 2}, "broker 1 registered again")
        nursery.cancel_scope.cancel()


class _EpochReadFailsOnce:
    """A coordination client whose second read of /controller_epoch fails, as a dropped
    connection fails it: the first is the new controller's increment, the second the
    controller's duties starting (``run_controller``)."""

    def __init__(self, inner: MemoryCoordination) -> None:
        self.inner, self.epoch_reads = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, path: str) -> Any:
        if path == CONTROLLER_EPOCH:
            self.epoch_reads += 1
            if self.epoch_reads == 2:
                raise SessionLost(f"{path}: ConnectionLoss")
        return await self.inner.get(path)


async def test_a_failed_read_as_the_controller_starts_is_retried() -> None:
    """A ZooKeeper call that failed as the controller's duties began ended the
    membership task, and the broker with it; the duties start again instead."""
    coord = _EpochReadFailsOnce(MemoryCoordination(MemoryZooKeeper()))
    view = ClusterView(1)
    active: list[object] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(run_membership, coord, registration(1), view, on_controller=active.append)
        )
        await eventually(lambda: bool(active) and active[-1] is not None, "controller active")
        assert coord.epoch_reads >= 3, "the duties read the epoch again"
        assert view.controller_id == 1 and view.controller_epoch == 1
        nursery.cancel_scope.cancel()


class _RegistersAgainWhenLetGo:
    """Broker 1's coordination client, whose registrations after the first wait for
    ``let_go``: the window between a session expiry and the broker's registering again."""

    def __init__(self, inner: MemoryCoordination) -> None:
        self.inner, self.registrations, self.let_go = inner, 0, trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        if path == f"{BROKER_IDS}/1":
            self.registrations += 1
            if self.registrations > 1:
                await self.let_go.wait()
        await self.inner.create(path, data, ephemeral=ephemeral)


async def test_a_broker_not_registered_again_yet_tells_clients_the_brokers_it_knew() -> None:
    """After its session expired, until it has registered again, ZooKeeper lists the
    broker as gone; Metadata must still name it and the brokers it knew (issue 30: an
    empty list made librdkafka drop every broker, and a consumer group stalled)."""
    server = MemoryZooKeeper()
    one = _RegistersAgainWhenLetGo(MemoryCoordination(server))
    two = MemoryCoordination(server)
    views = {b: ClusterView(b) for b in (1, 2)}

    def told(b: int) -> list[int]:
        return [info.broker_id for info, _, _ in views[b].brokers_on(None)]

    async with trio.open_nursery() as nursery:
        await nursery.start(run_membership, one, registration(1), views[1])
        await nursery.start(run_membership, two, registration(2), views[2])
        await eventually(lambda: set(views[1].brokers) == {1, 2}, "1 lists 1 and 2")
        one.expire_session()
        await eventually(lambda: set(views[1].brokers) == {2}, "ZooKeeper lists 2 alone")
        assert told(1) == [1, 2]
        assert told(2) == [2]  # registered: it tells what ZooKeeper lists
        one.let_go.set()
        await eventually(lambda: set(views[1].brokers) == {1, 2}, "1 registered again")
        await two.stop()  # while broker 1 is registered, a broker that goes is dropped
        await eventually(lambda: set(views[1].brokers) == {1}, "2 gone")
        assert told(1) == [1]
        nursery.cancel_scope.cancel()
