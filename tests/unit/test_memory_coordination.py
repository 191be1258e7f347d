"""The in-memory ZooKeeper (cluster/coordination.py) keeps ZooKeeper's atomicity."""

from __future__ import annotations

import pytest
import trio

from trio_broker.cluster.coordination import BadVersion, MemoryCoordination, MemoryZooKeeper


async def test_a_fenced_write_loses_to_a_fence_bumped_while_it_is_on_its_way() -> None:
    """set_fenced is one transaction (ZooKeeper's multi: check + setData). A successor
    controller that bumps /controller_epoch before the write is applied must fence it:
    checking the fence and then awaiting the write let the deposed controller's land."""
    server = MemoryZooKeeper()
    old = MemoryCoordination(server)
    await old.create("/controller_epoch", b"1")
    await old.create("/brokers/topics/t/partitions/0/state", b"old")

    async def successor_takes_over() -> None:
        # The successor's write reaches the server first (applied as this task runs).
        epoch = server.nodes["/controller_epoch"]
        epoch.data, epoch.version = b"2", epoch.version + 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(successor_takes_over)
        # Sent before the successor runs; applied after it (the call yields first).
        with pytest.raises(BadVersion):
            await old.set_fenced(
                "/brokers/topics/t/partitions/0/state", b"deposed", 0, ("/controller_epoch", 0)
            )
    node = await old.get("/brokers/topics/t/partitions/0/state")
    assert node is not None and node.data == b"old"
