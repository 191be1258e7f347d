"""This broker's replication throttles (KIP-73) as the rates in force say, right now.

Which replicas are throttled, and the byte budget itself, are pure rules
(``replication/throttle.py``); what this module adds is where their inputs come from
at runtime: the rates are the dynamic broker configs in force (``topics.broker_configs``,
set by AlterConfigs on the BROKER resource), else the config file's; the lists are the
topic's configs on this broker's copy; the ISR is the leader term's (the view's when
this broker does not lead). The leader's budget is shared by every partition it leads,
and made again when the rate in force changes.

The replica manager owns one (``ReplicaManager.throttles``) and answers the data path
(``leader_throttle_budget``) and its fetchers (``follower_throttled``) from it.
No trio: the caller passes nothing but names, and the clock is ``host.now_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from trio_broker.replication.leader import LeaderPartition
from trio_broker.replication.throttle import (
    UNLIMITED_RATE,
    ByteBudget,
    follower_throttles,
    leader_throttles,
)
from trio_broker.services.cluster_view import ClusterView, PartitionInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.broker_configs import FOLLOWER_THROTTLED_RATE, LEADER_THROTTLED_RATE

__all__ = ["ReplicationThrottles", "ThrottleHost"]


class ThrottleHost(Protocol):
    """What the throttles read of the replica manager that owns them."""

    view: ClusterView
    topics: TopicManager
    #: (topic, partition) -> this broker's leader term.
    terms: dict[tuple[str, int], LeaderPartition]
    now_ms: Callable[[], int]

    def partition(self, topic: str, partition: int) -> PartitionInfo | None: ...


class ReplicationThrottles:
    """The leader's and the follower's throttles of one broker (module docstring)."""

    def __init__(
        self, host: ThrottleHost, *, follower_throttle_rate: int, leader_throttle_rate: int
    ) -> None:
        self._host = host
        #: The config file's follower.replication.throttled.rate and
        #: leader.replication.throttled.rate (bytes/s); the dynamic broker configs
        #: (``topics.broker_configs``) override them at runtime.
        self.static_follower_throttle_rate = follower_throttle_rate
        self.static_leader_throttle_rate = leader_throttle_rate
        #: The leader's byte budget for throttled fetches, all partitions together; made
        #: again when the rate in force changes (None: no limit).
        self._leader_budget: ByteBudget | None = None

    @property
    def follower_throttle_rate(self) -> int:
        """follower.replication.throttled.rate in force (bytes/s, at least 1)."""
        rate = self._host.topics.broker_configs.throttle_rate(
            FOLLOWER_THROTTLED_RATE, self.static_follower_throttle_rate
        )
        return max(1, rate)

    @property
    def leader_throttle(self) -> ByteBudget | None:
        """The leader's budget at leader.replication.throttled.rate in force (None: no
        limit). A new rate (AlterConfigs on the BROKER resource) starts a new budget."""
        rate = self._host.topics.broker_configs.throttle_rate(
            LEADER_THROTTLED_RATE, self.static_leader_throttle_rate
        )
        if rate >= UNLIMITED_RATE:
            self._leader_budget = None
        elif self._leader_budget is None or self._leader_budget.rate != max(1, rate):
            self._leader_budget = ByteBudget(max(1, rate))
        return self._leader_budget

    def _topic_configs_here(self, name: str) -> Mapping[str, str]:
        local = self._host.topics.get(name)
        return local.info.configs if local is not None else {}

    def leader_throttle_budget(self, name: str, partition: int, replica: int) -> int | None:
        """Bytes a fetch of ``replica`` may read from this partition now, when this leader
        throttles it (replication/throttle.py: the topic's leader list, or a replica a
        reassignment is adding or that this view does not list yet, and a rate set);
        else None."""
        budget = self.leader_throttle
        if budget is None:
            return None
        info = self._host.partition(name, partition)
        if info is None:
            return None
        term = self._host.terms.get((name, partition))
        isr = term.isr if term is not None else frozenset(info.isr)
        configs = self._topic_configs_here(name)
        me = self._host.view.broker_id
        adding, replicas = info.adding_replicas, info.replicas
        if not leader_throttles(configs, partition, me, replica, adding, isr, replicas):
            return None
        return budget.available(self._host.now_ms())

    def leader_throttle_used(self, nbytes: int) -> None:
        budget = self.leader_throttle
        if budget is not None:
            budget.take(nbytes, self._host.now_ms())

    def follower_throttled(self, name: str, partition: int) -> bool:
        """Does this broker throttle its own fetching of the partition (the topic's
        follower list, or a replica a reassignment is adding, and a rate set)?"""
        if self.follower_throttle_rate >= UNLIMITED_RATE:
            return False
        info = self._host.partition(name, partition)
        if info is None:
            return False
        configs = self._topic_configs_here(name)
        me = self._host.view.broker_id
        return follower_throttles(configs, partition, me, info.adding_replicas, info.isr)
