"""This broker's local copies of the cluster's topics: made, grown and deleted.

A replica makes its copy of a topic (the local logs) when the topic appears in its view
with a partition assigned to it, and grows it with the topic. A copy goes when ZooKeeper
confirms the cluster lost it, never on the view's word alone (a topic znode that does
not parse, or a view not read yet, must not cost data):

- the cluster deleted the topic (:meth:`LocalCopies.drop_deleted_topic`);
- it was deleted, or deleted and made again under its name (another topic id), while
  this broker was away: a *stray* log, looked for once when ZooKeeper first answers
  (:meth:`LocalCopies.delete_strays`), as Kafka finds stray logs by topic id;
- a reassignment moved this broker's replica away (:meth:`LocalCopies.drop_replica`).

Internal topics are left to their coordinators. The replica manager owns one
(``ReplicaManager.copies``); deleting a copy ends this broker's roles in the topic first
(:class:`LocalCopiesHost`).
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

import trio

from trio_broker.cluster.config_watch import read_topic_configs
from trio_broker.cluster.coordination import Coordination, CoordinationError, NoNode
from trio_broker.cluster.zk_layout import (
    TOPICS,
    CoordinationDataError,
    TopicAssignment,
    topic_path,
)
from trio_broker.services.cluster_view import ClusterView
from trio_broker.services.topics import RESERVED_TOPICS, Topic, TopicError, TopicManager

__all__ = ["LocalCopies", "LocalCopiesHost"]

log = logging.getLogger(__name__)


class LocalCopiesHost(Protocol):
    """What the local copies need of the replica manager that owns them."""

    view: ClusterView
    coord: Coordination
    topics: TopicManager

    def drop_roles(self, name: str) -> None:
        """End every role this broker has in topic ``name``, and forget its terms' HWs."""
        ...


class LocalCopies:
    """The cluster topics this broker holds a copy of (module docstring)."""

    def __init__(self, host: LocalCopiesHost) -> None:
        self._host = host
        #: Cluster topics this broker keeps a local copy of (since it started): deleted
        #: locally when the cluster deletes them.
        self.names: set[str] = set()
        #: Stray local topics were looked for once ZooKeeper answered (:meth:`delete_strays`).
        self.strays_checked = False

    async def delete_strays_once(self) -> None:
        """:meth:`delete_strays`, until it has checked every local topic once."""
        if not self.strays_checked:
            self.strays_checked = await self.delete_strays()

    async def delete_strays(self) -> bool:
        """Delete the local topics the cluster no longer has: deleted while this broker
        was away, or deleted and made again under the same name (another topic id).
        Kafka finds such stray logs by topic id when a broker returns and deletes them.
        Each is confirmed by reading its znode first, so an empty or stale view never
        costs data, and nothing goes when ZooKeeper holds no topic at all (pointed at a
        new or wiped ensemble); internal topics are left to their coordinators. True once
        every local topic was checked (False: ZooKeeper failed, ask again next view
        change)."""
        topics = self._host.topics
        candidates = [name for name in topics.topics if name not in RESERVED_TOPICS]
        if not candidates:
            return True
        try:
            try:
                in_zookeeper, _ = await self._host.coord.children_and_watch(TOPICS)
            except NoNode:
                in_zookeeper = []
        except CoordinationError as exc:
            log.info("looking for stray topics: %s", exc)
            return False
        if not in_zookeeper:  # a new or wiped ZooKeeper more likely than every topic deleted
            log.warning("ZooKeeper holds no topic at all: keeping the %d local topic(s) "
                        "(delete them by hand if the cluster really deleted them)",
                        len(candidates))  # fmt: skip
            return True
        checked = True
        for name, local in list(topics.topics.items()):
            cluster = self._host.view.topics.get(name)
            if name in RESERVED_TOPICS or (
                cluster is not None and cluster.topic_id == local.topic_id
            ):
                continue
            try:
                stray = await self.is_stray(name, local.topic_id)
            except CoordinationError as exc:
                log.info("checking local topic %s against ZooKeeper: %s", name, exc)
                checked = False
                continue
            if stray:
                self.delete(name, "a stray log (deleted or replaced in the cluster)")
        return checked

    async def is_stray(self, name: str, local_id: uuid.UUID) -> bool:
        """ZooKeeper confirms: no topic ``name``, or one with another id than the local
        copy's. A znode that does not parse confirms nothing. Raises CoordinationError."""
        node = await self._host.coord.get(topic_path(name))
        if node is None:
            return True
        try:
            return TopicAssignment.decode(node.data, topic_path(name)).topic_id != local_id
        except CoordinationDataError:
            return False

    def delete(self, name: str, why: str) -> None:
        """Drop every role in topic ``name`` and delete the local copy."""
        self.names.discard(name)
        self._host.drop_roles(name)
        topics = self._host.topics
        if topics.get(name) is not None:
            topics.delete(name)
            log.info("topic %s: local copy deleted: %s", name, why)

    async def drop_deleted_topics(self) -> None:
        """:meth:`drop_deleted_topic` for each copy the view no longer names."""
        for name in self.names - set(self._host.view.topics):
            await self.drop_deleted_topic(name)

    async def drop_deleted_topic(self, name: str) -> None:
        """The cluster deleted the topic: so does this broker, once ZooKeeper confirms it
        (a topic znode that does not parse is left out of the view too, and must not cost
        the local copy)."""
        try:
            if await self._host.coord.get(topic_path(name)) is not None:
                return
        except CoordinationError:
            return  # ask again at the next view change
        self.delete(name, "deleted by the cluster")

    async def drop_replica(self, name: str, partition: int) -> None:
        """This broker is no longer a replica of the partition: its copy goes, the whole
        local topic if it holds no other partition of it."""
        topics = self._host.topics
        topic = self._host.view.topics.get(name)
        me = self._host.view.broker_id
        if topic is not None and not any(me in i.replicas for i in topic.partitions.values()):
            if topics.get(name) is not None:
                topics.delete(name)
                log.info("no longer a replica of any partition of %s: local topic deleted", name)
            return
        local = topics.get(name)
        if local is not None and 0 <= partition < len(local.logs):
            local.drop_partition(partition)  # its Partition goes with the role
            log_ = local.logs[partition]
            await trio.to_thread.run_sync(log_.delete_records, log_.log_end_offset)
            log.info("no longer a replica of %s-%d: its records deleted", name, partition)

    async def ensure(self, name: str, topic_id: uuid.UUID, partitions: int) -> Topic | None:
        """This broker's copy of cluster topic ``name``, made or grown to ``partitions``
        as the view has it, and counted in :attr:`names`; None if there is none to
        replicate into (the log here is another topic's, or it cannot be made)."""
        topics = self._host.topics
        local = topics.get(name)
        if local is not None and local.topic_id != topic_id:
            # The topic was deleted and made again under its name: the local copy is
            # the old topic's, a stray log once ZooKeeper confirms the new id (never
            # overwrite data of another topic on the view's word alone).
            try:
                stray = name not in RESERVED_TOPICS and await self.is_stray(name, local.topic_id)
            except CoordinationError:
                stray = False
            if not stray:
                log.error("topic %s: the local log has id %s, the cluster's topic %s; not "
                          "replicating it", name, local.topic_id, topic_id)  # fmt: skip
                return None
            self.delete(name, f"replaced in the cluster by topic id {topic_id}")
            local = None
        configs = await read_topic_configs(self._host.coord, name)
        if local is None:
            try:
                local = topics.create(name, partitions, configs, topic_id=topic_id,
                                      internal=name in RESERVED_TOPICS)  # fmt: skip
            except TopicError as exc:
                log.warning("cannot create local topic %s: %s", name, exc)
                return None
        elif len(local.logs) < partitions:
            local = topics.add_partitions(name, partitions)
        self.names.add(name)
        return local
