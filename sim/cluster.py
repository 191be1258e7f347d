"""Real ``Broker`` objects (storage=memory) in one Trio run, over the in-memory network
and the in-memory ZooKeeper, that can crash, lose power, restart and lose their session.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from typing import Any

import attrs
import trio

from sim.network import Network, SimSocket
from sim.timers import virtual_clock
from trio_broker.cluster.coordination import (
    MemoryCoordination,
    MemoryZooKeeper,
    SessionLost,
    Znode,
)
from trio_broker.cluster.waiting import Signal, Watch
from trio_broker.config import BrokerConfig
from trio_broker.handlers.base import ClientInfo
from trio_broker.server.broker import Broker
from trio_broker.server.sync_thread import InlineCalls
from trio_broker.server.transport import open_connection
from trio_broker.storage.epoch_cache import LeaderEpochCache
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.memory import MemoryLog

__all__ = ["SimBroker", "SimCoordination", "broker_host", "node_name", "virtual_clock"]

log = logging.getLogger("sim")

#: As Kafka's defaults (18 s and 30 s), the session times out before a replica lags:
#: a broker that restarts quickly can find itself still in the ISR. Short, so that a
#: schedule's faults and the cluster's reactions to them fit in a few virtual seconds
#: (every other duration of a schedule is a multiple of the session timeout).
SESSION_TIMEOUT_MS = 1000
REPLICA_LAG_TIME_MAX_MS = 1500
#: Flusher lanes per simulated broker: the run's topic has two partitions.
FLUSH_LANES = 2


def node_name(broker_id: int) -> str:
    return f"b{broker_id}"


def broker_host(broker_id: int) -> str:
    """The host name a broker registers; the network maps it back to the node."""
    return f"sim-broker-{broker_id}"


class SimCoordination(MemoryCoordination):
    """A broker's ZooKeeper session, which the simulation can cut off from ZooKeeper.

    Cut off, every call fails as kazoo's ConnectionLoss does (``SessionLost``); once
    the cut has lasted the session timeout, ZooKeeper expires the session (its
    ephemeral znodes go, the others' watches fire); when the cut heals after that, the
    broker hears that its session was lost and gets a new one. (Simplification: the
    broker's own watches still fire while it is cut off.) A crashed broker's session is
    not closed by the broker (kill -9 closes nothing): it lives until ZooKeeper expires it.
    """

    def __init__(self, server: MemoryZooKeeper) -> None:
        super().__init__(server)
        self.crashed = False
        self.cut_off = False
        self.expired = False

    async def _reachable(self) -> None:
        if self.cut_off or self.expired:
            await trio.lowlevel.checkpoint()
            raise SessionLost("connection loss: cut off from ZooKeeper")

    async def stop(self) -> None:
        if self.crashed or self.expired:
            return
        await super().stop()

    def server_expires(self) -> None:
        """ZooKeeper gives up on the session (its timeout passed without a heartbeat)."""
        if not self.expired:
            self.expired = True
            self._server.expire(self.session)

    def reconnect(self) -> None:
        """The cut healed: an expired session is reported lost and replaced."""
        self.cut_off = False
        if self.expired and not self.crashed:
            self.expired = False
            self.session = self._server.open_session()
            self._lost.set()
            self._lost = Signal()

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await self._reachable()
        await super().create(path, data, ephemeral=ephemeral)

    async def get(self, path: str) -> Znode | None:
        await self._reachable()
        return await super().get(path)

    async def owned_by_this_session(self, path: str) -> bool:
        await self._reachable()
        return await super().owned_by_this_session(path)

    async def get_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[Znode | None, Watch]:
        await self._reachable()
        return await super().get_and_watch(path, into=into)

    async def children_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[list[str], Watch]:
        await self._reachable()
        return await super().children_and_watch(path, into=into)

    async def set(self, path: str, data: bytes, version: int) -> int:
        await self._reachable()
        return await super().set(path, data, version)

    async def set_fenced(self, path: str, data: bytes, version: int, fence: tuple[str, int]) -> int:
        await self._reachable()
        return await super().set_fenced(path, data, version, fence)

    async def delete(self, path: str, version: int = -1) -> None:
        await self._reachable()
        await super().delete(path, version)


#: Told of every call run_inline makes, after it returns (the simulation watches log
#: truncations here: a moment for a fault to strike).
inline_call_observers: list[Callable[[Callable[..., Any], tuple[object, ...]], None]] = []


async def run_inline(fn: Callable[..., Any], *args: object, **_kwargs: object) -> Any:
    """Replaces ``trio.to_thread.run_sync`` for the simulation (see trio_broker.server.sync_thread.InlineCalls)."""
    await trio.lowlevel.checkpoint()
    result = fn(*args)
    for observer in inline_call_observers:
        observer(fn, args)
    return result


@attrs.define
class SavedLog:
    """What a partition's storage holds when its broker goes down."""

    batches: list[tuple[int, int, bytes]]
    durable_end: int
    epochs: list[Any]


@attrs.define
class SavedTopic:
    info: Any
    logs: list[SavedLog]


class SimBroker:
    """One broker id across its lives: each start is a fresh ``Broker`` object whose
    memory logs are what survived the previous life."""

    def __init__(
        self, broker_id: int, zk: MemoryZooKeeper, network: Network, now_ms: Callable[[], int]
    ) -> None:
        self.broker_id = broker_id
        self.node = node_name(broker_id)
        self.zk, self.network, self.now_ms = zk, network, now_ms
        self.broker: Broker | None = None
        self.coord: SimCoordination | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped: trio.Event | None = None
        self.saved: dict[str, SavedTopic] = {}
        self.lives = 0
        #: Trio time of the last start or crash (what a check of its log may trust).
        self.changed_at = -math.inf
        #: BrokerConfig fields a scenario sets over the simulator's (from the next start).
        self.overrides: dict[str, Any] = {}

    @property
    def up(self) -> bool:
        return self.broker is not None

    def config(self) -> BrokerConfig:
        fields: dict[str, Any] = dict(
            host="127.0.0.1", port=0, storage="memory", node_id=self.broker_id,
            advertised_listeners=f"PLAINTEXT://{broker_host(self.broker_id)}:9092",
            zookeeper_connect="sim", zookeeper_session_timeout_ms=SESSION_TIMEOUT_MS,
            min_insync_replicas=2, default_replication_factor=3,
            replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS, auto_leader_rebalance_enable=False,
            cluster_id="sim-cluster", num_handlers=2,
        )  # fmt: skip
        return BrokerConfig(**{**fields, **self.overrides})

    async def start(self, nursery: trio.Nursery) -> None:
        broker = Broker(self.config(), now_ms=self.now_ms)
        broker.flusher._threads = InlineCalls()
        # One flusher lane per partition of the run: the logs take lanes in turn, so with
        # the default eight the other six were idle tasks started and cancelled each life.
        broker.flusher.threads = FLUSH_LANES
        # The loop watchdog measures how late a sleep wakes on the wall clock; on the
        # mock clock that is no lag at all, and its 20 wakes a second per broker were
        # about half of a run's distinct virtual times (each a scheduler pass).
        broker.loop_watchdog.interval_s = math.inf
        self._restore(broker)
        zk = self.zk

        def open_coordination() -> SimCoordination:
            self.coord = SimCoordination(zk)
            return self.coord

        async def open_stream(host: str, port: int) -> trio.abc.Stream:
            return await self.network.connect(self.node, _node_of(host))

        broker.open_coordination = open_coordination
        broker.open_stream = open_stream
        scope = trio.CancelScope()
        stopped = trio.Event()
        self._scope, self._stopped = scope, stopped

        async def life(task_status: trio.TaskStatus[Broker]) -> None:
            try:
                with scope:
                    await broker.run(task_status=task_status)
            finally:
                stopped.set()

        await nursery.start(life)
        self.broker = broker
        self.lives += 1
        self.changed_at = trio.current_time()
        self.network.listeners[self.node] = self._accept

    def _accept(self, sock: SimSocket, client: str) -> None:
        broker = self.broker
        if broker is None:
            return
        conn_id = next(broker._connection_ids)
        # SimSocket has the socket methods Connection uses (network.py).
        fake_socket: Any = sock
        client_info = ClientInfo(conn_id, client, conn_id)
        conn = open_connection(broker, fake_socket, client_info, broker.listeners[0])
        broker.connections[conn_id] = conn
        broker.root_nursery.start_soon(broker._run_connection, conn)

    async def crash(self, *, power_cut: bool) -> None:
        """kill -9 (the page cache survives) or a power cut (only synced data does)."""
        broker = self.broker
        assert broker is not None and self._scope is not None and self._stopped is not None
        self.saved = {
            name: SavedTopic(
                topic.info,
                [
                    SavedLog(
                        list(_memory(log_).batches()),
                        log_.durable_end_offset if power_cut else log_.log_end_offset,
                        list(log_.epoch_cache.entries),
                    )
                    for log_ in topic.logs
                ],
            )
            for name, topic in broker.topics.topics.items()
        }
        if self.coord is not None:
            self.coord.crashed = True
        self.network.listeners.pop(self.node, None)
        self.network.reset_node(self.node)
        self.broker = None
        self.changed_at = trio.current_time()
        self._scope.cancel()
        await self._stopped.wait()

    def session_expires(self) -> None:
        """ZooKeeper expires this broker's session (crashed, or cut off long enough)."""
        if self.coord is not None:
            self.coord.server_expires()

    def _restore(self, broker: Broker) -> None:
        for saved in self.saved.values():
            topic = broker.topics._open(saved.info)
            for p, kept in enumerate(saved.logs):
                fresh = MemoryLog(topic.logs[p].config, now_ms=self.now_ms)
                for _base, last, data in kept.batches:
                    if last < kept.durable_end:
                        fresh.append_replicated(data, now_ms=self.now_ms())
                fresh.epoch_cache = LeaderEpochCache(list(kept.epochs))
                if any(last >= kept.durable_end for _base, last, _data in kept.batches):
                    fresh.epoch_cache.truncate_from_end(fresh.log_end_offset)  # a lost tail
                fresh.flush()
                topic.logs[p] = fresh
        self.saved = {}


#: The wall clock the brokers see when the virtual clock starts (November 2023).
WALL_CLOCK_START_MS = 1_700_000_000_000


class SimCluster:
    """Brokers sharing one in-memory ZooKeeper and network, on the virtual clock."""

    def __init__(self, broker_ids: list[int], rng: random.Random) -> None:
        self.zk = MemoryZooKeeper()
        self.network = Network(rng)
        #: trio.current_time() when the cluster was made: its wall clock's zero.
        self.started_at = trio.current_time()
        self.sims = [SimBroker(b, self.zk, self.network, self.now_ms) for b in broker_ids]

    def now_ms(self) -> int:
        return int((trio.current_time() - self.started_at) * 1000) + WALL_CLOCK_START_MS

    async def start(self, nursery: trio.Nursery) -> Broker:
        """Start every broker; returns the first once it knows them all."""
        for sim in self.sims:
            await sim.start(nursery)
        first = self.sims[0].broker
        assert first is not None
        while len(first.leaders.view.brokers) < len(self.sims):  # noqa: ASYNC110
            await trio.sleep(0.01)
        return first


def _node_of(host: str) -> str:
    prefix = "sim-broker-"
    if not host.startswith(prefix):
        raise OSError(f"unknown host {host}")
    return node_name(int(host[len(prefix) :]))


def _memory(log_: Log) -> MemoryLog:
    """A simulated broker's log: always in memory (the simulation saves and restores them)."""
    assert isinstance(log_, MemoryLog)
    return log_
