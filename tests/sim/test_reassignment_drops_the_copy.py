"""A replica a reassignment moved away stops replicating and drops its copy (the simulator).

On the simulator's in-memory brokers: one partition on brokers 1 and 2, 4 acks=all
writes, then a reassignment (KIP-455) to brokers 2 and 3 through the controller. Once
the move is over (every broker's view names replicas 2, 3 with nothing adding or
removing, broker 3 caught up), broker 1 holds no role in the partition (no leader term,
no follower role) and no records of it: Kafka's controller ends a move with
StopReplica(deletePartition=true) to the replicas it removed, which stop fetching and
delete their copy.
"""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from sim.client import Producer
from sim.cluster import SimBroker, SimCluster
from sim.simulation import BROKER_IDS, _deterministic
from tests.waits import poll

TOPIC = "t"
KEY = (TOPIC, 0)
#: Virtual seconds for the move to end and the leaving replica to let go (well under one).
MOVE_S = 30.0


def moved(sims: list[SimBroker]) -> bool:
    """Every broker's view: replicas (2, 3), nothing joining or leaving; 3 caught up."""
    for s in sims:
        topic = s.broker.replication.view.topics.get(TOPIC) if s.broker is not None else None
        info = None if topic is None else topic.partitions.get(0)
        if (
            info is None
            or info.replicas != (2, 3)
            or info.adding_replicas
            or info.removing_replicas
        ):
            return False
    ends = {s.broker.topics.log(*KEY).log_end_offset for s in sims[1:] if s.broker is not None}
    return len(ends) == 1


def held_by(sim: SimBroker) -> dict[str, Any]:
    """Broker ``sim``'s roles in the partition and the records its copy holds."""
    replication = sim.broker.replication
    log_ = sim.broker.topics.log(*KEY)
    return {
        "term": KEY in replication.terms,
        "follows": KEY in replication.following,
        "records": 0 if log_ is None else log_.log_end_offset - log_.log_start_offset,
    }


async def scenario(result: dict[str, Any]) -> None:
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.replication.admin.create_topic(TOPIC, 1, 2, {}, {0: [1, 2]})
        producer = Producer(network, TOPIC, BROKER_IDS)
        for _ in range(4):
            await producer.produce_once(0)
        result["before"] = held_by(sims[0])
        controller = None
        with trio.move_on_after(MOVE_S):
            while controller is None:
                controllers = [s.broker.replication.controller for s in sims if s.broker]
                controller = next((c for c in controllers if c is not None), None)
                await trio.sleep(0.05)
        assert controller is not None, "no controller"
        result["outcome"] = await controller.alter_reassignments({KEY: [2, 3]})

        def let_go() -> bool:
            held = held_by(sims[0])
            return moved(sims) and not (held["term"] or held["follows"] or held["records"])

        await poll(let_go, MOVE_S, 0.05)
        result["moved"] = moved(sims)
        result["after"] = held_by(sims[0])
        await producer.close()
        nursery.cancel_scope.cancel()


def test_a_replica_moved_away_stops_replicating_and_drops_its_copy() -> None:
    result: dict[str, Any] = {}
    with _deterministic(1):
        trio.run(scenario, result, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result["before"]["records"] > 0 and result["before"]["term"], result
    assert result["outcome"] == {KEY: (0, None)}, result
    assert result["moved"], result
    assert result["after"] == {"term": False, "follows": False, "records": 0}, (
        f"broker 1, moved away from {KEY}, still holds {result['after']}"
    )
