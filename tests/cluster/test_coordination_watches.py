"""Watches set on a znode that does not exist yet, on a real ZooKeeper through kazoo.

``children_and_watch`` on a missing znode reads its children (NoNode), then sets an
exists-watch for its creation. If the znode is created between those two calls,
exists() finds it and ZooKeeper sets a *data* watch, which a new child does not fire.
A controller missed a new topic so (issue 30: a partition state never written, the
broker idle for a minute): the call must read the children again instead.
"""

from __future__ import annotations

from typing import Any

import trio
from harness import ZOOKEEPER_LOGIN

from trio_broker.cluster.coordination import ZooKeeperCoordination


async def test_a_parent_created_between_the_read_and_the_watch_is_read_again(
    zookeeper: str,
) -> None:
    coord = ZooKeeperCoordination(zookeeper, session_timeout_s=4.0, login=ZOOKEEPER_LOGIN)
    await coord.start(timeout_s=30)
    try:
        client: Any = coord._client  # kazoo's, to steer the interleaving
        real_get_children = client.get_children

        def get_children_then_another_client_creates(path: str, **kwargs: Any) -> Any:
            # The read finds nothing; before the watch is set, the parent and a first
            # child appear (another broker creating the first topic).
            try:
                return real_get_children(path, **kwargs)
            finally:
                client.get_children = real_get_children
                client.create(f"{path}/first", b"", makepath=True)

        client.get_children = get_children_then_another_client_creates
        children, changed = await coord.children_and_watch("/topics")

        assert children == ["first"]
        # And the watch is on the children: the next topic wakes the reader.
        await coord.create("/topics/second", b"")
        with trio.fail_after(60):
            await changed.wait()
    finally:
        await coord.stop()
