"""The controller's reconcile loop (``cluster/controller.py``'s ``run_controller``) over
an in-memory ZooKeeper while brokers die, return, restart unseen and topics are created.

The reassignment machine calls ``decide`` and ``imbalanced_moves`` the way the loop does;
this machine runs the loop itself: it reads the broker list, the registrations' zxids and
every topic from ZooKeeper, and writes partition states with the conditional writes and
the controller epoch's fence. Each controller pass is a fresh controller (one
``trio.run``: start ``run_controller``, let it settle, cancel it), as after a failover:
the loop keeps no state of its own, so a pass is the whole of it.

What is checked after every pass (Kafka's controller rules, over every partition):

1. a partition created with some replicas down starts at epoch 0 with its live replicas
   as the ISR and the first of them leading; with none alive it has no state until one
   returns, and then the same rule applies (Kafka's controller leaves a new partition
   with no live replica new, whichever replica comes back first leads it);
2. a leader is alive and in the ISR; a leaderless partition has no live ISR member;
3. the ISR is within the replicas and never empty; a dead broker stays in it only as its
   last member (the partition is then offline, as Kafka keeps the last ISR member);
4. a changed leader or ISR comes with a new leader epoch, and epochs never go back;
5. a leader that restarted before the controller saw it go (registered after the state
   was written) gets a new epoch with the same leader and ISR;
6. every state carries the controller's epoch, and a second pass changes nothing (the
   module's promise: reconciling twice is reconciling once);
7. a topic placed by ``assign_replicas`` (CreateTopics with no assignment, over the live
   brokers and the racks they registered with) spans as many racks as it can in every
   partition: ``min(replication factor, racks)`` (Kafka's rack-aware placement; the
   brokers' racks are drawn per example, some of them on no rack);
8. a replica whose broker named it offline (a failed log dir: the broker's
   ``OfflineReplicas`` znode, with Kafka's log dir event notification) neither leads nor
   stays in the ISR, except as its last member with no leader; a leaderless partition
   has no live in-sync replica that is not offline; once the broker names it online again
   (its dir came back), a partition it was the last ISR member of has it as leader again;
   the notifications are gone after a pass (the controller deletes them, as Kafka's);
9. (a leader's ISR write brings a caught-up replica back, ``follower_rejoins_the_isr``);
10. a round that both elects (a non-preferred leader died) and rebalances leadership
    (auto.leader.rebalance.enable, its interval come round) writes states that keep 2
    and 3: the rebalance leaves the partitions the election decided alone.
"""

from __future__ import annotations

import uuid

import pytest
import trio
import trio.testing
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trio_broker.cluster.controller import Rebalance, run_controller
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    LOG_DIR_EVENT_PREFIX,
    LOG_DIR_EVENTS,
    BrokerRegistration,
    LogDirEvent,
    OfflineReplicas,
    PartitionState,
    TopicAssignment,
    encode_controller_epoch,
    offline_replicas_path,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import NO_LEADER, assign_replicas
from trio_broker.services.cluster_view import ClusterView

BROKERS = (1, 2, 3, 4)
CONTROLLER_EPOCH_NOW = 1

#: A new topic's partitions, each one to three brokers (the first preferred).
ASSIGNMENTS = st.lists(
    st.lists(st.sampled_from(BROKERS), min_size=1, max_size=3, unique=True),
    min_size=1,
    max_size=2,
)

Key = tuple[str, int]

#: Writes per partition one controller pass may make before it counts as never settling
#: (a pass writes each partition at most a few times; a loop that rewrites what it just
#: wrote, each write waking it again, would otherwise never let the pass end). Per
#: partition, not per pass: a broker leading 20 of 35 partitions dies and one pass
#: rightly writes 20 states (seed 2882179025 once counted that as a livelock).
WRITES_PER_PARTITION = 3

#: leader.imbalance.check.interval.seconds in ``leader_dies_as_the_rebalance_is_due``
#: (a mock clock jumps it).
REBALANCE_INTERVAL_S = 300.0


class NeverSettles(AssertionError):
    pass


class CountedCoordination(MemoryCoordination):
    """The controller's session, counting its writes so a livelock fails the step."""

    writes = 0
    #: The controller's fenced writes (path, data), as the machine last cleared them.
    written: list[tuple[str, bytes]]

    def __init__(self, server: MemoryZooKeeper) -> None:
        super().__init__(server)
        self.written = []

    #: Set before each pass: ``WRITES_PER_PARTITION`` times the partitions there are.
    write_limit = WRITES_PER_PARTITION

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        self._count(path)
        await super().create(path, data, ephemeral=ephemeral)

    async def set_fenced(self, path: str, data: bytes, version: int, fence: tuple[str, int]) -> int:
        self._count(path)
        self.written.append((path, data))
        return await super().set_fenced(path, data, version, fence)

    def _count(self, path: str) -> None:
        self.writes += 1
        if self.writes > self.write_limit:
            raise NeverSettles(f"the controller wrote {self.writes} times in one pass ({path})")


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server = MemoryZooKeeper()
        self.admin = CountedCoordination(self.server)
        #: Each live broker's session (a new one for every life).
        self.sessions: dict[int, MemoryCoordination] = {}
        self.replicas: dict[Key, tuple[int, ...]] = {}
        #: The states after the last pass.
        self.states: dict[Key, PartitionState] = {}
        self.topics = 0
        #: Each live broker's replicas in a failed log dir, as its znode names them (gone
        #: with its session, as the ephemeral znode).
        self.offline: dict[int, frozenset[Key]] = {}
        #: Each broker's rack (None: no rack), drawn by ``brokers_have_racks``.
        self.racks: dict[int, str | None] = dict.fromkeys(BROKERS)
        trio.run(self._start)
        self.states = trio.run(self._read_states)

    @initialize(racks=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=4, max_size=4))
    def brokers_have_racks(self, racks: list[str | None]) -> None:
        """Every broker registers again with a rack (as after a rolling restart that set
        ``broker.rack``); the partition states stay."""
        self.racks = dict(zip(BROKERS, racks, strict=True))
        note(f"racks {self.racks}")

        async def register_all() -> None:
            for broker, session in list(self.sessions.items()):
                self.server.expire(session.session)
                self.offline.pop(broker, None)
                await self._register(broker)

        trio.run(register_all)
        self._controller_passes(restarted=frozenset(BROKERS))

    async def _start(self) -> None:
        await self.admin.create(CONTROLLER_EPOCH, encode_controller_epoch(CONTROLLER_EPOCH_NOW))
        for broker in BROKERS:
            await self._register(broker)
        await self._create_topic([[1, 2, 3]])
        await self._pass()

    # -- ZooKeeper ------------------------------------------------------------------

    async def _register(self, broker: int) -> None:
        session = MemoryCoordination(self.server)
        registration = BrokerRegistration(
            broker, "127.0.0.1", 19000 + broker, rack=self.racks[broker]
        ).encode()
        await session.create(f"{BROKER_IDS}/{broker}", registration, ephemeral=True)
        self.sessions[broker] = session

    async def _create_topic(self, assignment: list[list[int]]) -> None:
        name = f"t{self.topics}"
        self.topics += 1
        partitions = {p: tuple(replicas) for p, replicas in enumerate(assignment)}
        await self.admin.create(
            topic_path(name), TopicAssignment(uuid.uuid4(), partitions).encode()
        )
        for partition, replicas in partitions.items():
            self.replicas[(name, partition)] = replicas
        note(f"topic {name}: {partitions}")

    async def _read_states(self) -> dict[Key, PartitionState]:
        states = {}
        for key in self.replicas:
            znode = await self.admin.get(partition_state_path(*key))
            if znode is None:  # 1: only a new partition none of whose replicas is alive
                alive = sorted(set(self.replicas[key]) & self._live())
                assert not alive, f"{key}: no state after a pass with {alive} alive"
                continue
            states[key] = PartitionState.decode(znode.data, f"{key[0]}-{key[1]}")
        return states

    async def _pass(self) -> None:
        """A controller runs until it has nothing left to do, then is stopped."""
        view = ClusterView(0, controller_id=0, controller_epoch=CONTROLLER_EPOCH_NOW)
        self.admin.writes = 0
        self.admin.write_limit = WRITES_PER_PARTITION * max(1, len(self.replicas))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_controller, self.admin, view)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    def _live(self) -> frozenset[int]:
        return frozenset(self.sessions)

    def _offline_of(self, key: Key) -> frozenset[int]:
        return frozenset(b for b, keys in self.offline.items() if key in keys)

    # -- the controller's passes and what they must write --------------------------------

    def _controller_passes(self, restarted: frozenset[int] = frozenset()) -> None:
        async def passes() -> tuple[dict[Key, PartitionState], dict[Key, PartitionState]]:
            await self._pass()
            first = await self._read_states()
            await self._pass()
            return first, await self._read_states()

        before = self.states
        after, again = trio.run(passes)
        assert again == after, f"a second pass changed states: {after} then {again}"
        live = self._live()
        for key, state in after.items():
            note(f"{key}: leader {state.leader} epoch {state.leader_epoch} ISR {state.isr}")
            replicas = self.replicas[key]
            old = before.get(key)
            assert state.controller_epoch == CONTROLLER_EPOCH_NOW
            if old is None:  # 1
                alive = tuple(r for r in replicas if r in live - self._offline_of(key))
                # Found by this machine (the twelfth round): a partition created with
                # every replica down got (no leader, epoch 0, every replica), then its
                # last replica alone in the ISR, so only that broker's return brought it
                # online. Kafka writes no state until a replica is alive.
                assert alive, f"{key}: a state written with none of {replicas} alive: {state}"
                assert (state.leader, state.leader_epoch, state.isr) == (alive[0], 0, alive), (
                    f"{key} created on {replicas} with {sorted(live)} alive: {state}"
                )
                continue
            # 4: a change is a new epoch; epochs never go back.
            changed = (state.leader, state.isr) != (old.leader, old.isr)
            assert state.leader_epoch >= old.leader_epoch, f"{key}: epoch back: {old} -> {state}"
            assert not changed or state.leader_epoch > old.leader_epoch, (
                f"{key}: leader or ISR changed in epoch {old.leader_epoch}: {old} -> {state}"
            )
            if old.leader in restarted and old.leader in live:  # 5
                assert state.leader_epoch > old.leader_epoch, (
                    f"{key}: leader {old.leader} restarted and leads on in {old.leader_epoch}"
                )
                if all(b in live for b in old.isr) and not self._offline_of(key) & set(old.isr):
                    assert (state.leader, state.isr) == (old.leader, old.isr), (old, state)
        self.states = after

    @rule(assignment=ASSIGNMENTS)
    def administrator_creates_a_topic(self, assignment: list[list[int]]) -> None:
        trio.run(self._create_topic, assignment)
        self._controller_passes()

    @rule(
        partitions=st.integers(1, 9),
        replication_factor=st.integers(1, 3),
        start_index=st.integers(0, 3),
    )
    def administrator_creates_a_placed_topic(
        self, partitions: int, replication_factor: int, start_index: int
    ) -> None:
        """CreateTopics with no assignment: placed over the live brokers' registered racks
        as ``cluster/topic_admin.py`` places it; 7: every partition spans
        ``min(replication factor, racks)`` racks."""

        async def registered_racks() -> dict[int, str | None]:
            racks = {}
            for broker in sorted(self._live()):
                znode = await self.admin.get(f"{BROKER_IDS}/{broker}")
                assert znode is not None
                racks[broker] = BrokerRegistration.decode(broker, znode.data).rack
            return racks

        brokers = trio.run(registered_racks)
        if replication_factor > len(brokers):
            return
        placed = assign_replicas(
            partitions, replication_factor, brokers, start_index=start_index % len(brokers)
        )
        all_racks = {brokers[b] or "" for b in brokers}
        for partition, replicas in enumerate(placed):
            racks = {brokers[b] or "" for b in replicas}
            assert len(set(replicas)) == replication_factor, (partition, replicas)
            assert len(racks) == min(replication_factor, len(all_racks)), (
                f"partition {partition} of {partitions} placed on {replicas}, racks "
                f"{sorted(racks)}, where {sorted(all_racks)} were there ({brokers})"
            )
        if len(all_racks) > 1 and partitions > len(brokers):
            event("a placed topic past the first round, with racks")
        trio.run(self._create_topic, placed)
        self._controller_passes()

    @rule(broker=st.sampled_from(BROKERS), picks=st.lists(st.integers(0, 50), max_size=3))
    def log_dir_fails(self, broker: int, picks: list[int]) -> None:
        """A live broker's log dir fails: it names the replicas there offline (more, if
        one failed before) and notifies, as cluster/log_dir_events.py writes them."""
        session = self.sessions.get(broker)
        held = sorted(k for k, replicas in self.replicas.items() if broker in replicas)
        if session is None or not held:
            return
        offline = self.offline.get(broker, frozenset()) | {held[i % len(held)] for i in picks}
        if not offline:
            return
        self.offline[broker] = offline
        note(f"broker {broker}: replicas {sorted(offline)} offline")
        event("a failed log dir")

        async def publish() -> None:
            data = OfflineReplicas(broker, ("/data",), offline).encode()
            path = offline_replicas_path(broker)
            if await session.get(path) is None:
                await session.create(path, data, ephemeral=True)
            else:
                await session.set(path, data, -1)
            await session.create_sequential(LOG_DIR_EVENT_PREFIX, LogDirEvent(broker).encode())

        trio.run(publish)
        self._controller_passes()

    @rule(broker=st.sampled_from(BROKERS))
    def log_dir_returns(self, broker: int) -> None:
        """The broker's failed dirs came back whole: its znode goes; a partition it was
        the last in-sync replica of is led by it again."""
        session = self.sessions.get(broker)
        offline = self.offline.pop(broker, None)
        if session is None or offline is None:
            return
        note(f"broker {broker}: replicas {sorted(offline)} back online")
        trio.run(session.delete, offline_replicas_path(broker))
        waiting = {
            key
            for key in offline
            if key in self.states
            and self.states[key].leader == NO_LEADER
            and self.states[key].isr == (broker,)
        }
        self._controller_passes()
        for key in waiting:
            event("a partition led again by the replica whose dir came back")
            assert self.states[key].leader == broker, (key, self.states[key])

    @rule(broker=st.sampled_from(BROKERS))
    def the_only_in_sync_replica_loses_its_dir(self, broker: int) -> None:
        """The case the random rules seldom build: a partition whose one replica's dir
        fails has no leader (its ISR keeps that replica), and leads again once the dir is
        back."""
        if broker not in self.sessions:
            return
        trio.run(self._create_topic, [[broker]])
        key = (f"t{self.topics - 1}", 0)
        self._controller_passes()
        held = sorted(k for k, replicas in self.replicas.items() if broker in replicas)
        self.log_dir_fails(broker, [held.index(key)])  # 8
        assert (self.states[key].leader, self.states[key].isr) == (NO_LEADER, (broker,))
        self.log_dir_returns(broker)
        assert (self.states[key].leader, self.states[key].isr) == (broker, (broker,))

    @rule(broker=st.sampled_from(BROKERS))
    def broker_dies(self, broker: int) -> None:
        session = self.sessions.pop(broker, None)
        self.offline.pop(broker, None)
        if session is None:
            return
        self.server.expire(session.session)
        note(f"broker {broker} dies")
        self._controller_passes()

    @rule(broker=st.sampled_from(BROKERS))
    def broker_returns(self, broker: int) -> None:
        if broker in self.sessions:
            return
        trio.run(self._register, broker)
        note(f"broker {broker} returns")
        self._controller_passes()

    @rule(
        replicas=st.lists(st.sampled_from(BROKERS), min_size=1, max_size=3, unique=True),
        first_back=st.integers(0, 2),
    )
    def topic_created_while_its_replicas_are_down(
        self, replicas: list[int], first_back: int
    ) -> None:
        """The case the random rules seldom build: every replica of a new topic down,
        then one of them (any, not only the last listed) back first: it must lead, alone
        in the ISR, at epoch 0."""
        for broker in replicas:
            session = self.sessions.pop(broker, None)
            self.offline.pop(broker, None)
            if session is not None:
                self.server.expire(session.session)
        note(f"brokers {replicas} die")
        self._controller_passes()
        trio.run(self._create_topic, [replicas])
        key = (f"t{self.topics - 1}", 0)
        self._controller_passes()
        assert key not in self.states
        back = replicas[first_back % len(replicas)]
        trio.run(self._register, back)
        note(f"broker {back} returns")
        event("a topic created with every replica down")
        self._controller_passes()
        state = self.states[key]
        assert (state.leader, state.leader_epoch, state.isr) == (back, 0, (back,)), state

    @rule(broker=st.sampled_from(BROKERS))
    def broker_restarts_unseen(self, broker: int) -> None:
        """Its session expires and a new life registers before any controller pass."""
        session = self.sessions.pop(broker, None)
        self.offline.pop(broker, None)
        if session is None:
            return
        self.server.expire(session.session)
        trio.run(self._register, broker)
        note(f"broker {broker} restarts unseen")
        self._controller_passes(restarted=frozenset({broker}))

    @rule(data=st.data())
    def follower_rejoins_the_isr(self, data: st.DataObject) -> None:
        """A live replica outside the ISR catches up: its partition's leader stores the
        ISR with it (the leader's conditional write, same leader and epoch, as
        ``cluster/isr_store.py`` writes it). The controller's passes take that as it is."""
        live = self._live()
        candidates = sorted(
            (key, broker)
            for key, state in self.states.items()
            if state.leader != NO_LEADER
            for broker in self.replicas[key]
            if broker in live and broker not in state.isr
        )
        if not candidates:
            return
        key, broker = data.draw(st.sampled_from(candidates))
        self._rejoin(key, broker)

    def _rejoin(self, key: Key, broker: int) -> None:
        state = self.states[key]
        grown = PartitionState(
            state.leader, state.leader_epoch, tuple(sorted((*state.isr, broker))),
            state.controller_epoch,
        )  # fmt: skip

        async def store() -> None:
            path = partition_state_path(*key)
            znode = await self.admin.get(path)
            assert znode is not None
            await self.admin.set(path, grown.encode(), znode.version)

        trio.run(store)
        note(f"{key}: broker {broker} back in the ISR {grown.isr}")
        # The leader's write, not the controller's: the same epoch (4 is the controller's).
        self.states = {**self.states, key: grown}
        self._controller_passes()

    @rule(data=st.data())
    def leader_dies_as_the_rebalance_is_due(self, data: st.DataObject) -> None:
        """9 (built): a leader that is not its partition's preferred replica dies at the
        moment leader.imbalance.check.interval.seconds comes round, the preferred
        replica alive and in sync: one controller round both elects a new leader for
        the partition (the dead one leaves the ISR) and runs the rebalance
        (``imbalanced_moves``, percentage 0). The rebalance moves only partitions the
        round's election left alone (Kafka's controller skips partitions with an
        election under way): its move, built from the state read before the election,
        would keep the dead leader in the ISR. Checked on the states that round wrote,
        before any later pass repairs them."""
        leaders = self._non_preferred_leaders()
        if not leaders:
            # Built: a preferred leader with another live ISR member dies (leadership
            # moves on), returns and catches up (its leader stores it in the ISR).
            live = self._live()
            keys = sorted(
                key
                for key, state in self.states.items()
                if state.leader == self.replicas[key][0]
                and len([b for b in state.isr if b in live]) >= 2
            )
            if not keys:
                return
            key = data.draw(st.sampled_from(keys))
            preferred = self.replicas[key][0]
            self.broker_dies(preferred)
            self.broker_returns(preferred)
            if self.states[key].leader not in (NO_LEADER, preferred):
                self._rejoin(key, preferred)
            leaders = self._non_preferred_leaders()
            if not leaders:
                return
        broker = data.draw(st.sampled_from(leaders))
        session = self.sessions.pop(broker)
        note(f"broker {broker} dies as the rebalance is due")
        event("a leader dies as the rebalance is due")
        trio.run(self._pass_as_the_rebalance_comes, session, clock=trio.testing.MockClock())
        live = self._live()
        for path, written in self.admin.written:  # every state the round wrote, in order
            state = PartitionState.decode(written, path)
            dead = sorted(set(state.isr) - live)
            assert state.leader == NO_LEADER or state.leader in live, (
                f"{path}: written with dead leader {state.leader} ({sorted(live)} alive)"
            )
            assert not dead or (len(state.isr) == 1 and state.leader == NO_LEADER), (
                f"{path}: written as leader {state.leader} epoch {state.leader_epoch} ISR"
                f" {state.isr} with dead {dead} in the ISR, in the round broker {broker}"
                " died and the leadership rebalance came round"
            )
        self._controller_passes()

    def _non_preferred_leaders(self) -> list[int]:
        """Live leaders of partitions whose preferred replica is alive and in sync."""
        live = self._live()
        return sorted(
            {
                state.leader
                for key, state in self.states.items()
                if state.leader in live
                and state.leader != self.replicas[key][0]
                and self.replicas[key][0] in live
                and self.replicas[key][0] in state.isr
            }
        )

    async def _pass_as_the_rebalance_comes(self, dying: MemoryCoordination) -> None:
        """One controller with leadership rebalancing on: it settles, then ``dying``'s
        session expires at the moment its imbalance check is due, and it settles again."""
        view = ClusterView(0, controller_id=0, controller_epoch=CONTROLLER_EPOCH_NOW)
        self.admin.writes = 0
        self.admin.write_limit = WRITES_PER_PARTITION * max(1, len(self.replicas))
        rebalance = Rebalance(interval_s=REBALANCE_INTERVAL_S, percentage=0)
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)

        async def controller() -> None:
            await run_controller(self.admin, view, rebalance=rebalance)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller)
            await trio.testing.wait_all_tasks_blocked()
            self.admin.written.clear()  # from here on, the writes after the death
            self.server.expire(dying.session)  # the broker dies ...
            clock.jump(REBALANCE_INTERVAL_S)  # ... as the imbalance check comes round
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    # -- invariants over the stored states ------------------------------------------------

    @invariant()
    def log_dir_events_are_cleared(self) -> None:  # 8
        names = trio.run(self.admin.children_and_watch, LOG_DIR_EVENTS)[0]
        assert not names, f"notifications left after a pass: {names}"

    @invariant()
    def leaders_and_isrs_follow_the_live_brokers(self) -> None:
        live = self._live()
        for key, state in self.states.items():
            replicas = self.replicas[key]
            isr = frozenset(state.isr)
            assert isr and isr <= frozenset(replicas), f"{key}: ISR {state.isr} of {replicas}"
            offline = self._offline_of(key)
            if state.leader != NO_LEADER:  # 2, 8
                assert state.leader in live and state.leader in isr, f"{key}: {state}"
                assert state.leader not in offline, f"{key}: {state}, {sorted(offline)} offline"
            else:
                alive = sorted(isr & (live - offline))
                assert not alive, f"{key}: no leader with ISR members {alive} alive"
            stale = isr & offline  # 8
            assert not stale or (len(isr) == 1 and state.leader == NO_LEADER), (
                f"{key}: offline {sorted(stale)} in ISR {state.isr}"
            )
            dead = isr - live  # 3
            assert not dead or (len(isr) == 1 and state.leader == NO_LEADER), (
                f"{key}: dead {sorted(dead)} in ISR {state.isr} ({sorted(live)} alive)"
            )


#: pytest-timeout's guard against a hang, not a budget: planted with
#: replicas-ignore-racks at load 18 the machine was stopped at 318 s while it shrank the
#: failure (alone at seed 1: 71 s of wall time); the other slow machines' guard.
pytestmark = pytest.mark.timeout(1200)
TestControllerMachine = ControllerMachine.TestCase
TestControllerMachine.settings = settings(max_examples=50, stateful_step_count=15, deadline=None)
