"""Share group membership (KIP-932, ShareGroupHeartbeat): pure rules, no I/O.

A member joins with epoch 0 and the topics it subscribes to, heartbeats with the epoch it
was given and leaves with epoch -1. Records of a share partition are handed out one
acquisition at a time, so a partition may go to several members at once: with more
members than partitions, members share them. Assignments follow Kafka's ``simple``
assignor (balanced; :func:`simple_assignment`); nothing is owned exclusively, so there
is no revocation step. The group epoch rises with every change of membership,
subscriptions or topic metadata, and a new target assignment is computed at once; each
member moves to it (its epoch becoming the group epoch) in the answer to its own next
heartbeat, as in Kafka: until then it keeps, and may heartbeat with, the epoch it was
given (or the one before, in case the answer that raised it was lost).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from trio_broker.protocol.error_codes import ErrorCode

JOIN_EPOCH = 0
LEAVE_EPOCH = -1

#: topic name -> partition count, of the topics that exist.
Metadata = Mapping[str, int]
#: topic name -> the partitions that may be assigned: those whose share state is
#: durably initialized (Kafka's assignable partitions of a share group). None: all.
Assignable = Mapping[str, frozenset[int]] | None
Assignment = frozenset[tuple[str, int]]


@attrs.define
class ShareMember:
    member_id: str
    member_epoch: int
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed: tuple[str, ...]
    #: What the member was last told it has (in the answer to its heartbeat).
    assignment: Assignment
    #: The session ends (the member is removed) unless it heartbeats before this (ms).
    deadline_ms: int
    #: The epoch before ``member_epoch``: a heartbeat carrying it is still accepted.
    previous_epoch: int = -1


@attrs.frozen
class ShareHeartbeat:
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed: tuple[str, ...] | None
    client_id: str = ""
    client_host: str = ""


@attrs.frozen
class ShareHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


def validate(hb: ShareHeartbeat) -> str | None:
    """Why the request is malformed (INVALID_REQUEST), or None."""
    if not hb.member_id:
        return "MemberId can't be empty."
    if hb.member_epoch < LEAVE_EPOCH:
        return f"MemberEpoch is {hb.member_epoch}, but must be greater than or equal to -1."
    if hb.member_epoch == JOIN_EPOCH and not hb.subscribed:
        return "SubscribedTopicNames must be set in first request."
    return None


@attrs.define
class ShareGroup:
    group_id: str
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    group_epoch: int = 0
    members: dict[str, ShareMember] = attrs.field(factory=dict)
    #: The metadata the target assignment was computed from.
    metadata: dict[str, int] = attrs.field(factory=dict)
    #: Each member's assignment at ``group_epoch``; a member gets its own when it
    #: heartbeats.
    target: dict[str, Assignment] = attrs.field(factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed}

    def expire(self, now_ms: int) -> list[str]:
        """Remove members whose session ran out; their ids."""
        gone = [mid for mid, m in self.members.items() if m.deadline_ms <= now_ms]
        for mid in gone:
            del self.members[mid]
        if gone:
            # What was assignable is what the target holds (every assignable partition
            # of a subscribed topic has a member).
            self._reassign(self.metadata, self.assigned_partitions())
        return gone

    def assigned_partitions(self) -> dict[str, frozenset[int]]:
        """topic -> the partitions of it the target assignment gives to some member."""
        out: dict[str, set[int]] = {}
        for assignment in self.target.values():
            for topic, partition in assignment:
                out.setdefault(topic, set()).add(partition)
        return {topic: frozenset(partitions) for topic, partitions in out.items()}

    def assignment_pending(self, assignable: Assignable) -> bool:
        """Whether the target misses partitions that became assignable, or holds some that
        are no longer (Kafka's initializedAssignmentPending, which also catches a topic
        created again under its name: its partitions are not assignable until the new
        topic's are initialized)."""
        if assignable is None or not self.members:
            return False
        assigned = self.assigned_partitions()
        return any(
            assignable.get(topic, frozenset()) != assigned.get(topic, frozenset())
            for topic in self.subscribed_topics()
        )

    def heartbeat(
        self, hb: ShareHeartbeat, metadata: Metadata, now_ms: int, assignable: Assignable = None
    ) -> ShareHeartbeatResult:
        """``assignable``: the partitions that may be assigned (None: every partition of
        ``metadata``); the target moves when they change, as when the metadata does."""
        if (why := validate(hb)) is not None:
            return ShareHeartbeatResult(ErrorCode.INVALID_REQUEST, why)
        member = self.members.get(hb.member_id)
        if hb.member_epoch == LEAVE_EPOCH:
            if member is None:
                return ShareHeartbeatResult(
                    ErrorCode.UNKNOWN_MEMBER_ID, member_id=hb.member_id, member_epoch=LEAVE_EPOCH
                )
            del self.members[hb.member_id]
            self._reassign(metadata, assignable)
            return ShareHeartbeatResult(
                ErrorCode.NONE, member_id=hb.member_id, member_epoch=LEAVE_EPOCH
            )
        if hb.member_epoch == JOIN_EPOCH:
            if member is None:
                member = ShareMember(
                    hb.member_id, 0, hb.rack_id, hb.client_id, hb.client_host,
                    (), frozenset(), 0,
                )  # fmt: skip
                self.members[hb.member_id] = member
        elif member is None:
            return ShareHeartbeatResult(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {hb.member_id} is not in group {self.group_id}.",
            )
        elif hb.member_epoch not in (member.member_epoch, member.previous_epoch):
            return ShareHeartbeatResult(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The share group member has a different epoch ({hb.member_epoch}) than "
                f"the one known by the coordinator ({member.member_epoch}).",
            )
        member.deadline_ms = now_ms + self.session_timeout_ms
        if hb.rack_id is not None:
            member.rack_id = hb.rack_id
        changed = False
        if hb.subscribed is not None and tuple(sorted(set(hb.subscribed))) != member.subscribed:
            member.subscribed = tuple(sorted(set(hb.subscribed)))
            changed = True
        if (
            changed
            or dict(metadata) != self.metadata
            or member.member_epoch == 0
            or self.assignment_pending(assignable)
        ):
            self._reassign(metadata, assignable)
        return self._answer(member)

    def catch_up(
        self, member_id: str, metadata: Metadata, assignable: Assignable
    ) -> ShareHeartbeatResult | None:
        """After the member's heartbeat was taken: partitions became assignable since
        (their share state was initialized meanwhile), so the target moves and the member
        with it, in the answer to that heartbeat. None: the member is gone."""
        member = self.members.get(member_id)
        if member is None:
            return None
        if self.assignment_pending(assignable):
            self._reassign(metadata, assignable)
        return self._answer(member)

    def _answer(self, member: ShareMember) -> ShareHeartbeatResult:
        if member.member_epoch != self.group_epoch:
            # Only the member's own heartbeat moves it to the target (Kafka's rule):
            # raising every member's epoch when another joined would fence each of
            # them at its next heartbeat, which still carries the epoch it was given.
            member.previous_epoch = member.member_epoch
            member.member_epoch = self.group_epoch
            member.assignment = self.target[member.member_id]
        return ShareHeartbeatResult(
            ErrorCode.NONE,
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            assignment=member.assignment,
        )

    def _reassign(self, metadata: Metadata, assignable: Assignable = None) -> None:
        self.group_epoch += 1
        self.metadata = dict(metadata)
        self.target = simple_assignment(
            {mid: m.subscribed for mid, m in self.members.items()}, self.metadata, assignable
        )


def spread(
    members: list[str], partitions: list[tuple[str, int]]
) -> dict[str, set[tuple[str, int]]]:
    """Deal partitions to members in turn, going round both lists until each is used:
    with fewer members, a partition each and the counts differ by at most one; with more
    members, each gets one partition and a partition's sharers differ by at most one."""
    out: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    if members and partitions:
        for k in range(max(len(members), len(partitions))):
            out[members[k % len(members)]].add(partitions[k % len(partitions)])
    return out


def simple_assignment(
    subscriptions: Mapping[str, tuple[str, ...]], metadata: Metadata, assignable: Assignable = None
) -> dict[str, Assignment]:
    """Kafka's ``simple`` share assignor, without its stickiness: balanced over the members
    when they all subscribe to the same topics, else balanced topic by topic among that
    topic's subscribers. Every assignable partition of a subscribed topic has a member,
    and every member subscribed to a topic with one has a partition."""

    def of(topic: str) -> list[int]:
        count = metadata.get(topic, 0)
        if assignable is None:
            return list(range(count))
        return sorted(p for p in assignable.get(topic, frozenset()) if p < count)

    members = sorted(subscriptions)
    out: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    if len({subscriptions[m] for m in members}) <= 1:
        topics = subscriptions[members[0]] if members else ()
        partitions = [(t, p) for t in sorted(topics) for p in of(t)]
        out.update(spread(members, partitions))
    else:
        for topic in sorted({t for m in members for t in subscriptions[m]}):
            readers = [m for m in members if topic in subscriptions[m]]
            partitions = [(topic, p) for p in of(topic)]
            for member, got in spread(readers, partitions).items():
                out[member] |= got
    return {m: frozenset(got) for m, got in out.items()}
