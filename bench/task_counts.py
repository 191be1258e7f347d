"""Trio tasks spawned and scheduler work per request, counted (not timed).

    python bench/task_counts.py [--requests 50] [--seeds 1000:1010] [--json] [--no-sim]

Counts, with a ``trio.abc.Instrument``, what the broker's Trio shell does per request:
tasks spawned, task steps (``before_task_step``, the harness's own client task left out)
and scheduler passes (``after_io_wait``), for

* (a) an acks=-1 produce of one small record, (b) an acks=1 produce: an in-process
  broker on file storage (a temporary directory) and one raw client connection in the
  same loop, one request at a time, averaged over ``--requests`` after a warm-up;
* (c) a fetch answered from a long poll: the fetch waits at the log end, a produce
  (acks=1) on a second connection wakes it; the pair's counts, then the pair less (b);
* (d) one simulator schedule (``sim.simulation.simulate``) per seed, averaged over
  ``--seeds``.

The counts do not depend on the machine's load (the simulator's are exact; the
broker's vary by a step or two with when the fsync thread reports). Spawns are also
listed by task name, the most frequent first: what to cut next.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker

TOPIC = "counts"


class Counter(trio.abc.Instrument):
    """Spawns (by name), steps and passes while installed; ``ignore``: tasks not counted."""

    def __init__(self, ignore: set[trio.lowlevel.Task] | None = None) -> None:
        self.ignore = ignore or set()
        self.spawned = 0
        self.steps = 0
        self.passes = 0
        self.names: collections.Counter[str] = collections.Counter()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1
        self.names[task.name.rsplit(".", 1)[-1] if "<" in task.name else task.name] += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task not in self.ignore:
            self.steps += 1

    def after_io_wait(self, timeout: float) -> None:
        self.passes += 1

    def per(self, n: int) -> dict[str, Any]:
        return {
            "tasks_spawned": round(self.spawned / n, 2),
            "task_steps": round(self.steps / n, 2),
            "scheduler_passes": round(self.passes / n, 2),
            "spawned_by_name": {k: round(v / n, 2) for k, v in self.names.most_common(8) if v > 0},
        }


def produce_request(acks: int) -> m.ProduceRequest:
    Req = m.ProduceRequest
    part = Req.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(build_batch([(b"k", b"v")]))
    )
    return Req(
        acks=acks,
        timeout_ms=30_000,
        topic_data=[Req.TopicProduceData(name=TOPIC, partition_data=[part])],
    )


def fetch_request(offset: int) -> m.FetchRequest:
    Req = m.FetchRequest
    part = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=offset, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    return Req(replica_id=-1, max_wait_ms=30_000, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=TOPIC, partitions=[part])],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def _broker_counts(requests: int, data_dir: Path) -> dict[str, Any]:
    config = BrokerConfig(port=0, data_dir=data_dir, storage="file")
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create(TOPIC, 1)
        port = broker.bound[0][1]
        client = RawClient(await trio.open_tcp_stream("127.0.0.1", port))
        waker = RawClient(await trio.open_tcp_stream("127.0.0.1", port))
        me = trio.lowlevel.current_task()
        for acks, name in ((-1, "produce_acks_all"), (1, "produce_acks_1")):
            for _ in range(5):  # warm-up: the first appends open files, fill caches
                await client.call(m.ApiKey.PRODUCE, 9, produce_request(acks))
            counter = Counter({me})
            trio.lowlevel.add_instrument(counter)
            for _ in range(requests):
                answer = await client.call(m.ApiKey.PRODUCE, 9, produce_request(acks))
                assert answer.responses[0].partition_responses[0].error_code == 0
            trio.lowlevel.remove_instrument(counter)
            out[name] = counter.per(requests)

        offset = broker.topics.get(TOPIC).logs[0].log_end_offset  # type: ignore[union-attr]
        counter = Counter({me})
        for i in range(requests + 3):
            if i == 3:
                trio.lowlevel.add_instrument(counter)
            answers: list[Any] = []
            async with trio.open_nursery() as pair:

                async def long_poll(at: int = offset, into: list[Any] = answers) -> None:
                    into.append(await client.call(m.ApiKey.FETCH, 12, fetch_request(at)))

                pair.start_soon(long_poll)
                counter.ignore.add(trio.lowlevel.current_task())
                # The fetch waits once the purgatory holds it (no fixed sleep: a condition).
                while broker.appends.statistics().waiters == 0:
                    await trio.lowlevel.checkpoint()
                await waker.call(m.ApiKey.PRODUCE, 9, produce_request(1))
            (fetched,) = answers
            assert fetched.responses[0].partitions[0].records, "the long poll answered empty"
            offset += 1
        trio.lowlevel.remove_instrument(counter)
        # The harness's own tasks (the pair's nursery child, the polling loop) are not the
        # broker's: one spawned per round.
        counter.spawned -= requests
        counter.names["long_poll"] -= requests
        pair_counts = counter.per(requests)
        out["long_poll_fetch_plus_waking_produce"] = pair_counts
        out["long_poll_fetch_net"] = {
            k: round(pair_counts[k] - out["produce_acks_1"][k], 2)
            for k in ("tasks_spawned", "task_steps", "scheduler_passes")
        }
        await client.stream.aclose()
        await waker.stream.aclose()
        await broker.shutdown()
        nursery.cancel_scope.cancel()
    return out


def sim_counts(seeds: range) -> dict[str, Any]:
    import sim.simulation as simulation

    original = simulation._main
    counter = Counter()

    async def counted(*args: Any) -> None:
        trio.lowlevel.add_instrument(counter)
        try:
            await original(*args)
        finally:
            trio.lowlevel.remove_instrument(counter)

    simulation._main = counted  # type: ignore[assignment]
    try:
        for seed in seeds:
            result = simulation.simulate(seed)
            assert result.ok, f"seed {seed}: {result.violations[:3]}"
    finally:
        simulation._main = original  # type: ignore[assignment]
    return counter.per(len(seeds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--seeds", default="1000:1010", help="simulator seeds A:B")
    parser.add_argument("--no-sim", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    logging.getLogger("trio_broker").setLevel(logging.ERROR)  # the loop watchdog's lines
    with tempfile.TemporaryDirectory(prefix="task-counts-") as tmp:
        results = trio.run(_broker_counts, args.requests, Path(tmp))
    if not args.no_sim:
        first, last = (int(x) for x in args.seeds.split(":"))
        results["sim_schedule"] = sim_counts(range(first, last))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for name, counts in results.items():
        print(f"{name}:")
        for key, value in counts.items():
            print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
