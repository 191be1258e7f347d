"""Reference model of one classic consumer group, written as plain rules over dicts.

``trio_broker.state.group`` is checked against this by the Hypothesis machine in
``statemachine/test_group_machine.py``. The model keeps no transition table, no
waiter lists per member and no timer heap: only the rules, as sentences.

Membership
 1. A dynamic member without an id (JoinGroup v4+) gets MEMBER_ID_REQUIRED and a
    *pending* id; it must rejoin with that id within its session timeout.
 2. A static member (group.instance.id) never gets MEMBER_ID_REQUIRED. Rejoining
    with an empty id takes over its instance under a new id; the old id is fenced.
 3. The leader is the earliest-joined member still present.

Rebalances
 4. Adding a member, removing one, the leader rejoining, or a member changing its
    protocols starts a rebalance (PreparingRebalance), except in the cases of 12.
 5. The join phase ends when every member has rejoined and no id is pending, or
    at the join deadline (the largest rebalance timeout after it started). Then
    members that did not rejoin are dropped, the generation goes up by one, and the
    group is CompletingRebalance (or Empty if nobody is left).
 6. The first rebalance of an Empty group ends no earlier than the initial delay,
    which is extended (by the delay, within the rebalance timeout) while new
    members keep arriving.
 7. The protocol is the one most members prefer among those all support; ties go to
    the leader's preference.
 8. The leader's SyncGroup in CompletingRebalance asks for its assignment to be
    written (members it left out get an empty one); the group stays
    CompletingRebalance, and every SyncGroup of the generation, the leader's too,
    waits. A leader's SyncGroup sent again meanwhile only waits too.
 8a. When that write counts, the group is Stable with that assignment and every
    parked SyncGroup is answered with its member's share, all in the same step; a
    SyncGroup arriving later (Stable) is answered at once.
 8b. When the write fails, every parked SyncGroup is answered with the error and the
    group rebalances. A write that ends after the group left that generation's
    CompletingRebalance (a rebalance started meanwhile) changes nothing.
 9. A member that has not sent SyncGroup by the sync deadline (rebalance timeout
    after the join phase) is dropped and the group rebalances.

Liveness
10. Every member heartbeats within its session timeout or is dropped; a member with a
    parked JoinGroup or SyncGroup is alive, and its session restarts when answered.
11. Timers fire at their deadline in order; at equal deadlines: pending ids, sessions
    (in join order), the join deadline, the sync deadline.

Shortcuts
12. A follower rejoining a Stable group, or anyone rejoining a CompletingRebalance
    group, with unchanged protocols gets the current generation back at once; a
    static member taking over in a Stable group whose protocol choice stands too
    (a pre-v9 client is told the old leader id, so it never thinks it leads).

Offsets
13. A commit is accepted from a member of the current generation while the group
    is Stable or PreparingRebalance, or with generation -1 while it is Empty.

Coordinator moves
14. A new coordinator loads a Stable or Empty group as it was stored: same state,
    generation, leader, members and assignments, but each member supports only the
    generation's protocol; pending ids are forgotten; sessions restart at the load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trio_broker.protocol.error_codes import ErrorCode as Err
from trio_broker.state.group import JoinResult, SyncResult

Replies = list[tuple[Any, Any]]  # (waiter, JoinResult | SyncResult)


@dataclass
class MMember:
    mid: str
    instance: str | None
    session: int
    rebalance: int
    ptype: str
    protocols: tuple[tuple[str, bytes], ...]
    client: tuple[str, str]
    deadline: int
    assignment: bytes = b""
    joins: list[Any] = field(default_factory=list)
    syncs: list[Any] = field(default_factory=list)

    def names(self) -> list[str]:
        return [n for n, _ in self.protocols]


@dataclass
class GroupModel:
    delay: int = 3000
    min_session: int = 6000
    max_session: int = 1_800_000
    state: str = "Empty"
    generation: int = 0
    ptype: str | None = None
    pname: str | None = None
    members: dict[str, MMember] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    join_deadline: int | None = None
    delay_left: int | None = None
    arrived: bool = False
    sync_deadline: int | None = None
    #: Rule 8: the leader's assignment while its write is on its way.
    writing: dict[str, bytes] | None = None

    @property
    def leader(self) -> str | None:
        return next(iter(self.members), None)

    # --------------------------------------------------------------- answers

    def _ok_join(self, m: MMember, skip: bool = False) -> JoinResult:
        assert self.pname is not None
        lead = m.mid == self.leader
        members = (
            tuple((x.mid, x.instance, dict(x.protocols)[self.pname]) for x in self.members.values())
            if lead
            else ()
        )
        return JoinResult(Err.NONE, self.generation, self.ptype, self.pname, self.leader or "",
                          m.mid, members, skip)  # fmt: skip

    # --------------------------------------------------------------- rebalancing

    def _rebalance(self, now: int) -> Replies:
        out: Replies = []
        if self.state == "CompletingRebalance":
            for m in self.members.values():
                if m.syncs:  # rule 10: answered, so its session runs again
                    m.deadline = now + m.session
                out += [(w, SyncResult(Err.REBALANCE_IN_PROGRESS)) for w in m.syncs]
                m.syncs, m.assignment = [], b""
            self.sync_deadline, self.writing = None, None
        timeout = max((m.rebalance for m in self.members.values()), default=0)
        if self.state == "Empty":  # rule 6
            self.state = "PreparingRebalance"
            self.delay_left, self.arrived = max(timeout - self.delay, 0), False
            self.join_deadline = now + self.delay
            return out
        self.state = "PreparingRebalance"
        self.delay_left = None
        self.join_deadline = now + timeout
        return out + self._try_finish_join(now)

    def _try_finish_join(self, now: int) -> Replies:  # rule 5
        everyone = all(m.joins for m in self.members.values()) and not self.pending
        if self.state == "PreparingRebalance" and self.delay_left is None and everyone:
            return self._finish_join(now)
        return []

    def _finish_join(self, now: int) -> Replies:
        out: Replies = []
        for m in [m for m in self.members.values() if not m.joins]:
            out += self._drop(m)
        self.join_deadline, self.delay_left, self.arrived = None, None, False
        self.generation += 1
        if not self.members:
            self.state, self.pname = "Empty", None
            return out
        self.pname = self._choose()
        self.state = "CompletingRebalance"
        self.sync_deadline = now + max(m.rebalance for m in self.members.values())
        for m in self.members.values():
            m.deadline, m.assignment = now + m.session, b""
        for m in self.members.values():
            out += [(w, self._ok_join(m)) for w in m.joins]
            m.joins = []
        return out

    def _choose(self) -> str:  # rule 7
        ms = list(self.members.values())
        common = set.intersection(*(set(m.names()) for m in ms))
        votes: dict[str, int] = {}
        for m in ms:
            pick = next(n for n in m.names() if n in common)
            votes[pick] = votes.get(pick, 0) + 1
        return max(ms[0].names(), key=lambda n: (votes.get(n, 0), -ms[0].names().index(n)))

    def _drop(self, m: MMember) -> Replies:
        out: Replies = [(w, JoinResult(Err.UNKNOWN_MEMBER_ID, member_id=m.mid)) for w in m.joins]
        out += [(w, SyncResult(Err.UNKNOWN_MEMBER_ID)) for w in m.syncs]
        del self.members[m.mid]
        return out

    def _leave(self, m: MMember, now: int) -> Replies:
        out = self._drop(m)
        if self.state in ("Stable", "CompletingRebalance"):
            return out + self._rebalance(now)
        return out + self._try_finish_join(now)

    def _holder(self, instance: str | None) -> str | None:
        if instance is None:
            return None
        return next((m.mid for m in self.members.values() if m.instance == instance), None)

    def _fenced(self, instance: str | None, mid: str) -> bool:
        holder = self._holder(instance)
        return holder is not None and holder != mid

    # --------------------------------------------------------------- requests

    def join(
        self, mid: str, instance: str | None, session: int, rebalance: int, ptype: str,
        protocols: tuple[tuple[str, bytes], ...], now: int, new_id: str, waiter: Any,
        client: tuple[str, str] = ("", ""), v4: bool = True, v9: bool = True,
    ) -> tuple[JoinResult | None, Replies]:  # fmt: skip
        def fail(code: Err, member: str = mid) -> tuple[JoinResult, Replies]:
            return JoinResult(code, member_id=member), []

        if not self.min_session <= session <= self.max_session:
            return fail(Err.INVALID_SESSION_TIMEOUT)
        others = [m for m in self.members.values() if m.mid != mid]
        names = {n for n, _ in protocols}
        if not ptype or not protocols or (others and (
            ptype != self.ptype or not names.intersection(*(set(m.names()) for m in others))
        )):  # fmt: skip
            return fail(Err.INCONSISTENT_GROUP_PROTOCOL)

        def fresh(member_id: str) -> tuple[None, Replies]:
            if not self.members:
                self.ptype = ptype
            m = MMember(member_id, instance, session, rebalance, ptype, protocols, client,
                        now + session, joins=[waiter])  # fmt: skip
            self.members[member_id] = m
            if self.state == "PreparingRebalance":
                if self.delay_left is not None:
                    self.arrived = True
                return None, self._try_finish_join(now)
            return None, self._rebalance(now)

        def refresh(m: MMember) -> None:
            m.protocols, m.ptype, m.session, m.rebalance = protocols, ptype, session, rebalance
            m.client, m.deadline = client, now + session

        if mid == "":
            if instance is None:
                if not v4:
                    return fresh(new_id)
                self.pending[new_id] = now + session  # rule 1
                return fail(Err.MEMBER_ID_REQUIRED, new_id)
            old = self._holder(instance)
            if old is None:
                return fresh(new_id)
            # rule 2: take over, fence the old id, keep the place in join order
            m, old_leader = self.members[old], self.leader
            out: Replies = [(w, JoinResult(Err.FENCED_INSTANCE_ID, member_id=old)) for w in m.joins]
            out += [(w, SyncResult(Err.FENCED_INSTANCE_ID)) for w in m.syncs]
            m.joins, m.syncs, m.mid = [], [], new_id
            self.members = {(new_id if k == old else k): v for k, v in self.members.items()}
            refresh(m)
            if self.state == "Stable":
                if self._common_choice() == self.pname:  # rule 12
                    if v9:
                        return self._ok_join(m, skip=new_id == self.leader), out
                    # before v9 nobody may think it leads: name the old leader id
                    follower = JoinResult(Err.NONE, self.generation, self.ptype, self.pname,
                                          old_leader or "", new_id)  # fmt: skip
                    return follower, out
                m.joins.append(waiter)
                return None, out + self._rebalance(now)
            m.joins.append(waiter)
            if self.state == "CompletingRebalance":
                return None, out + self._rebalance(now)
            return None, out + self._try_finish_join(now)
        if mid in self.pending:
            del self.pending[mid]
            return fresh(mid)
        if self._fenced(instance, mid):
            return fail(Err.FENCED_INSTANCE_ID)
        m_or_none = self.members.get(mid)
        if m_or_none is None or (instance is not None and m_or_none.instance != instance):
            return fail(Err.UNKNOWN_MEMBER_ID)
        m = m_or_none
        same = m.protocols == protocols
        if self.state == "PreparingRebalance":
            refresh(m)
            m.joins.append(waiter)
            return None, self._try_finish_join(now)
        if same and (self.state == "CompletingRebalance" or mid != self.leader):  # rule 12
            return self._ok_join(m), []
        refresh(m)
        m.joins.append(waiter)
        return None, self._rebalance(now)

    def _common_choice(self) -> str | None:
        try:
            return self._choose()
        except (StopIteration, TypeError, ValueError):
            return None

    def sync(
        self, mid: str, instance: str | None, generation: int, assignments: dict[str, bytes],
        now: int, waiter: Any,
    ) -> tuple[SyncResult | None, Replies]:  # fmt: skip
        if self._fenced(instance, mid):
            return SyncResult(Err.FENCED_INSTANCE_ID), []
        m = self.members.get(mid)
        if m is None:
            return SyncResult(Err.UNKNOWN_MEMBER_ID), []
        if generation != self.generation:
            return SyncResult(Err.ILLEGAL_GENERATION), []
        if self.state == "PreparingRebalance":
            return SyncResult(Err.REBALANCE_IN_PROGRESS), []
        m.deadline = now + m.session
        if self.state == "Stable":
            return SyncResult(Err.NONE, self.ptype, self.pname, m.assignment), []
        m.syncs.append(waiter)
        if mid == self.leader and self.writing is None:  # rule 8
            self.writing = {x: assignments.get(x, b"") for x in self.members}
        return None, []

    def stored(self, generation: int, error: Err, now: int) -> Replies:
        """Rules 8a, 8b: the write the leader's SyncGroup of ``generation`` asked for ended."""
        if self.writing is None or generation != self.generation:
            return []
        writing, self.writing = self.writing, None
        out: Replies = []
        if error is not Err.NONE:
            for x in self.members.values():
                if x.syncs:  # rule 10
                    x.deadline = now + x.session
                out += [(w, SyncResult(error)) for w in x.syncs]
                x.syncs = []
            return out + self._rebalance(now)
        self.state, self.sync_deadline = "Stable", None
        for x in self.members.values():
            x.assignment = writing[x.mid]
            out += [
                (w, SyncResult(Err.NONE, self.ptype, self.pname, x.assignment)) for w in x.syncs
            ]
            x.syncs, x.deadline = [], now + x.session
        return out

    def heartbeat(self, mid: str, instance: str | None, generation: int, now: int) -> Err:
        if self._fenced(instance, mid):
            return Err.FENCED_INSTANCE_ID
        m = self.members.get(mid)
        if m is None:
            return Err.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return Err.ILLEGAL_GENERATION
        m.deadline = now + m.session
        return Err.REBALANCE_IN_PROGRESS if self.state == "PreparingRebalance" else Err.NONE

    def leave(self, mid: str, instance: str | None, now: int) -> tuple[Err, Replies]:
        if mid and self._fenced(instance, mid):
            return Err.FENCED_INSTANCE_ID, []
        if mid in self.pending:
            del self.pending[mid]
            return Err.NONE, self._try_finish_join(now)
        holder = self._holder(instance)
        m = self.members.get(holder if holder is not None else mid)
        if m is None:
            return Err.UNKNOWN_MEMBER_ID, []
        return Err.NONE, self._leave(m, now)

    def commit(self, mid: str, instance: str | None, generation: int, now: int) -> Err:  # rule 13
        if self._fenced(instance, mid):
            return Err.FENCED_INSTANCE_ID
        if generation < 0 and self.state == "Empty":
            return Err.NONE
        m = self.members.get(mid)
        if m is None:
            return Err.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return Err.ILLEGAL_GENERATION
        if self.state == "CompletingRebalance":
            return Err.REBALANCE_IN_PROGRESS
        m.deadline = now + m.session
        return Err.NONE

    # --------------------------------------------------------------- rule 14

    def restore(self, now: int) -> None:
        assert self.state in ("Stable", "Empty")
        self.pending = {}
        for m in self.members.values():
            assert self.pname is not None
            m.protocols = ((self.pname, dict(m.protocols)[self.pname]),)
            m.deadline = now + m.session

    # --------------------------------------------------------------- time (rules 10, 11)

    def _due(self) -> list[tuple[int, int, int, str]]:
        due = [(d, 0, i, k) for i, (k, d) in enumerate(self.pending.items())]
        due += [(m.deadline, 1, i, m.mid) for i, m in enumerate(self.members.values())
                if not m.joins and not m.syncs]  # fmt: skip
        if self.join_deadline is not None:
            due.append((self.join_deadline, 2, 0, ""))
        if self.sync_deadline is not None:
            due.append((self.sync_deadline, 3, 0, ""))
        return due

    def advance(self, now: int) -> Replies:
        out: Replies = []
        while self._due() and min(self._due())[0] <= now:
            at, kind, _, key = min(self._due())
            if kind == 0:
                del self.pending[key]
                out += self._try_finish_join(at)
            elif kind == 1:
                out += self._leave(self.members[key], at)
            elif kind == 2:
                if self.delay_left is not None and self.arrived and self.delay_left > 0:
                    step = min(self.delay, self.delay_left)
                    self.delay_left -= step
                    self.arrived = False
                    self.join_deadline = at + step
                else:
                    out += self._finish_join(at)
            else:
                self.sync_deadline = None
                for m in [m for m in self.members.values() if not m.syncs]:
                    out += self._drop(m)
                out += self._rebalance(at)
        return out
