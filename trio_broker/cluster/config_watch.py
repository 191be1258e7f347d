"""Topic configs and the cluster-wide broker config default, kept as ZooKeeper has them.

An AlterConfigs taken by any broker is a write of a config znode (``topic_admin.py``);
every broker watches the znodes of the topics it holds a copy of, and the cluster-wide
default of the dynamic broker configs (Kafka's entity-default znode), and applies what
they say without a restart: to its copy of the topic (its logs' settings) and to its
leader terms (min.insync.replicas, whose value in force is
``BrokerConfigStore.min_insync_replicas``'s rule). A znode is read again when its watch
fires (one watch per znode at a time); a view change brings new topics in.

The replica manager owns one (``ReplicaManager.configs``) and runs :meth:`run` in its
nursery; what it needs of the manager is :class:`ConfigWatchHost`.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from trio_broker.cluster.coordination import Coordination, CoordinationError
from trio_broker.cluster.topic_admin import decode_configs
from trio_broker.cluster.waiting import RETRY_S, Watch, wait_any
from trio_broker.cluster.zk_layout import BROKER_DEFAULT_CONFIG, topic_config_path
from trio_broker.replication.leader import LeaderPartition
from trio_broker.services.topics import TopicError, TopicManager
from trio_broker.storage.broker_configs import CLUSTER_DEFAULT

__all__ = ["ConfigWatchHost", "TopicConfigWatch", "read_topic_configs"]

log = logging.getLogger(__name__)


class ConfigWatchHost(Protocol):
    """What the config watch needs of the replica manager that owns it."""

    coord: Coordination
    topics: TopicManager
    #: (topic, partition) -> this broker's leader term.
    terms: dict[tuple[str, int], LeaderPartition]
    #: The cluster topics this broker holds a copy of: whose config znodes are watched.
    local_copies: set[str]

    def view_event(self) -> Watch:
        """Set at the next change of the view."""
        ...

    def wake(self, key: tuple[str, int]) -> None:
        """The partition's acks=all waiters and long polls look again."""
        ...


async def read_topic_configs(coord: Coordination, name: str) -> dict[str, str]:
    """Topic ``name``'s stored overrides; none when the znode is missing or ZooKeeper
    fails (the watch applies them later)."""
    try:
        node = await coord.get(topic_config_path(name))
    except CoordinationError:
        return {}
    return decode_configs(node.data) if node is not None else {}


class TopicConfigWatch:
    """Applies the config znodes to this broker's copies and terms (module docstring)."""

    def __init__(self, host: ConfigWatchHost, *, min_insync_replicas: int) -> None:
        self._host = host
        #: The config file's min.insync.replicas, the last resort of a term's value.
        self.static_min_insync_replicas = min_insync_replicas

    def min_insync(self, configs: dict[str, str]) -> int:
        """The topic's min.insync.replicas, else the dynamic broker config in force (this
        broker's, else the cluster-wide default), else the config file's."""
        broker_configs = self._host.topics.broker_configs
        return broker_configs.min_insync_replicas(configs, self.static_min_insync_replicas)

    def local_configs(self, name: str) -> dict[str, str]:
        """The configs of this broker's copy of topic ``name`` (none without a copy)."""
        local = self._host.topics.get(name)
        return dict(local.info.configs) if local is not None else {}

    def apply_min_insync(
        self, name: str | None = None, configs: dict[str, str] | None = None
    ) -> None:
        """Every term's (of topic ``name`` with its ``configs``, or all) min.insync.replicas
        as in force now."""
        for key, term in list(self._host.terms.items()):
            if name is not None and key[0] != name:
                continue
            min_insync = self.min_insync(
                configs if configs is not None else self.local_configs(key[0])
            )
            if term.min_insync_replicas != min_insync:
                term.min_insync_replicas = min_insync
                self._host.wake(key)  # acks=all waiters see the new rule
                log.info("%s-%d: min.insync.replicas now %d", *key, min_insync)

    async def run(self) -> None:
        """Follow the config znodes for good (module docstring)."""
        host = self._host
        watching: dict[str, Watch] = {}
        default_watch: Watch | None = None
        while True:
            view_changed = host.view_event()
            if default_watch is None or default_watch.is_set():
                # The cluster-wide default of the dynamic broker configs (any broker's
                # AlterConfigs of the BROKER resource "").
                try:
                    node, default_watch = await host.coord.get_and_watch(BROKER_DEFAULT_CONFIG)
                except CoordinationError as exc:
                    log.info("reading the broker default configs: %s", exc)
                    default_watch = None
                else:
                    self.apply_cluster_default_configs(
                        decode_configs(node.data) if node is not None else {}
                    )
            for name in sorted(host.local_copies):
                if name in watching and not watching[name].is_set():
                    continue
                try:
                    node, watching[name] = await host.coord.get_and_watch(topic_config_path(name))
                except CoordinationError as exc:
                    log.info("reading the configs of %s: %s", name, exc)
                    watching.pop(name, None)
                    continue
                if node is not None:
                    self.apply_topic_configs(name, decode_configs(node.data))
            for gone in set(watching) - host.local_copies:
                del watching[gone]
            with trio.move_on_after(10 * RETRY_S):  # a failed read is tried again
                defaults = () if default_watch is None else (default_watch,)
                await wait_any(view_changed, *defaults, *watching.values())

    def apply_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Topic ``name``'s stored overrides: to this broker's copy and leader terms."""
        topics = self._host.topics
        local = topics.get(name)
        if local is not None and dict(local.info.configs) != configs:
            try:
                topics.set_configs(name, configs)
                log.info("topic %s: configs now %s", name, configs)
            except (TopicError, OSError) as exc:
                log.warning("topic %s: cannot apply configs %s: %s", name, configs, exc)
        self.apply_min_insync(name, configs)

    def apply_cluster_default_configs(self, configs: dict[str, str]) -> None:
        """The dynamic broker configs' cluster-wide default as ZooKeeper holds it: to
        this broker's logs and leader terms (``on_broker_configs_changed``)."""
        topics = self._host.topics
        if topics.broker_configs.get(CLUSTER_DEFAULT) == configs:
            return
        try:
            topics.set_broker_configs(CLUSTER_DEFAULT, configs)
            log.info("broker default configs now %s", configs)
        except (TopicError, OSError) as exc:
            log.warning("cannot apply broker default configs %s: %s", configs, exc)
