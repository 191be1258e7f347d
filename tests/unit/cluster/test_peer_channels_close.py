"""A broker that stops closes its own connections to the other brokers (the transaction
marker channel's and the share-state channel's), so the brokers that stay up do not keep
a dead peer's connections open until its process exits (in one process: ever)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.waits import eventually
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker


def cluster_broker(server: MemoryZooKeeper, node_id: int, data_dir: Path) -> Broker:
    config = BrokerConfig(
        host="127.0.0.1", port=0, storage="memory", data_dir=data_dir, node_id=node_id,
        zookeeper_connect="memory",
    )  # fmt: skip
    broker = Broker(config)
    broker.open_coordination = lambda: MemoryCoordination(server)
    return broker


async def test_a_stopping_broker_closes_its_connections_to_the_others(tmp_path: Path) -> None:
    server = MemoryZooKeeper()
    leaving, staying = (cluster_broker(server, i, tmp_path / str(i)) for i in (1, 2))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(staying.run)
        async with trio.open_nursery() as leaving_nursery:
            with trio.fail_after(60):
                await leaving_nursery.start(leaving.run)
            await eventually(lambda: 2 in leaving.replication.view.brokers, "broker 2 registered")
            before = len(staying.connections)
            # Each channel to broker 2 opens its connection (as a marker or a share
            # state request would).
            channels = [leaving.transactions.send_markers.__self__,  # type: ignore[attr-defined]
                        leaving.share_coordinator.remote]  # fmt: skip
            for channel in channels:
                found = channel._peers.client(2)
                assert found is not None
                await found[0].connect()
            await eventually(lambda: len(staying.connections) == before + 2, "2 connections")
            await leaving.shutdown()
        await eventually(lambda: len(staying.connections) == before, "the connections closed")
        nursery.cancel_scope.cancel()
