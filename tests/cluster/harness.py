"""Shared pieces of the cluster tests: coordination clients of both kinds, brokers' membership."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from tests.waits import eventually
from trio_broker.cluster.controller import ControllerActions, Rebalance
from trio_broker.cluster.coordination import (
    Coordination,
    MemoryCoordination,
    MemoryZooKeeper,
    ZooKeeperCoordination,
)
from trio_broker.cluster.membership import run_membership
from trio_broker.cluster.zk_layout import (
    BrokerRegistration,
)
from trio_broker.security.zookeeper_login import ZooKeeperLogin
from trio_broker.services.cluster_view import ClusterView

KINDS = ["zookeeper", "memory"]
#: The brokers' user in the tests' ZooKeeper (conftest.py): the ACLs name it.
ZOOKEEPER_LOGIN = ZooKeeperLogin("broker", "test-zookeeper-secret")


class Clients:
    """Makes coordination clients of one kind, all on one (real or in-memory) server."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.hosts = request.getfixturevalue("zookeeper") if kind == "zookeeper" else ""
        self.memory = MemoryZooKeeper()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Coordination]:
        if self.kind == "memory":
            memory = MemoryCoordination(self.memory)
            try:
                yield memory
            finally:
                await memory.stop()
            return
        # Logged in and setting ACLs, as a secured cluster's brokers (zookeeper.set.acl).
        coord = ZooKeeperCoordination(
            self.hosts, session_timeout_s=4.0, login=ZOOKEEPER_LOGIN, set_acl=True
        )
        await coord.start(timeout_s=30)
        try:
            yield coord
        finally:
            await coord.stop()  # closes the session: its ephemeral znodes go at once


def registration(broker_id: int) -> BrokerRegistration:
    return BrokerRegistration(broker_id, "127.0.0.1", 19000 + broker_id, rack=f"r{broker_id}")


class Member:
    """One broker's membership tasks, stoppable on their own (its session then closes)."""

    def __init__(self, clients: Clients, broker_id: int) -> None:
        self.clients, self.broker_id = clients, broker_id
        self.view = ClusterView(broker_id)
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        self.nursery: trio.Nursery | None = None
        self.rebalance: Rebalance | None = None
        #: The controller's actions while this member is the controller.
        self.actions: ControllerActions | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                async with self.clients.client() as coord, trio.open_nursery() as nursery:
                    reg = registration(self.broker_id)
                    await nursery.start(
                        partial(
                            run_membership,
                            coord,
                            reg,
                            self.view,
                            rebalance=self.rebalance,
                            on_controller=self._controller_changed,
                        )
                    )
                    task_status.started()
        finally:
            self.stopped.set()

    def _controller_changed(self, actions: ControllerActions | None) -> None:
        self.actions = actions

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()

    async def restart(self) -> None:
        """Start again in the cluster's nursery, with a fresh session."""
        assert self.nursery is not None and self.stopped.is_set()
        self.scope, self.stopped = trio.CancelScope(), trio.Event()
        await self.nursery.start(self.run)


@asynccontextmanager
async def cluster(
    clients: Clients, *broker_ids: int, rebalance: Rebalance | None = None
) -> AsyncIterator[dict[int, Member]]:
    members = {b: Member(clients, b) for b in broker_ids}
    for member in members.values():
        member.rebalance = rebalance
    async with trio.open_nursery() as nursery:
        for m in members.values():  # one after another: the first is the controller
            m.nursery = nursery
            await nursery.start(m.run)
            await eventually(lambda m=m: m.view.controller_id != -1, "a controller is known")
        yield members
        nursery.cancel_scope.cancel()
