"""A follower that truncates below its high watermark takes its HW down with its log.

On the simulator's in-memory brokers, with unclean.leader.election.enable: one
partition on brokers 1-3, led by 1, takes 2 writes; broker 3 is cut off from broker 1
(it stays up and in ZooKeeper) and leaves the ISR; 4 more writes reach brokers 1 and 2,
and broker 2 learns their high watermark; broker 2 is cut off from everything and its
session expires (it leaves the ISR, keeping its HW); broker 1 is killed. No ISR member
is alive: the controller elects broker 3 uncleanly, whose log ends at the first 2
writes. Broker 2 comes back as its follower and truncates to that end, below its HW.

Kafka's follower truncation keeps the HW within the log (``UnifiedLog.truncateTo``
lowers a high watermark at or past the new log end to it): checked every 10 ms of virtual time on
every follower, from the moment broker 2 is back until it caught up. Before its next
fetch answer, the follower's HW is what a consumer of it, or a leadership it takes, would
start from: above its log end it would announce records it does not hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import trio
import trio.testing

from sim.client import Producer
from sim.cluster import SESSION_TIMEOUT_MS, SimBroker, SimCluster
from sim.simulation import BROKER_IDS, _deterministic
from tests.waits import poll

TOPIC = "t"
#: Virtual seconds for an election and the follower's catch-up (well under one each).
SETTLE_S = 10.0


def follower_state(sim: SimBroker) -> tuple[int | None, int] | None:
    """(HW, log end) of the broker's replica, None while it is down or holds none."""
    broker = sim.broker
    if broker is None:
        return None
    log = broker.topics.log(TOPIC, 0)
    if log is None:
        return None
    return broker.replication.replica_high_watermark(TOPIC, 0), log.log_end_offset


def isr_of(sim: SimBroker) -> frozenset[int] | None:
    """The ISR of the broker's leader term, None while it does not lead."""
    term = None if sim.broker is None else sim.broker.replication.leader_term(TOPIC, 0)
    return None if term is None else frozenset(term.isr)


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    assert await poll(condition, SETTLE_S, 0.05), f"not within {SETTLE_S} virtual s: {what}"


def leader_of(sims: list[SimBroker]) -> int | None:
    for s in sims:
        if s.broker is not None and s.broker.replication.leader_term(TOPIC, 0) is not None:
            return s.broker_id
    return None


async def scenario(seen: list[str], facts: dict[str, object]) -> None:
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    for s in sims:
        s.overrides = {"unclean_leader_election_enable": True, "min_insync_replicas": 1}
    b1, b2, b3 = sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.admin.create_topic(TOPIC, 1, 3, {}, {0: [1, 2, 3]})
        producer = Producer(network, TOPIC, BROKER_IDS)
        for _ in range(2):
            await producer.produce_once(0)
        network.partition(b3.node, b1.node)
        await wait_for(lambda: isr_of(b1) == {1, 2}, "broker 3 lags out of the ISR")
        for _ in range(4):
            await producer.produce_once(0)
        assert b1.broker is not None
        log1 = b1.broker.topics.log(TOPIC, 0)
        assert log1 is not None
        end = log1.log_end_offset
        await wait_for(lambda: follower_state(b2) == (end, end), "broker 2 learns the HW")
        facts["b2 before"] = follower_state(b2)
        facts["b3 before"] = follower_state(b3)
        assert b2.coord is not None
        others = [b1.node, b3.node, "client"]
        for other in others:
            network.partition(b2.node, other)
        b2.coord.cut_off = True
        # The time is under test here: broker 2's session times out.
        await trio.sleep(SESSION_TIMEOUT_MS / 1000)
        b2.coord.server_expires()
        await wait_for(lambda: isr_of(b1) == {1}, "broker 2 leaves the ISR")
        await b1.crash(power_cut=False)
        b1.session_expires()
        await wait_for(lambda: leader_of(sims) == 3, "broker 3 is elected uncleanly")
        facts["leader after"] = leader_of(sims)
        for other in others:
            network.heal(b2.node, other)
        b2.coord.reconnect()

        def caught_up() -> bool:
            a, b = follower_state(b2), follower_state(b3)
            return a is not None and b is not None and a[1] == b[1] and a[0] == b[0]

        with trio.move_on_after(SETTLE_S):
            while not caught_up():
                for s in sims:
                    state = follower_state(s)
                    if state is not None and state[0] is not None and state[0] > state[1]:
                        seen.append(
                            f"{s.node} at {trio.current_time():.2f}: HW {state[0]} above "
                            f"its log end {state[1]}"
                        )
                await trio.sleep(0.01)
        facts["b2 after"] = follower_state(b2)
        facts["b3 after"] = follower_state(b3)
        await producer.close()
        nursery.cancel_scope.cancel()


def test_a_follower_truncated_below_its_hw_by_an_unclean_leader_lowers_its_hw() -> None:
    seen: list[str] = []
    facts: dict[str, object] = {}
    with _deterministic(1):
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(scenario, seen, facts, clock=clock)
    assert facts["leader after"] == 3, facts  # elected uncleanly
    before, short = facts["b2 before"], facts["b3 before"]
    assert isinstance(before, tuple) and isinstance(short, tuple)
    assert before[0] is not None and before[0] > short[1], facts  # the HW the cut goes below
    assert not seen, (
        "a follower's HW above its log end after truncating (Kafka's truncateTo lowers the "
        f"HW to the new log end): {seen[:3]} ({facts})"
    )
    assert facts["b2 after"] == facts["b3 after"], facts
