"""A broker in a cluster takes the cluster's id from ZooKeeper before it listens, so no
client ever sees an id of its own (librdkafka warns of a client "connected to multiple
clusters" when brokers answer Metadata with different ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.zk_layout import CLUSTER_ID
from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker


class HeldCoordination(MemoryCoordination):
    """The in-memory ZooKeeper, with the cluster-id write held until the test says go."""

    def __init__(self, server: MemoryZooKeeper, go: trio.Event) -> None:
        super().__init__(server)
        self.go = go
        self.asked = trio.Event()

    async def create(self, path: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
        if path == CLUSTER_ID:
            self.asked.set()
            await self.go.wait()
        return await super().create(path, data, *args, **kwargs)


async def test_the_cluster_id_is_known_before_the_listeners_open(tmp_path: Path) -> None:
    server = MemoryZooKeeper()
    first = MemoryCoordination(server)
    await first.create(CLUSTER_ID, b'{"version":"1","id":"the-clusters-id"}')
    config = BrokerConfig(
        host="127.0.0.1", port=0, storage="memory", data_dir=tmp_path, node_id=1,
        zookeeper_connect="memory", cluster_id="this-brokers-own-id",
    )  # fmt: skip
    broker = Broker(config)
    go = trio.Event()
    held = HeldCoordination(server, go)
    broker.open_coordination = lambda: held
    async with trio.open_nursery() as nursery:

        async def look_then_let_zookeeper_answer() -> None:
            # The broker asked, and got as far as it can without an answer.
            await held.asked.wait()
            await trio.testing.wait_all_tasks_blocked()
            # ZooKeeper has not answered yet: nothing listens, so nobody can ask.
            assert broker.bound == [] and broker.cluster_id == "this-brokers-own-id"
            go.set()

        nursery.start_soon(look_then_let_zookeeper_answer)
        with trio.fail_after(10):
            await nursery.start(broker.run)  # returns once listening
        assert broker.bound and broker.cluster_id == "the-clusters-id"
        nursery.cancel_scope.cancel()
