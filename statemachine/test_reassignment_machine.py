"""One partition moving between replica sets (KIP-455) under a live leader and faults.

The replication machine's three replicas never change; this one's do. Five brokers; a
partition starts on brokers 1-3 and an administrator moves it to any other non-empty
set of them, or cancels the move, at any time. The controller's decisions are the real
``replication.controller_rules`` (``reassign``, ``reassignment_done``,
``leave_replicas``, ``after_broker_loss``, ``after_broker_return``) taken in the order
``cluster/controller.py`` takes them (the assignment write, then the partition state
with a new leader epoch; at the end of a move the state first, then the assignment).
The leader's term is the real ``LeaderPartition``: followers join the ISR through its
proposals, stored with a leader-epoch condition, and a leaving replica does not join
back once the move is ending (``may_join``, as ``cluster/replica_manager.py`` decides).
Logs are their lengths; a follower fetches a prefix of the leader's log.

What is checked, the machine keeping its own record of which replicas each move adds:

1. a move ends (the leaving replicas go) only when every replica it adds is in the ISR
   at that moment, and then the replicas are exactly the move's target;
2. a move that adds no replica (it only removes) ends at the controller's next pass,
   once a target replica alive and in the ISR can lead;
3. while a replica leads, the ISR is within the replicas; the leader is within the ISR,
   and every ISR member holds the log below the leader's HW (what acks=all counted is
   on each of them);
4. a follower's fetch at the leader's log end puts it in the ISR, a replica the move
   removes too while some joiner is not yet in sync (Kafka lets it rejoin then); once
   every joiner is in sync a leaving replica stays out. The fetch goes through
   ``replica_rules.record_follower_fetch`` and ``leaving_replica``, as the replica
   manager calls them.

5. the controller's pass (``decide`` with ``restarted_leader``, as ``_reconcile`` calls
   them, zxids kept by the machine) gives a leader that restarted unseen (registered
   after the state was written) the same leader and ISR in a new epoch;
6. the rebalance pass (``imbalanced_moves``) moves leadership back to the preferred
   replica exactly when more than leader.imbalance.per.broker.percentage % of the
   partitions that broker prefers are led elsewhere and it is alive and in the ISR, in a
   new epoch with the same ISR; partitions it leads already never move;
7. a leader's ISR write that fails in ZooKeeper (``store_isr``, its session lost at the
   write) leaves its term as before the proposal: the ISR it had, nothing pending;
8. an acks=all write is taken exactly when the ISR holds min.insync.replicas members,
   capped at the replica count (Kafka's effectiveMinIsr), as moves change that count.

A cancel, or a new target, is a move from the current replicas (``reassign``): a
replica the abandoned move added stays until the new move ends, so 3 holds too in the
state that once escaped it (a move cancelled back to replicas none of which can lead
yet: the original replica down, a joining one the ISR alone; the joiner keeps leading
until an original replica has caught up from it).
"""

from __future__ import annotations

import os

import attrs
import pytest
import trio
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.cluster.controller import decide, imbalanced_moves, restarted_leader
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper, SessionLost
from trio_broker.cluster.isr_store import store_isr
from trio_broker.cluster.zk_layout import PartitionState, partition_state_path
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    ElectionType,
    LeaderAndIsr,
    Reassignment,
    leave_replicas,
    reassign,
    reassignment_done,
    requested_election,
)
from trio_broker.replication.leader import IsrProposal, LeaderPartition
from trio_broker.replication.replica_rules import leaving_replica, record_follower_fetch
from trio_broker.services.cluster_view import PartitionInfo

BROKERS = (1, 2, 3, 4, 5)
TOPIC = "moving"
LAG_MAX_MS = 100

#: A move's target: one to four brokers in some order (the first is preferred).
TARGETS = st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True)


class _SessionLostAtWrite(MemoryCoordination):
    """A ZooKeeper client whose session is lost when it writes (kazoo's LOST)."""

    async def set(self, path: str, data: bytes, version: int) -> int:
        raise SessionLost(f"session lost writing {path}")


@attrs.define
class Broker:
    log_end: int = 0
    alive: bool = True


class ReassignmentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0
        self.brokers = {b: Broker() for b in BROKERS}
        self.state = LeaderAndIsr(1, 0, (1, 2, 3))
        self.moving = Reassignment((1, 2, 3))
        #: The replicas the move under way adds, as the machine recorded the request.
        self.joining: frozenset[int] = frozenset()
        self.target: tuple[int, ...] = (1, 2, 3)
        self.term: LeaderPartition | None = None
        self.pending: IsrProposal | None = None
        #: ZooKeeper's zxids as the controller reads them: the partition state's last
        #: write, and each live broker's registration (a restart registers anew).
        self.zxid = 1
        self.state_zxid = 1
        self.registered = dict.fromkeys(BROKERS, 1)
        #: The topic's min.insync.replicas (``min_insync_changes``), each term's too.
        self.min_insync = 1
        self._start_term()

    # -- the controller ------------------------------------------------------------

    def _live(self) -> frozenset[int]:
        return frozenset(b for b in BROKERS if self.brokers[b].alive)

    def _start_term(self) -> None:
        """The leader hears the stored state: a new term knowing the current replicas."""
        self.term, self.pending = None, None
        leader = self.state.leader
        if leader == NO_LEADER or not self.brokers[leader].alive:
            return
        self.term = LeaderPartition.become_leader(
            broker_id=leader,
            leader_epoch=self.state.leader_epoch,
            replicas=self.moving.replicas,
            isr=frozenset(self.state.isr),
            log_end_offset=self.brokers[leader].log_end,
            high_watermark=self._high_watermark_floor(),
            now_ms=self.now_ms,
            min_insync_replicas=self.min_insync,
            replica_lag_time_max_ms=LAG_MAX_MS,
        )

    def _high_watermark_floor(self) -> int:
        """What the new leader may count as committed: every ISR member holds it."""
        ends = [self.brokers[b].log_end for b in self.state.isr]
        return min(ends) if ends else 0

    def _store(self, state: LeaderAndIsr) -> None:
        assert state.leader_epoch > self.state.leader_epoch, "a leader epoch reused"
        note(f"controller: leader {state.leader} epoch {state.leader_epoch} ISR {state.isr}")
        self.state = state
        self.zxid += 1
        self.state_zxid = self.zxid
        self._start_term()

    @rule(wanted=st.one_of(st.none(), TARGETS))
    def administrator_moves(self, wanted: list[int] | None) -> None:
        """AlterPartitionReassignments: a new target (replacing one under way) or a cancel."""
        if wanted is None and not (self.moving.adding or self.moving.removing):
            return  # NO_REASSIGNMENT_IN_PROGRESS
        original, abandoned = self.moving.original, frozenset(self.moving.adding)
        self.moving = reassign(self.moving, wanted)
        if wanted is None or tuple(wanted) == original:
            self.joining, self.target = frozenset(), original
        else:
            self.joining = frozenset(wanted) - frozenset(original)
            self.target = tuple(wanted)
        note(f"move to {self.target}: replicas {self.moving.replicas}")
        new = leave_replicas(self.state, self.moving.replicas, self._live())
        if new is None:
            new = LeaderAndIsr(self.state.leader, self.state.leader_epoch + 1, self.state.isr)
        self._store(new)
        leader = self.state.leader
        if leader in abandoned and leader in self.moving.removing:
            # The state that once escaped 3: an abandoned joiner leads and leaves with
            # the new move; with no target replica able to take over, it stays.
            can_lead = any(b in self.state.isr and self.brokers[b].alive for b in self.target)
            event(f"an abandoned joiner leads, a target replica can lead: {can_lead}")

    @rule()
    def controller_finishes_moves(self) -> None:
        """The reconciler's pass over a moving partition (``_finish_move``)."""
        moving = self.moving
        if not (moving.adding or moving.removing):
            return
        can_lead = any(b in self.state.isr and self.brokers[b].alive for b in self.target)
        if reassignment_done(self.state, moving):
            # Sentence 1: every replica this move adds is in sync now.
            out_of_sync = sorted(self.joining - frozenset(self.state.isr))
            assert not out_of_sync, f"move ends with joining {out_of_sync} out of the ISR"
            after = leave_replicas(self.state, moving.target, self._live())
            leader = self.state.leader
            if after is None and (leader not in moving.target or leader not in self._live()):
                return  # no target replica can lead yet (as ``_finish_move``)
            if after is not None:
                self._store(after)
            self.moving = Reassignment(moving.target)
            assert self.moving.replicas == self.target, "a move ended off its target"
            self.joining = frozenset()
            note(f"move done: replicas {self.moving.replicas}")
        else:
            # Sentence 2: removing only, with a target replica able to lead, ends now.
            assert self.joining or not can_lead, (
                f"a move that only removes replicas did not end: {moving}, {self.state}"
            )

    @rule()
    def leader_dies_as_the_move_ends(self) -> None:
        """Rule 7's order: the leader (a target replica) dies, and the controller's pass
        ends the move before it handles the loss; then the loss pass. With no move
        ready to end, one that only removes a follower is asked first."""
        leader = self.state.leader
        moving = self.moving
        if not (moving.adding or moving.removing) and leader != NO_LEADER:
            followers = [r for r in moving.replicas if r != leader]
            if followers:
                self.administrator_moves([leader, *followers[:-1]])
        if not reassignment_done(self.state, self.moving):
            return
        leader = self.state.leader
        if leader == NO_LEADER or leader not in self.target or len(self._live()) == 1:
            return
        self.brokers[leader].alive = False
        del self.registered[leader]
        note(f"leader {leader} dies; the move's end comes first")
        self.controller_finishes_moves()
        others = [
            b for b in self.target if b != leader and b in self.state.isr and b in self._live()
        ]
        if self.moving.replicas == self.target:  # the move ended
            event("a move ended with its leader dead", bool(others))
            assert not others or self.state.leader in self._live(), (
                f"the move to {self.target} ended with dead leader {self.state.leader} kept,"
                f" though in-sync {others} are alive: {self.state}"
            )
        new = self._controller_decides()
        if new is not None:
            self._store(new)
        else:
            self._start_term()

    @rule()
    def leader_dies_then_unclean_election(self) -> None:
        """Rule 8: the leader dies and an administrator's unclean ElectLeaders comes
        before the controller's loss pass."""
        leader = self.state.leader
        if leader == NO_LEADER or len(self._live()) == 1:
            return
        self.brokers[leader].alive = False
        del self.registered[leader]
        live = self._live()
        elected = requested_election(self.state, self.moving.replicas, live, ElectionType.UNCLEAN)
        note(f"leader {leader} dies; unclean ElectLeaders -> {elected}")
        if isinstance(elected, LeaderAndIsr):
            in_sync = tuple(b for b in self.state.isr if b in live)
            event("an unclean election with a live ISR member", bool(in_sync))
            dead = sorted(set(elected.isr) - live)
            assert elected.leader in live and not dead, (
                f"unclean ElectLeaders with {leader} dead elected {elected}: dead {dead} in"
                f" the ISR ({sorted(live)} alive)"
            )
            assert set(elected.isr) == set(in_sync or (elected.leader,)), (self.state, elected)
            if in_sync:  # an unclean choice (a replica outside the ISR) loses records:
                self._store(elected)  # only the clean case goes on (the HW rule 3 holds)
                return
        new = self._controller_decides()
        if new is not None:
            self._store(new)
        else:
            self._start_term()

    @rule(broker=st.sampled_from(BROKERS))
    def broker_dies(self, broker: int) -> None:
        if not self.brokers[broker].alive or len(self._live()) == 1:
            return
        self.brokers[broker].alive = False
        del self.registered[broker]
        if broker not in self.moving.replicas:
            return
        new = self._controller_decides()
        if new is not None:
            self._store(new)
        elif self.state.leader == broker:
            self._start_term()

    @rule(broker=st.sampled_from(BROKERS))
    def broker_returns(self, broker: int) -> None:
        if self.brokers[broker].alive:
            return
        self.brokers[broker].alive = True
        self.zxid += 1
        self.registered[broker] = self.zxid
        if broker not in self.moving.replicas:
            return
        new = self._controller_decides()
        if new is not None:
            self._store(new)

    @precondition(lambda self: self.state.leader == NO_LEADER)
    @rule()
    def offline_partitions_isr_member_returns(self) -> None:
        """A leaderless partition's ISR member comes back (the random returns seldom
        pick it): the controller's pass makes it leader."""
        dead = [b for b in self.state.isr if not self.brokers[b].alive]
        if dead:
            self.broker_returns(dead[0])

    def _controller_decides(self) -> LeaderAndIsr | None:
        """The controller's pass over the partition after the broker list changed:
        ``cluster/controller.py``'s ``decide`` (the lost brokers through
        ``after_broker_loss``, then a leaderless partition's returning ISR member
        through ``after_broker_return``), as its reconcile loop calls it."""
        return decide(
            self._info(),
            self._live(),
            leader_restarted=restarted_leader(self._info(), self.registered),
        )

    def _info(self) -> PartitionInfo:
        """The partition as the controller reads it from ZooKeeper."""
        state, moving = self.state, self.moving
        return PartitionInfo(
            moving.replicas, state.leader, state.leader_epoch, state.isr,
            moving.adding, moving.removing, state_zxid=self.state_zxid,
        )  # fmt: skip

    @precondition(lambda self: self.state.leader != NO_LEADER)
    @rule()
    def leader_restarts_unseen(self) -> None:
        """The leader's broker restarts (or its session expires and it registers again)
        before the controller saw its registration go. Kafka's controller then sees a
        failure and a startup of that broker; here ``restarted_leader`` reads it from the
        zxids (the state older than the leader's registration), and the pass must give
        the leader's new life a new epoch: the old life's term, and any follower still
        fetching from it, is fenced. With nothing else changed the pass keeps the leader
        and the ISR."""
        leader, before = self.state.leader, self.state
        if not self.brokers[leader].alive or self._controller_decides() is not None:
            return  # not settled: the pass would write more than the restart's epoch
        self.zxid += 1
        self.registered[leader] = self.zxid
        self.term, self.pending = None, None  # the old life's term is gone with it
        new = self._controller_decides()
        assert new == LeaderAndIsr(leader, before.leader_epoch + 1, before.isr), (
            f"restarted leader {leader}: {before} became {new}"
        )
        self._store(new)
        assert self._controller_decides() is None, "the pass after a restart changes more"

    @rule(percentage=st.sampled_from([0, 10, 20, 25, 50, 100]), balanced=st.integers(0, 4))
    def preferred_replica_bounces_then_rebalance(self, percentage: int, balanced: int) -> None:
        """The shape the random rules seldom build (at seed 2 never): the preferred
        replica leads, dies, returns and catches up into the ISR, so a rebalance pass
        has a move to make (or to refuse at or below the percentage)."""
        preferred = self.moving.replicas[0]
        if self.state.leader != preferred:
            return
        self.broker_dies(preferred)
        self.broker_returns(preferred)
        self.follower_fetches(preferred, whole=True)
        self.follower_fetches(preferred, whole=True)
        self.controller_rebalances_leaders(percentage, balanced)

    @rule(percentage=st.sampled_from([0, 10, 20, 25, 50, 100]), balanced=st.integers(0, 4))
    def controller_rebalances_leaders(self, percentage: int, balanced: int) -> None:
        """The controller's rebalance pass (auto.leader.rebalance.enable: ``imbalanced_moves``
        over the settled partitions, as ``_reconcile`` calls it) on this partition and
        ``balanced`` others that its preferred replica prefers and leads. Kafka's rule
        (leader.imbalance.per.broker.percentage): when more than ``percentage`` % of the
        partitions a broker prefers are led by others, each of them moves back to it
        where it is alive and in the ISR, in a new epoch with the same ISR; nothing else
        moves, and nothing at all at or below the percentage."""
        if self._controller_decides() is not None:
            return  # not settled: this pass writes decide's state instead
        preferred = self.moving.replicas[0]
        others = {
            (f"balanced-{i}", 0): PartitionInfo((preferred,), preferred, 0, (preferred,))
            for i in range(balanced)
        }
        moves = imbalanced_moves({(TOPIC, 0): self._info(), **others}, self._live(), percentage)
        led_elsewhere = self.state.leader != preferred
        over = led_elsewhere and percentage * (balanced + 1) < 100  # Kafka's ratio, strictly over
        can_lead = preferred in self._live() and preferred in self.state.isr
        expected = (
            LeaderAndIsr(preferred, self.state.leader_epoch + 1, self.state.isr)
            if over and can_lead
            else None
        )
        event(f"rebalance: led elsewhere {led_elsewhere}, over {over}, can lead {can_lead}")
        assert set(moves) <= {(TOPIC, 0)}, f"a balanced partition moved: {moves}"
        assert moves.get((TOPIC, 0)) == expected, (
            f"{percentage}% with {balanced} balanced, {self.state}, live "
            f"{sorted(self._live())}: moves {moves}, expected {expected}"
        )
        if expected is not None:
            self._store(expected)

    @rule(replicas=TARGETS)
    def controller_creates_a_partition(self, replicas: list[int]) -> None:
        """A partition created while some brokers are down (``decide`` on a partition
        with no state yet): Kafka's controller starts it with its live replicas as the
        ISR, the first of them leading, at epoch 0; with none alive it writes no state
        (it waits for one to return: the controller machine drives that)."""
        live = self._live()
        new = decide(PartitionInfo(tuple(replicas), NO_LEADER, -1, ()), live)
        alive = tuple(r for r in replicas if r in live)
        if alive:
            assert new == LeaderAndIsr(alive[0], 0, alive), (replicas, sorted(live), new)
        else:
            assert new is None, (replicas, new)

    # -- the leader and its followers -------------------------------------------------

    def _store_proposal(
        self, proposal: IsrProposal | None, term: LeaderPartition | None = None
    ) -> None:
        """The leader's ISR change reaches ZooKeeper through the broker's own
        ``store_isr`` (cluster/isr_store.py), against a partition state znode holding
        what the controller stored. It must be stored exactly when it is the current
        leader's, proposed in the current epoch (Kafka: the write is conditional on the
        znode's version and the leader's epoch); ``term``: a write of an older term
        landing late."""
        term = self.term if term is None else term
        if proposal is None or term is None:
            return
        state = self.state
        stored, isr = trio.run(self._isr_write_lands, state, term, proposal)
        current = (
            term is self.term
            and state.leader == term.broker_id
            and proposal.leader_epoch == state.leader_epoch
        )
        assert stored == current, (
            f"ISR {sorted(proposal.isr)} of broker {term.broker_id}'s epoch "
            f"{proposal.leader_epoch} {'stored' if stored else 'refused'} over {state}"
        )
        if stored:
            self.state = LeaderAndIsr(state.leader, state.leader_epoch, isr)
            note(f"ISR now {self.state.isr}")

    @staticmethod
    async def _isr_write_lands(
        state: LeaderAndIsr, term: LeaderPartition, proposal: IsrProposal
    ) -> tuple[bool, tuple[int, ...]]:
        """(stored?, the znode's ISR after) for one ``store_isr`` call."""
        coord = MemoryCoordination(MemoryZooKeeper())
        path = partition_state_path(TOPIC, 0)
        await coord.create(path, PartitionState.of(state, 1).encode())
        before = await coord.get(path)
        await store_isr(coord, term.broker_id, TOPIC, 0, term, proposal)
        after = await coord.get(path)
        assert before is not None and after is not None
        return after.version != before.version, PartitionState.decode(after.data).isr

    @rule(data=st.data())
    def isr_write_overtaken_by_the_controller(self, data: st.DataObject) -> None:
        """Built on purpose: the leader proposes an ISR change (a lagging follower out,
        or a caught-up one in), and before its write reaches ZooKeeper the controller
        stores a new epoch for the same leader (an ISR follower died). The late write
        must be refused. The random rules store each proposal at once."""
        term = self.term
        if term is None:
            return
        followers = [b for b in self.state.isr if b != term.broker_id and self.brokers[b].alive]
        if not followers:
            return
        self.now_ms += LAG_MAX_MS + 1  # every follower that has not fetched since lags
        proposal = term.check_lagging(self.now_ms)
        if proposal is None:
            proposal = self._catch_up_a_joiner(term)
        if proposal is None:
            return
        dies = data.draw(st.sampled_from(followers))
        note(f"broker {term.broker_id} proposes ISR {sorted(proposal.isr)}; broker {dies} dies")
        self.broker_dies(dies)
        if self.term is term:
            return  # the controller changed nothing
        event("an ISR write overtaken by the controller")
        self._store_proposal(proposal, term)

    def _catch_up_a_joiner(self, term: LeaderPartition) -> IsrProposal | None:
        """The first live replica of the move outside the ISR fetches up to the leader's
        log end: the ISR proposal that lets it join (None if none can)."""
        leader_end = self.brokers[term.broker_id].log_end
        for broker in sorted(set(self.moving.replicas) - term.isr):
            if self.brokers[broker].alive and broker in term.replicas:
                self.brokers[broker].log_end = leader_end
                _, proposal = record_follower_fetch(
                    term, broker, leader_end, 0, self.now_ms, may_join=True
                )
                if proposal is not None:
                    return proposal
        return None

    @rule(joining=st.booleans())
    def isr_write_meets_a_zookeeper_failure(self, joining: bool) -> None:
        """7: the current leader proposes an ISR change (a lagging follower out, or
        ``joining``: a caught-up one in) and its write fails in ZooKeeper (the session
        lost mid-write): ``store_isr`` must drop the proposal, leaving the term as it
        was before it (Kafka's ZooKeeper-mode leader skips the ISR update when its
        conditional write fails, and proposes again at its next check). A term left with
        the proposal pending proposes nothing again, takes none of the controller's ISR
        changes, and its HW goes on counting a joiner that was never stored."""
        term = self.term
        if term is None or term.pending is not None:
            return
        proposal = None
        if joining:
            proposal = self._catch_up_a_joiner(term)
        else:
            self.now_ms += LAG_MAX_MS + 1  # every follower that has not fetched since lags
            proposal = term.check_lagging(self.now_ms)
        if proposal is None:
            return
        isr_before = term.isr
        trio.run(self._isr_write_fails, term, proposal)
        event("an ISR write failed in ZooKeeper")
        assert term.pending is None and term.isr == isr_before, (
            f"broker {term.broker_id}'s ISR write {sorted(proposal.isr)} failed in ZooKeeper,"
            f" yet its term holds ISR {sorted(term.isr)} with {term.pending} pending"
        )

    async def _isr_write_fails(self, term: LeaderPartition, proposal: IsrProposal) -> None:
        """``store_isr`` against a ZooKeeper holding the current state, whose session is
        lost at the write."""
        coord = _SessionLostAtWrite(MemoryZooKeeper())
        await coord.create(
            partition_state_path(TOPIC, 0), PartitionState.of(self.state, 1).encode()
        )
        await store_isr(coord, term.broker_id, TOPIC, 0, term, proposal)

    @rule(value=st.integers(1, 5))
    def min_insync_changes(self, value: int) -> None:
        """AlterConfigs of min.insync.replicas: the config watch sets it on the term
        (``TopicConfigWatch.apply_min_insync``), and new terms start with it."""
        self.min_insync = value
        if self.term is not None:
            self.term.min_insync_replicas = value
        self.acks_all_write_arrives()  # the next write meets the new setting

    @rule()
    def acks_all_write_arrives(self) -> None:
        """8: an acks=all write is taken exactly when the ISR holds min.insync.replicas
        members, the setting capped at the partition's replica count (Kafka's
        effectiveMinIsr: a setting above it means every replica). Moves change the
        replica count under a fixed setting."""
        term = self.term
        if term is None:
            return
        needed = min(self.min_insync, len(term.replicas))
        taken = term.can_accept_acks_all()
        assert taken == (len(term.isr) >= needed), (
            f"min.insync.replicas {self.min_insync} over replicas {term.replicas}, ISR"
            f" {sorted(term.isr)}: acks=all {'taken' if taken else 'refused'}; Kafka's"
            f" effectiveMinIsr is {needed}"
        )

    @rule(records=st.integers(1, 3))
    def produce(self, records: int) -> None:
        term = self.term
        if term is None:
            return
        leader = self.brokers[term.broker_id]
        leader.log_end += records
        term.leader_appended(leader.log_end)
        term.leader_synced(leader.log_end)

    @rule(broker=st.sampled_from(BROKERS), whole=st.booleans())
    def follower_fetches(self, broker: int, whole: bool) -> None:
        """A replica fetches at its log end and takes all or one of what follows."""
        term = self.term
        follower = self.brokers[broker]
        if term is None or broker == term.broker_id or not follower.alive:
            return
        if broker not in term.replicas or broker not in self.moving.replicas:
            return  # not a replica (of this term, or any more): it does not fetch
        leader_end = self.brokers[term.broker_id].log_end
        follower.log_end = min(follower.log_end, leader_end)  # truncation, simplified
        moving = self.moving
        leaving = leaving_replica(broker, moving.removing, moving.adding, term.isr)
        ending = frozenset(moving.adding) <= term.isr
        _, proposal = record_follower_fetch(
            term, broker, follower.log_end, 0, self.now_ms, may_join=not leaving
        )
        self._store_proposal(proposal)
        if follower.log_end == leader_end and self.state.leader_epoch == term.leader_epoch:
            # 4: caught up to the leader's log end, a replica joins the ISR, a replica the
            # move removes too while the move goes on (as in Kafka); once every joiner
            # is in sync, a leaving one stays out.
            joins = not (broker in moving.removing and ending)
            assert broker in term.isr or not joins, (
                f"broker {broker} fetched at the log end {leader_end} and is not in the"
                f" ISR {sorted(term.isr)} (move {moving})"
            )
        follower.log_end = leader_end if whole else min(leader_end, follower.log_end + 1)

    @rule(ms=st.integers(1, 150))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms
        if self.term is not None:
            self._store_proposal(self.term.check_lagging(self.now_ms))

    @rule()
    def everyone_catches_up(self) -> None:
        """A quiet moment: every replica fetches twice, then the controller's pass."""
        for _ in range(2):
            for broker in BROKERS:
                self.follower_fetches(broker, whole=True)
        self.controller_finishes_moves()

    @rule(records=st.integers(1, 3))
    def one_of_two_joiners_catches_up(self, records: int) -> None:
        """The shape sentence 1 is about, built on purpose: a move adds two replicas,
        the leader writes, one joiner catches up and joins the ISR, the other has not
        fetched yet, and the controller looks."""
        if self.moving.adding or self.moving.removing or self.term is None:
            return
        outside = [b for b in BROKERS if b not in self.moving.replicas]
        if len(outside) < 2:
            return
        first, second = outside[:2]
        self.administrator_moves([self.term.broker_id, first, second])
        self.produce(records)
        self.follower_fetches(first, whole=True)
        self.follower_fetches(first, whole=True)
        self.controller_finishes_moves()
        note(f"joiners {first} (caught up) and {second} (not yet)")

    @rule(records=st.integers(1, 3))
    def leaving_replica_rejoins_mid_move(self, records: int) -> None:
        """Sentence 4's shape, built on purpose: a replica the move removes falls out of
        the ISR (it stops fetching past the lag limit) while one of two joiners catches
        up and joins; the move is not ending (the other joiner is out), so the leaving
        replica, fetching at the log end again, rejoins."""
        term = self.term
        if self.moving.adding or self.moving.removing or term is None:
            return
        outside = [b for b in BROKERS if b not in self.moving.replicas]
        staying = term.broker_id
        leaving = [b for b in self.moving.replicas if b != staying]
        if len(outside) < 2 or not leaving:
            return
        first, second = outside[:2]
        self.administrator_moves([staying, first, second])
        self.produce(records)
        for _ in range(2):
            self.follower_fetches(first, whole=True)
        self.time_passes(LAG_MAX_MS + 1)  # the leaving replicas and `second` lag
        for _ in range(2):
            self.follower_fetches(first, whole=True)
        note(f"joiner {first} in sync, {second} not; {leaving[0]} leaving, fetching again")
        for _ in range(2):
            self.follower_fetches(leaving[0], whole=True)

    @rule(records=st.integers(0, 3))
    def joiner_alone_in_sync_then_cancel(self, records: int) -> None:
        """The state a cancel once left outside invariant 3, built on purpose: a move to
        one new broker, which catches up and joins the ISR; the original replicas go
        down (the joiner takes over, the ISR alone); the administrator cancels before
        the controller's pass has ended the move."""
        if self.moving.adding or self.moving.removing or self.term is None:
            return
        outside = [b for b in BROKERS if b not in self.moving.replicas]
        if not outside:
            return
        joiner = outside[0]
        self.administrator_moves([joiner])
        self.produce(records)
        self.follower_fetches(joiner, whole=True)
        self.follower_fetches(joiner, whole=True)
        for broker in self.moving.original:
            self.broker_dies(broker)
        note(f"joiner {joiner} leads alone: {self.state}; cancelling")
        self.administrator_moves(None)

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def a_live_isr_member_means_a_leader(self) -> None:
        """The controller's pass elects a leaderless partition's ISR member once one is
        alive (Kafka's OfflinePartition -> OnlinePartition)."""
        if self.state.leader == NO_LEADER:
            alive = [b for b in self.state.isr if self.brokers[b].alive]
            assert not alive, f"no leader with ISR members {alive} alive"

    @invariant()
    def isr_within_replicas_and_leader_within_isr(self) -> None:
        replicas = frozenset(self.moving.replicas)
        assert self.state.leader in replicas or self.state.leader == NO_LEADER, (
            f"leader {self.state.leader} outside replicas {self.moving.replicas}"
        )
        assert frozenset(self.state.isr) <= replicas, (
            f"ISR {self.state.isr} outside replicas {self.moving.replicas}"
        )
        assert self.state.leader == NO_LEADER or self.state.leader in self.state.isr

    @invariant()
    def isr_members_hold_the_log_below_the_hw(self) -> None:
        term = self.term
        if term is None:
            return
        short = [b for b in term.isr if self.brokers[b].log_end < term.high_watermark]
        assert not short, f"ISR members {short} below HW {term.high_watermark}"


#: pytest-timeout's guard against a hang, not a budget: planted slips at load 15-18
#: were stopped by the 300 s default while the failure shrank (the sixteenth round).
pytestmark = pytest.mark.timeout(1200)
TestReassignmentMachine = ReassignmentMachine.TestCase
# tools/mutation.sh sets MUTATION_EXAMPLES to run fewer examples per mutant.
TestReassignmentMachine.settings = settings(
    max_examples=int(os.environ.get("MUTATION_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
)
