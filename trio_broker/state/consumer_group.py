"""Consumer groups of the consumer rebalance protocol (KIP-848): the pure state.

A member speaks to its group only through ConsumerGroupHeartbeat. The group keeps

* a **group epoch**, bumped when the membership or a subscription changes (or a
  subscribed topic grows);
* a **target assignment** (member -> partitions) computed by a server-side assignor
  for one group epoch, the **assignment epoch**;
* per member its **current assignment**, its **member epoch**, and the partitions it
  was asked to give up but still holds (**pending revocation**).

Each heartbeat reconciles the member towards the target (Kafka's CurrentAssignmentBuilder):
partitions leave it first (UNREVOKED_PARTITIONS, the member keeps its epoch until its
next heartbeat shows them released); a partition still held by another member is held
back (UNRELEASED_PARTITIONS) and handed over on a later heartbeat, once free. So a
partition is never in two members' current assignments (assigned or pending revocation)
at once: ``owners`` maps each held partition to its only holder.

Time comes in as milliseconds from the caller (no clock here, no I/O, no trio): session
and rebalance deadlines fence a silent member, which frees its partitions and bumps the
group epoch. Topics are handled by name; the handler maps Kafka's topic ids. A member
may subscribe by regular expression too, matched here against the topics it is given.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from trio_broker.protocol.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    metadata_version,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.patterns import InvalidPattern, Pattern, compile_pattern
from trio_broker.state.group import (
    Group,
    GroupRecord,
    JoinResult,
    MemberRecord,
    SyncResult,
)

TopicPartition = tuple[str, int]
Assignment = frozenset[TopicPartition]
EMPTY: Assignment = frozenset()

#: MemberEpoch values with a meaning of their own in a heartbeat.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

#: Version of :meth:`ConsumerGroup.encode`'s snapshot.
SNAPSHOT_VERSION = 1

#: ListGroups/DescribeGroups call these groups "consumer", like Kafka.
CONSUMER_PROTOCOL_TYPE = "consumer"
UNIFORM, RANGE = "uniform", "range"
#: Distinct regexes a group keeps matches of (more: the cache starts over).
MAX_CACHED_REGEXES = 64
#: Never matched by a subscription regex.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


@functools.lru_cache(maxsize=64)  # bounded: compiled programs are up to 8 MiB
def _pattern(regex: str) -> Pattern:
    """A subscription regex compiled with RE2 (protocol/patterns.py: linear-time
    matching, as Kafka's RE2/J; Python's backtracking ``re`` would let one member's
    pattern stall the broker at every heartbeat). Cached: it is matched again against
    the topics at each heartbeat of any member."""
    return compile_pattern(regex)


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ConsumerGroupState(enum.Enum):
    """Kafka's ConsumerGroupState, as ListGroups and ConsumerGroupDescribe spell it."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@attrs.frozen
class ConsumerGroupConfig:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    #: Server-side assignors by name; the first is the default.
    assignors: tuple[str, ...] = (UNIFORM, RANGE)


class Refused(Exception):
    """A heartbeat (or commit) refused with a Kafka error and its message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class Heartbeat:
    """One ConsumerGroupHeartbeat, topics by name. None means "unchanged"."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed: tuple[str, ...] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@attrs.frozen
class HeartbeatResult:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    #: The member's assignment (what it may consume now); None: not sent this time.
    assignment: Assignment | None = None


@attrs.frozen
class ClassicMetadata:
    """What a classic member (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) of a
    consumer-protocol group sent in its JoinGroup (Kafka's ClassicMemberMetadata)."""

    session_timeout_ms: int
    #: (name, metadata) in the member's order of preference. The first is the protocol
    #: its JoinGroup is answered with, and its metadata the subscription.
    protocols: tuple[tuple[str, bytes], ...]

    @property
    def protocol_name(self) -> str:
        return self.protocols[0][0]

    def metadata_for(self, name: str) -> bytes:
        return next((meta for n, meta in self.protocols if n == name), b"")


@attrs.frozen
class ClassicJoin:
    """One JoinGroup to a consumer-protocol group with members."""

    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""
    #: JoinGroup v4+ from a dynamic member without an id: answered MEMBER_ID_REQUIRED.
    require_known_member_id: bool = False


@attrs.define(eq=False)
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed: tuple[str, ...] = ()
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = 0
    state: MemberState = MemberState.STABLE
    #: Partitions the member may consume (its current assignment).
    assigned: Assignment = EMPTY
    #: Partitions it must give up and is not yet known to have released.
    pending_revocation: Assignment = EMPTY
    #: The member epoch each assigned partition was given at (KIP-1251): a commit with
    #: an older epoch is still fine for a partition the member had then.
    assigned_at: dict[TopicPartition, int] = attrs.Factory(dict)
    session_deadline_ms: int = 0
    #: Set while the member owes a revocation: fenced if it has not released by then.
    rebalance_deadline_ms: int | None = None
    #: A subscription by regular expression (a full match of the topic name), and the
    #: topics it matched at the member's last heartbeat that it may describe.
    regex: str | None = None
    resolved: tuple[str, ...] = ()
    #: Set for a member that speaks the classic protocol (KIP-848's migration): its
    #: session is its JoinGroup's, its partitions reach it through SyncGroup.
    classic: ClassicMetadata | None = None
    #: A classic member asked to rejoin (or to send SyncGroup after its JoinGroup) is
    #: fenced if it has not by then (Kafka's join and sync timeouts). Not stored.
    classic_deadline_ms: int | None = None

    def topics(self) -> tuple[str, ...]:
        """The topics the member subscribes to: by name, and by its regex."""
        if not self.resolved:
            return self.subscribed
        return tuple(sorted(set(self.subscribed) | set(self.resolved)))

    def holds(self) -> Assignment:
        return self.assigned | self.pending_revocation


def validate_heartbeat(request: Heartbeat, group_id: str, assignors: Sequence[str]) -> None:
    """Kafka's request checks, before the group is looked at; raises :class:`Refused`."""
    invalid = ErrorCode.INVALID_REQUEST
    if not group_id:
        raise Refused(invalid, "GroupId can't be empty.")
    if request.instance_id is not None and not request.instance_id:
        raise Refused(invalid, "InstanceId can't be empty.")
    if request.rack_id is not None and not request.rack_id:
        raise Refused(invalid, "RackId can't be empty.")
    if request.regex:  # librdkafka sends "" for "no regex"
        try:
            _pattern(request.regex)
        except InvalidPattern as exc:
            raise Refused(
                ErrorCode.INVALID_REGULAR_EXPRESSION,
                f"SubscribedTopicRegex `{request.regex}` is not a valid regular expression: {exc}.",
            ) from exc
    epoch = request.member_epoch
    if epoch > 0 or epoch == LEAVE_EPOCH:
        if not request.member_id:
            raise Refused(invalid, "MemberId can't be empty.")
    elif epoch == JOIN_EPOCH:
        if request.rebalance_timeout_ms == -1:
            raise Refused(invalid, "RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or request.owned:
            raise Refused(invalid, "TopicPartitions must be empty when (re-)joining.")
        if not request.subscribed and not request.regex:
            raise Refused(
                invalid,
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
            )
    elif epoch == STATIC_LEAVE_EPOCH:
        if not request.member_id:
            raise Refused(invalid, "MemberId can't be empty.")
        if request.instance_id is None:
            raise Refused(invalid, "InstanceId can't be null.")
    else:
        raise Refused(invalid, "MemberEpoch is invalid.")
    if request.server_assignor is not None and request.server_assignor not in assignors:
        raise Refused(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {request.server_assignor} is not supported. "
            f"Supported assignors: {', '.join(assignors)}.",
        )


# ------------------------------------------------------------------------- assignors


def _eligible(
    subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[TopicPartition, list[str]]:
    """Each partition of a subscribed topic -> its subscribers, sorted."""
    out: dict[TopicPartition, list[str]] = {}
    for member_id in sorted(subscriptions):
        for topic in subscriptions[member_id]:
            for p in range(partitions.get(topic, 0)):
                out.setdefault((topic, p), []).append(member_id)
    return out


def assign_uniform(
    subscriptions: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Balanced and sticky: a member keeps up to its fair share of what it had; the
    rest goes, partition by partition, to the least loaded subscriber. With one
    subscription for all, counts differ by at most one."""
    eligible = _eligible(subscriptions, partitions)
    share: dict[str, float] = dict.fromkeys(subscriptions, 0.0)
    for subscribers in eligible.values():
        for m in subscribers:
            share[m] += 1 / len(subscribers)
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    taken: set[TopicPartition] = set()
    for m in sorted(subscriptions):
        keep = int(share[m] + 1e-9)
        for tp in sorted(previous.get(m, EMPTY)):
            if len(out[m]) >= keep:
                break
            if tp not in taken and m in eligible.get(tp, ()):
                out[m].add(tp)
                taken.add(tp)
    # The least-subscribed partitions first, so that narrow members get theirs.
    for tp in sorted(eligible, key=lambda tp: (len(eligible[tp]), tp)):
        if tp not in taken:
            m = min(eligible[tp], key=lambda m: (len(out[m]), m))
            out[m].add(tp)
    return {m: frozenset(tps) for m, tps in out.items()}


def assign_range(
    subscriptions: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Per topic, its subscribers (sorted by member id) take contiguous ranges; the
    first ``count % subscribers`` take one more."""
    del previous  # range is not sticky
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partitions.get(topic, 0)
        quota, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = quota + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(tps) for m, tps in out.items()}


ASSIGNORS = {UNIFORM: assign_uniform, RANGE: assign_range}


# ------------------------------------------------------------------------- the group


@attrs.define(eq=False)
class ConsumerGroup:
    group_id: str
    config: ConsumerGroupConfig = attrs.Factory(ConsumerGroupConfig)
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = attrs.Factory(dict)
    #: member id -> its partitions in the target assignment of ``assignment_epoch``.
    target: dict[str, Assignment] = attrs.Factory(dict)
    #: partition -> the one member holding it (assigned or pending revocation).
    owners: dict[TopicPartition, str] = attrs.Factory(dict)
    #: Partition counts of the subscribed topics that exist, as of the last heartbeat.
    subscription_metadata: dict[str, int] = attrs.Factory(dict)
    #: The assignor of the last target assignment.
    assignor_name: str = UNIFORM
    #: regex -> (the topic names it was matched against, the matches): matched again
    #: only when the topics change, not at every heartbeat (not stored).
    _matches: dict[str, tuple[frozenset[str], tuple[str, ...]]] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )

    # -------------------------------------------------------------- views

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for member in self.members.values():
            if member.state is not MemberState.STABLE or member.epoch != self.assignment_epoch:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def is_empty(self) -> bool:
        return not self.members

    def classic_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.classic is not None]

    def all_classic(self) -> bool:
        """Every member (at least one) speaks the classic protocol: the group may go
        back to a classic group (KIP-848's downgrade)."""
        return bool(self.members) and all(m.classic is not None for m in self.members.values())

    def static_member(self, instance_id: str) -> Member | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def preferred_assignor(self) -> str:
        """The assignor most members ask for; else the broker's first."""
        counts: dict[str, int] = {}
        for member in self.members.values():
            if member.server_assignor is not None:
                counts[member.server_assignor] = counts.get(member.server_assignor, 0) + 1
        if not counts:
            return self.config.assignors[0]
        return max(sorted(counts), key=lambda name: counts[name])

    def next_deadline(self) -> int | None:
        deadlines = [m.session_deadline_ms for m in self.members.values()]
        deadlines += [
            m.rebalance_deadline_ms
            for m in self.members.values()
            if m.rebalance_deadline_ms is not None
        ]
        deadlines += [
            m.classic_deadline_ms
            for m in self.members.values()
            if m.classic_deadline_ms is not None
        ]
        return min(deadlines, default=None)

    # -------------------------------------------------------------- heartbeat

    def heartbeat(
        self,
        request: Heartbeat,
        now_ms: int,
        metadata: Mapping[str, int],
        new_member_id: str,
        describable: Callable[[str], bool] | None = None,
    ) -> HeartbeatResult:
        """One validated heartbeat (:func:`validate_heartbeat`); ``metadata`` gives the
        partition count of every existing topic the group may subscribe to;
        ``describable`` tells whether the heartbeat's principal may describe a topic
        (None: no authorizer), which a regex subscription's matches must pass."""
        try:
            if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._leave(request, now_ms)
            return self._heartbeat(request, now_ms, metadata, new_member_id, describable)
        except Refused as refused:
            return HeartbeatResult(refused.code, refused.message)

    def _matched(self, regex: str, metadata: Mapping[str, int]) -> tuple[str, ...]:
        """The topics ``regex`` matches (internal ones never), from the cache while
        the topics are the same."""
        names = frozenset(metadata)
        cached = self._matches.get(regex)
        if cached is not None and cached[0] == names:
            return cached[1]
        pattern = _pattern(regex)
        matched = tuple(
            sorted(t for t in names if t not in INTERNAL_TOPICS and pattern.fullmatch(t))
        )
        if len(self._matches) >= MAX_CACHED_REGEXES and regex not in self._matches:
            self._matches.clear()  # members changed their regexes many times: start over
        self._matches[regex] = (names, matched)
        return matched

    def _heartbeat(
        self,
        request: Heartbeat,
        now_ms: int,
        metadata: Mapping[str, int],
        new_member_id: str,
        describable: Callable[[str], bool] | None,
    ) -> HeartbeatResult:
        joining = request.member_epoch == JOIN_EPOCH
        member_id = request.member_id or new_member_id
        member = self._member_for(request, member_id, joining)
        is_new = member.member_id not in self.members
        before = (member.subscribed, member.assigned, member.regex)

        if request.subscribed is not None:
            member.subscribed = tuple(sorted(set(request.subscribed)))
        if request.regex is not None:
            member.regex = request.regex or None  # "" clears it
            if member.regex is None:
                member.resolved = ()
        if request.server_assignor is not None:
            member.server_assignor = request.server_assignor
        if request.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        if request.instance_id is not None:
            member.instance_id = request.instance_id
        member.client_id, member.client_host = request.client_id, request.client_host
        # A member that heartbeats speaks the consumer protocol now.
        member.classic, member.classic_deadline_ms = None, None
        self.members[member.member_id] = member

        bump = is_new or member.subscribed != before[0] or member.regex != before[2]
        # A member's regex is matched at its own heartbeats, against the topics as they
        # are now (a new topic that matches joins its subscription at its next one),
        # and keeps only the topics its own principal may describe (Kafka filters
        # regex matches by DESCRIBE too). Other members' matches are theirs: a
        # heartbeat never re-filters them with another principal's rights.
        if member.regex is not None:
            matched = self._matched(member.regex, metadata)
            if describable is not None:
                matched = tuple(t for t in matched if describable(t))
            if matched != member.resolved:
                member.resolved = matched
                bump = True
        self._refresh_target(bump, metadata)

        self._reconcile(member, request.owned, now_ms)
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms

        full = joining or (
            request.rebalance_timeout_ms != -1
            and request.subscribed is not None
            and request.owned is not None
        )
        return HeartbeatResult(
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignment=member.assigned if full or member.assigned != before[1] else None,
        )

    def _member_for(self, request: Heartbeat, member_id: str, joining: bool) -> Member:
        """The member the heartbeat is from (new when joining); raises Refused."""
        instance_id = request.instance_id
        if instance_id is None:
            member = self.members.get(member_id)
            if member is None:
                if not joining:
                    raise Refused(
                        ErrorCode.UNKNOWN_MEMBER_ID,
                        f"Member {member_id} is not a member of group {self.group_id}.",
                    )
                return Member(member_id)
            self._check_epoch(member, request)
            return member
        static = self.static_member(instance_id)
        if joining:
            if static is None:
                return self.members.get(member_id) or Member(member_id, instance_id)
            if static.member_id == member_id:
                return static
            if static.epoch != STATIC_LEAVE_EPOCH:
                raise Refused(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} cannot join the "
                    f"group because the instance id is owned by {static.member_id} member.",
                )
            return self._replace(static, member_id)
        if static is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if static.member_id != member_id:
            raise Refused(
                ErrorCode.FENCED_INSTANCE_ID,
                f"Static member {member_id} with instance id {instance_id} was fenced by "
                f"member {static.member_id}.",
            )
        self._check_epoch(static, request)
        return static

    @staticmethod
    def _check_epoch(member: Member, request: Heartbeat) -> None:
        received = request.member_epoch
        if received == JOIN_EPOCH:
            return  # a known member rejoining: it gets its assignment again in full
        if received > member.epoch:
            raise Refused(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a greater member epoch ({received}) than the "
                f"one known by the group coordinator ({member.epoch}). The member must abandon "
                "all its partitions and rejoin.",
            )
        if received < member.epoch:
            # The answer that bumped the epoch may have been lost: the previous epoch is
            # fine as long as the member claims nothing beyond its assignment.
            owned = request.owned
            if received != member.previous_epoch or owned is None or not owned <= member.assigned:
                raise Refused(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The consumer group member has a smaller member epoch ({received}) than "
                    f"the one known by the group coordinator ({member.epoch}). The member must "
                    "abandon all its partitions and rejoin.",
                )

    def _replace(self, old: Member, member_id: str) -> Member:
        """A static member back under a new member id takes the old one's place."""
        new = attrs.evolve(old, member_id=member_id, epoch=0, previous_epoch=0)
        del self.members[old.member_id]
        for tp in new.holds():
            self.owners[tp] = member_id
        if old.member_id in self.target:
            self.target[member_id] = self.target.pop(old.member_id)
        self.members[member_id] = new
        return new

    def _refresh_target(self, bump: bool, metadata: Mapping[str, int]) -> None:
        """The group's epoch moves on when a subscription changed (``bump``) or a
        subscribed topic's partition count did; a new epoch gets a new target assignment."""
        wanted = {t for m in self.members.values() for t in m.topics()}
        fresh = {t: n for t in sorted(wanted) if (n := metadata.get(t, 0)) > 0}
        if fresh != self.subscription_metadata:
            self.subscription_metadata = fresh
            bump = True
        if bump:
            self.group_epoch += 1
        if self.group_epoch > self.assignment_epoch:
            self._compute_target()

    def _compute_target(self) -> None:
        name = self.preferred_assignor()
        assign = ASSIGNORS.get(name, assign_uniform)
        subscriptions = {m.member_id: m.topics() for m in self.members.values()}
        self.target = assign(subscriptions, self.subscription_metadata, self.target)
        self.assignor_name = name
        self.assignment_epoch = self.group_epoch

    # -------------------------------------------------------------- reconciliation

    def _reconcile(self, member: Member, owned: Assignment | None, now_ms: int) -> None:
        """Move the member one step towards its target (Kafka's CurrentAssignmentBuilder)."""
        if member.state is MemberState.STABLE and member.epoch == self.assignment_epoch:
            return
        if member.state is MemberState.UNREVOKED_PARTITIONS and _still_owns(
            owned, member.pending_revocation
        ):
            return
        self._next_assignment(member, owned, now_ms)

    def _next_assignment(self, member: Member, owned: Assignment | None, now_ms: int) -> None:
        target = self.target.get(member.member_id, EMPTY)
        keep = member.assigned & target
        revoke = member.assigned - keep
        wanted = target - keep
        unreleased = {tp for tp in wanted if tp in self.owners}
        free = wanted - unreleased
        if revoke and _still_owns(owned, revoke):
            new_state, epoch = MemberState.UNREVOKED_PARTITIONS, member.epoch
            assigned, pending = keep, revoke
        else:
            new_state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
            epoch, assigned, pending = self.assignment_epoch, keep | free, EMPTY
        self._set_holdings(member, assigned, pending)
        member.assigned_at = {tp: member.assigned_at.get(tp, epoch) for tp in assigned}
        if epoch != member.epoch:
            member.previous_epoch, member.epoch = member.epoch, epoch
        if new_state is MemberState.UNREVOKED_PARTITIONS:
            if member.state is not MemberState.UNREVOKED_PARTITIONS:
                member.rebalance_deadline_ms = now_ms + member.rebalance_timeout_ms
        else:
            member.rebalance_deadline_ms = None
        member.state = new_state

    def _set_holdings(self, member: Member, assigned: Assignment, pending: Assignment) -> None:
        for tp in member.holds():
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]
        for tp in assigned | pending:
            holder = self.owners.setdefault(tp, member.member_id)
            assert holder == member.member_id, f"{tp} given to {member.member_id}, held by {holder}"
        member.assigned, member.pending_revocation = assigned, pending

    # -------------------------------------------------------------- classic members

    def supports_classic_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        """A classic member may join with protocol type ``consumer`` and a protocol
        every classic member already in the group supports (Kafka's rule)."""
        names = set(names)
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
            return False
        classic = self.classic_members()
        return any(all(n in dict(m.classic.protocols) for m in classic if m.classic) for n in names)

    def classic_join(
        self, request: ClassicJoin, now_ms: int, metadata: Mapping[str, int], new_member_id: str
    ) -> JoinResult:
        """A JoinGroup: the member joins (or rejoins) as a classic member, subscribed to
        what its first protocol's metadata names, and moves one step towards its target
        assignment with the partitions it says it still owns. Answered with its member
        epoch as the generation, its first protocol, and no leader: the coordinator
        assigns, so no member runs an assignor."""
        member_id = request.member_id or new_member_id
        if not self.supports_classic_protocols(
            request.protocol_type, (name for name, _ in request.protocols)
        ):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=request.member_id)
        if request.require_known_member_id:
            # Kafka keeps no pending ids here: the member comes back with this one.
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        try:
            subscription = decode_subscription(request.protocols[0][1])
        except ValueError:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=request.member_id)
        try:
            member = self._classic_member_for(request, member_id)
        except Refused as refused:
            return JoinResult(refused.code, member_id=request.member_id)
        is_new = member.member_id not in self.members
        before = member.subscribed
        member.subscribed = tuple(sorted(set(subscription.topics)))
        member.regex, member.resolved = None, ()
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if subscription.rack_id is not None:
            member.rack_id = subscription.rack_id
        if request.instance_id is not None:
            member.instance_id = request.instance_id
        member.client_id, member.client_host = request.client_id, request.client_host
        member.classic = ClassicMetadata(request.session_timeout_ms, request.protocols)
        self.members[member.member_id] = member

        bump = is_new or member.subscribed != before
        self._refresh_target(bump, metadata)
        # Its subscription's owned partitions (none before v1: an eager consumer gave
        # everything up before rejoining) say what it has released.
        self._reconcile(member, subscription.owned, now_ms)
        member.session_deadline_ms = now_ms + request.session_timeout_ms
        # It must send SyncGroup within its rebalance timeout (Kafka's sync timeout).
        member.classic_deadline_ms = now_ms + member.rebalance_timeout_ms
        return JoinResult(
            ErrorCode.NONE, generation_id=member.epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=member.classic.protocol_name, leader_id="", member_id=member.member_id,
        )  # fmt: skip

    def _classic_member_for(self, request: ClassicJoin, member_id: str) -> Member:
        instance_id = request.instance_id
        if instance_id is None:
            # Any id joins, as Kafka: the one MEMBER_ID_REQUIRED handed out (no pending
            # ids are kept), or one from before a restart.
            return self.members.get(member_id) or Member(member_id)
        static = self.static_member(instance_id)
        if static is None:
            return self.members.get(member_id) or Member(member_id, instance_id)
        if static.member_id == member_id:
            return static
        if request.member_id:
            raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Instance {instance_id} is fenced.")
        return self._replace(static, member_id)  # the instance is back under a new id

    def _classic_member(
        self, member_id: str, instance_id: str | None, generation_id: int | None
    ) -> Member:
        """The classic member a SyncGroup/Heartbeat/LeaveGroup is from; raises Refused."""
        if instance_id is None:
            member = self.members.get(member_id)
        else:
            member = self.static_member(instance_id)
            if member is not None and member_id and member.member_id != member_id:
                raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Instance {instance_id} is fenced.")
        if member is None or member.classic is None:
            raise Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a classic member of group {self.group_id}.",
            )
        if generation_id is not None and generation_id != member.epoch:
            raise Refused(ErrorCode.ILLEGAL_GENERATION, f"Generation {generation_id} is stale.")
        return member

    def _must_rejoin(self, member: Member, now_ms: int) -> bool:
        """Kafka's rule for a classic member: rejoin when the group epoch moved past its
        own, when it must give partitions up, or when partitions held back from it are
        free now. Asking starts its join timeout (its rebalance timeout)."""
        if not (
            member.epoch < self.group_epoch
            or member.state is MemberState.UNREVOKED_PARTITIONS
            or (
                member.state is MemberState.UNRELEASED_PARTITIONS
                and not self._waiting_on_unreleased(member)
            )
        ):
            return False
        if member.classic_deadline_ms is None:
            member.classic_deadline_ms = now_ms + member.rebalance_timeout_ms
        return True

    def _waiting_on_unreleased(self, member: Member) -> bool:
        held_back = self.target.get(member.member_id, EMPTY) - member.assigned
        return any(self.owners.get(tp, member.member_id) != member.member_id for tp in held_back)

    def classic_sync(
        self, member_id: str, instance_id: str | None, generation_id: int,
        protocol_type: str | None, protocol_name: str | None, now_ms: int,
    ) -> SyncResult:  # fmt: skip
        """A classic member's SyncGroup: its current assignment, as
        ConsumerProtocolAssignment in the version of its subscription."""
        try:
            member = self._classic_member(member_id, instance_id, generation_id)
        except Refused as refused:
            return SyncResult(refused.code)
        assert member.classic is not None
        name = member.classic.protocol_name
        if (protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE) or (
            protocol_name is not None and protocol_name != name
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if self.group_epoch > member.epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
            if member.classic_deadline_ms is None:
                member.classic_deadline_ms = now_ms + member.rebalance_timeout_ms
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        member.classic_deadline_ms = None
        member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
        version = metadata_version(member.classic.protocols[0][1])
        return SyncResult(
            ErrorCode.NONE, CONSUMER_PROTOCOL_TYPE, name,
            encode_assignment(member.assigned, version),
        )  # fmt: skip

    def classic_heartbeat(
        self, member_id: str, instance_id: str | None, generation_id: int, now_ms: int
    ) -> ErrorCode:
        try:
            member = self._classic_member(member_id, instance_id, generation_id)
        except Refused as refused:
            return refused.code
        assert member.classic is not None
        member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
        if self._must_rejoin(member, now_ms):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def classic_leave(self, member_id: str, instance_id: str | None) -> ErrorCode:
        """One member of a LeaveGroup (a static one may leave by instance id alone)."""
        try:
            member = self._classic_member(member_id, instance_id, None)
        except Refused as refused:
            return refused.code
        self.remove_member(member.member_id)
        return ErrorCode.NONE

    # -------------------------------------------------------------- migration

    @classmethod
    def from_classic(cls, group: Group, config: ConsumerGroupConfig, now_ms: int) -> ConsumerGroup:
        """KIP-848's upgrade of a live classic group whose protocol type is ``consumer``:
        its members become classic members of a consumer group at its generation, each
        keeping its assignment (the target assignment, until the next epoch). Raises
        ValueError when a member's subscription or assignment does not decode.

        A group rebalancing (its first join phase has no protocol yet; a member that
        joined since may not support the last one) is converted too: such a member is
        subscribed as its first protocol says, with nothing assigned, and rejoins."""
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            raise ValueError(f"group {group.group_id!r} does not use the consumer protocol")
        generation = group.generation_id
        out = cls(group.group_id, config, group_epoch=generation, assignment_epoch=generation)
        for old in group.members.values():
            protocols = dict(old.protocols)
            metadata = protocols.get(group.protocol_name or "", old.protocols[0][1])
            subscription = decode_subscription(metadata)
            assigned = decode_assignment(old.assignment)
            member = Member(
                old.member_id, old.group_instance_id, subscription.rack_id, old.client_id,
                old.client_host, old.rebalance_timeout_ms,
                tuple(sorted(set(subscription.topics))), epoch=generation,
                previous_epoch=generation,
                classic=ClassicMetadata(old.session_timeout_ms, old.protocols),
                session_deadline_ms=now_ms + old.session_timeout_ms,
            )  # fmt: skip
            if assigned & out.owners.keys():
                raise ValueError(f"group {group.group_id!r}: a partition assigned twice")
            out.members[member.member_id] = member
            out._set_holdings(member, assigned, EMPTY)
            member.assigned_at = dict.fromkeys(assigned, generation)
            out.target[member.member_id] = assigned
        # The topics as the assignment saw them: a new member's join compares against it.
        out.subscription_metadata = {}
        return out

    def classic_protocol(self) -> str:
        """The protocol a downgraded group's generation runs: among those every member
        supports, the one most members prefer (ties: the first member's preference)."""
        members = [m.classic for m in self.members.values() if m.classic is not None]
        common = set.intersection(*({n for n, _ in c.protocols} for c in members))
        if not common:
            raise ValueError(f"group {self.group_id!r}: no protocol every member supports")
        votes: dict[str, int] = {}
        for c in members:
            choice = next(n for n, _ in c.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        first = [n for n, _ in members[0].protocols if n in common]
        return max(first, key=lambda n: (votes.get(n, 0), -first.index(n)))

    def classic_record(self, generation: int) -> GroupRecord:
        """KIP-848's downgrade: the group as a classic ``generation``, every
        member assigned its target assignment in its own subscription's version, the
        first member leading. Call when :meth:`all_classic`; raises ValueError."""
        protocol = self.classic_protocol()
        members = []
        for m in self.members.values():
            assert m.classic is not None
            metadata = m.classic.metadata_for(protocol)
            assignment = self.target.get(m.member_id, m.assigned)
            members.append(MemberRecord(
                m.member_id, m.instance_id, m.client_id, m.client_host,
                m.rebalance_timeout_ms, m.classic.session_timeout_ms, metadata,
                encode_assignment(assignment, metadata_version(metadata)),
            ))  # fmt: skip
        leader = members[0].member_id if members else None
        return GroupRecord(CONSUMER_PROTOCOL_TYPE, generation, protocol, leader, tuple(members))

    # -------------------------------------------------------------- leaving, fencing

    def _leave(self, request: Heartbeat, now_ms: int) -> HeartbeatResult:
        member = self.members.get(request.member_id)
        if request.instance_id is not None:
            static = self.static_member(request.instance_id)
            if static is None:
                raise Refused(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {request.instance_id} is unknown."
                )
            if static.member_id != request.member_id:
                raise Refused(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {request.member_id} with instance id "
                    f"{request.instance_id} was fenced by member {static.member_id}.",
                )
            member = static
        if member is None:
            raise Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {request.member_id} is not a member of group {self.group_id}.",
            )
        if request.member_epoch == STATIC_LEAVE_EPOCH:
            # The instance will be back: it keeps its partitions (nobody else gets them)
            # until it rejoins or its session runs out.
            member.previous_epoch, member.epoch = member.epoch, STATIC_LEAVE_EPOCH
            member.rebalance_deadline_ms = None
        else:
            self.remove_member(member.member_id)
        return HeartbeatResult(
            member_id=member.member_id,
            member_epoch=request.member_epoch,
            heartbeat_interval_ms=0,
        )

    def remove_member(self, member_id: str) -> None:
        """The member is gone (left, or fenced): its partitions are free and the group
        epoch moves on, so the next heartbeat computes a new target."""
        member = self.members.pop(member_id, None)
        if member is None:
            return
        for tp in member.holds():
            if self.owners.get(tp) == member_id:
                del self.owners[tp]
        self.target.pop(member_id, None)
        wanted = {t for m in self.members.values() for t in m.topics()}
        self.subscription_metadata = {
            t: n for t, n in self.subscription_metadata.items() if t in wanted
        }
        self.group_epoch += 1

    def advance_to(self, now_ms: int) -> list[str]:
        """Fence the members whose session or revocation deadline passed; their ids."""
        fenced = [
            m.member_id
            for m in self.members.values()
            if m.session_deadline_ms <= now_ms
            or (m.rebalance_deadline_ms is not None and m.rebalance_deadline_ms <= now_ms)
            or (m.classic_deadline_ms is not None and m.classic_deadline_ms <= now_ms)
        ]
        for member_id in fenced:
            self.remove_member(member_id)
        return fenced

    # -------------------------------------------------------------- stored form

    def encode(self) -> bytes:
        """The whole group as stored in ``__consumer_offsets`` (our format: JSON)."""

        def tps(assignment: Assignment) -> list[list[str | int]]:
            return [[t, p] for t, p in sorted(assignment)]

        return json.dumps(
            {
                "v": SNAPSHOT_VERSION,
                "group_epoch": self.group_epoch,
                "assignment_epoch": self.assignment_epoch,
                "assignor": self.assignor_name,
                "metadata": self.subscription_metadata,
                "target": {m: tps(a) for m, a in sorted(self.target.items())},
                "members": [
                    {
                        "id": m.member_id,
                        "instance": m.instance_id,
                        "rack": m.rack_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "rebalance_timeout_ms": m.rebalance_timeout_ms,
                        "subscribed": list(m.subscribed),
                        "regex": m.regex,
                        "resolved": list(m.resolved),
                        "assignor": m.server_assignor,
                        "epoch": m.epoch,
                        "previous_epoch": m.previous_epoch,
                        "state": m.state.value,
                        "assigned": tps(m.assigned),
                        "assigned_at": [[t, p, e] for (t, p), e in sorted(m.assigned_at.items())],
                        "revoking": tps(m.pending_revocation),
                        # Only for a classic member (KIP-848's migration): its JoinGroup's
                        # session timeout and protocols (metadata hex-encoded).
                        **(
                            {}
                            if m.classic is None
                            else {
                                "classic": {
                                    "session_timeout_ms": m.classic.session_timeout_ms,
                                    "protocols": [
                                        [n, meta.hex()] for n, meta in m.classic.protocols
                                    ],
                                }
                            }
                        ),
                    }
                    for m in self.members.values()
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(
        cls, group_id: str, raw: bytes, config: ConsumerGroupConfig, now_ms: int
    ) -> ConsumerGroup:
        """A stored group back; sessions start now. Raises ValueError if it is damaged
        or contradicts itself (two holders of one partition)."""
        try:
            data = json.loads(raw)
            if data["v"] != SNAPSHOT_VERSION:
                raise ValueError(f"snapshot version {data['v']}")

            def tps(items: list[list[str | int]]) -> Assignment:
                return frozenset((str(t), int(p)) for t, p in items)

            group = cls(
                group_id, config, group_epoch=int(data["group_epoch"]),
                assignment_epoch=int(data["assignment_epoch"]),
                subscription_metadata={str(t): int(n) for t, n in data["metadata"].items()},
                target={str(m): tps(a) for m, a in data["target"].items()},
                assignor_name=str(data["assignor"]),
            )  # fmt: skip
            for d in data["members"]:
                member = Member(
                    str(d["id"]), d["instance"], d["rack"], str(d["client_id"]),
                    str(d["client_host"]), int(d["rebalance_timeout_ms"]),
                    tuple(d["subscribed"]), d["assignor"], int(d["epoch"]),
                    int(d["previous_epoch"]), MemberState(d["state"]),
                    session_deadline_ms=now_ms + config.session_timeout_ms,
                    regex=d.get("regex"), resolved=tuple(d.get("resolved", ())),
                )  # fmt: skip
                if (classic := d.get("classic")) is not None:
                    member.classic = ClassicMetadata(
                        int(classic["session_timeout_ms"]),
                        tuple((str(n), bytes.fromhex(meta)) for n, meta in classic["protocols"]),
                    )
                    if not member.classic.protocols:
                        raise ValueError(f"classic member {member.member_id} without protocols")
                    member.session_deadline_ms = now_ms + member.classic.session_timeout_ms
                holds = tps(d["assigned"]) | tps(d["revoking"])
                if member.member_id in group.members or holds & group.owners.keys():
                    raise ValueError(f"member {member.member_id} contradicts the others")
                group.members[member.member_id] = member
                group._set_holdings(member, tps(d["assigned"]), tps(d["revoking"]))
                member.assigned_at = {(str(t), int(p)): int(e) for t, p, e in d["assigned_at"]}
                if member.assigned_at.keys() != member.assigned:
                    raise ValueError(f"member {member.member_id}: assignment epochs differ")
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    member.rebalance_deadline_ms = now_ms + member.rebalance_timeout_ms
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"unreadable consumer group snapshot: {exc!r}") from exc
        return group

    # -------------------------------------------------------------- offsets

    def validate_offset_commit(self, member_id: str, member_epoch: int, api_version: int) -> None:
        """Kafka's rule for a commit into this group; raises Refused."""
        if member_epoch < 0 and not self.members:
            return  # an admin or a consumer assigning partitions itself, group empty
        member = self.members.get(member_id)
        if member is None:
            raise Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a member of group {self.group_id}.",
            )
        if member.classic is not None:
            # A classic member commits with its generation, any version (Kafka's rule).
            if member_epoch != member.epoch:
                raise Refused(
                    ErrorCode.ILLEGAL_GENERATION,
                    f"The generation {member_epoch} is not the member's epoch {member.epoch}.",
                )
            return
        if api_version < 9:
            raise Refused(
                ErrorCode.UNSUPPORTED_VERSION,
                "OffsetCommit version 9 or above must be used by members using the modern "
                "group protocol",
            )
        if member_epoch > member.epoch:
            _check_member_epoch(member_epoch, member.epoch)
        # An older epoch is checked partition by partition (commit_partition_error).

    def commit_partition_error(
        self, member_id: str, member_epoch: int, partition: TopicPartition
    ) -> ErrorCode:
        """KIP-1251: a commit whose epoch is behind the member's (the heartbeat that bumped
        it crossed the commit) is fine for a partition the member has held since that
        epoch; otherwise STALE_MEMBER_EPOCH. Call after :meth:`validate_offset_commit`."""
        member = self.members.get(member_id)
        if member is None or member_epoch >= member.epoch:
            return ErrorCode.NONE  # checked as a whole already
        given_at = member.assigned_at.get(partition)
        if given_at is not None and given_at <= member_epoch:
            return ErrorCode.NONE
        return ErrorCode.STALE_MEMBER_EPOCH

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> None:
        if member_id is None and member_epoch < 0:
            return
        member = self.members.get(member_id or "")
        if member is None:
            raise Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a member of group {self.group_id}.",
            )
        if member.classic is not None and member_epoch != member.epoch:
            raise Refused(
                ErrorCode.ILLEGAL_GENERATION,
                f"The generation {member_epoch} is not the member's epoch {member.epoch}.",
            )
        _check_member_epoch(member_epoch, member.epoch)


def _check_member_epoch(received: int, expected: int) -> None:
    if received != expected:
        raise Refused(
            ErrorCode.STALE_MEMBER_EPOCH,
            f"The received member epoch {received} does not match the expected member "
            f"epoch {expected}.",
        )


def _still_owns(owned: Iterable[TopicPartition] | None, revoking: Assignment) -> bool:
    """Does the member's report still hold one of ``revoking``? No report: assume so."""
    if owned is None:
        return True
    return any(tp in revoking for tp in owned)
