"""The group state machine against its reference model (``spec/group_model.py``).

Four clients -- two dynamic, two static -- join, sync, heartbeat, commit and leave
one group while the clock jumps. Every step runs on the implementation and on the
model; their answers (immediate and for parked requests) must be equal. The
invariants are the group protocol's promises:

* at most one generation is Stable at a time, and generations only go up;
* every Stable generation's assignment is exactly what its leader sent;
* the write of a generation (the leader's SyncGroup hands it out; a separate step
  completes or fails it, or completes after the generation was abandoned) comes
  before any member learns an assignment of it, and the step that completes it
  answers every member waiting in SyncGroup; what was written is what the Stable
  group serves;
* no parked request is lost: every unanswered one is parked in the group;
* a committed offset never regresses: only members of the current generation (or
  simple consumers of an Empty group) commit, and each commits only what it owns.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import attrs
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spec.group_model import GroupModel
from trio_broker.groups.offsets_store import GroupMetadata, decode_record, encode_record
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.group import (
    Group,
    GroupConfig,
    GroupRecord,
    GroupState,
    JoinRequest,
    JoinResult,
    Reply,
    SyncResult,
)

CLIENTS = ("dyn-a", "dyn-b", "static-c", "static-d")
INSTANCE = {"static-c": "instance-c", "static-d": "instance-d"}
PARTITIONS = (0, 1, 2, 3)
PROTOCOLS: tuple[tuple[tuple[str, bytes], ...], ...] = (
    (("range", b"r1"), ("roundrobin", b"rr1")),
    (("roundrobin", b"rr2"), ("range", b"r2")),
    (("roundrobin", b"rr3"),),
    (("sticky", b"s"), ("range", b"r3")),
    (("other", b"o"),),
)


@attrs.define
class Client:
    member_id: str = ""
    generation: int = -1
    #: Set by JoinGroup: the members list, if this client leads the generation.
    members_to_assign: tuple[str, ...] = ()
    owned: frozenset[int] = frozenset()
    positions: dict[int, int] = attrs.field(factory=dict)
    #: What a well-behaved consumer does next: "join", "sync" or "heartbeat".
    next_step: str = "join"


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.ids = itertools.count()
        self.waiter_ids = itertools.count()
        #: waiter -> (client, the member id it sent the request with)
        self.waiter_owner: dict[int, tuple[str, str]] = {}
        self.clients = {name: Client() for name in CLIENTS}
        self.group = Group("g")
        self.model = GroupModel()
        #: generation -> the assignment its leader sent
        self.leader_assignments: dict[int, dict[str, bytes]] = {}
        self.stable_generations: list[int] = []
        #: Writes handed out by a leader's SyncGroup and not completed yet, oldest first.
        self.writes: list[GroupRecord] = []
        #: generation -> the record whose write completed (made it Stable).
        self.written: dict[int, GroupRecord] = {}
        #: partition -> (generation, offset) of the last accepted commit
        self.committed: dict[int, tuple[int, int]] = {}

    @initialize(delay=st.sampled_from([0, 100, 3000]))
    def configure(self, delay: int) -> None:
        self.group = Group("g", GroupConfig(initial_rebalance_delay_ms=delay))
        self.model = GroupModel(delay=delay)

    # ------------------------------------------------------------------ plumbing

    def _waiter(self, client: str) -> int:
        waiter = next(self.waiter_ids)
        self.waiter_owner[waiter] = (client, self.clients[client].member_id)
        return waiter

    def _compare(self, impl: Any, model: Any, what: str) -> None:
        assert impl == model, f"{what}: implementation {impl!r} != model {model!r}"

    def _deliver(self, replies: tuple[Reply, ...] | list[Reply], model: list[Any]) -> None:
        got = {r.waiter: r.result for r in replies}
        assert len(got) == len(replies), "a waiter was answered twice"
        self._compare(got, dict(model), "replies")
        for waiter, result in got.items():
            assert isinstance(waiter, int)
            name, sent_as = self.waiter_owner.pop(waiter)
            self._observe(name, sent_as, result)

    def _observe(self, name: str, sent_as: str, result: JoinResult | SyncResult) -> None:
        client = self.clients[name]
        note(f"{name} <- {result}")
        event(f"{type(result).__name__} {result.error.name}")
        if isinstance(result, JoinResult):
            if result.error is ErrorCode.MEMBER_ID_REQUIRED:
                client.member_id = result.member_id
            elif result.error is ErrorCode.NONE:
                client.member_id = result.member_id
                client.generation = result.generation_id
                client.members_to_assign = tuple(m[0] for m in result.members)
                client.next_step = "sync"
            elif result.error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                client.member_id, client.generation = "", -1
            return
        if result.error is ErrorCode.NONE:
            # Invariant: a Stable generation hands out exactly its leader's assignment,
            # and only once the write of that generation completed.
            group = self.group
            assert group.state is GroupState.STABLE
            assert group.generation_id in self.written, "assignment answered before its write"
            sent = self.leader_assignments[group.generation_id]
            assert result.assignment == sent.get(sent_as, b"")
            if sent_as != client.member_id:
                return  # answers a request of an earlier incarnation of this client
            client.owned = frozenset(result.assignment)
            # A new owner resumes from the committed offset, like a consumer.
            client.positions = {p: self.committed.get(p, (-1, 0))[1] for p in client.owned}
            client.next_step = "heartbeat"
        elif result.error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
            client.member_id, client.generation, client.owned = "", -1, frozenset()
            client.next_step = "join"
        else:
            client.next_step = "join"

    def _track_state(self, before: GroupState) -> None:
        # Illegal moves raise inside the group (IllegalGroupTransition fails the run);
        # here we only watch generations become Stable. Only a completed write (or a
        # load) makes a group Stable, so a step enters Stable at most once.
        after = self.group.state
        if after is GroupState.STABLE and before is not GroupState.STABLE:
            assert not self.stable_generations or (
                self.stable_generations[-1] < self.group.generation_id
            ), "a generation became Stable twice, or generations went down"
            self.stable_generations.append(self.group.generation_id)

    # ------------------------------------------------------------------ rules

    @rule(
        name=st.sampled_from(CLIENTS),
        protocols=st.sampled_from(PROTOCOLS),
        session=st.sampled_from([6000, 10_000, 10_000, 5000]),
        rebalance=st.sampled_from([6000, 20_000]),
        forget_id=st.booleans(),
        v4=st.booleans(),
        v9=st.booleans(),
    )
    def join(
        self, name: str, protocols: tuple[tuple[str, bytes], ...], session: int,
        rebalance: int, forget_id: bool, v4: bool, v9: bool = True,
    ) -> None:  # fmt: skip
        client = self.clients[name]
        # Eager rebalancing: a consumer gives up its partitions before it rejoins.
        client.owned = frozenset()
        member_id = "" if forget_id else client.member_id
        instance = INSTANCE.get(name)
        new_id = f"m{next(self.ids)}"
        waiter = self._waiter(name)
        before = self.group.state
        note(f"t={self.now} {name} JoinGroup member={member_id!r} {[p for p, _ in protocols]}")
        req = JoinRequest(member_id, instance, name, "host", session, rebalance, "consumer",
                          protocols, require_known_member_id=v4,
                          supports_skip_assignment=v9)  # fmt: skip
        holder = self.group.static_members.get(instance or "")
        out = self.group.join(req, self.now, new_id, waiter)
        new_holder = self.group.static_members.get(instance or "")
        sent = self.leader_assignments.get(self.group.generation_id, {})
        if holder in sent and new_holder is not None and new_holder != holder:
            # A static member took over under a new id and keeps its assignment.
            sent[new_holder] = sent.pop(holder)
        m_result, m_replies = self.model.join(
            member_id, instance, session, rebalance, "consumer", protocols, self.now, new_id,
            waiter, (name, "host"), v4, v9,
        )  # fmt: skip
        self._compare(out.result, m_result, "JoinGroup")
        if out.result is not None:
            self._observe(*self.waiter_owner.pop(waiter), out.result)
        self._deliver(out.replies, m_replies)
        self._track_state(before)

    @rule(
        name=st.sampled_from(CLIENTS),
        generation_skew=st.sampled_from([0, 0, 0, -1, 1]),
        owners=st.lists(st.integers(0, 7), min_size=len(PARTITIONS), max_size=len(PARTITIONS)),
    )
    def sync(self, name: str, generation_skew: int, owners: list[int]) -> None:
        client = self.clients[name]
        generation = client.generation + generation_skew
        assignments: dict[str, bytes] = {}
        if client.members_to_assign:
            # The leader gives each partition to exactly one member (any member id).
            members = client.members_to_assign
            for partition, pick in zip(PARTITIONS, owners, strict=True):
                owner = members[pick % len(members)]
                assignments[owner] = assignments.get(owner, b"") + bytes([partition])
        waiter = self._waiter(name)
        before = self.group.state
        note(f"t={self.now} {name} SyncGroup gen={generation} {assignments}")
        instance = INSTANCE.get(name)
        if (
            self.group.state is GroupState.COMPLETING_REBALANCE
            and client.member_id == self.group.leader_id
            and generation == self.group.generation_id
            and not self.group.store_pending  # (a retry: the first assignment stands)
        ):
            self.leader_assignments[generation] = assignments
        out = self.group.sync(client.member_id, instance, generation, None, None, assignments,
                              self.now, waiter)  # fmt: skip
        m_result, m_replies = self.model.sync(
            client.member_id, instance, generation, assignments, self.now, waiter
        )
        self._compare(out.result, m_result, "SyncGroup")
        if out.store is not None:
            assert out.store.generation_id == self.group.generation_id
            sent = self.leader_assignments[out.store.generation_id]
            assert {r.member_id: r.assignment for r in out.store.members} == {
                mid: sent.get(mid, b"") for mid in self.group.members
            }, "the write does not carry the leader's assignment"
            self.writes.append(out.store)
            note(f"t={self.now} write of generation {out.store.generation_id} pending")
        if out.result is not None:
            self._observe(*self.waiter_owner.pop(waiter), out.result)
        self._deliver(out.replies, m_replies)
        self._track_state(before)

    @rule(name=st.sampled_from(CLIENTS), generation_skew=st.sampled_from([0, 0, -1]))
    def heartbeat(self, name: str, generation_skew: int) -> None:
        client = self.clients[name]
        generation = client.generation + generation_skew
        instance = INSTANCE.get(name)
        got = self.group.heartbeat(client.member_id, instance, generation, self.now)
        want = self.model.heartbeat(client.member_id, instance, generation, self.now)
        note(f"t={self.now} {name} Heartbeat gen={generation} -> {got.name}")
        self._compare(got, want, "Heartbeat")
        event(f"Heartbeat {got.name}")
        if got is not ErrorCode.NONE:
            client.next_step = "join"
            if got in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                client.member_id, client.generation, client.owned = "", -1, frozenset()

    @rule(name=st.sampled_from(CLIENTS), owners=st.lists(st.integers(0, 7), min_size=4, max_size=4))
    def behave(self, name: str, owners: list[int]) -> None:
        """What a real consumer does next, so that runs reach Stable generations often."""
        step = self.clients[name].next_step
        if step == "join":
            self.join(name, PROTOCOLS[0 if name.startswith("dyn") else 1], 10_000, 20_000,
                      forget_id=False, v4=True)  # fmt: skip
        elif step == "sync":
            self.sync(name, 0, owners)
        else:
            self.heartbeat(name, 0)

    @rule(members=st.sets(st.sampled_from(CLIENTS), min_size=1), rounds=st.integers(1, 4))
    def cooperate(self, members: set[str], rounds: int) -> None:
        """Some clients behave for a few rounds of 1 s (well within session timeouts);
        the writes of the generations succeed within each round."""
        for _ in range(rounds):
            for name in CLIENTS:
                if name in members:
                    self.behave(name, [0, 1, 2, 3])
            while self.writes:
                self.complete_write(0, ErrorCode.NONE)
            self.tick(1000)

    @precondition(lambda self: self.writes)
    @rule(
        index=st.integers(0, 3),
        error=st.sampled_from([ErrorCode.NONE, ErrorCode.NONE, ErrorCode.NOT_COORDINATOR,
                               ErrorCode.COORDINATOR_NOT_AVAILABLE]),
    )  # fmt: skip
    def complete_write(self, index: int, error: ErrorCode) -> None:
        """A pending write of a generation counts (NONE) or fails -- perhaps one of a
        generation the group has left behind meanwhile."""
        record = self.writes.pop(index % len(self.writes))
        generation = record.generation_id
        group = self.group
        current = group.store_pending and generation == group.generation_id
        parked = {w for m in group.members.values() for w in m.sync_waiters}
        before = group.state
        note(f"t={self.now} write of generation {generation} ends: {error.name}")
        if error is ErrorCode.NONE and current:
            self.written[generation] = record
        replies = group.store_completed(generation, error, self.now)
        m_replies = self.model.stored(generation, error, self.now)
        event(f"write {'current' if current else 'stale'} {error.name}")
        self._deliver(replies, m_replies)
        self._track_state(before)
        if not current:
            assert not replies and group.state is before, "a stale write changed the group"
            return
        # Invariant: the step that ends the write answers everyone waiting in SyncGroup.
        assert parked <= {r.waiter for r in replies}
        if error is ErrorCode.NONE:
            assert group.state is GroupState.STABLE
            # What was written is what the group serves (and a new coordinator loads).
            assert group.record() == record
        else:
            assert group.state is GroupState.PREPARING_REBALANCE
            assert all(r.result.error is error for r in replies if r.waiter in parked)

    @precondition(lambda self: self.writes)
    @rule(
        joiner=st.sampled_from(CLIENTS),
        error=st.sampled_from([ErrorCode.NONE, ErrorCode.NOT_COORDINATOR]),
    )
    def stale_write_ends_during_the_next_one(self, joiner: str, error: ErrorCode) -> None:
        """The adversary's order: a generation's write is still pending when a member
        joins again (a new generation), everyone rejoins and the new leader's SyncGroup
        sends its own write; then the older write ends, counted or failed. It changes
        nothing (``complete_write`` checks): the group waits for its own generation's
        write, as Kafka drops the callback of a generation it left."""
        oldest = self.writes[0].generation_id
        self.join(joiner, PROTOCOLS[0 if joiner.startswith("dyn") else 1], 10_000, 20_000,
                  forget_id=False, v4=True)  # fmt: skip
        for _ in range(4):  # heartbeat (told to rejoin), join, sync
            if any(w.generation_id > oldest for w in self.writes):
                break
            for name in CLIENTS:
                self.behave(name, [0, 1, 2, 3])
        newer = any(w.generation_id > oldest for w in self.writes)
        event("a stale write ends while a newer one is pending", str(newer))
        if newer:
            self.complete_write(0, error)

    @rule(name=st.sampled_from(CLIENTS), by_instance=st.booleans())
    def leave(self, name: str, by_instance: bool) -> None:
        client = self.clients[name]
        instance = INSTANCE.get(name)
        member_id = "" if by_instance and instance else client.member_id
        before = self.group.state
        got, replies = self.group.leave(member_id, instance, self.now)
        want, m_replies = self.model.leave(member_id, instance, self.now)
        note(f"t={self.now} {name} LeaveGroup {member_id!r} -> {got.name}")
        self._compare(got, want, "LeaveGroup")
        self._deliver(replies, m_replies)
        if got is ErrorCode.NONE:
            self.clients[name] = Client()
        self._track_state(before)

    @rule(
        name=st.sampled_from(CLIENTS),
        advance=st.integers(0, 50),
        simple=st.booleans(),
        partition=st.sampled_from(PARTITIONS),
    )
    def commit(self, name: str, advance: int, simple: bool, partition: int) -> None:
        client = self.clients[name]
        instance = None if simple else INSTANCE.get(name)
        member_id, generation = ("", -1) if simple else (client.member_id, client.generation)
        got = self.group.validate_offset_commit(member_id, instance, generation, self.now)
        want = self.model.commit(member_id, instance, generation, self.now)
        self._compare(got, want, "OffsetCommit")
        event(f"OffsetCommit {got.name}")
        if simple:
            offset = self.committed.get(partition, (-1, 0))[1] + advance
            assert got is ErrorCode.NONE or self.group.state is not GroupState.EMPTY
        elif partition in client.owned and generation >= 0:
            # (A group-managed consumer without a generation does not commit.)
            offset = client.positions[partition] = client.positions[partition] + advance
        else:
            return  # a consumer commits only partitions it owns
        note(f"t={self.now} {name} OffsetCommit p{partition}={offset} gen={generation} -> {got}")
        if got is not ErrorCode.NONE:
            return
        # Invariant: accepted member commits come from the current generation and
        # never move an offset (or its generation) backwards.
        if generation >= 0:
            assert generation == self.group.generation_id
        previous = self.committed.get(partition, (-1, 0))
        assert offset >= previous[1], f"offset regressed: {previous} -> {offset}"
        assert generation < 0 or generation >= previous[0], "commit from an older generation"
        self.committed[partition] = (max(generation, previous[0]), offset)

    @rule(delta=st.sampled_from([0, 1, 99, 500, 3000, 5999, 6000, 10_000, 20_001, 60_000]))
    def tick(self, delta: int) -> None:
        self.now += delta
        before = self.group.state
        replies = self.group.advance_to(self.now)
        m_replies = self.model.advance(self.now)
        note(f"t={self.now} tick +{delta}: {self.group.state.value} gen {self.group.generation_id}")
        self._deliver(replies, m_replies)
        self._track_state(before)
        event(f"after tick: {self.group.state.value}")

    @precondition(lambda self: self.group.state in (GroupState.STABLE, GroupState.EMPTY))
    @rule()
    def move_coordinator(self) -> None:
        """A new coordinator loads the group from its stored record (through the bytes)."""
        stored = decode_record(*encode_record(GroupMetadata("g", self.group.record())))
        assert isinstance(stored, GroupMetadata) and stored.value is not None
        note(f"t={self.now} coordinator moves: {self.group.state.value} gen {stored.value}")
        self.group = Group.restore("g", stored.value, self.group.config, self.now)
        self.model.restore(self.now)
        event(f"restored {self.group.state.value}")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def same_as_model(self) -> None:
        g, m = self.group, self.model
        self._compare(g.state.value, m.state, "state")
        self._compare(g.generation_id, m.generation, "generation")
        self._compare(g.leader_id, m.leader, "leader")
        self._compare(list(g.members), list(m.members), "members")
        self._compare(dict(g.pending_members), m.pending, "pending members")
        self._compare(g.protocol_name, m.pname, "protocol")
        self._compare(g.pending_assignment, m.writing, "assignment being written")
        self._compare(
            {k: v.assignment for k, v in g.members.items()},
            {k: v.assignment for k, v in m.members.items()},
            "assignments",
        )
        self._compare(g.next_deadline(), min((d[0] for d in m._due()), default=None), "deadline")

    @invariant()
    def one_stable_generation(self) -> None:
        if self.group.state is GroupState.STABLE:
            assert self.stable_generations[-1] == self.group.generation_id
            # Parked requests belong to rebalances; a Stable group has none.
            assert not any(m.join_waiters or m.sync_waiters for m in self.group.members.values())

    @invariant()
    def no_request_lost(self) -> None:
        parked = [w for m in self.group.members.values() for w in m.join_waiters + m.sync_waiters]
        assert len(parked) == len(set(parked))
        assert set(parked) == set(self.waiter_owner), "a parked request was dropped"

    @invariant()
    def static_members_consistent(self) -> None:
        g = self.group
        held = {m.group_instance_id: mid for mid, m in g.members.items() if m.group_instance_id}
        assert held == g.static_members
        assert (g.leader_id is None) == (not g.members)
        assert g.leader_id is None or g.leader_id == next(iter(g.members))

    @invariant()
    def timers_match_state(self) -> None:
        g = self.group
        assert (g.join_deadline_ms is not None) == (g.state is GroupState.PREPARING_REBALANCE)
        assert (g.sync_deadline_ms is not None) == (g.state is GroupState.COMPLETING_REBALANCE)
        assert not g.store_pending or g.state is GroupState.COMPLETING_REBALANCE
        if g.state is GroupState.EMPTY:
            assert not g.members and g.protocol_name is None


#: tools/mutation.sh runs this machine once per mutant and asks for fewer examples.
EXAMPLES = int(os.environ.get("MUTATION_EXAMPLES", "300"))

GroupMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupMachine = GroupMachine.TestCase
