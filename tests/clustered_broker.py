"""A broker in a cluster as its coordinators and handlers see it, in process (no
ZooKeeper, no sockets), for the unit tests of the group, transaction and share
coordinators in a cluster (tests/unit/groups/test_groups_cluster.py,
tests/unit/transactions/test_txn_cluster.py, tests/unit/handlers/test_share_*.py).

The replica manager is a stand-in the test feeds directly: which partitions this broker
leads and in which leader epoch (``terms``), the cluster's view, and how a write's wait
for the high watermark ends (``wait_committed``). The logs, the flusher, the
coordinators and the handlers are the broker's own.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from trio_broker.config import BrokerConfig
from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.replication.leader import AckState
from trio_broker.server.flusher import Flusher
from trio_broker.services.cluster_view import ClusterView, PartitionInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

#: This broker's id.
ME = 1


@attrs.define
class Term:
    """A cluster leader's term of one partition (partition/append.py's Term)."""

    leader_epoch: int
    replicated: bool = True
    #: What a read of the partition may see (the tests that read one acquire in the
    #: share partition itself, so nothing is readable).
    high_watermark: int = 0


@attrs.define(eq=False)
class Replication:
    """The replica manager as the coordinators see it: terms, the view, the HW wait, and
    the internal topics it was asked to create."""

    view: ClusterView = attrs.field(factory=lambda: ClusterView(ME))
    terms: dict[tuple[str, int], Term] = attrs.field(factory=dict)
    #: What a write's wait answers once its term still holds; None: it never ends (the
    #: followers do not fetch).
    ack: AckState | None = AckState.DONE
    #: While set, every wait waits for it first (a write in flight).
    hold: trio.Event | None = None
    #: How many of the next writes never reach the high watermark (as a partition whose
    #: ISR still names a dead follower): each ends NOT_ENOUGH_REPLICAS_AFTER_APPEND.
    uncommitted_writes: int = 0
    #: Each ``ensure_internal_topic_soon``: (name, partitions, replication factor, configs).
    created: list[tuple[str, int, int, dict[str, str]]] = attrs.field(factory=list)

    def leader_term(self, topic: str, partition: int) -> Term | None:
        return self.terms.get((topic, partition))

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """As the replica manager: the partition as its view has it."""
        info = self.view.topics.get(topic)
        return None if info is None else info.partitions.get(partition)

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """As the replica manager: the view names this broker, its term is not begun."""
        held = self.partition(topic, partition)
        return (held is not None and held.leader == self.view.broker_id
                and self.leader_term(topic, partition) is None)  # fmt: skip

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        if self.hold is not None:
            await self.hold.wait()
        if self.ack is None:
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        if (topic, partition) not in self.terms:
            return AckState.LEADERSHIP_LOST
        if self.uncommitted_writes > 0:
            self.uncommitted_writes -= 1
            return AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        assert self.ack is not None
        return self.ack

    def ensure_internal_topic_soon(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        self.created.append((name, partitions, replication_factor, configs))


@attrs.define
class ClusteredBroker:
    """What the coordinators and the group and share handlers use of a Broker in a
    cluster (server/broker.py's services)."""

    config: BrokerConfig
    flusher: Flusher = attrs.field(factory=Flusher)
    log_defaults: LogConfig = attrs.field(factory=LogConfig)
    replication: Replication = attrs.field(factory=Replication)
    leadership_listeners: dict[str, Any] = attrs.field(factory=dict)
    #: None: every request is allowed (handlers/authorization.py).
    authorizer: Any = None
    topics: TopicManager = attrs.field(factory=lambda: TopicManager(None, LogConfig(), lambda: 0))
    shares: ShareGroups = attrs.field(factory=lambda: ShareGroups(ShareGroupsConfig()))
    groups: Any = None
    #: Asked by a ShareFetch's acquisition in a read_committed group only.
    producers: Any = None
    share_coordinator: Any = None

    @property
    def leaders(self) -> Replication:
        """Services.leaders: in a cluster, the replica manager."""
        return self.replication

    @property
    def admin(self) -> Replication:
        """Services.admin: in a cluster, the replica manager's (internal topics)."""
        return self.replication

    @property
    def durability(self) -> Flusher:
        return self.flusher

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    def advertised_for(self, connection_id: int | None) -> tuple[str, int]:
        return ("127.0.0.1", 9092)

    def listener_name_for(self, connection_id: int | None) -> str:
        return "PLAINTEXT"
