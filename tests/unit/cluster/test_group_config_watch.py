"""The group config watch (cluster/group_config_watch.py) never sets a group's configs back
to a value it read before this broker applied a newer one.

An IncrementalAlterConfigs of a GROUP taken by a broker writes the znode and applies the
new configs at once (handlers/alter_configs.py); the broker's own watch may be in the
middle of a round whose reads came before that write. busy-v-1 saw it: the broker that
took the alter described {} right after answering it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper, Znode
from trio_broker.cluster.group_config_watch import GroupConfigWatch
from trio_broker.cluster.topic_admin import encode_configs
from trio_broker.cluster.zk_layout import GROUP_CONFIGS, group_config_path


class ShareGroupsConfigs:
    """What the watch holds the configs in (the broker's ShareGroups, its config part)."""

    def __init__(self) -> None:
        self.group_configs = SimpleNamespace(groups={})

    def set_group_configs(self, group_id: str, configs: Mapping[str, str]) -> None:
        self.group_configs.groups[group_id] = dict(configs)


class SlowReads(MemoryCoordination):
    """ZooKeeper whose znode reads answer late: what was there when asked, once let go."""

    def __init__(self, server: MemoryZooKeeper) -> None:
        super().__init__(server)
        self.reading = trio.Event()
        self.go = trio.Event()

    async def get_and_watch(self, path: str, **kwargs: Any) -> tuple[Znode | None, trio.Event]:
        answer = await super().get_and_watch(path, **kwargs)
        self.reading.set()
        await self.go.wait()
        return answer


async def test_a_read_from_before_a_local_change_does_not_undo_it() -> None:
    server = MemoryZooKeeper()
    admin = MemoryCoordination(server)
    await admin.create(GROUP_CONFIGS, b"")
    path = group_config_path("g")
    await admin.create(path, encode_configs({"share.record.lock.duration.ms": "1000"}))
    holder = ShareGroupsConfigs()
    holder.set_group_configs("g", {"share.record.lock.duration.ms": "1000"})
    slow = SlowReads(server)
    watch = GroupConfigWatch(slow, holder)
    changed = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.apply_all, changed)
        await slow.reading.wait()  # the round read the znode's old value
        # An alter taken here: the znode written, then applied at once.
        node = await admin.get(path)
        assert node is not None
        newer = {"share.record.lock.duration.ms": "2000"}
        await admin.set(path, encode_configs(newer), node.version)
        holder.set_group_configs("g", newer)
        slow.go.set()
    assert holder.group_configs.groups["g"] == newer
    assert changed.is_set()  # another round reads it again
    # That round applies what ZooKeeper holds: the same.
    await watch.apply_all(trio.Event())
    assert holder.group_configs.groups["g"] == newer
