"""The controller's decisions, pure: where replicas go and who leads.

The controller (one broker, elected through ZooKeeper) applies these to what it reads
from ZooKeeper and writes the results back with conditional updates. Kafka's rules:

- replicas are spread round-robin from a start broker, the followers of each partition
  shifted so that no two partitions share the same follower order; with racks, brokers
  are interleaved rack by rack so that a partition's replicas span as many racks as
  possible;
- a leader is the first replica, in assignment order, that is alive and in the ISR
  (the first one is the *preferred* leader); only with unclean leader election enabled
  may an alive replica outside the ISR lead;
- every leader change bumps the leader epoch; so does the controller's removal of a lost
  broker from the ISR, so that the leader's own ISR updates of the old epoch fail;
- a replica whose log dir failed on a live broker (Kafka's OfflineReplica) counts as
  lost for its partition only: out of the ISR unless it is the last member, a new
  leader if it led; its broker stays alive for every other partition;
- so does a leader's restart (Kafka's bounced broker): a broker that registered again,
  before the controller saw it gone, must not lead on in the epoch its previous life
  led. Its log may have lost an unsynced tail that followers copied; in the same epoch
  their copies could not be told from what it appends next (the epoch-end check a
  follower truncates by compares epochs).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "NO_LEADER",
    "ElectionRefused",
    "ElectionType",
    "InvalidReplicationFactor",
    "LeaderAndIsr",
    "Reassignment",
    "after_broker_loss",
    "after_broker_return",
    "after_leader_restart",
    "after_replicas_offline",
    "assign_replicas",
    "elect_leader",
    "leave_replicas",
    "preferred_leader_move",
    "reassign",
    "reassignment_done",
    "requested_election",
]

NO_LEADER = -1


class InvalidReplicationFactor(ValueError):
    """More replicas asked than there are live brokers (INVALID_REPLICATION_FACTOR)."""


@attrs.frozen
class LeaderAndIsr:
    leader: int  # NO_LEADER: the partition is offline
    leader_epoch: int
    isr: tuple[int, ...]


def _rack_alternated(brokers: Mapping[int, str | None]) -> list[int]:
    """Brokers ordered so that consecutive ones are on different racks when possible."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(brokers):
        by_rack.setdefault(brokers[broker] or "", []).append(broker)
    racks = sorted(by_rack)
    ordered: list[int] = []
    for i in range(max(len(v) for v in by_rack.values())):
        ordered.extend(by_rack[rack][i] for rack in racks if i < len(by_rack[rack]))
    return ordered


def assign_replicas(
    partitions: int,
    replication_factor: int,
    brokers: Mapping[int, str | None],
    *,
    start_index: int = 0,
    first_partition: int = 0,
) -> list[list[int]]:
    """Replica lists for partitions ``first_partition`` .. ``first_partition + partitions - 1``.

    ``brokers`` maps each live broker id to its rack (None: no rack). ``start_index``
    picks the first partition's leader (Kafka picks it at random; callers may too).
    """
    if replication_factor < 1:
        raise InvalidReplicationFactor("the replication factor must be at least 1")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} is larger than the "
            f"{len(brokers)} available broker(s)"
        )
    racked = any(rack for rack in brokers.values())
    ordered = _rack_alternated(brokers) if racked else sorted(brokers)
    n = len(ordered)
    all_racks = len({brokers[b] or "" for b in ordered})
    assignment = []
    for p in range(first_partition, first_partition + partitions):
        first = (start_index + p) % n
        # The follower shift grows every n partitions, so that followers differ too.
        shift = 1 + (p // n) % max(n - 1, 1)
        replicas = [ordered[first]]
        used_racks = {brokers[ordered[first]] or ""}
        step = 0
        while len(replicas) < replication_factor:
            candidate = ordered[(first + shift + step) % n]
            step += 1
            rack = brokers[candidate] or ""
            # As Kafka: skip a broker whose rack holds a replica while a rack holds none
            # (the shift alone can land two replicas in one rack from the second round on).
            if candidate in replicas or (rack in used_racks and len(used_racks) < all_racks):
                continue
            replicas.append(candidate)
            used_racks.add(rack)
        assignment.append(replicas)
    return assignment


def elect_leader(
    replicas: Sequence[int], isr: Sequence[int], live: frozenset[int], *, unclean: bool = False
) -> int:
    """The first replica alive and in the ISR; with ``unclean``, else the first alive one."""
    for broker in replicas:
        if broker in live and broker in isr:
            return broker
    if unclean:
        for broker in replicas:
            if broker in live:
                return broker
    return NO_LEADER


def after_broker_loss(
    state: LeaderAndIsr,
    replicas: Sequence[int],
    lost: int,
    live: frozenset[int],
    *,
    unclean: bool = False,
) -> LeaderAndIsr | None:
    """The partition's state once ``lost`` is gone, or None if it is not affected.

    The lost broker leaves the ISR, unless it is its last member (Kafka keeps the last
    one, so that it may lead again when it returns). A new leader is elected if the lost
    broker led; an unclean one resets the ISR to itself.
    """
    if lost not in state.isr and state.leader != lost:
        return None
    isr = tuple(b for b in state.isr if b != lost) or state.isr
    leader = state.leader
    if leader in (lost, NO_LEADER):
        leader = elect_leader(replicas, isr, live - {lost})
        if leader == NO_LEADER and unclean:
            leader = elect_leader(replicas, (), live - {lost}, unclean=True)
            if leader != NO_LEADER:
                isr = (leader,)
    if leader == state.leader and isr == state.isr:
        return None  # already as it should be (an offline partition's last ISR member)
    return LeaderAndIsr(leader, state.leader_epoch + 1, isr)


def after_replicas_offline(
    state: LeaderAndIsr,
    replicas: Sequence[int],
    offline: frozenset[int],
    live: frozenset[int],
    *,
    unclean: bool = False,
) -> LeaderAndIsr | None:
    """The partition's state once the replicas of brokers ``offline`` can no longer
    serve it (a disk error took the log dir holding it offline; the brokers stay in
    ``live`` for their other partitions), or None if none of them leads or is in sync.

    Each goes as :func:`after_broker_loss` takes a lost broker: out of the ISR unless it
    is its last member, and a new leader from the rest of the ISR (with ``unclean``,
    any other live replica) if it led; no offline replica is elected. One new leader
    epoch, however many of the partition's replicas went offline."""
    usable = live - offline
    after = state
    for broker in (state.leader, *state.isr):
        if broker in offline:
            after = after_broker_loss(after, replicas, broker, usable, unclean=unclean) or after
    if (after.leader, after.isr) == (state.leader, state.isr):
        return None
    return LeaderAndIsr(after.leader, state.leader_epoch + 1, after.isr)


def after_leader_restart(state: LeaderAndIsr) -> LeaderAndIsr:
    """The state once its leader is known to have restarted: the same leader and ISR in
    a new epoch, which its new life starts a term in (the old one's term is fenced)."""
    return LeaderAndIsr(state.leader, state.leader_epoch + 1, state.isr)


def after_broker_return(
    state: LeaderAndIsr, replicas: Sequence[int], returned: int, live: frozenset[int]
) -> LeaderAndIsr | None:
    """An offline partition whose last ISR member came back gets it as leader again."""
    if state.leader != NO_LEADER or returned not in state.isr:
        return None
    leader = elect_leader(replicas, state.isr, live | {returned})
    return LeaderAndIsr(leader, state.leader_epoch + 1, state.isr)


def preferred_leader_move(
    state: LeaderAndIsr, replicas: Sequence[int], live: frozenset[int]
) -> LeaderAndIsr | None:
    """Leadership back to the preferred (first) replica, if it is alive and in sync."""
    preferred = replicas[0]
    if state.leader == preferred or preferred not in live or preferred not in state.isr:
        return None
    return LeaderAndIsr(preferred, state.leader_epoch + 1, state.isr)


class ElectionType(enum.IntEnum):
    """ElectLeaders' election types (KIP-460)."""

    PREFERRED = 0
    UNCLEAN = 1


class ElectionRefused(enum.Enum):
    """Why a requested election changes nothing; each is one of Kafka's error codes."""

    #: Preferred: the preferred replica already leads. Unclean: a live leader leads.
    NOT_NEEDED = "ELECTION_NOT_NEEDED"
    #: Preferred: the preferred replica is down or out of the ISR.
    PREFERRED_NOT_AVAILABLE = "PREFERRED_LEADER_NOT_AVAILABLE"
    #: Unclean: no replica is alive at all.
    NO_ELIGIBLE_LEADER = "ELIGIBLE_LEADERS_NOT_AVAILABLE"


def requested_election(
    state: LeaderAndIsr,
    replicas: Sequence[int],
    live: frozenset[int],
    election_type: ElectionType,
) -> LeaderAndIsr | ElectionRefused:
    """An election an administrator asked for (ElectLeaders), as Kafka's controller
    decides it.

    Preferred: leadership to the first replica if it is alive and in the ISR.
    Unclean: only for a partition without a live leader; an in-sync live replica is
    still chosen first, else any live replica, which then is the whole ISR (the
    records it lacks are lost: that is what the administrator asked for).
    """
    if election_type is ElectionType.PREFERRED:
        if not replicas or state.leader == replicas[0]:
            return ElectionRefused.NOT_NEEDED
        moved = preferred_leader_move(state, replicas, live)
        return ElectionRefused.PREFERRED_NOT_AVAILABLE if moved is None else moved
    if state.leader != NO_LEADER and state.leader in live:
        return ElectionRefused.NOT_NEEDED
    isr = tuple(b for b in state.isr if b in live)
    leader = elect_leader(replicas, isr, live)
    if leader == NO_LEADER:
        leader = elect_leader(replicas, (), live, unclean=True)
        isr = (leader,)
    if leader == NO_LEADER:
        return ElectionRefused.NO_ELIGIBLE_LEADER
    return LeaderAndIsr(leader, state.leader_epoch + 1, isr)


@attrs.frozen
class Reassignment:
    """A partition's replicas while it moves (KIP-455): the target replicas first, then
    those leaving; ``adding`` join, ``removing`` leave once every joining one is in sync."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the move (what a cancellation returns to)."""
        return tuple(r for r in self.replicas if r not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)


def reassign(current: Reassignment, target: Sequence[int] | None) -> Reassignment:
    """The replicas once an administrator asks to move to ``target`` (None: cancel, a
    move back to the original replicas).

    A new target while a move is under way follows Kafka's KRaft controller: the replica
    set is the target plus every current replica outside it, and those leave with the
    move's end, so no replica is dropped while it leads or holds the only in-sync copy
    (the stored leader and ISR stay within the replicas). Kafka's ZooKeeper controller
    instead starts again from the original replicas and drops the abandoned move's
    joiners at once, a leading or only in-sync one included.
    A cancel is the same move with the original replicas as the target (KRaft reverts at
    once and refuses a revert that would empty the ISR, unless unclean election is on):
    the abandoned joiners leave at the controller's next pass, once an original replica
    alive and in sync can lead. Joining are the target's replicas outside the original
    ones (KRaft: outside the current ones, but its move ends only with every target
    replica in sync; ours ends once the joining ones are), so an abandoned joiner that
    the new target keeps is still waited for.
    """
    original = current.original
    wanted = original if target is None else tuple(target)
    leaving = tuple(r for r in current.replicas if r not in wanted)
    joining = tuple(r for r in wanted if r not in original)
    if not (leaving or joining):
        return Reassignment(wanted)
    return Reassignment(wanted + leaving, adding=joining, removing=leaving)


def reassignment_done(state: LeaderAndIsr, moving: Reassignment) -> bool:
    """Every joining replica is in the ISR: the leaving ones may go."""
    return bool(moving.adding or moving.removing) and all(r in state.isr for r in moving.adding)


def leave_replicas(
    state: LeaderAndIsr, replicas: Sequence[int], live: frozenset[int]
) -> LeaderAndIsr | None:
    """The partition's state once only ``replicas`` remain (the end of a move, or its
    cancellation): the others leave the ISR, and a leader among them hands over to the
    first live in-sync remaining replica. None if nothing changes; if no remaining
    replica can lead yet, the state is left as it is (the caller waits)."""
    isr = tuple(r for r in state.isr if r in replicas)
    leader = state.leader
    if leader not in replicas or leader not in live:
        leader = elect_leader(replicas, isr, live)
        if leader == NO_LEADER:
            return None
    if (leader, isr) == (state.leader, state.isr):
        return None
    return LeaderAndIsr(leader, state.leader_epoch + 1, isr)
