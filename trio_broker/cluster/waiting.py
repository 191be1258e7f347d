"""Small waiting helpers the cluster tasks share."""

from __future__ import annotations

import trio

__all__ = ["RETRY_S", "wait_any"]

#: How long to wait before trying again after ZooKeeper refused or was unreachable.
RETRY_S = 0.5


async def wait_any(*events: trio.Event) -> None:
    """Return as soon as one of ``events`` is set.

    Each further event costs a task, so callers that watch many znodes collect their
    watches in one event (``Coordination.get_and_watch(..., into=event)``)."""
    if any(event.is_set() for event in events):
        await trio.lowlevel.checkpoint()
        return
    first, *others = events
    async with trio.open_nursery() as nursery:
        for event in others:

            async def wait_then_stop(e: trio.Event = event) -> None:
                await e.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait_then_stop)
        await first.wait()  # the nursery's own body waits for the first one
        nursery.cancel_scope.cancel()
