"""The classic consumer group protocol as a pure, synchronous state machine.

One :class:`Group` holds a group's members, generation, selected protocol and
assignment, and the deadlines of its timers. The Trio coordinator
(``trio_broker.groups.coordinator``) feeds it requests and the clock; the
group answers with results and with :class:`Reply` objects for requests that
were parked earlier (a JoinGroup waits for the rebalance, a SyncGroup for the
leader and the write of its assignment). Waiters are opaque tokens to this module,
so it never imports trio and Hypothesis can drive it with plain integers.

Storing a generation is a step of its own: the leader's SyncGroup hands the caller
the :class:`GroupRecord` to write (:attr:`SyncOutcome.store`) and the group stays
CompletingRebalance; the caller reports the write's fate with
:meth:`Group.store_completed`, and only a successful write makes the group Stable
and answers every parked SyncGroup of the generation, the leader's and the
followers' together (Kafka's order: no member learns an assignment that a crash
could take back, and none learns it before the others can).

The lifecycle is data: :data:`TRANSITIONS` maps ``(state, event)`` to the next
state; :meth:`Group._transition` is the only place that changes the state and
raises :class:`IllegalGroupTransition` for a pair the table lacks.
``docs/consumer-groups.md`` draws its diagram from that table.

Timers are deadlines in milliseconds of whatever monotonic clock the caller
uses. :meth:`Group.advance_to` fires every due timer *at its own deadline*, in
deadline order, so a big clock jump means the same as many small ones.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType

import attrs

from trio_broker.protocol.error_codes import ErrorCode

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "TRANSITIONS",
    "Group",
    "GroupConfig",
    "GroupEvent",
    "GroupRecord",
    "GroupState",
    "GroupSummary",
    "IllegalGroupTransition",
    "JoinOutcome",
    "JoinRequest",
    "JoinResult",
    "Member",
    "MemberRecord",
    "MemberSummary",
    "Reply",
    "SyncOutcome",
    "SyncResult",
    "consumer_subscription_topics",
    "lifecycle_diagram",
    "next_state",
    "select_protocol",
]

#: Kafka's protocol type for consumers; OffsetDelete reads their subscriptions.
CONSUMER_PROTOCOL_TYPE = "consumer"
#: The generation a group has before its first rebalance, and the "no generation" marker.
NO_GENERATION = -1


class GroupState(enum.Enum):
    """Kafka's group states; the values are the names DescribeGroups/ListGroups report."""

    #: No members (maybe pending KIP-394 members, maybe committed offsets).
    EMPTY = "Empty"
    #: A rebalance started: waiting for every member to (re)send JoinGroup.
    PREPARING_REBALANCE = "PreparingRebalance"
    #: JoinGroup answered with a new generation: waiting for the leader's SyncGroup.
    COMPLETING_REBALANCE = "CompletingRebalance"
    #: The leader's assignment is in; members heartbeat.
    STABLE = "Stable"
    #: Deleted; the coordinator forgets the group. Terminal.
    DEAD = "Dead"


class GroupEvent(enum.Enum):
    """Why a group changes state."""

    #: A member joined, left, changed its protocols or timed out (or the first join).
    PREPARE_REBALANCE = "prepare_rebalance"
    #: The join phase ended with members left: a new generation is handed out.
    JOIN_COMPLETED = "join_completed"
    #: The join phase ended with nobody left: a new, empty generation.
    ALL_MEMBERS_GONE = "all_members_gone"
    #: The leader's assignment was written to the offsets log (durable; in a cluster,
    #: replicated below the high watermark).
    ASSIGNMENT_STORED = "assignment_stored"
    #: DeleteGroups, or cleanup of an empty group that has no offsets left.
    DELETE = "delete"
    #: A new coordinator restored a generation from the offsets log (:meth:`Group.restore`).
    LOADED = "loaded"


S, E = GroupState, GroupEvent

#: The whole lifecycle. A missing pair is a coordinator bug, never a client error:
#: handlers check the state first and answer clients with Kafka's error codes.
TRANSITIONS: Mapping[tuple[GroupState, GroupEvent], GroupState] = MappingProxyType(
    {
        (S.EMPTY, E.PREPARE_REBALANCE): S.PREPARING_REBALANCE,
        (S.STABLE, E.PREPARE_REBALANCE): S.PREPARING_REBALANCE,
        # A member left or changed before the assignment was stored, or its write
        # failed: start over.
        (S.COMPLETING_REBALANCE, E.PREPARE_REBALANCE): S.PREPARING_REBALANCE,
        (S.PREPARING_REBALANCE, E.JOIN_COMPLETED): S.COMPLETING_REBALANCE,
        (S.PREPARING_REBALANCE, E.ALL_MEMBERS_GONE): S.EMPTY,
        (S.COMPLETING_REBALANCE, E.ASSIGNMENT_STORED): S.STABLE,
        # Only an empty group may be deleted (DeleteGroups answers NON_EMPTY_GROUP).
        (S.EMPTY, E.DELETE): S.DEAD,
        # A stored generation comes back Stable: its members go on without a rebalance.
        (S.EMPTY, E.LOADED): S.STABLE,
    }
)


def lifecycle_diagram() -> str:
    """The lifecycle as a Mermaid state diagram, drawn from :data:`TRANSITIONS`.

    ``docs/consumer-groups.md`` embeds exactly this text (a unit test keeps them in step).
    """
    lines = ["stateDiagram-v2", f"    [*] --> {GroupState.EMPTY.value}"]
    for (before, event), after in TRANSITIONS.items():
        lines.append(f"    {before.value} --> {after.value}: {event.value}")
    lines.append(f"    {GroupState.DEAD.value} --> [*]")
    return "\n".join(lines)


class IllegalGroupTransition(Exception):
    """The coordinator drove a group through a transition the table does not have."""

    def __init__(self, state: GroupState, event: GroupEvent) -> None:
        super().__init__(f"{event.name} is illegal in state {state.value}")
        self.state = state
        self.event = event


def next_state(state: GroupState, event: GroupEvent) -> GroupState:
    """The state after ``event``, or :class:`IllegalGroupTransition`."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalGroupTransition(state, event) from None


@attrs.frozen
class GroupConfig:
    """Broker-wide group settings (Kafka's names in the comments)."""

    #: group.initial.rebalance.delay.ms: wait this long for more members when an
    #: empty group gets its first member, so N starting consumers cause 1 rebalance.
    initial_rebalance_delay_ms: int = 3000
    #: group.min.session.timeout.ms / group.max.session.timeout.ms
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000


# ------------------------------------------------------------------------- requests / results


@attrs.frozen
class JoinRequest:
    """What the group needs from a JoinGroup request (any version)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    #: JoinGroup v0 has none; the handler passes the session timeout then (as Kafka does).
    rebalance_timeout_ms: int
    protocol_type: str
    #: (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...]
    #: v4+ (KIP-394): a dynamic member with no id gets MEMBER_ID_REQUIRED and an id first.
    require_known_member_id: bool = True
    #: v9+: the client understands ``skip_assignment`` (KIP-814).
    supports_skip_assignment: bool = True


@attrs.frozen
class JoinResult:
    error: ErrorCode
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    #: For the leader only: (member id, group instance id, metadata of the chosen protocol).
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    #: v9+: a static leader rejoining a stable group keeps the current assignment.
    skip_assignment: bool = False


@attrs.frozen
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@attrs.frozen
class Reply:
    """The answer for a request parked earlier under ``waiter``."""

    waiter: Hashable
    result: JoinResult | SyncResult


@attrs.frozen
class JoinOutcome:
    #: The answer now, or None when the request is parked under its waiter.
    result: JoinResult | None
    #: Answers for parked requests (perhaps including this one's) that this step completed.
    replies: tuple[Reply, ...] = ()


@attrs.frozen
class SyncOutcome:
    result: SyncResult | None
    replies: tuple[Reply, ...] = ()
    #: The leader's SyncGroup: the generation to write. Nobody is answered until the
    #: caller reports the write with :meth:`Group.store_completed`.
    store: GroupRecord | None = None


@attrs.frozen
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@attrs.frozen
class GroupSummary:
    """What DescribeGroups reports. Metadata and assignments only when Stable, like Kafka."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberSummary, ...]


@attrs.frozen
class MemberRecord:
    """A member as the offsets log keeps it (Kafka's MemberMetadata in GroupMetadataValue)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    #: Its metadata for the generation's protocol (a consumer's subscription).
    subscription: bytes
    assignment: bytes


@attrs.frozen
class GroupRecord:
    """A completed generation as stored in the offsets log, written when the leader's
    SyncGroup brings the assignment (the group is Stable once it is written) and when
    the group becomes Empty (no members)."""

    protocol_type: str | None
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    members: tuple[MemberRecord, ...]


# ------------------------------------------------------------------------- members


@attrs.define(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    #: What the leader assigned in the current generation (empty until then).
    assignment: bytes = b""
    #: When the member is removed unless it heartbeats; ignored while it has parked
    #: JoinGroup/SyncGroup requests (a member waiting for the rebalance is alive).
    session_deadline_ms: int = 0
    #: Parked JoinGroup requests; non-empty means "has rejoined this rebalance".
    #: More than one when a client retried a JoinGroup; all get the same answer.
    join_waiters: list[Hashable] = attrs.field(factory=list)
    #: Parked SyncGroup requests (CompletingRebalance only: they wait for the leader's
    #: assignment and for its write).
    sync_waiters: list[Hashable] = attrs.field(factory=list)

    @property
    def awaiting_join(self) -> bool:
        return bool(self.join_waiters)

    @property
    def awaiting_sync(self) -> bool:
        return bool(self.sync_waiters)

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(protocol)

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


def select_protocol(members: Iterable[Member]) -> str:
    """Kafka's rule: among the protocols all members support, each member votes for
    its most preferred; most votes wins. Ties go to the protocol the first member
    (the leader, in join order) prefers -- Kafka leaves ties to hash order."""
    ordered = list(members)
    if not ordered:
        raise ValueError("no members to select a protocol for")
    candidates = set(ordered[0].protocol_names())
    for member in ordered[1:]:
        candidates &= set(member.protocol_names())
    if not candidates:
        raise ValueError("members share no protocol")
    votes: dict[str, int] = {}
    for member in ordered:
        choice = member.vote(candidates)
        votes[choice] = votes.get(choice, 0) + 1
    best = max(votes.values())
    return next(name for name in ordered[0].protocol_names() if votes.get(name) == best)


# ------------------------------------------------------------------------- the group


class _Timer(enum.IntEnum):
    # At equal deadlines timers fire in this order (then by member join order).
    PENDING_MEMBER = 0
    SESSION = 1
    JOIN_PHASE = 2
    SYNC_PHASE = 3


@attrs.define(eq=False)
class Group:
    """One consumer group. Drive it with the request methods and :meth:`advance_to`."""

    group_id: str
    config: GroupConfig = attrs.field(factory=GroupConfig)
    # Private so that every change of state goes through _transition() and the table.
    _state: GroupState = attrs.field(default=GroupState.EMPTY, init=False)
    #: Bumped each time a join phase ends (also when it ends with nobody left).
    generation_id: int = attrs.field(default=0, init=False)
    #: Set by the first member ever and kept while empty (ListGroups shows it).
    protocol_type: str | None = attrs.field(default=None, init=False)
    #: The protocol of the current generation; None while Empty.
    protocol_name: str | None = attrs.field(default=None, init=False)
    #: The first member in join order; re-chosen when the leader leaves.
    leader_id: str | None = attrs.field(default=None, init=False)
    #: member id -> member, in join order (which decides leadership).
    members: dict[str, Member] = attrs.field(factory=dict, init=False)
    #: group.instance.id -> member id of the static member holding it.
    static_members: dict[str, str] = attrs.field(factory=dict, init=False)
    #: KIP-394 ids handed out with MEMBER_ID_REQUIRED -> deadline for rejoining with it.
    pending_members: dict[str, int] = attrs.field(factory=dict, init=False)
    #: PreparingRebalance: when the join phase ends even if members are missing.
    join_deadline_ms: int | None = attrs.field(default=None, init=False)
    #: Not None during the initial delay of an empty group's first rebalance: how much
    #: of the rebalance timeout is left for extending the delay as members arrive.
    initial_delay_remaining_ms: int | None = attrs.field(default=None, init=False)
    new_member_added: bool = attrs.field(default=False, init=False)
    #: CompletingRebalance: members that have not sent SyncGroup by then are removed.
    sync_deadline_ms: int | None = attrs.field(default=None, init=False)
    #: CompletingRebalance after the leader's SyncGroup: its assignment (member id ->
    #: bytes, every member), waiting for its write (:meth:`store_completed`).
    pending_assignment: dict[str, bytes] | None = attrs.field(default=None, init=False)
    #: When the group entered its current state (offset expiry of empty groups).
    state_since_ms: int = attrs.field(default=0, init=False)

    # ------------------------------------------------------------------ persistence

    def record(self) -> GroupRecord:
        """The generation to store: call when Stable (members and assignment) or Empty."""
        if self._state not in (GroupState.STABLE, GroupState.EMPTY):
            raise ValueError(f"only a Stable or Empty group is stored, not {self._state.value}")
        return self._record({mid: m.assignment for mid, m in self.members.items()})

    def _record(self, assignments: Mapping[str, bytes]) -> GroupRecord:
        """The current generation, each member with its assignment in ``assignments``."""
        protocol = self.protocol_name
        members = tuple(
            MemberRecord(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata_for(protocol) if protocol is not None else b"",
                assignments[m.member_id],
            )
            for m in self.members.values()
        )
        return GroupRecord(
            self.protocol_type, self.generation_id, protocol, self.leader_id, members
        )

    @classmethod
    def restore(cls, group_id: str, record: GroupRecord, config: GroupConfig, now_ms: int) -> Group:
        """The group a new coordinator loads from its stored ``record``.

        With members it is Stable at the stored generation, leader and assignment,
        and every member's session starts at ``now_ms`` (the members heartbeat on,
        no rebalance). Without members it is Empty, keeping its generation and
        protocol type. A record that contradicts itself raises ValueError (the
        caller starts the group afresh: its members rejoin).
        """
        group = cls(group_id, config)
        group.generation_id = record.generation_id
        group.protocol_type = record.protocol_type
        group.state_since_ms = now_ms
        if record.generation_id < 0:
            raise ValueError(f"group {group_id!r}: negative generation {record.generation_id}")
        if not record.members:
            return group
        ids = [m.member_id for m in record.members]
        instances = [m.group_instance_id for m in record.members if m.group_instance_id]
        if (
            record.protocol_type is None
            or record.protocol_name is None
            or record.leader_id not in ids
            or len(set(ids)) != len(ids)
            or len(set(instances)) != len(instances)
            or not all(ids)
        ):
            raise ValueError(f"group {group_id!r}: inconsistent stored generation")
        group.protocol_name = record.protocol_name
        group.leader_id = record.leader_id
        # The leader first: join order decides who leads after it leaves.
        for stored in sorted(record.members, key=lambda m: m.member_id != record.leader_id):
            group.members[stored.member_id] = Member(
                stored.member_id, stored.group_instance_id, stored.client_id,
                stored.client_host, stored.session_timeout_ms, stored.rebalance_timeout_ms,
                record.protocol_type, ((record.protocol_name, stored.subscription),),
                assignment=stored.assignment,
                session_deadline_ms=now_ms + stored.session_timeout_ms,
            )  # fmt: skip
            if stored.group_instance_id is not None:
                group.static_members[stored.group_instance_id] = stored.member_id
        group._transition(GroupEvent.LOADED, now_ms)
        return group

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> GroupState:
        return self._state

    def is_empty(self) -> bool:
        return self._state is GroupState.EMPTY

    def _transition(self, event: GroupEvent, now_ms: int) -> None:
        self._state = next_state(self._state, event)
        self.state_since_ms = now_ms

    def delete(self, now_ms: int) -> None:
        """Mark the group Dead (the caller checked it is Empty)."""
        self._transition(GroupEvent.DELETE, now_ms)
        self.pending_members.clear()

    # ------------------------------------------------------------------ JoinGroup

    def join(
        self, req: JoinRequest, now_ms: int, new_member_id: str, waiter: Hashable
    ) -> JoinOutcome:
        """Handle a JoinGroup. ``new_member_id`` is used if the member needs an id."""
        if self._state is GroupState.DEAD:
            return JoinOutcome(
                JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id)
            )
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinOutcome(
                JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=req.member_id)
            )
        if not self._supports(req):
            return JoinOutcome(
                JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=req.member_id)
            )
        instance = req.group_instance_id
        if req.member_id == "":
            if instance is not None:
                return self._join_static_unknown_id(req, now_ms, new_member_id, waiter)
            if req.require_known_member_id:
                # KIP-394: hand out the id first, so a client that times out and
                # retries does not leave a ghost member behind.
                self.pending_members[new_member_id] = now_ms + req.session_timeout_ms
                return JoinOutcome(
                    JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_member_id)
                )
            return self._add_member_and_rebalance(req, new_member_id, now_ms, waiter)
        if req.member_id in self.pending_members:
            del self.pending_members[req.member_id]
            return self._add_member_and_rebalance(req, req.member_id, now_ms, waiter)
        if self._fenced(instance, req.member_id):
            return JoinOutcome(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=req.member_id))
        member = self.members.get(req.member_id)
        if member is None or (instance is not None and member.group_instance_id != instance):
            return JoinOutcome(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=req.member_id))
        return self._join_existing(member, req, now_ms, waiter)

    def _supports(self, req: JoinRequest) -> bool:
        """Protocol type matches and some protocol is supported by every other member."""
        if not req.protocol_type or not req.protocols:
            return False
        others = [m for m in self.members.values() if m.member_id != req.member_id]
        if not others:
            return True
        if req.protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in req.protocols}
        for member in others:
            names &= set(member.protocol_names())
        return bool(names)

    def _fenced(self, instance: str | None, member_id: str) -> bool:
        """A known group.instance.id now held by a different member id (KIP-345)."""
        if instance is None:
            return False
        holder = self.static_members.get(instance)
        return holder is not None and holder != member_id

    def _join_static_unknown_id(
        self, req: JoinRequest, now_ms: int, new_member_id: str, waiter: Hashable
    ) -> JoinOutcome:
        assert req.group_instance_id is not None
        old_id = self.static_members.get(req.group_instance_id)
        if old_id is None:
            # A new static member: no MEMBER_ID_REQUIRED round (its instance id names it).
            return self._add_member_and_rebalance(req, new_member_id, now_ms, waiter)
        # A known static member restarted: it takes over under a new id and the old
        # id is fenced, so a zombie of the old process can do no harm.
        old_leader = self.leader_id
        replies = list(self._replace_static(old_id, new_member_id))
        member = self.members[new_member_id]
        self._update_member(member, req, now_ms)
        if self._state is GroupState.STABLE:
            # Like Kafka, only the selected protocol matters: a restarted consumer's
            # metadata differs anyway (it owns no partitions yet). If the choice
            # stands, keep the generation and its assignment: no rebalance.
            if self._selectable_protocol() == self.protocol_name:
                member.session_deadline_ms = now_ms + member.session_timeout_ms
                is_leader = new_member_id == self.leader_id
                if req.supports_skip_assignment:
                    result = self._join_result(member, is_leader, skip=is_leader)
                else:
                    # Older clients cannot skip the assignment. Naming the *old* id as
                    # leader makes the restarted leader act as a follower: a Stable group
                    # would not hand out a fresh assignment anyway.
                    result = attrs.evolve(
                        self._join_result(member, False), leader_id=old_leader or ""
                    )
                return JoinOutcome(result, tuple(replies))
            member.join_waiters.append(waiter)
            replies += self._prepare_rebalance(now_ms)
            return JoinOutcome(None, tuple(replies))
        member.join_waiters.append(waiter)
        if self._state is GroupState.COMPLETING_REBALANCE:
            replies += self._prepare_rebalance(now_ms)
        else:
            replies += self._maybe_complete_join(now_ms)
        return JoinOutcome(None, tuple(replies))

    def _selectable_protocol(self) -> str | None:
        try:
            return select_protocol(self.members.values())
        except ValueError:
            return None

    def _replace_static(self, old_id: str, new_id: str) -> list[Reply]:
        """Move a static member to ``new_id``; the old id's parked requests are fenced."""
        old = self.members[old_id]
        replies = [Reply(w, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old_id))
                   for w in old.join_waiters]  # fmt: skip
        replies += [Reply(w, SyncResult(ErrorCode.FENCED_INSTANCE_ID)) for w in old.sync_waiters]
        old.join_waiters, old.sync_waiters = [], []
        old.member_id = new_id
        # Keep the member's place in join order: leadership follows it.
        self.members = {(new_id if k == old_id else k): v for k, v in self.members.items()}
        assert old.group_instance_id is not None
        self.static_members[old.group_instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        return replies

    @staticmethod
    def _update_member(member: Member, req: JoinRequest, now_ms: int) -> None:
        member.protocols = req.protocols
        member.protocol_type = req.protocol_type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id
        member.client_host = req.client_host
        member.session_deadline_ms = now_ms + req.session_timeout_ms

    def _add_member_and_rebalance(
        self, req: JoinRequest, member_id: str, now_ms: int, waiter: Hashable
    ) -> JoinOutcome:
        member = Member(
            member_id=member_id, group_instance_id=req.group_instance_id,
            client_id=req.client_id, client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            protocol_type=req.protocol_type, protocols=req.protocols,
            session_deadline_ms=now_ms + req.session_timeout_ms,
        )  # fmt: skip
        member.join_waiters.append(waiter)
        if not self.members:
            self.protocol_type = req.protocol_type
        self.members[member_id] = member
        if req.group_instance_id is not None:
            self.static_members[req.group_instance_id] = member_id
        if self.leader_id is None:
            self.leader_id = member_id
        if self._state is GroupState.PREPARING_REBALANCE:
            if self.initial_delay_remaining_ms is not None:
                self.new_member_added = True
            return JoinOutcome(None, tuple(self._maybe_complete_join(now_ms)))
        return JoinOutcome(None, tuple(self._prepare_rebalance(now_ms)))

    def _join_existing(
        self, member: Member, req: JoinRequest, now_ms: int, waiter: Hashable
    ) -> JoinOutcome:
        same_protocols = member.protocols == req.protocols
        state = self._state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member(member, req, now_ms)
            member.join_waiters.append(waiter)
            return JoinOutcome(None, tuple(self._maybe_complete_join(now_ms)))
        if state is GroupState.COMPLETING_REBALANCE and same_protocols:
            # It lost the JoinGroup response: answer again with the current generation.
            is_leader = member.member_id == self.leader_id
            return JoinOutcome(self._join_result(member, is_leader))
        if state is GroupState.STABLE and same_protocols and member.member_id != self.leader_id:
            # A follower rejoining with nothing new: no rebalance needed.
            return JoinOutcome(self._join_result(member, False))
        # The leader rejoining (it wants to reassign) or changed protocols: rebalance.
        self._update_member(member, req, now_ms)
        member.join_waiters.append(waiter)
        return JoinOutcome(None, tuple(self._prepare_rebalance(now_ms)))

    def _join_result(self, member: Member, is_leader: bool, skip: bool = False) -> JoinResult:
        assert self.protocol_name is not None
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if is_leader:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            )
        return JoinResult(
            error=ErrorCode.NONE, generation_id=self.generation_id,
            protocol_type=self.protocol_type, protocol_name=self.protocol_name,
            leader_id=self.leader_id or "", member_id=member.member_id, members=members,
            skip_assignment=skip,
        )  # fmt: skip

    # ------------------------------------------------------------------ rebalance phases

    def rebalance(self, now_ms: int) -> list[Reply]:
        """Start a rebalance of a Stable group: its members are told to rejoin at their
        next heartbeat (a consumer-protocol group just downgraded to this one)."""
        if self._state is not GroupState.STABLE:
            return []
        return self._prepare_rebalance(now_ms)

    def _rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _prepare_rebalance(self, now_ms: int) -> list[Reply]:
        replies: list[Reply] = []
        if self._state is GroupState.COMPLETING_REBALANCE:
            # Members waiting for an assignment of a generation that will never be stable.
            for member in self.members.values():
                if member.sync_waiters:
                    # Its session was on hold while it waited; it starts again now.
                    member.session_deadline_ms = now_ms + member.session_timeout_ms
                replies += [Reply(w, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
                            for w in member.sync_waiters]  # fmt: skip
                member.sync_waiters = []
                member.assignment = b""
            self.sync_deadline_ms = None
            self.pending_assignment = None  # its write, when it ends, changes nothing
        was_empty = self._state is GroupState.EMPTY
        self._transition(GroupEvent.PREPARE_REBALANCE, now_ms)
        timeout = self._rebalance_timeout_ms()
        if was_empty:
            delay = self.config.initial_rebalance_delay_ms
            self.initial_delay_remaining_ms = max(timeout - delay, 0)
            self.new_member_added = False
            self.join_deadline_ms = now_ms + delay
        else:
            self.initial_delay_remaining_ms = None
            self.join_deadline_ms = now_ms + timeout
            replies += self._maybe_complete_join(now_ms)
        return replies

    def _all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def _maybe_complete_join(self, now_ms: int) -> list[Reply]:
        if (
            self._state is GroupState.PREPARING_REBALANCE
            and self.initial_delay_remaining_ms is None
            and self._all_members_joined()
        ):
            return self._complete_join(now_ms)
        return []

    def _complete_join(self, now_ms: int) -> list[Reply]:
        """End the join phase: drop members that did not rejoin, start a generation."""
        replies: list[Reply] = []
        for member in [m for m in self.members.values() if not m.awaiting_join]:
            replies += self._forget_member(member)
        self.join_deadline_ms = None
        self.initial_delay_remaining_ms = None
        self.new_member_added = False
        self.generation_id += 1
        if not self.members:
            self.protocol_name = None
            self.leader_id = None
            self._transition(GroupEvent.ALL_MEMBERS_GONE, now_ms)
            return replies
        self.protocol_name = select_protocol(self.members.values())
        self._transition(GroupEvent.JOIN_COMPLETED, now_ms)
        self.sync_deadline_ms = now_ms + self._rebalance_timeout_ms()
        for member in self.members.values():
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            member.assignment = b""
            result = self._join_result(member, member.member_id == self.leader_id)
            replies += [Reply(w, result) for w in member.join_waiters]
            member.join_waiters = []
        return replies

    def _forget_member(self, member: Member) -> list[Reply]:
        """Drop a member without starting a rebalance; fail its parked requests."""
        replies = [Reply(w, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id))
                   for w in member.join_waiters]  # fmt: skip
        replies += [Reply(w, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)) for w in member.sync_waiters]
        del self.members[member.member_id]
        if member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member.member_id:
            self.leader_id = next(iter(self.members), None)
        return replies

    def _remove_member(self, member: Member, now_ms: int) -> list[Reply]:
        """A member left or expired: forget it and let the group rebalance."""
        replies = self._forget_member(member)
        state = self._state
        if state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            replies += self._prepare_rebalance(now_ms)
        elif state is GroupState.PREPARING_REBALANCE:
            replies += self._maybe_complete_join(now_ms)
        return replies

    # ------------------------------------------------------------------ SyncGroup

    def sync(
        self, member_id: str, group_instance_id: str | None, generation_id: int,
        protocol_type: str | None, protocol_name: str | None,
        assignments: Mapping[str, bytes], now_ms: int, waiter: Hashable,
    ) -> SyncOutcome:  # fmt: skip
        """Handle a SyncGroup; the leader's carries the assignment for everyone."""
        if self._state is GroupState.DEAD:
            return SyncOutcome(SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        if self._fenced(group_instance_id, member_id):
            return SyncOutcome(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member = self.members.get(member_id)
        if member is None:
            return SyncOutcome(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if generation_id != self.generation_id:
            return SyncOutcome(SyncResult(ErrorCode.ILLEGAL_GENERATION))
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol_name is not None and protocol_name != self.protocol_name
        ):
            return SyncOutcome(SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        state = self._state
        if state is GroupState.PREPARING_REBALANCE:
            return SyncOutcome(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if state is GroupState.STABLE:
            return SyncOutcome(self._sync_result(member))
        assert state is GroupState.COMPLETING_REBALANCE
        # Followers wait for the leader; everyone, the leader too, for the write.
        member.sync_waiters.append(waiter)
        if member_id != self.leader_id or self.pending_assignment is not None:
            return SyncOutcome(None)  # (a leader's retry: its first assignment is on its way)
        # The leader's assignment: members it left out get an empty one.
        pending = {mid: bytes(assignments.get(mid, b"")) for mid in self.members}
        self.pending_assignment = pending
        return SyncOutcome(None, store=self._record(pending))

    def store_completed(self, generation_id: int, error: ErrorCode, now_ms: int) -> list[Reply]:
        """The write of generation ``generation_id``'s assignment ended: NONE if it counts.

        Success makes the group Stable with that assignment and answers every parked
        SyncGroup at once. A failure answers them ``error`` and starts a rebalance (the
        members rejoin). A write of a generation the group has since left behind (a
        member left, joined or timed out meanwhile) changes nothing.
        """
        pending = self.pending_assignment
        if (
            pending is None
            or generation_id != self.generation_id
            or self._state is not GroupState.COMPLETING_REBALANCE
        ):
            return []
        self.pending_assignment = None
        replies: list[Reply] = []
        if error is not ErrorCode.NONE:
            for m in self.members.values():
                if m.sync_waiters:
                    m.session_deadline_ms = now_ms + m.session_timeout_ms
                replies += [Reply(w, SyncResult(error)) for w in m.sync_waiters]
                m.sync_waiters = []
            return replies + self._prepare_rebalance(now_ms)
        for m in self.members.values():
            m.assignment = pending[m.member_id]
        self._transition(GroupEvent.ASSIGNMENT_STORED, now_ms)
        self.sync_deadline_ms = None
        for m in self.members.values():
            result = self._sync_result(m)
            replies += [Reply(w, result) for w in m.sync_waiters]
            m.sync_waiters = []
            m.session_deadline_ms = now_ms + m.session_timeout_ms
        return replies

    @property
    def store_pending(self) -> bool:
        """The leader's assignment is in and waits for its write."""
        return self.pending_assignment is not None

    def _sync_result(self, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    # ------------------------------------------------------------------ Heartbeat / Leave

    def heartbeat(
        self, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int
    ) -> ErrorCode:
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if self._state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS  # "please rejoin"
        return ErrorCode.NONE

    def leave(
        self, member_id: str, group_instance_id: str | None, now_ms: int
    ) -> tuple[ErrorCode, tuple[Reply, ...]]:
        """One member of a LeaveGroup. A static member may leave by instance id alone."""
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, ()
        if member_id and self._fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID, ()
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            return ErrorCode.NONE, tuple(self._maybe_complete_join(now_ms))
        if group_instance_id is not None and group_instance_id in self.static_members:
            member = self.members[self.static_members[group_instance_id]]
        else:
            found = self.members.get(member_id)
            if found is None:
                return ErrorCode.UNKNOWN_MEMBER_ID, ()
            member = found
        return ErrorCode.NONE, tuple(self._remove_member(member, now_ms))

    # ------------------------------------------------------------------ OffsetCommit

    def validate_offset_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int
    ) -> ErrorCode:
        """May this commit be stored? A member's commit also counts as a heartbeat."""
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id < 0 and self._state is GroupState.EMPTY:
            return ErrorCode.NONE  # a consumer that assigns itself and only stores offsets
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if self._state is GroupState.COMPLETING_REBALANCE:
            # It has the new generation but not its assignment yet.
            return ErrorCode.REBALANCE_IN_PROGRESS
        # Stable, or PreparingRebalance: members commit before rejoining (like Kafka).
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        return ErrorCode.NONE

    def validate_txn_offset_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """May a transactional producer stage offsets for this group (TxnOffsetCommit)?

        KIP-447 fencing: a producer that names a member (v3+) must name a current one
        of the current generation. Unlike a consumer's commit it is no heartbeat, the
        group may be rebalancing, and a request naming nobody (v0-2, or a producer
        given only the group id) is accepted whatever the group's state.
        """
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self._state is GroupState.EMPTY:
            return ErrorCode.NONE
        if generation_id < 0 and not member_id and group_instance_id is None:
            return ErrorCode.NONE
        if group_instance_id is not None:
            holder = self.static_members.get(group_instance_id)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def subscribed_topics(self) -> set[str] | None:
        """Topics the consumer members subscribe to; None if not a consumer group."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics |= consumer_subscription_topics(member.metadata_for(self.protocol_name))
            except (KeyError, ValueError):
                continue
        return topics

    # ------------------------------------------------------------------ timers

    def _timers(self) -> list[tuple[int, _Timer, int, str]]:
        timers = [(d, _Timer.PENDING_MEMBER, i, mid)
                  for i, (mid, d) in enumerate(self.pending_members.items())]  # fmt: skip
        timers += [
            (m.session_deadline_ms, _Timer.SESSION, i, mid)
            for i, (mid, m) in enumerate(self.members.items())
            if not (m.awaiting_join or m.awaiting_sync)
        ]
        if self.join_deadline_ms is not None:
            timers.append((self.join_deadline_ms, _Timer.JOIN_PHASE, 0, ""))
        if self.sync_deadline_ms is not None:
            timers.append((self.sync_deadline_ms, _Timer.SYNC_PHASE, 0, ""))
        return timers

    def next_deadline(self) -> int | None:
        """The earliest time :meth:`advance_to` has something to do."""
        return min((t[0] for t in self._timers()), default=None)

    def advance_to(self, now_ms: int) -> list[Reply]:
        """Fire every timer due by ``now_ms``, each at its own deadline, earliest first."""
        replies: list[Reply] = []
        while True:
            timers = self._timers()
            if not timers:
                return replies
            deadline, kind, _, key = min(timers)
            if deadline > now_ms:
                return replies
            replies += self._fire(kind, key, deadline)

    def _fire(self, kind: _Timer, key: str, at_ms: int) -> list[Reply]:
        if kind is _Timer.PENDING_MEMBER:
            # Never came back with its KIP-394 id.
            del self.pending_members[key]
            return self._maybe_complete_join(at_ms)
        if kind is _Timer.SESSION:
            return self._remove_member(self.members[key], at_ms)
        if kind is _Timer.JOIN_PHASE:
            remaining = self.initial_delay_remaining_ms
            if remaining is not None and self.new_member_added and remaining > 0:
                # Members are still arriving: wait a little longer, within the timeout.
                delay = min(self.config.initial_rebalance_delay_ms, remaining)
                self.initial_delay_remaining_ms = remaining - delay
                self.new_member_added = False
                self.join_deadline_ms = at_ms + delay
                return []
            return self._complete_join(at_ms)
        # SYNC_PHASE: the leader (or some follower) never sent SyncGroup.
        self.sync_deadline_ms = None
        replies: list[Reply] = []
        laggards = [m for m in self.members.values() if not m.awaiting_sync]
        for member in laggards:
            replies += self._forget_member(member)
        return replies + self._prepare_rebalance(at_ms)

    # ------------------------------------------------------------------ describe

    def summary(self) -> GroupSummary:
        stable = self._state is GroupState.STABLE
        protocol = self.protocol_name if stable and self.protocol_name else ""
        members = tuple(
            MemberSummary(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(protocol) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in self.members.values()
        )
        return GroupSummary(self.group_id, self._state, self.protocol_type or "", protocol, members)


# ------------------------------------------------------------------------- consumer protocol

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def consumer_subscription_topics(metadata: bytes) -> set[str]:
    """Topic names of a ConsumerProtocolSubscription (any version: topics come first)."""
    view = memoryview(metadata)
    try:
        pos = 2  # version
        (count,) = _I32.unpack_from(view, pos)
        pos += 4
        if count < 0 or count > len(view):
            raise ValueError("bad topic count")
        topics = set()
        for _ in range(count):
            (size,) = _I16.unpack_from(view, pos)
            pos += 2
            if size < 0 or pos + size > len(view):
                raise ValueError("bad topic name")
            topics.add(bytes(view[pos : pos + size]).decode())
            pos += size
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return topics
