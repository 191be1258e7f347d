"""Producer ids in a cluster: blocks claimed in ZooKeeper, as Kafka's ZooKeeper mode.

Every broker hands out producer ids (InitProducerId) from a block of its own; the
blocks are claimed one after another with a conditional update of
``/latest_producer_id_block`` (its content: ``zk_layout.ProducerIdBlock``), so no two
brokers ever hand out the same id. The allocator (``services/producers.py``) says when
it runs low; :func:`supply_producer_id_blocks`, a task of the replica manager's
nursery, claims the next block then.
"""

from __future__ import annotations

import logging

import trio

from trio_broker.cluster.coordination import (
    BadVersion,
    Coordination,
    CoordinationError,
    NodeExists,
)
from trio_broker.cluster.zk_layout import (
    PRODUCER_ID_BLOCK,
    CoordinationDataError,
    ProducerIdBlock,
)
from trio_broker.services.producers import ProducerIdAllocator

__all__ = ["claim_producer_id_block", "supply_producer_id_blocks"]

log = logging.getLogger(__name__)

#: How long a failed claim waits before the next try.
CLAIM_RETRY_S = 0.2


async def claim_producer_id_block(
    coord: Coordination, broker_id: int, size: int
) -> tuple[int, int]:
    """Claim the next block of producer ids, [start, end), with a conditional update of
    ``/latest_producer_id_block`` (Kafka's layout: inclusive block_end)."""
    while True:
        node = await coord.get(PRODUCER_ID_BLOCK)
        start = 0
        if node is not None:
            try:
                start = ProducerIdBlock.next_start(node.data)
            except CoordinationDataError:
                raise CoordinationError(f"{PRODUCER_ID_BLOCK} is unreadable") from None
        data = ProducerIdBlock(broker_id, start, start + size).encode()
        try:
            if node is None:
                await coord.create(PRODUCER_ID_BLOCK, data)
            else:
                await coord.set(PRODUCER_ID_BLOCK, data, node.version)
        except (NodeExists, BadVersion):
            continue  # another broker claimed one meanwhile
        return start, start + size


async def supply_producer_id_blocks(
    coord: Coordination, broker_id: int, allocator: ProducerIdAllocator
) -> None:
    """Keep the producer id allocator supplied with blocks claimed in ZooKeeper."""
    while True:
        if allocator.needs_block:
            try:
                start, end = await claim_producer_id_block(coord, broker_id, allocator.block_size)
                allocator.offer_block(start, end)
                log.info("producer ids %d..%d are this broker's", start, end - 1)
                continue
            except CoordinationError as exc:
                log.warning("claiming producer ids: %s", exc)
            await trio.sleep(CLAIM_RETRY_S)
            continue
        wanted = trio.Event()
        allocator.on_needs_block = wanted.set
        await wanted.wait()
