"""Producer-id blocks in a cluster (cluster/producer_id_blocks.py), over the in-memory
ZooKeeper: each claim takes the block after the stored one, in Kafka's znode layout; a
claim another broker made between the read and the write is never taken twice; an
unreadable znode stops the claim rather than risk reissuing ids; and the supplying task
keeps the allocator one block ahead."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from trio_broker.cluster.coordination import (
    CoordinationError,
    MemoryCoordination,
    MemoryZooKeeper,
    Znode,
)
from trio_broker.cluster.producer_id_blocks import (
    claim_producer_id_block,
    supply_producer_id_blocks,
)
from trio_broker.cluster.zk_layout import PRODUCER_ID_BLOCK, ProducerIdBlock
from trio_broker.services.producers import ProducerIdAllocator


async def test_claims_follow_one_another_in_kafkas_layout() -> None:
    server = MemoryZooKeeper()
    one, two = MemoryCoordination(server), MemoryCoordination(server)
    assert await claim_producer_id_block(one, 1, 1000) == (0, 1000)
    assert await claim_producer_id_block(two, 2, 1000) == (1000, 2000)
    assert await claim_producer_id_block(one, 1, 10) == (2000, 2010)
    node = await one.get(PRODUCER_ID_BLOCK)
    assert node is not None
    assert json.loads(node.data) == {
        "version": 1, "broker": 1, "block_start": "2000", "block_end": "2009",
    }  # fmt: skip


class _Raced(MemoryCoordination):
    """Another broker claims a block right after this one's first read."""

    raced = False

    async def get(self, path: str) -> Znode | None:
        node = await super().get(path)
        if not self.raced and node is not None:
            self.raced = True
            await claim_producer_id_block(MemoryCoordination(self._server), 2, 100)
        return node


async def test_a_block_claimed_meanwhile_is_not_claimed_again() -> None:
    server = MemoryZooKeeper()
    await claim_producer_id_block(MemoryCoordination(server), 3, 100)  # [0, 100)
    raced = _Raced(server)
    assert await claim_producer_id_block(raced, 1, 100) == (200, 300)  # broker 2 took 100
    assert raced.raced


async def test_an_unreadable_znode_stops_the_claim() -> None:
    server = MemoryZooKeeper()
    coord = MemoryCoordination(server)
    await coord.create(PRODUCER_ID_BLOCK, b'{"version": 1, "broker": 1}')
    with pytest.raises(CoordinationError):
        await claim_producer_id_block(coord, 1, 100)
    assert ProducerIdBlock.next_start(ProducerIdBlock(1, 5, 10).encode()) == 10


async def test_the_allocator_is_kept_a_block_ahead() -> None:
    coord = MemoryCoordination(MemoryZooKeeper())
    allocator = ProducerIdAllocator(None, block_size=10)
    allocator.use_cluster_blocks()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supply_producer_id_blocks, coord, 1, allocator)
        await trio.testing.wait_all_tasks_blocked()
        assert [allocator.allocate() for _ in range(6)] == list(range(6))
        # Fewer than half a block left: the task claims the next one, which waits as a
        # spare, so the ids run on past the first block without waiting for ZooKeeper.
        await trio.testing.wait_all_tasks_blocked()
        assert [allocator.allocate() for _ in range(14)] == list(range(6, 20))
        node = await coord.get(PRODUCER_ID_BLOCK)
        assert node is not None and ProducerIdBlock.next_start(node.data) == 20
        nursery.cancel_scope.cancel()
