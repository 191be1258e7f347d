"""The replica manager's decisions about its leader terms, pure.

``cluster/replica_manager.py`` holds this broker's terms (:class:`LeaderPartition`)
and follower roles, and feeds them what happens: a leader's log moving, a follower's
fetch, a term ending and another beginning. The rules of each are here, with no I/O:

- :func:`leader_log_progress`: how far the leader's log counts for its term;
- :func:`record_follower_fetch` and :func:`leaving_replica`: what a follower's fetch
  tells the term, and whether a replica a reassignment removes may rejoin the ISR;
- :class:`HighWatermarkFloors`: where a new term's (or a follower role's) HW starts,
  never below what an earlier term of this broker showed.

No trio, no files.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from trio_broker.replication.leader import IsrProposal, NotAReplica

__all__ = [
    "HighWatermarkFloors",
    "Key",
    "LeaderTerm",
    "leader_log_progress",
    "leaving_replica",
    "record_follower_fetch",
]

#: (topic, partition).
Key = tuple[str, int]


class LeaderTerm(Protocol):
    """What these rules read and tell of a leader term: a cluster's
    (``replication/leader.py``'s ``LeaderPartition``), or a node alone's, a replica set
    of one (``services/local_replication.py``'s ``LocalTerm``: no follower, so a
    replica's fetch names no replica of it and records nothing, as Kafka's
    ``Partition`` answers a fetch from a broker outside its replicas). One type for
    both, so that the caller (``partition/read.py``) asks no term what it is."""

    @property
    def log_end_offset(self) -> int: ...
    @property
    def durable_end_offset(self) -> int: ...

    def leader_appended(self, log_end_offset: int) -> None: ...
    def leader_synced(self, durable_end_offset: int) -> bool: ...

    def follower_fetched(
        self, replica_id: int, fetch_offset: int, now_ms: int, *, may_join: bool = True
    ) -> tuple[bool, IsrProposal | None]: ...

    def follower_log_start(self, replica_id: int, log_start_offset: int) -> bool: ...


def leader_log_progress(term: LeaderTerm, log_end_offset: int, counted_end_offset: int) -> bool:
    """Tell ``term`` how far its leader's log is appended (``log_end_offset``) and counts
    (``counted_end_offset``: synced, or appended when acks.all.fsync is off); neither
    goes back. True if the term's log end or HW moved (both news for the partition's
    waiting fetches: followers read up to the log end, consumers up to the HW)."""
    appended = log_end_offset > term.log_end_offset
    term.leader_appended(max(log_end_offset, term.log_end_offset))
    durable = min(max(counted_end_offset, term.durable_end_offset), term.log_end_offset)
    return term.leader_synced(durable) or appended


def leaving_replica(
    replica: int, removing: Collection[int], adding: Collection[int], isr: Collection[int]
) -> bool:
    """A replica a reassignment removes, once every joining one is in the ISR: the
    controller is ending the move (its two writes may not both be seen yet), so the
    replica must not come back into the ISR. While the move is under way it may, as
    in Kafka."""
    return replica in removing and set(adding) <= set(isr)


def record_follower_fetch(
    term: LeaderTerm,
    replica: int,
    fetch_offset: int,
    log_start_offset: int,
    now_ms: int,
    *,
    may_join: bool,
) -> tuple[bool, IsrProposal | None]:
    """A follower's fetch in the term's epoch: it holds everything below
    ``fetch_offset`` and its log starts at ``log_start_offset``. A fetch past the log
    end (answered OFFSET_OUT_OF_RANGE) records nothing, nor does one of a replica a
    reassignment removed. Returns whether the partition's waiters should look again
    (the HW moved, or the low watermark DeleteRecords waits for may have) and an ISR
    change to store, if any."""
    if fetch_offset > term.log_end_offset:
        return False, None
    moved, proposal = False, None
    try:
        moved, proposal = term.follower_fetched(replica, fetch_offset, now_ms, may_join=may_join)
    except NotAReplica:  # a replica a reassignment removed, fetching in this epoch
        pass
    return term.follower_log_start(replica, log_start_offset) or moved, proposal


class HighWatermarkFloors:
    """The HW each ended term of this broker reached, per partition: a later term, or a
    follower role, starts there at least.

    Those records were on every ISR member when that HW was shown, so a clean election
    kept them, and a consumer of this broker never sees its HW go back (a follower's
    HW, learned from its leader, can lag what it showed). A leader's start is capped
    at its log end (only an unclean election cuts below). Forgotten with the replica.
    """

    def __init__(self) -> None:
        self._reached: dict[Key, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._reached

    def term_ended(self, key: Key, high_watermark: int) -> None:
        self._reached[key] = max(self._reached.get(key, 0), high_watermark)

    def leader_start(self, key: Key, log_end_offset: int, *known: int) -> int:
        """A new term's HW: the highest ``known`` to this replica (its previous term's,
        its follower role's) or reached by an ended term, capped at the log end."""
        return min(max(0, *known, self._reached.get(key, 0)), log_end_offset)

    def follower_start(self, key: Key, role_high_watermark: int) -> int:
        """A new follower role's HW: the HW belongs to the log, not the role (as Kafka's
        log keeps it), so a leader turned follower keeps what its terms reached, and a
        truncation that falls back to the HW does not cut below it."""
        return max(role_high_watermark, self._reached.get(key, 0))

    def forget(self, key: Key) -> None:
        self._reached.pop(key, None)

    def forget_topic(self, name: str) -> None:
        for key in [k for k in self._reached if k[0] == name]:
            del self._reached[key]
