"""Group configs in a cluster, kept as ZooKeeper has them (``/config/groups/<group>``).

An IncrementalAlterConfigs or AlterConfigs of a GROUP resource taken by any broker is a
write of the group's config znode (``topic_admin.py``'s ``update_group_configs``);
every broker follows ``/config/groups`` and each group's znode and applies what they
say to its share groups (``ShareGroups.set_group_configs``: the lock duration of the
next acquisition, the session timeout of the next heartbeat, a new share partition's
``share.auto.offset.reset``), so that the group's coordinator and the leaders of its
partitions, whichever brokers they are, use the same values. A group whose znode is
gone loses its overrides. A znode is read again when its watch fires; a failed read is
tried again a moment later.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import trio

from trio_broker.cluster.coordination import Coordination, CoordinationError
from trio_broker.cluster.topic_admin import decode_configs
from trio_broker.cluster.waiting import RETRY_S
from trio_broker.cluster.zk_layout import GROUP_CONFIGS, group_config_path, group_of_config_znode

__all__ = ["GroupConfigWatch"]

log = logging.getLogger(__name__)


class GroupConfigHolder(Protocol):
    """The broker's share groups (groups/share.py), which hold the group configs."""

    @property
    def group_configs(self) -> _Groups: ...

    def set_group_configs(self, group_id: str, configs: Mapping[str, str]) -> None: ...


class _Groups(Protocol):
    groups: dict[str, dict[str, str]]


class GroupConfigWatch:
    def __init__(self, coord: Coordination, holder: GroupConfigHolder) -> None:
        self.coord = coord
        self.holder = holder

    async def run(self) -> None:
        """Follow ``/config/groups`` for good (module docstring)."""
        while True:
            changed = trio.Event()
            try:
                await self.apply_all(changed)
            except CoordinationError as exc:
                log.info("reading the group configs: %s", exc)
            with trio.move_on_after(10 * RETRY_S):  # a failed read is tried again
                await changed.wait()

    async def apply_all(self, changed: trio.Event) -> None:
        """Read every group's configs (watching them and the list into ``changed``) and
        apply those that differ from this broker's."""
        # What this broker held before the reads: a group whose configs changed here
        # meanwhile (an alter taken by this broker applies its write at once) may have
        # been read before that write, and must not be set back to the older value.
        held_before = {g: dict(c) for g, c in self.holder.group_configs.groups.items()}
        names, _ = await self.coord.children_and_watch(GROUP_CONFIGS, into=changed)
        stored: dict[str, dict[str, str]] = {}
        for name in names:
            group_id = group_of_config_znode(name)
            node, _ = await self.coord.get_and_watch(group_config_path(group_id), into=changed)
            if node is not None:
                stored[group_id] = decode_configs(node.data)
        held = self.holder.group_configs.groups
        for group_id in sorted(set(held) | set(stored)):
            configs = stored.get(group_id, {})
            if held.get(group_id) != held_before.get(group_id):
                changed.set()  # read it again, after the change made here
                continue
            if held.get(group_id, {}) != configs:
                try:
                    self.holder.set_group_configs(group_id, configs)
                except OSError as exc:  # the data dir's copy; the memory one is set
                    log.warning("group %s: cannot keep configs %s: %s", group_id, configs, exc)
                    continue
                log.info("group %s: configs now %s", group_id, configs)
