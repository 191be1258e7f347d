"""Small waiting helpers the cluster tasks share."""

from __future__ import annotations

import trio

__all__ = ["RETRY_S", "wait_any"]

#: How long to wait before trying again after ZooKeeper refused or was unreachable.
RETRY_S = 0.5


async def wait_any(*events: trio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait_then_stop(e: trio.Event = event) -> None:
                await e.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait_then_stop)
