"""The throttled-replica lists of a topic, sans-I/O: Kafka's KIP-73 topic configs.

``leader.replication.throttled.replicas`` and ``follower.replication.throttled.replicas``
are LIST configs: comma-separated ``partition:brokerId`` pairs of non-negative integers
(``0:1,0:2,1:3``), or the single value ``*`` (every replica of the topic); the empty
string names no replica. Kafka's ThrottledReplicaListValidator accepts exactly that
(each element, trimmed, matches ``([0-9]+:[0-9]+)?``, or the elements join to ``*``).

What a listed pair means is the replication rules' (``replication/throttle.py``); this
module only reads and checks the values, for the topic config table
(``storage/topic_configs.py``) and the replica manager.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import attrs

__all__ = [
    "FOLLOWER_THROTTLED_REPLICAS",
    "LEADER_THROTTLED_REPLICAS",
    "THROTTLED_REPLICA_CONFIGS",
    "ThrottledReplicas",
    "parse_throttled_replicas",
    "throttled_replica_lists",
]

LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
THROTTLED_REPLICA_CONFIGS = (LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS)

_PAIR = re.compile(r"([0-9]+):([0-9]+)")
_INT32_MAX = 2**31 - 1


@attrs.frozen
class ThrottledReplicas:
    """One list: every replica of the topic (``everything``), or these (partition, broker)."""

    everything: bool = False
    replicas: frozenset[tuple[int, int]] = frozenset()

    def names(self, partition: int, broker: int) -> bool:
        """Is ``partition:broker`` on the list (``*`` names every replica)?"""
        return self.everything or (partition, broker) in self.replicas


@functools.lru_cache(maxsize=1024)  # read at every replica fetch: parse each value once
def parse_throttled_replicas(key: str, value: str) -> ThrottledReplicas:
    """The list ``value`` of config ``key``; ValueError (saying what is wrong) if malformed."""
    elements = [element.strip() for element in value.split(",")]
    if "".join(elements) == "*":
        return ThrottledReplicas(everything=True)
    replicas: set[tuple[int, int]] = set()
    for element in elements:
        if not element:
            continue  # "" names nothing; Kafka's validator lets empty elements pass
        match = _PAIR.fullmatch(element)
        if match is None:
            raise ValueError(
                f"{key} must be the literal '*' or a list of replicas in the form"
                f" [partitionId]:[brokerId],[partitionId]:[brokerId],..., got {value!r}"
            )
        partition, broker = int(match.group(1)), int(match.group(2))
        if partition > _INT32_MAX or broker > _INT32_MAX:
            raise ValueError(f"{key}: {element!r} is out of range (at most {_INT32_MAX})")
        replicas.add((partition, broker))
    return ThrottledReplicas(replicas=frozenset(replicas))


def throttled_replica_lists(
    configs: Mapping[str, str],
) -> tuple[ThrottledReplicas, ThrottledReplicas] | None:
    """A topic's (leader list, follower list), an unset one empty; None when it sets
    neither. Malformed values (never stored: the config checks refuse them) name nothing."""
    if not any(key in configs for key in THROTTLED_REPLICA_CONFIGS):
        return None
    lists = []
    for key in THROTTLED_REPLICA_CONFIGS:
        try:
            lists.append(parse_throttled_replicas(key, configs.get(key, "")))
        except ValueError:
            lists.append(ThrottledReplicas())
    return lists[0], lists[1]
