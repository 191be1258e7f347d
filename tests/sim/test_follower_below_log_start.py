"""A follower whose log ends below its leader's log start catches up (the simulator).

On the simulator's in-memory brokers: one partition on brokers 1-3, 4 acks=all writes;
broker 3 is killed until its ZooKeeper session expires; 4 writes in the next epoch;
DeleteRecords up to the leader's log end; broker 3 restarts; 4 more writes. Its fetch
at its old log end is out of range below the leader's log start: it must empty its log
and start at the leader's (Kafka's fetchOffsetAndTruncate), not truncate again and stay
behind for good, as it did before (its log stayed at 5, the leader's reached 21).

The writers are idempotent: one producer writes the first 8 batches, another the last 4.
Emptying the log empties the follower's producer state with it (Kafka's
truncateFullyAndStartAt clears its ProducerStateManager): once caught up, the follower
remembers exactly the producers its log from its start implies, each at the sequence
of its last batch there, and not the first producer, all of whose batches lie below its
new log start. A follower keeps no producer state in memory (it rebuilds it when it
leads), so that matters for a broker that led the partition and held its producers'
state, then fell below the new leader's log start without a restart: the last test.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from sim.client import Producer
from sim.cluster import SESSION_TIMEOUT_MS, SimBroker, SimCluster
from sim.faults import Fault
from sim.simulation import BROKER_IDS, _deterministic, simulate
from tests.waits import poll
from trio_broker.services.producers import ProducerStateRegistry, read_batch_headers

TOPIC = "t"
#: Virtual seconds the follower has to catch up (it takes well under one).
CATCH_UP_S = 30.0

Ends = dict[str, tuple[int, int] | None]
#: producer id -> (epoch, last sequence)
Producers = dict[int, tuple[int, int]]


def ends(sims: list[SimBroker]) -> Ends:
    """(log start, log end) per broker, None while it is down."""
    out: Ends = {}
    for s in sims:
        log = s.broker.topics.log(TOPIC, 0) if s.broker is not None else None
        out[s.node] = None if log is None else (log.log_start_offset, log.log_end_offset)
    return out


def producer_state(sim: SimBroker) -> tuple[Producers, Producers]:
    """The broker's producer state of the partition, and what its log from its start
    implies (the last batch of each producer id in it)."""
    assert sim.broker is not None
    log = sim.broker.topics.log(TOPIC, 0)
    assert log is not None
    held = ProducerStateRegistry.attached_to(sim.broker).manager(TOPIC, 0, log).producers
    implied: Producers = {}
    for batch in read_batch_headers(log, log.log_start_offset):
        if not batch.is_control and batch.producer_id >= 0:
            implied[batch.producer_id] = (batch.producer_epoch, batch.last_sequence)
    return {pid: (e.epoch, e.last_seq) for pid, e in held.items()}, implied


async def scenario(
    delete: bool, result: list[Ends], states: list[tuple[Producers, Producers]] | None = None
) -> None:
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.admin.create_topic(TOPIC, 1, 3, {}, {0: [1, 2, 3]})
        producer = Producer(network, TOPIC, BROKER_IDS, idempotent=True, now_ms=cluster.now_ms)
        for _ in range(4):
            await producer.produce_once(0)
        follower = sims[2]
        await follower.crash(power_cut=False)
        # The time is under test here: the session expires and 1-2 lead a new epoch.
        await trio.sleep(SESSION_TIMEOUT_MS / 1000)
        follower.session_expires()
        for _ in range(4):
            await producer.produce_once(0)
        leader = sims[0].broker.topics.log(TOPIC, 0) if sims[0].broker is not None else None
        assert leader is not None
        if delete:
            leader.delete_records(leader.log_end_offset)
        await follower.start(nursery)
        later = Producer(network, TOPIC, BROKER_IDS, idempotent=True, now_ms=cluster.now_ms)
        for _ in range(4):
            await later.produce_once(0)

        await until_caught_up(sims)
        result.append(ends(sims))
        if states is not None and follower.broker is not None:
            states.append(producer_state(follower))
        await producer.close()
        await later.close()
        nursery.cancel_scope.cancel()


def caught_up(sims: list[SimBroker]) -> bool:
    """Every broker is up and its log of the topic ends where the others' do."""
    logs = [v for v in ends(sims).values() if v is not None]
    return len(logs) == 3 and len(set(logs)) == 1


async def until_caught_up(sims: list[SimBroker]) -> bool:
    """Polls (virtual time) until :func:`caught_up`, at most CATCH_UP_S; whether it is."""
    return bool(await poll(lambda: caught_up(sims), CATCH_UP_S, 0.05))


async def former_leader(states: list[tuple[Producers, Producers]]) -> None:
    """Broker 3 leads and takes 4 idempotent writes; it is cut off from every node and
    ZooKeeper until its session expires; 4 writes to the next leader, which deletes up
    to its log end; broker 3 comes back as a follower below that log start; another
    producer writes 4."""
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.admin.create_topic(TOPIC, 1, 3, {}, {0: [3, 1, 2]})
        producer = Producer(network, TOPIC, BROKER_IDS, idempotent=True, now_ms=cluster.now_ms)
        for _ in range(4):
            await producer.produce_once(0)
        former = sims[2]
        assert former.broker is not None and former.coord is not None
        log3 = former.broker.topics.log(TOPIC, 0)
        assert log3 is not None and log3.log_end_offset > 0
        registry = ProducerStateRegistry.attached_to(former.broker)
        assert registry.loaded(TOPIC, 0, log3), "broker 3 led the writes: it holds their state"
        others = [s.node for s in sims if s is not former] + ["client"]
        for other in others:
            network.partition(former.node, other)
        former.coord.cut_off = True
        # The time is under test here: the session expires and 1-2 lead a new epoch.
        await trio.sleep(SESSION_TIMEOUT_MS / 1000)
        former.coord.server_expires()
        for _ in range(4):
            await producer.produce_once(0)
        leader_id = producer.leaders.get(0)
        assert leader_id in (1, 2), producer.leaders
        leader_broker = sims[leader_id - 1].broker
        assert leader_broker is not None
        leader = leader_broker.topics.log(TOPIC, 0)
        assert leader is not None and leader.log_end_offset > log3.log_end_offset
        leader.delete_records(leader.log_end_offset)
        for other in others:
            network.heal(former.node, other)
        former.coord.reconnect()
        later = Producer(network, TOPIC, BROKER_IDS, idempotent=True, now_ms=cluster.now_ms)
        for _ in range(4):
            await later.produce_once(0)

        assert await until_caught_up(sims), ends(sims)
        states.append(producer_state(former))
        await producer.close()
        await later.close()
        nursery.cancel_scope.cancel()


def run(delete: bool, states: list[tuple[Producers, Producers]] | None = None) -> Ends:
    result: list[Ends] = []
    with _deterministic(1):
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(scenario, delete, result, states, clock=clock)
    return result[0]


def test_a_follower_below_its_leaders_log_start_starts_there_and_catches_up() -> None:
    states: list[tuple[Producers, Producers]] = []
    got = run(delete=True, states=states)
    leader_start, leader_end = got["b1"] or (-1, -1)
    assert leader_start > 5, got  # the DeleteRecords happened past the follower's end
    # The follower's log starts where the leader's does and ends where it ends; the
    # follower that was up moved its log start with the leader's.
    assert got["b3"] == (leader_start, leader_end), got
    assert got["b2"] == (leader_start, leader_end), got
    # Its producer state is what its log from the new start implies: the later
    # producer only; the first one's batches all lie below that start.
    (held, implied) = states[0]
    assert len(implied) == 1, implied
    for pid, (epoch, seq) in held.items():
        assert pid in implied, (
            f"broker 3, its log emptied to start at {leader_start}, remembers producer {pid} "
            f"(epoch {epoch}, sequence {seq}), none of whose batches it holds: emptying the "
            f"log empties its producer state (its log implies {implied})"
        )
    assert held == implied, f"broker 3 holds producer state {held}, its log implies {implied}"


def test_without_the_delete_records_the_follower_keeps_its_log() -> None:
    # The control: the follower's log end is inside the leader's log; nothing is emptied.
    got = run(delete=False)
    assert got["b3"] == got["b1"] and got["b3"] is not None and got["b3"][0] == 0, got


def test_delete_records_while_a_follower_is_down_keeps_every_invariant() -> None:
    # The simulator's "delete_records" fault, in a schedule of its own: broker 3 (a
    # follower of both partitions) is killed; while it is down both leaders delete up to
    # their HW; it restarts below their log starts. The whole run's invariants hold,
    # and the cluster settles: every replica at its leader's end (before the fix
    # broker 3 never got there and the run did not settle).
    schedule = [
        Fault(0.3, "crash", "b3", duration=1.5),
        Fault(2.2, "delete_records", "p0"),
        Fault(2.2, "delete_records", "p1"),
    ]
    result = simulate(5, schedule=schedule, span_s=3.0)
    assert result.ok, "\n".join(result.violations + result.trace[-30:])
    assert result.settled and result.acked > 0 and result.consumed > 0
    deleted = [line for line in result.trace if "delete_records" in line]
    assert len(deleted) == 2, result.trace


def test_a_former_leader_emptied_below_the_log_start_forgets_its_producers() -> None:
    states: list[tuple[Producers, Producers]] = []
    with _deterministic(1):
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(former_leader, states, clock=clock)
    (held, implied) = states[0]
    assert len(implied) == 1, implied  # the later producer's batches only
    for pid, (epoch, seq) in held.items():
        assert pid in implied, (
            f"broker 3, its log emptied to start at its leader's log start, remembers "
            f"producer {pid} (epoch {epoch}, sequence {seq}), none of whose batches it "
            f"holds: emptying the log empties its producer state (its log implies {implied})"
        )
    assert held == implied, f"broker 3 holds producer state {held}, its log implies {implied}"
