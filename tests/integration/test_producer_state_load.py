"""A partition's producer state is loaded off the event loop (docs/idempotence.md).

After a start, the first request that needs a partition's producer state (a Produce's
sequence check, a Fetch's LSO) has it built from the latest snapshot and every batch
header after it: up to a whole segment. That runs in a worker thread, so the broker
answers other requests meanwhile. The test holds the load of one partition (its header
reader waits until another connection's Produce to the other partition was answered)
and checks that the state it built is the one a load on the loop would build: the
retried last batch is answered with its original offset.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.integration.test_idempotence_clients import (
    PRODUCE_V,
    RawClient,
    batch_of,
    port_of,
    running_broker,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.services.producers import latest_snapshot, read_batch_headers
from trio_broker.storage.log_protocol import Log

pytestmark = pytest.mark.timeout(300)

TAIL = "tail"
#: How long the held load waits for the other answer: on the old code (the load on the
#: loop) it never comes, and the load goes on after this.
HOLD_S = 15.0


async def send_produce(client: RawClient, partition: int, batch: bytes) -> None:
    Req = m.ProduceRequest
    part = Req.TopicProduceData.PartitionProduceData(index=partition, records=batch)
    body = Req(transactional_id=None, acks=1, timeout_ms=10_000,
               topic_data=[Req.TopicProduceData(name=TAIL, partition_data=[part])])  # fmt: skip
    await client.send(m.ApiKey.PRODUCE, PRODUCE_V, body)


async def produce(client: RawClient, partition: int, batch: bytes) -> tuple[int, int]:
    await send_produce(client, partition, batch)
    response = await client.receive(m.ApiKey.PRODUCE, PRODUCE_V)
    part = response.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


async def test_a_partition_load_does_not_hold_other_requests(tmp_path: Path) -> None:
    batches = 200
    async with running_broker(tmp_path) as broker:
        broker.topics.create(TAIL, 2)
        client = await RawClient.connect(port_of(broker))
        pid = (await client.init_producer_id()).producer_id
        sent = [batch_of(pid, 0, 2 * i) for i in range(batches)]
        for i, raw in enumerate(sent):
            assert await produce(client, 0, raw) == (0, 2 * i)
        await client.stream.aclose()
    # As after a crash: no snapshot, the state is the whole segment's headers.
    while (snapshot := latest_snapshot(tmp_path / f"{TAIL}-0")) is not None:
        snapshot.unlink()

    async with running_broker(tmp_path) as broker:
        gated = broker.topics.log(TAIL, 0)
        load_began, other_answered = threading.Event(), threading.Event()
        seen: dict[str, object] = {}

        def held_reader(log_: Log, from_offset: int) -> Iterator[RecordBatchView]:
            if log_ is gated and "answered_while_loading" not in seen:
                seen["on_loop_thread"] = threading.current_thread() is threading.main_thread()
                load_began.set()
                seen["answered_while_loading"] = other_answered.wait(HOLD_S)
            return read_batch_headers(log_, from_offset)

        broker.producers._read_headers = held_reader
        retrier = await RawClient.connect(port_of(broker))
        other = await RawClient.connect(port_of(broker))
        # The producer never saw the last ack and retries it: its partition's state loads.
        await send_produce(retrier, 0, sent[-1])
        assert await trio.to_thread.run_sync(load_began.wait, HOLD_S / 2)
        # Another connection's write to the other partition is answered meanwhile.
        plain = bytes(build_batch([(None, b"other")]))
        with trio.move_on_after(HOLD_S / 2):
            assert await produce(other, 1, plain) == (0, 0)
            other_answered.set()
        response = await retrier.receive(m.ApiKey.PRODUCE, PRODUCE_V)
        part = response.responses[0].partition_responses[0]
        # The state the thread built knows the producer's last batch: a duplicate.
        assert (part.error_code, part.base_offset) == (0, 2 * (batches - 1))
        assert seen == {"on_loop_thread": False, "answered_while_loading": True}
        assert broker.topics.log(TAIL, 0).log_end_offset == 2 * batches
        await retrier.stream.aclose()
        await other.stream.aclose()
