"""Replication throttles (KIP-73), pure: which replicas are throttled, and the leader's
byte budget.

**Which replicas.** A topic's throttled-replica lists (``storage/throttled_replicas.py``)
name ``partition:broker`` pairs, as Kafka reads them: the leader list names brokers that,
while they *lead* the partition, throttle serving it to followers
(:func:`leader_throttles`); the follower list names brokers that throttle their *own*
fetching of it (:func:`follower_throttles`); ``*`` names every replica. As in Kafka, a
replica in the ISR is never throttled (the leader serves it, and it fetches, at full
speed), so a list naming a partition's current replicas slows only the ones catching up.
Kafka's reassignment tool (``--throttle``) lists the existing replicas on the leader side
and the ones a move adds on the follower side. A topic that sets neither list keeps
this broker's own rule: the replicas a reassignment is adding are throttled, on both sides.
On the leader's side that rule also throttles a fetcher the leader does not know as a
replica: the joining replica learns of a move from its own ZooKeeper watch and may fetch
before the leader's view lists it as adding, and it must not get those first bytes free.

**The leader's budget.** ``leader.replication.throttled.rate`` bytes per second, shared
by every partition this broker leads, for the throttled fetches (as Kafka's leader
quota). A fetch reads at most :meth:`ByteBudget.available` bytes of a throttled partition and
reports what it read (:meth:`ByteBudget.take`); the budget may go below zero once (a
fetch returns at least one whole batch), and the next fetches then wait for it to
refill. Holds at most one second's worth, so an idle stretch does not store up a burst.
Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from trio_broker.storage.throttled_replicas import throttled_replica_lists

__all__ = ["UNLIMITED_RATE", "ByteBudget", "follower_throttles", "leader_throttles"]

#: A replication throttle rate this high (Kafka's default, Long.MAX_VALUE) throttles nothing.
UNLIMITED_RATE = 2**63 - 1


def leader_throttles(
    configs: Mapping[str, str],
    partition: int,
    leader: int,
    replica: int,
    adding: Collection[int],
    isr: Collection[int],
    replicas: Collection[int],
) -> bool:
    """Does ``leader`` throttle serving ``replica``'s fetches of ``partition`` (a topic
    with these ``configs``; ``adding``: the replicas a reassignment adds; ``replicas``: the
    partition's replicas as the leader's view has them)?"""
    if replica in isr:
        return False  # in sync: never throttled, whatever the lists (Kafka's rule)
    lists = throttled_replica_lists(configs)
    if lists is None:
        return replica in adding or replica not in replicas
    return lists[0].names(partition, leader)


def follower_throttles(
    configs: Mapping[str, str],
    partition: int,
    follower: int,
    adding: Collection[int],
    isr: Collection[int],
) -> bool:
    """Does ``follower`` throttle its own fetching of ``partition``?"""
    if follower in isr:
        return False  # in sync: never throttled (a joiner in the ISR before the move ends)
    lists = throttled_replica_lists(configs)
    if lists is None:
        return follower in adding
    return lists[1].names(partition, follower)


@attrs.define
class ByteBudget:
    rate: int  # bytes per second, > 0
    _available: float = attrs.field(init=False, default=0.0)
    _at_ms: int | None = attrs.field(init=False, default=None)

    def _refill(self, now_ms: int) -> None:
        if self._at_ms is None:
            self._available = float(self.rate)
        elif now_ms > self._at_ms:
            self._available += (now_ms - self._at_ms) * self.rate / 1000
        self._available = min(self._available, float(self.rate))
        self._at_ms = now_ms if self._at_ms is None else max(self._at_ms, now_ms)

    def available(self, now_ms: int) -> int:
        """Whole bytes that may be read now (0 while the budget is spent)."""
        self._refill(now_ms)
        return max(0, int(self._available))

    def take(self, nbytes: int, now_ms: int) -> None:
        self._refill(now_ms)
        self._available -= nbytes
