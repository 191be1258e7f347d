"""Reproducer (not a test): a follower whose log ends below its leader's log start.

Found while checking ``truncation-unknown-epoch-keeps-all`` (docs/verification.md, sixth
round). On the simulator's in-memory brokers: one partition on brokers 1-3, 4 acks=all
writes; broker 3 is killed until its ZooKeeper session expires; 4 writes in the next
epoch; DeleteRecords up to the leader's log end (on the leader's log, as the handler
does); broker 3 restarts; 4 more writes. Kafka's fetcher meets OFFSET_OUT_OF_RANGE
below the leader's log start by truncating fully and fetching from that start; here
the fetcher only truncates again, so broker 3 stays behind. Exit status 1 while it does
(``keep`` skips the DeleteRecords: the control run, exit 0):

    PYTHONPATH=. python tools/repro_follower_below_log_start.py [keep]
"""

from __future__ import annotations

import random
import sys

import trio
import trio.testing

from sim.client import Producer
from sim.cluster import SimBroker
from sim.network import Network
from sim.simulation import BROKER_IDS, _deterministic
from trio_broker.cluster.coordination import MemoryZooKeeper

TOPIC = "t"


def ends(sims: list[SimBroker]) -> dict[str, tuple[int, int] | None]:
    """(log start, log end) per broker, None while it is down."""
    out: dict[str, tuple[int, int] | None] = {}
    for s in sims:
        log = s.broker.topics.log(TOPIC, 0) if s.broker is not None else None
        out[s.node] = None if log is None else (log.log_start_offset, log.log_end_offset)
    return out


async def scenario(delete: bool, result: list[dict[str, tuple[int, int] | None]]) -> None:
    zk = MemoryZooKeeper()
    network = Network(random.Random(1))
    start = trio.current_time()

    def now_ms() -> int:
        return int((trio.current_time() - start) * 1000) + 1_700_000_000_000

    sims = [SimBroker(b, zk, network, now_ms) for b in BROKER_IDS]
    async with trio.open_nursery() as nursery:
        for s in sims:
            await s.start(nursery)
        first = sims[0].broker
        assert first is not None
        while first.replication is None or len(first.replication.view.brokers) < 3:  # noqa: ASYNC110
            await trio.sleep(0.01)
        await first.replication.create_topic(TOPIC, 1, 3, {}, {0: [1, 2, 3]})
        producer = Producer(network, TOPIC, BROKER_IDS)
        for _ in range(4):
            await producer.produce_once(0)
        follower = sims[2]
        await follower.crash(power_cut=False)
        await trio.sleep(1.0)
        follower.session_expires()
        await trio.sleep(0.5)
        for _ in range(4):
            await producer.produce_once(0)
        await trio.sleep(1)
        leader = sims[0].broker.topics.log(TOPIC, 0) if sims[0].broker is not None else None
        assert leader is not None
        if delete:
            leader.delete_records(leader.log_end_offset)
        await follower.start(nursery)
        for _ in range(4):
            await producer.produce_once(0)
        await trio.sleep(10)
        result.append(ends(sims))
        await producer.close()
        nursery.cancel_scope.cancel()


def main() -> int:
    delete = sys.argv[1:] != ["keep"]
    result: list[dict[str, tuple[int, int] | None]] = []
    with _deterministic(1):
        trio.run(scenario, delete, result, clock=trio.testing.MockClock(autojump_threshold=0))
    print("(log start, log end) 10 virtual seconds after the restart:", result[0])
    logs = [v for v in result[0].values() if v is not None]
    return 0 if len({end for _, end in logs}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
