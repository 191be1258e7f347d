"""KIP-848 consumer groups (trio_broker.state.consumer_group) under random heartbeats.

Members join, heartbeat reporting what they own (a member releases what it was asked
to revoke on one of its later heartbeats, or keeps it a while longer), report stale
epochs, leave, leave statically, go silent past their session, and commit offsets.
After every step:

1. no partition is held (assigned or pending revocation) by two members at once, and
   ``owners`` is exactly the union of the members' holdings;
2. the group epoch and every live member's epoch never go back, and a member's epoch
   is never ahead of the assignment epoch;
3. a partition a member was given is one of the target's partitions for it;
4. a commit with a member epoch above the member's is refused (STALE_MEMBER_EPOCH), an
   older one is accepted exactly for the partitions held since that epoch (KIP-1251:
   "since" as the machine saw it, each partition from the member epoch at which it
   appeared in the member's assignment, kept while it stays there), and one from a
   removed member is refused too (UNKNOWN_MEMBER_ID);
5. the group's stored snapshot decodes to the same group;
6. a heartbeat at the member's previous epoch (the answer that bumped it was lost) is
   accepted exactly when what it reports owning is within the member's assignment,
   else fenced (FENCED_MEMBER_EPOCH), as Kafka's consumer group coordinator decides.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerGroupConfig,
    Heartbeat,
    MemberState,
    Refused,
)

SESSION_MS = 1_000
TOPICS = {"a": 3, "b": 2}
IDS = [f"m{i}" for i in range(4)]


class ConsumerGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.group = ConsumerGroup("g", ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
        self.now = 0
        #: What each client believes it owns (what it was last given, minus releases).
        self.client_owned: dict[str, frozenset[tuple[str, int]]] = {}
        self.client_epoch: dict[str, int] = {}
        self.last_group_epoch = 0
        self.last_member_epoch: dict[str, int] = {}
        self.gone: set[str] = set()
        #: member -> partition -> the member epoch at which the machine first saw the
        #: partition in the member's assignment, while it has stayed there since.
        self.held_since: dict[str, dict[tuple[str, int], int]] = {}

    def beat(self, member_id: str, epoch: int, owned: frozenset[tuple[str, int]] | None,
             topics: tuple[str, ...] | None = None, instance: str | None = None) -> ErrorCode:  # fmt: skip
        result = self.group.heartbeat(
            Heartbeat(
                member_id=member_id,
                member_epoch=epoch,
                owned=owned,
                subscribed=topics,
                rebalance_timeout_ms=SESSION_MS if epoch == 0 else -1,
                instance_id=instance,
            ),
            self.now,
            TOPICS,
            member_id,
        )
        note(f"{member_id} epoch {epoch} owned {owned and sorted(owned)} -> {result}")
        if result.error is ErrorCode.NONE:
            self.client_epoch[member_id] = result.member_epoch
            if result.assignment is not None:
                self.client_owned[member_id] = result.assignment
        elif result.error in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            # The client abandons its partitions and rejoins from scratch.
            self.client_owned.pop(member_id, None)
            self.client_epoch.pop(member_id, None)
        return result.error

    @rule(member_id=st.sampled_from(IDS),
          topics=st.sampled_from([("a",), ("b",), ("a", "b")]),
          static=st.booleans())  # fmt: skip
    def join(self, member_id: str, topics: tuple[str, ...], static: bool) -> None:
        if member_id in self.group.members:
            return
        self.beat(member_id, 0, frozenset(), topics, f"i-{member_id}" if static else None)

    @rule(member_id=st.sampled_from(IDS), release=st.booleans())
    def heartbeat(self, member_id: str, release: bool) -> None:
        epoch = self.client_epoch.get(member_id)
        if epoch is None or epoch < 0:
            return
        owned = self.client_owned.get(member_id, frozenset())
        member = self.group.members.get(member_id)
        if release and member is not None:
            # The client gives up what it no longer has in its last assignment.
            owned = owned & (member.assigned | frozenset())
            owned = owned - member.pending_revocation
            self.client_owned[member_id] = owned
        instance = member.instance_id if member is not None else None
        self.beat(member_id, epoch, owned, instance=instance)

    @rule(member_id=st.sampled_from(IDS), delta=st.integers(1, 3))
    def stale_epoch(self, member_id: str, delta: int) -> None:
        member = self.group.members.get(member_id)
        if member is None or member.epoch <= 0:
            return
        result = self.group.heartbeat(
            Heartbeat(member_id=member_id, member_epoch=member.epoch + delta, owned=frozenset()),
            self.now,
            TOPICS,
            member_id,
        )
        assert result.error is ErrorCode.FENCED_MEMBER_EPOCH

    @rule(member_id=st.sampled_from(IDS), beyond=st.booleans(), data=st.data())
    def heartbeat_at_previous_epoch(
        self, member_id: str, beyond: bool, data: st.DataObject
    ) -> None:
        """Sentence 6: the answer that bumped a member's epoch may be lost, so a heartbeat
        at its previous epoch is accepted while it reports nothing beyond its assignment;
        reporting more, it is fenced (FENCED_MEMBER_EPOCH: it might still be consuming a
        partition given to another member)."""
        member = self.group.members.get(member_id)
        if member is None or not 0 < member.previous_epoch < member.epoch:
            # Build it: the member joins and reconciles, another joins (a new group
            # epoch), and the member reconciles to it, releasing what it must.
            self.join(member_id, ("a", "b"), static=False)
            self.heartbeat(member_id, release=True)
            other = next((i for i in IDS if i not in self.group.members), None)
            if other is not None:
                self.join(other, ("a", "b"), static=False)
                self.heartbeat(other, release=True)
            for _ in range(2):
                self.heartbeat(member_id, release=True)
            member = self.group.members.get(member_id)
            if member is None or not 0 < member.previous_epoch < member.epoch:
                return
        owned = frozenset(member.assigned)
        if beyond:
            others = [(t, p) for t, n in TOPICS.items() for p in range(n) if (t, p) not in owned]
            if not others:
                return
            owned |= {data.draw(st.sampled_from(others))}
        event("heartbeat at the previous epoch", "beyond" if beyond else "within")
        error = self.beat(member_id, member.previous_epoch, owned, instance=member.instance_id)
        assert error is (ErrorCode.FENCED_MEMBER_EPOCH if beyond else ErrorCode.NONE), error

    @rule(member_id=st.sampled_from(IDS), static=st.booleans())
    def leave(self, member_id: str, static: bool) -> None:
        member = self.group.members.get(member_id)
        if member is None or member.epoch < 0:
            return
        if static and member.instance_id is not None:
            self.beat(member_id, STATIC_LEAVE_EPOCH, None, instance=member.instance_id)
        else:
            self.beat(member_id, LEAVE_EPOCH, None, instance=member.instance_id)
            self.gone.add(member_id)
        self.client_owned.pop(member_id, None)
        self.client_epoch.pop(member_id, None)

    @rule(ms=st.integers(1, 2 * SESSION_MS))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        for member_id in self.group.advance_to(self.now):
            note(f"{member_id} fenced")
            self.gone.add(member_id)

    @precondition(lambda self: bool(self.group.members))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(sorted(self.group.members)))
        member = self.group.members[member_id]
        epoch = data.draw(st.integers(-1, member.epoch + 2))
        tp = data.draw(st.sampled_from([(t, p) for t, n in TOPICS.items() for p in range(n)]))
        try:
            self.group.validate_offset_commit(member_id, epoch, 9)
        except Refused as refused:
            assert epoch > member.epoch
            assert refused.code is ErrorCode.STALE_MEMBER_EPOCH
            return
        error = self.group.commit_partition_error(member_id, epoch, tp)
        if epoch == member.epoch:
            assert error is ErrorCode.NONE
        elif error is ErrorCode.NONE:
            # KIP-1251: an older epoch only for a partition held since then.
            assert tp in member.assigned and member.assigned_at[tp] <= epoch
        else:
            assert error is ErrorCode.STALE_MEMBER_EPOCH
            # ... and for every such partition: the commit that crossed the heartbeat
            # which bumped the epoch must not fail for a partition the member kept.
            since = self.held_since.get(member_id, {}).get(tp)
            assert since is None or since > epoch, (
                f"{member_id} has held {tp} since epoch {since}: a commit at {epoch} is fine"
            )

    @precondition(lambda self: bool(self.gone))
    @rule(data=st.data())
    def commit_from_a_removed_member(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(sorted(self.gone)))
        if member_id in self.group.members:
            return  # it rejoined
        try:
            self.group.validate_offset_commit(member_id, 1, 9)
        except Refused as refused:
            assert refused.code is ErrorCode.UNKNOWN_MEMBER_ID
        else:
            raise AssertionError(f"{member_id} was removed but may commit")

    @invariant()
    def one_holder_per_partition(self) -> None:
        seen: dict[tuple[str, int], str] = {}
        for member in self.group.members.values():
            for tp in member.holds():
                assert tp not in seen, f"{tp} held by {seen.get(tp)} and {member.member_id}"
                seen[tp] = member.member_id
            assert not member.assigned & member.pending_revocation
            assert member.assigned_at.keys() == member.assigned
            if member.epoch >= 0:  # a static member away (-2) keeps its partitions
                assert all(e <= member.epoch for e in member.assigned_at.values())
        assert seen == self.group.owners

    @invariant()
    def track_holdings(self) -> None:
        """Note since when each member holds each partition (the commit rule's truth)."""
        for member_id in list(self.held_since):
            if member_id not in self.group.members:
                del self.held_since[member_id]
        for member_id, member in self.group.members.items():
            seen = self.held_since.setdefault(member_id, {})
            if member.epoch <= 0:  # left statically, or (re)joining: nothing held yet
                seen.clear()
                continue
            for tp in list(seen):
                if tp not in member.assigned:
                    del seen[tp]
            for tp in member.assigned - seen.keys():
                seen[tp] = member.epoch

    @invariant()
    def the_stored_snapshot_restores_the_group(self) -> None:
        raw = self.group.encode()
        back = ConsumerGroup.decode("g", raw, self.group.config, self.now)
        assert back.encode() == raw
        assert back.owners == self.group.owners
        assert back.state is self.group.state

    @invariant()
    def epochs_never_go_back(self) -> None:
        assert self.group.group_epoch >= self.last_group_epoch
        self.last_group_epoch = self.group.group_epoch
        assert self.group.assignment_epoch <= self.group.group_epoch
        for member_id, member in self.group.members.items():
            if member.epoch >= 0:
                last = self.last_member_epoch.get(member_id, 0)
                assert member.epoch >= last or member.epoch == 0, (member_id, member.epoch, last)
                assert member.epoch <= self.group.assignment_epoch
                self.last_member_epoch[member_id] = member.epoch
        for member_id in list(self.last_member_epoch):
            if member_id not in self.group.members:
                del self.last_member_epoch[member_id]

    @invariant()
    def given_partitions_are_targeted(self) -> None:
        for member_id, member in self.group.members.items():
            settled = member.state is not MemberState.UNREVOKED_PARTITIONS
            if settled and 0 < member.epoch == self.group.assignment_epoch:
                assert member.assigned <= self.group.target.get(member_id, frozenset())


ConsumerGroupMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestConsumerGroupMachine = ConsumerGroupMachine.TestCase


def test_members_converge_to_a_balanced_assignment() -> None:
    """Two members on one topic, then a third, then one leaves: releasing on every
    heartbeat, each ends with its share and nobody else's partitions."""
    group = ConsumerGroup("g")
    owned: dict[str, frozenset[tuple[str, int]]] = {}
    epochs: dict[str, int] = {}
    topics = {"t": 6}

    def beat(member_id: str, epoch: int | None = None) -> None:
        e = epochs.get(member_id, 0) if epoch is None else epoch
        mine = owned.get(member_id, frozenset()) if e > 0 else frozenset()
        r = group.heartbeat(
            Heartbeat(
                member_id=member_id,
                member_epoch=e,
                owned=mine,
                subscribed=("t",),
                rebalance_timeout_ms=1000,
            ),
            0,
            topics,
            member_id,
        )
        assert r.error is ErrorCode.NONE, r
        epochs[member_id] = r.member_epoch
        if r.assignment is not None:
            owned[member_id] = r.assignment

    def settle(members: list[str]) -> None:
        for _ in range(6):
            for m in members:
                beat(m)
                pending = group.members[m].pending_revocation
                owned[m] = owned.get(m, frozenset()) - pending  # released at once

    beat("a", 0)
    beat("b", 0)
    settle(["a", "b"])
    assert [len(owned["a"]), len(owned["b"])] == [3, 3]
    beat("c", 0)
    settle(["a", "b", "c"])
    assert sorted(len(owned[m]) for m in "abc") == [2, 2, 2]
    assert owned["a"] | owned["b"] | owned["c"] == {("t", p) for p in range(6)}
    assert group.state.value == "Stable"
    group.heartbeat(Heartbeat(member_id="c", member_epoch=LEAVE_EPOCH), 0, topics, "c")
    settle(["a", "b"])
    assert owned["a"] | owned["b"] == {("t", p) for p in range(6)}
    assert not owned["a"] & owned["b"]
