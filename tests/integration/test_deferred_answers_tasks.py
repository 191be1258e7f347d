"""A long-poll fetch and a node alone's acks=all produce are answered without a task of
their own (issue 33): the handler pool's completer polls them when the purgatory or
the group commit wakes them. Counted with a Trio instrument around one request each,
over a real socket to the in-process broker; the answers are the usual ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.integration.raw_client import file_broker_and_client
from tests.waits import eventually
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch

TOPIC = "no-task-answers"


class Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


def produce(acks: int) -> m.ProduceRequest:
    Req = m.ProduceRequest
    part = Req.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(build_batch([(b"k", b"v")]))
    )
    return Req(acks=acks, timeout_ms=60_000,
               topic_data=[Req.TopicProduceData(name=TOPIC, partition_data=[part])])  # fmt: skip


def fetch(offset: int) -> m.FetchRequest:
    Req = m.FetchRequest
    part = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=offset, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    return Req(replica_id=-1, max_wait_ms=60_000, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=TOPIC, partitions=[part])],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def test_acks_all_produce_and_long_poll_are_answered_without_a_task(tmp_path: Path) -> None:
    async with file_broker_and_client(tmp_path / "data") as (broker, client):
        broker.topics.create(TOPIC, 1)
        spawns = Spawns()
        trio.lowlevel.add_instrument(spawns)
        try:
            answer = await client.call(m.ApiKey.PRODUCE, 9, produce(-1))
        finally:
            trio.lowlevel.remove_instrument(spawns)
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == 0 and part.base_offset == 0
        assert spawns.names == []

        other = await trio.open_tcp_stream("127.0.0.1", broker.bound[0][1])
        answers: list[Any] = []
        async with other, trio.open_nursery() as nursery:

            async def long_poll() -> None:
                answers.append(await client.call(m.ApiKey.FETCH, 12, fetch(1)))

            nursery.start_soon(long_poll)
            await eventually(lambda: broker.appends.statistics().waiters == 1, "the long poll")
            trio.lowlevel.add_instrument(spawns)
            try:
                await other.send_all(m.encode_request(m.ApiKey.PRODUCE, 9, 1, "w", produce(1)))
                await eventually(lambda: bool(answers), "the long poll's answer")
            finally:
                trio.lowlevel.remove_instrument(spawns)
        assert answers[0].responses[0].partitions[0].records
        assert spawns.names == []


async def test_an_answered_acks_all_produce_is_freed_without_the_cyclic_gc(
    tmp_path: Path,
) -> None:
    """Its request's objects go when it is answered, by reference counting: a cycle
    through the group commit's waiter would keep its buffers until a GC pass."""
    import gc

    from trio_broker.server.handler_pool import _Waiting

    async with file_broker_and_client(tmp_path / "data") as (broker, client):
        broker.topics.create(TOPIC, 1)
        await client.call(m.ApiKey.PRODUCE, 9, produce(-1))  # warm-up
        gc.collect()
        # Waiters alive already belong to others (another test's broker in this worker
        # process, its long polls parked): held here, so their ids stay theirs.
        before = [o for o in gc.get_objects() if isinstance(o, _Waiting)]
        known = {id(o) for o in before}
        gc.disable()
        try:
            for _ in range(3):
                answer = await client.call(m.ApiKey.PRODUCE, 9, produce(-1))
                assert answer.responses[0].partition_responses[0].error_code == 0
            left = [o for o in gc.get_objects() if isinstance(o, _Waiting) and id(o) not in known]
        finally:
            gc.enable()
        assert left == []
