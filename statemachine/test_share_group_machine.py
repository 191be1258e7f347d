"""Share group membership (trio_broker/state/share_group.py) under random heartbeats.

The share partition machine drives the records of one share partition; nothing drove the
group's membership and assignment. This machine joins, heartbeats, leaves and lets
members' sessions run out, changes subscriptions and the topics' partition counts, and
checks what KIP-932's ``simple`` assignor promises of every assignment the group hands
out (the group's own state, read after every step), against the machine's own record of
who is a member with which subscription:

1. the members are exactly those that joined and have not left or timed out;
2. a member's epoch is at most the group epoch, and the group epoch rises with every
   change of membership, subscriptions or metadata; a heartbeat answers the member's
   target assignment at the group epoch (the checks below are of the target);
3. every partition of a subscribed, existing topic is assigned to at least one of its
   subscribers, and to no one else;
4. every member subscribed to an existing topic with partitions gets at least one
   partition (with more members than partitions, members share partitions);
5. balance: among the subscribers of one same subscription, partition counts differ by
   at most one.
"""

from __future__ import annotations

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_group import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    ShareGroup,
    ShareHeartbeat,
)

MEMBERS = ("m1", "m2", "m3", "m4", "m5")
TOPICS = ("a", "b")
SESSION_MS = 1000
SUBSCRIPTIONS = st.sampled_from((("a",), ("b",), ("a", "b")))


class ShareGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = ShareGroup("g", session_timeout_ms=SESSION_MS)
        self.now_ms = 0
        self.metadata: dict[str, int] = {"a": 2, "b": 1}
        #: member id -> (subscription, session deadline)
        self.members: dict[str, tuple[tuple[str, ...], int]] = {}
        self.last_epoch = 0

    def _send(self, member: str, epoch: int, subscribed: tuple[str, ...] | None) -> None:
        known = self.group.members.get(member)
        current = known.member_epoch if known is not None else None
        hb = ShareHeartbeat(member, epoch, None, subscribed)
        result = self.group.heartbeat(hb, self.metadata, self.now_ms)
        note(f"{member} epoch {epoch} {subscribed}: {result.error.name} {result.assignment}")
        if epoch == LEAVE_EPOCH:
            if member in self.members:
                assert result.error == ErrorCode.NONE
                del self.members[member]
            else:
                assert result.error == ErrorCode.UNKNOWN_MEMBER_ID
            return
        if epoch == JOIN_EPOCH or member in self.members:
            if epoch != JOIN_EPOCH and epoch != current:
                assert result.error == ErrorCode.FENCED_MEMBER_EPOCH, result
                return  # a stale epoch: nothing changes
            assert result.error == ErrorCode.NONE, result
            previous = self.members.get(member, ((), 0))[0]
            self.members[member] = (
                tuple(sorted(set(subscribed))) if subscribed else previous,
                self.now_ms + SESSION_MS,
            )
            assert result.assignment == self.group.members[member].assignment
            assert result.assignment == self.group.target[member]
            assert result.member_epoch == self.group.group_epoch
        else:
            assert result.error == ErrorCode.UNKNOWN_MEMBER_ID

    @rule(member=st.sampled_from(MEMBERS), subscribed=SUBSCRIPTIONS)
    def join(self, member: str, subscribed: tuple[str, ...]) -> None:
        self._send(member, JOIN_EPOCH, subscribed)

    @rule(member=st.sampled_from(MEMBERS), subscribed=st.one_of(st.none(), SUBSCRIPTIONS))
    def heartbeat(self, member: str, subscribed: tuple[str, ...] | None) -> None:
        known = self.group.members.get(member)
        self._send(member, known.member_epoch if known else 3, subscribed)

    @rule(member=st.sampled_from(MEMBERS))
    def leave(self, member: str) -> None:
        self._send(member, LEAVE_EPOCH, None)

    @rule(topic=st.sampled_from(TOPICS), partitions=st.integers(0, 4))
    def metadata_changes(self, topic: str, partitions: int) -> None:
        if partitions:
            self.metadata[topic] = partitions
        else:
            self.metadata.pop(topic, None)

    @rule(ms=st.sampled_from((10, 400, SESSION_MS + 1)))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms
        gone = self.group.expire(self.now_ms)
        expected = sorted(m for m, (_, deadline) in self.members.items() if deadline <= self.now_ms)
        assert sorted(gone) == expected, f"expired {gone}, sessions ended {expected}"
        for member in gone:
            del self.members[member]

    @invariant()
    def assignments_follow_the_simple_assignor(self) -> None:
        group = self.group
        assert set(group.members) == set(self.members)  # 1
        if group.members:
            assert group.group_epoch >= self.last_epoch  # 2
            for member in group.members.values():
                assert member.member_epoch <= group.group_epoch
        self.last_epoch = group.group_epoch
        metadata = group.metadata
        subscriptions = {m: self.members[m][0] for m in group.members}
        for topic in {t for subs in subscriptions.values() for t in subs}:
            readers = [m for m, subs in subscriptions.items() if topic in subs]
            partitions = {(topic, p) for p in range(metadata.get(topic, 0))}
            given = {m: {tp for tp in group.target[m] if tp[0] == topic} for m in readers}
            assert set().union(*given.values()) == partitions, (  # 3
                f"{topic}'s partitions {sorted(partitions)} given as {given}"
            )
        for member in group.members.values():
            subs = subscriptions[member.member_id]
            target = group.target[member.member_id]
            assert all(t in subs for t, _ in target), member  # 3
            if any(metadata.get(t, 0) for t in subs):  # 4
                assert target, (
                    f"{member.member_id} subscribes to {subs} ({metadata}) and got nothing"
                )
        if len(set(subscriptions.values())) == 1:  # 5
            counts = [len(group.target[m]) for m in group.members]
            assert max(counts) - min(counts) <= 1, f"unbalanced: {counts}"


TestShareGroupMachine = ShareGroupMachine.TestCase
TestShareGroupMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
