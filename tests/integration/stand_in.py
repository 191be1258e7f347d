"""An in-process broker's replica manager, as broker_node.py would attach it once the
broker joined a cluster, over an in-memory ZooKeeper: tests then give it the view and
the roles they need (a follower, a leader with another replica)."""

from __future__ import annotations

from typing import Any

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import ClusterView


def stand_in_replica_manager(broker: Broker, **overrides: Any) -> ReplicaManager:
    """min.insync.replicas 1, a 60 s replica lag, the broker's clock, long polls and
    producer state;
    ``overrides``: other ReplicaManager arguments (a still clock, throttle rates)."""
    arguments: dict[str, Any] = dict(
        min_insync_replicas=1, replica_lag_time_max_ms=60_000, now_ms=broker.now_ms,
        durability=None, on_partition_changed=broker.appends.notify,
        # The broker's registry, as broker_node.py passes it: the Partitions the manager
        # takes keep the producer state the broker's handlers and cleaner read.
        producers=broker.producers,
    )  # fmt: skip
    arguments.update(overrides)
    return ReplicaManager(
        ClusterView(broker.config.node_id), MemoryCoordination(MemoryZooKeeper()),
        broker.topics, **arguments,
    )  # fmt: skip
