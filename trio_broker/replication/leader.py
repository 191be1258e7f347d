"""A partition leader's view of its replicas: the ISR, the high watermark, acks=all.

The leader learns what a follower holds only from the follower's fetches: a fetch at
offset X says "I have everything below X". From those and its own log end it keeps

- the **high watermark (HW)**: the smallest log end among the leader and the ISR. Only
  records below it are shown to consumers and count as committed. It never goes back.
- the **ISR**: followers that caught up with the leader's log end within
  ``replica.lag.time.max.ms``. A lagging follower is proposed for removal; a follower
  that reaches the HW is proposed for addition. A proposal takes effect only when the
  coordination service (ZooKeeper) has stored it: until then the HW is computed over
  the larger of the two sets, so it never counts on a replica the stored ISR lacks.
- **acks=all**: a write is answered once the HW passes it, and only while the ISR has
  at least the *effective* ``min.insync.replicas`` members (else NOT_ENOUGH_REPLICAS
  before the append, NOT_ENOUGH_REPLICAS_AFTER_APPEND after it). Effective: at most the
  partition's replica count, as in Kafka since 3.7 (its ``effectiveMinIsr``), so that a
  topic with fewer replicas than the setting is not refused acks=all writes forever.

"Log end" for the HW is what the broker has made durable: with the default durability a
replica counts a write only after its fsync (the leader through ``leader_synced``, a
follower by fetching past it only after syncing). Pure and sync; the shell persists
ISR proposals and performs the waits.
"""

from __future__ import annotations

import enum
from collections.abc import Container

import attrs

from trio_broker.state.mute import StateMachineError

__all__ = [
    "AckState",
    "FollowerProgress",
    "IsrProposal",
    "LeaderPartition",
    "NotAReplica",
]


class NotAReplica(StateMachineError):
    """A fetch claimed to come from a broker that is not a replica of this partition."""


class AckState(enum.Enum):
    WAITING = "waiting"  # the HW has not passed the write yet
    DONE = "done"  # committed: answer the producer without error
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "not_enough_replicas_after_append"
    #: The term ended before the write committed (another broker leads, or this one
    #: shuts down): NOT_LEADER_OR_FOLLOWER, as Kafka answers a delayed produce then.
    LEADERSHIP_LOST = "leadership_lost"


@attrs.frozen
class IsrProposal:
    """An ISR change for the shell to store (conditionally) in the coordination service."""

    leader_epoch: int
    isr: frozenset[int]


@attrs.define
class FollowerProgress:
    #: Everything below this offset is on the follower (its last fetch offset); -1: unknown.
    log_end_offset: int = -1
    #: When the follower last held all the leader had (ms); starts at the term's start.
    last_caught_up_ms: int = 0
    #: The leader's log end and the clock at the follower's previous fetch.
    previous_fetch_leader_end: int = -1
    previous_fetch_ms: int = 0
    #: The follower's log start offset as its last fetch told (-1: not yet this term).
    log_start_offset: int = -1


@attrs.define(eq=False)
class LeaderPartition:
    """One leader term of one partition: created on becoming leader, dropped on losing it."""

    broker_id: int
    leader_epoch: int
    replicas: tuple[int, ...]
    min_insync_replicas: int
    replica_lag_time_max_ms: int
    #: The ISR as stored in the coordination service (includes the leader).
    isr: frozenset[int]
    #: Log end offset at which this term began: the new leader's first own offset.
    epoch_start_offset: int
    #: The leader's appended log end (what followers can fetch) and its durable end.
    log_end_offset: int
    durable_end_offset: int
    high_watermark: int
    followers: dict[int, FollowerProgress]
    #: An ISR change sent to the coordination service and not yet answered.
    pending: IsrProposal | None = None

    @classmethod
    def become_leader(
        cls,
        broker_id: int,
        leader_epoch: int,
        replicas: tuple[int, ...],
        isr: frozenset[int],
        log_end_offset: int,
        high_watermark: int,
        now_ms: int,
        min_insync_replicas: int = 1,
        replica_lag_time_max_ms: int = 30_000,
    ) -> LeaderPartition:
        """Start a term. Everything this replica holds is durable (it synced or recovered)."""
        if broker_id not in replicas or broker_id not in isr:
            raise StateMachineError(f"broker {broker_id} leads without being in replicas/ISR")
        followers = {
            r: FollowerProgress(last_caught_up_ms=now_ms, previous_fetch_ms=now_ms)
            for r in replicas
            if r != broker_id
        }
        return cls(
            broker_id=broker_id,
            leader_epoch=leader_epoch,
            replicas=replicas,
            min_insync_replicas=min_insync_replicas,
            replica_lag_time_max_ms=replica_lag_time_max_ms,
            isr=isr,
            epoch_start_offset=log_end_offset,
            log_end_offset=log_end_offset,
            durable_end_offset=log_end_offset,
            high_watermark=min(high_watermark, log_end_offset),
            followers=followers,
        )

    # -- what the shell asks -------------------------------------------------------

    @property
    def replicated(self) -> bool:
        """A cluster's term: writes carry its epoch, acks=all waits for the HW
        (``partition/append.py``'s ``Term``; a node alone's term is not)."""
        return True

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The ISR the HW must respect: stored ISR plus any member a pending change adds."""
        return self.isr | self.pending.isr if self.pending is not None else self.isr

    @property
    def effective_min_insync_replicas(self) -> int:
        """min.insync.replicas, capped at the replica count (Kafka's effectiveMinIsr): an
        ISR can never be larger than the replicas, so a higher setting would refuse every
        acks=all write; the cap makes it "all replicas" instead."""
        return min(self.min_insync_replicas, len(self.replicas))

    def can_accept_acks_all(self) -> bool:
        """Before appending an acks=all write: is the ISR large enough?"""
        return len(self.isr) >= self.effective_min_insync_replicas

    def ack_state(self, last_offset: int) -> AckState:
        """Is an acks=all write ending at ``last_offset`` committed yet?"""
        if self.high_watermark <= last_offset:
            return AckState.WAITING
        if len(self.isr) < self.effective_min_insync_replicas:
            return AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return AckState.DONE

    def visible_high_watermark(self) -> int | None:
        """The HW to show consumers (ListOffsets latest), or None: OFFSET_NOT_AVAILABLE.

        A new leader's HW may lag the one its predecessor showed; it is the predecessor's
        at least once it reaches this term's start offset (KIP-207), so until then it
        is not shown and the HW seen by clients never goes back.
        """
        if self.high_watermark < self.epoch_start_offset:
            return None
        return self.high_watermark

    def low_watermark(self, leader_log_start: int, live_brokers: Container[int]) -> int:
        """The lowest log start over this leader and every follower on a live broker
        (Kafka's lowWatermarkIfLeader): assigned replicas, in the ISR or not; one that
        has not fetched in this term counts as -1. DeleteRecords answers once it reaches
        the requested offset; a dead broker does not hold it back."""
        low = leader_log_start
        for replica, progress in self.followers.items():
            if replica in live_brokers:
                low = min(low, progress.log_start_offset)
        return low

    # -- events --------------------------------------------------------------------

    def leader_appended(self, log_end_offset: int) -> None:
        if log_end_offset < self.log_end_offset:
            raise StateMachineError("the leader's log end went back")
        self.log_end_offset = log_end_offset

    def leader_synced(self, durable_end_offset: int) -> bool:
        """The leader's log is durable up to here; True if the HW moved."""
        if not self.durable_end_offset <= durable_end_offset <= self.log_end_offset:
            raise StateMachineError("durable end outside [previous durable end, log end]")
        self.durable_end_offset = durable_end_offset
        return self._advance_high_watermark()

    def follower_fetched(
        self, replica_id: int, fetch_offset: int, now_ms: int, *, may_join: bool = True
    ) -> tuple[bool, IsrProposal | None]:
        """A follower fetched at ``fetch_offset``: (HW moved?, ISR change to store).

        ``may_join=False`` for a replica a finished reassignment is removing: it stays out
        of the ISR. The controller ends a move with two writes (the ISR without the leaving
        replicas, then the assignment without them); a leader that has seen the first but
        not yet the second must not admit a leaving replica back (it would be in the ISR
        of a partition it is no longer a replica of)."""
        progress = self.followers.get(replica_id)
        if progress is None:
            raise NotAReplica(f"broker {replica_id} is not a follower of this partition")
        if not 0 <= fetch_offset <= self.log_end_offset:
            raise StateMachineError(f"fetch offset {fetch_offset} beyond the log end")
        # Caught up: holds all the leader has now, or all it had at the previous fetch
        # (the follower could not have fetched more than existed then).
        if fetch_offset >= self.log_end_offset:
            progress.last_caught_up_ms = now_ms
        elif fetch_offset >= progress.previous_fetch_leader_end:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.previous_fetch_ms)
        progress.log_end_offset = fetch_offset
        progress.previous_fetch_leader_end = self.log_end_offset
        progress.previous_fetch_ms = now_ms
        moved = self._advance_high_watermark()
        proposal = None
        if (
            may_join
            and replica_id not in self.maximal_isr
            and self.pending is None
            and fetch_offset >= self.high_watermark
            and fetch_offset >= self.epoch_start_offset
        ):
            proposal = self._propose(self.isr | {replica_id})
        return moved, proposal

    def follower_log_start(self, replica_id: int, log_start_offset: int) -> bool:
        """A follower's fetch told its log start offset; True if it changed (the low
        watermark may have moved)."""
        progress = self.followers.get(replica_id)
        if progress is None or progress.log_start_offset == log_start_offset:
            return False
        progress.log_start_offset = log_start_offset
        return True

    def check_lagging(self, now_ms: int) -> IsrProposal | None:
        """Propose dropping ISR followers that have not caught up for too long."""
        if self.pending is not None:
            return None
        lagging = {
            r
            for r in self.isr
            if r != self.broker_id
            and now_ms - self.followers[r].last_caught_up_ms > self.replica_lag_time_max_ms
        }
        return self._propose(self.isr - lagging) if lagging else None

    def isr_stored(self, proposal: IsrProposal) -> bool:
        """The coordination service stored ``proposal``; True if the HW moved."""
        if proposal != self.pending:
            raise StateMachineError("an ISR change was stored that is not the pending one")
        self.isr, self.pending = proposal.isr, None
        return self._advance_high_watermark()

    def isr_refused(self) -> None:
        """The conditional update failed (another controller epoch or leader): drop it.

        The shell then reads the partition state again; if it is no longer leader this
        term ends.
        """
        self.pending = None

    # -- the rule ------------------------------------------------------------------

    def _propose(self, isr: frozenset[int]) -> IsrProposal:
        self.pending = IsrProposal(self.leader_epoch, isr)
        return self.pending

    def _advance_high_watermark(self) -> bool:
        ends = [self.durable_end_offset]
        for replica in self.maximal_isr:
            if replica != self.broker_id:
                ends.append(self.followers[replica].log_end_offset)
        candidate = min(ends)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False
