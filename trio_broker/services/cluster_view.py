"""What this broker knows of its cluster: the live brokers and who the controller is.

Plain data, written by the cluster membership tasks (``trio_broker/cluster``) as
ZooKeeper tells them, read by handlers (Metadata, DescribeCluster). A broker that runs
alone has a view of one broker that is its own controller.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Protocol

import attrs

__all__ = ["BrokerInfo", "ClusterView", "MetadataView", "PartitionInfo", "TopicInfo"]


@attrs.frozen
class BrokerInfo:
    broker_id: int
    #: The first listener's advertised address (the registration's host and port).
    host: str
    port: int
    rack: str | None = None
    #: Every advertised listener as (name, host, port); empty for a registration that
    #: names none (then host/port serve every listener).
    endpoints: tuple[tuple[str, str, int], ...] = ()
    #: The zxid that created this registration (0: unknown): a broker that restarted
    #: registers anew, so this tells its lives apart (Kafka's broker epoch).
    registered_zxid: int = attrs.field(default=0, eq=False)

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """The address of ``listener`` (None: the first), or None if the broker has no
        such listener: Kafka then leaves the broker out of what it tells that client."""
        if listener is None or not self.endpoints:
            return (self.host, self.port)
        for name, host, port in self.endpoints:
            if name == listener:
                return (host, port)
        return None


@attrs.frozen
class PartitionInfo:
    replicas: tuple[int, ...]
    leader: int  # -1: offline (no live in-sync replica), or its state is not written yet
    leader_epoch: int
    isr: tuple[int, ...]
    #: During a reassignment (KIP-455): replicas joining, and replicas leaving once the
    #: joining ones are in sync; ``replicas`` is then the union, target replicas first.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    #: The zxid of the state's last write (0: unknown or not written): a state written
    #: before its leader's registration names a previous life of that broker as leader.
    state_zxid: int = attrs.field(default=0, eq=False)


@attrs.frozen
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionInfo]


@attrs.define(eq=False)
class ClusterView:
    broker_id: int
    #: Live brokers by id (this one included once it is registered).
    brokers: dict[int, BrokerInfo] = attrs.field(factory=dict)
    #: -1 while no broker holds the controller role.
    controller_id: int = -1
    #: Increases with every new controller; fences orders from a deposed one.
    controller_epoch: int = 0
    #: Every topic of the cluster with its partitions' replicas, leaders and ISRs.
    topics: dict[str, TopicInfo] = attrs.field(factory=dict)
    #: The last ``brokers`` that listed this broker: what clients are told while it is
    #: not listed (:meth:`brokers_on`). Set by the membership task as it reads the list.
    last_listing_self: dict[int, BrokerInfo] = attrs.field(factory=dict)

    @property
    def is_controller(self) -> bool:
        return self.controller_id == self.broker_id

    def brokers_on(self, listener: str | None) -> list[tuple[BrokerInfo, str, int]]:
        """Live brokers by id with their address on ``listener`` (the one a client
        connected to: Kafka answers each client with that listener's endpoints).

        While this broker is not among ``brokers`` -- its ZooKeeper session expired and
        it has not registered again, so ZooKeeper lists it (and every broker not back
        yet) as gone -- clients are told the last list that named it. A Kafka broker
        answers from its metadata cache then, which a lost session does not clear. A
        list without the broker answering makes librdkafka drop every broker it does not
        name, its connections and the group coordinator's with them (an empty one: all
        of them, until it bootstraps again), which stalled a consumer group for a minute
        after ZooKeeper came back with the sessions expired (issue 30).
        """
        if self.broker_id in self.brokers or not self.last_listing_self:
            return brokers_on(self.brokers, listener)
        return brokers_on(self.last_listing_self, listener)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)


def brokers_on(
    brokers: Mapping[int, BrokerInfo], listener: str | None
) -> list[tuple[BrokerInfo, str, int]]:
    """``brokers`` by id with their address on ``listener`` (those without it left out)."""
    out = []
    for broker_id in sorted(brokers):
        info = brokers[broker_id]
        address = info.endpoint(listener)
        if address is not None:
            out.append((info, *address))
    return out


class MetadataView(Protocol):
    """The brokers, the controller and the topics as Metadata, DescribeCluster and the
    topic lookups answer them: ``Services.leaders.view``, never None. A cluster's is the
    :class:`ClusterView` its replica manager keeps from ZooKeeper; a node alone's is
    itself, leading every partition of its own topics (``services/local_replication``).
    """

    @property
    def broker_id(self) -> int: ...

    @property
    def brokers(self) -> Mapping[int, BrokerInfo]:
        """Live brokers by id."""
        ...

    @property
    def controller_id(self) -> int:
        """-1 while no broker holds the controller role."""
        ...

    @property
    def topics(self) -> Mapping[str, TopicInfo]: ...

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...

    def brokers_on(self, listener: str | None) -> list[tuple[BrokerInfo, str, int]]: ...
