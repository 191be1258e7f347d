"""The in-memory ZooKeeper (cluster/coordination.py) keeps ZooKeeper's atomicity."""

from __future__ import annotations

import pytest
import trio

from trio_broker.cluster.coordination import BadVersion, MemoryCoordination, MemoryZooKeeper


async def test_a_fenced_write_loses_to_a_fence_bumped_while_it_is_on_its_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """set_fenced is one transaction (ZooKeeper's multi: check + setData). A successor
    controller's bump of /controller_epoch that lands while the call is on its way (at
    its checkpoint, where other tasks run) must fence it: checking the fence before the
    checkpoint and writing after it let the deposed controller's write land."""
    server = MemoryZooKeeper()
    old = MemoryCoordination(server)
    await old.create("/controller_epoch", b"1")
    await old.create("/brokers/topics/t/partitions/0/state", b"old")
    real_checkpoint = trio.lowlevel.checkpoint

    async def successor_lands_meanwhile() -> None:
        epoch = server.nodes["/controller_epoch"]
        epoch.data, epoch.version = b"2", epoch.version + 1
        await real_checkpoint()

    monkeypatch.setattr(trio.lowlevel, "checkpoint", successor_lands_meanwhile)
    with pytest.raises(BadVersion):
        await old.set_fenced(
            "/brokers/topics/t/partitions/0/state", b"deposed", 0, ("/controller_epoch", 0)
        )
    monkeypatch.undo()
    node = await old.get("/brokers/topics/t/partitions/0/state")
    assert node is not None and node.data == b"old"
