"""librdkafka's idempotent producer meets OUT_OF_ORDER_SEQUENCE_NUMBER (45), end to end.

confluent-kafka (enable.idempotence, 5 in flight, acks=all) produces through a proxy
that, a few times, holds one Produce request back and forwards the NEXT Produce
request of that connection first, then the held one. The broker sees a sequence gap
and answers 45 to the first-forwarded request, then appends the held one; since it
answers in the order it received requests, the client gets its responses out of its
own request order on that connection (it matches them by correlation id).

The proxy decodes every Produce response and counts the 45s it carries; the test
asserts at least one was sent (otherwise it proves nothing). It then consumes the
topic back (confluent-kafka Consumer) and checks: no duplicates, no gaps, order kept.

Observed librdkafka behaviour (confluent-kafka 2.16.1 / librdkafka 2.16.0):

* In idempotent mode librdkafka caps the *messages* in flight per partition at 5,
  not the requests: with 50-record batches it sends one Produce at a time and the
  proxy has nothing to reorder. Hence ``batch.num.messages=1`` (5 requests in flight).
* Each swap yields one or more 45s (the first-forwarded request and, sometimes, the
  requests pipelined behind it). librdkafka does not fail the records: it lets
  what is in flight finish, bumps its epoch (InitProducerId with its current id and epoch,
  KIP-360; same producer id, epoch + 1), restarts the sequences at 0 and retries
  the rejected batches. Every delivery report is a success, the log holds every
  record once, in order, and the stored batches show epochs 0..3 for 3 swaps.
* Should a future librdkafka fail some deliveries instead, the test still checks
  Kafka semantics: records reported delivered are in the log exactly once, in
  order, at the reported offsets; nothing reported failed is in the log.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.test_idempotence_clients import (
    TOPIC,
    DroppingProxy,
    expected_values,
    port_of,
    running_broker,
    stored_batches,
    stored_values,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(300)

COUNT = 1_000
OOS = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class ReorderingProxy(DroppingProxy):
    """Forwards frames both ways; up to ``swaps`` times holds one Produce request back
    and forwards the next Produce request of the connection before it. Decodes every
    Produce response and counts the partitions answered with 45."""

    def __init__(self, target_port: int, swaps: int, skip: int = 3) -> None:
        super().__init__(target_port, drops=0)
        self.swaps_left = swaps
        self.swapped = 0
        self.skip = skip  # let the producer settle: reorder only after this many Produces
        self.produces_seen = 0
        self.oos_answers = 0
        self.error_codes: list[int] = []

    async def handle(self, client: trio.SocketStream) -> None:
        upstream = await self.open_upstream(client)
        if upstream is None:
            return
        versions: dict[int, int] = {}  # correlation id -> version of Produce in flight
        lock = trio.Lock()
        held: list[bytes] = []

        async def release_later(frame: bytes) -> None:
            # No next Produce came soon (end of the run): forward the held one as is.
            await trio.sleep(1.0)
            async with lock:
                if held and held[0] is frame:
                    held.clear()
                    await upstream.send_all(frame)

        async def requests() -> None:
            # A held request is released by a task of its own (release_later).
            async with trio.open_nursery() as nursery:
                async for frame in self.frames(client):
                    api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                    async with lock:
                        if api_key != m.ApiKey.PRODUCE:
                            await upstream.send_all(frame)
                            continue
                        versions[correlation_id] = version
                        self.produces_seen += 1
                        if held:
                            await upstream.send_all(frame)  # the later one first ...
                            await upstream.send_all(held.pop())  # ... then the held one
                            self.swapped += 1
                        elif self.swaps_left and self.produces_seen > self.skip:
                            self.swaps_left -= 1
                            self.skip = self.produces_seen + 20  # spread the swaps out
                            held.append(frame)
                            nursery.start_soon(release_later, frame)
                        else:
                            await upstream.send_all(frame)

        async def responses() -> None:
            async for frame in self.frames(upstream):
                correlation_id = struct.unpack_from(">i", frame, 4)[0]
                version = versions.pop(correlation_id, None)
                if version is not None:
                    _, answer = m.decode_response(m.ApiKey.PRODUCE, version, frame[4:])
                    for topic in answer.responses:
                        for part in topic.partition_responses:
                            self.error_codes.append(part.error_code)
                            if part.error_code == OOS:
                                self.oos_answers += 1
                await client.send_all(frame)

        await self.relay(client, upstream, requests, responses)


def produce(bootstrap: str, values: list[bytes]) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 5,
            "acks": "all",
            "linger.ms": 2,
            "batch.num.messages": 1,  # see the docstring: else 1 request in flight
            "request.timeout.ms": 2_000,
            "message.timeout.ms": 30_000,
            "reconnect.backoff.ms": 10,
            "retry.backoff.ms": 10,
        }
    )
    delivered: list[tuple[int, bytes]] = []
    failed: list[tuple[str, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivered.append((msg.offset(), bytes(msg.value())))
        else:
            failed.append((f"{err.name()} fatal={err.fatal()}", bytes(msg.value())))

    for value in values:
        for _ in range(10_000):
            try:
                producer.produce(TOPIC, value=value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    unflushed = producer.flush(35)
    return {"delivered": delivered, "failed": failed, "unflushed": unflushed}


def consume_all(bootstrap: str, end_offset: int) -> list[tuple[int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "oos-check",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    out: list[tuple[int, bytes]] = []
    try:
        for _ in range(200):  # bounded: at most ~20 s
            if out and out[-1][0] >= end_offset - 1:
                break
            for msg in consumer.consume(1000, timeout=0.1):
                assert msg.error() is None, msg.error()
                out.append((msg.offset(), bytes(msg.value())))
    finally:
        consumer.close()
    return out


async def test_confluent_idempotent_survives_out_of_order_sequence(tmp_path: Path) -> None:
    values = expected_values(COUNT, "oos")
    async with trio.open_nursery() as nursery:
        proxy = ReorderingProxy(target_port=0, swaps=3)
        proxy_port: int = await nursery.start(proxy.serve)
        async with running_broker(
            tmp_path, advertised_host="127.0.0.1", advertised_port=proxy_port
        ) as broker:
            proxy.target_port = port_of(broker)
            bootstrap = f"127.0.0.1:{proxy_port}"
            with trio.fail_after(60):
                result = await trio.to_thread.run_sync(produce, bootstrap, values)
            assert proxy.swapped > 0, "the proxy never reordered two Produce requests"
            assert proxy.oos_answers > 0, f"no 45 was sent: {sorted(set(proxy.error_codes))}"
            assert result["unflushed"] == 0

            stored = stored_values(broker)
            views = [view for view, _ in stored_batches(broker)]
            with trio.fail_after(30):
                consumed = await trio.to_thread.run_sync(consume_all, bootstrap, len(stored))
        nursery.cancel_scope.cancel()

    consumed_values = [v for _, v in consumed]
    assert [o for o, _ in consumed] == list(range(len(consumed)))
    assert consumed_values == stored
    assert len(set(consumed_values)) == len(consumed_values), "duplicates in the log"

    delivered = result["delivered"]
    failed_values = {v for _, v in result["failed"]}
    # One producer id; epochs only grow; within an epoch the sequences start at 0
    # and continue batch after batch (no gap, no overlap).
    assert len({v.producer_id for v in views}) == 1 and views[0].producer_id != -1
    for before, after in itertools.pairwise(views):
        assert after.producer_epoch >= before.producer_epoch
        if after.producer_epoch == before.producer_epoch:
            assert after.base_sequence == before.last_sequence + 1
        else:
            assert after.base_sequence == 0
    if not result["failed"]:
        # What librdkafka 2.16 does: every record delivered, once, in order.
        assert consumed_values == values
        assert sorted(delivered) == list(enumerate(values))
    else:
        # Kafka semantics if some deliveries fail: the delivered ones are present
        # exactly once, in order, at the offsets reported; no failed one is present.
        delivered_values = [v for _, v in sorted(delivered)]
        assert consumed_values == delivered_values
        assert all(consumed[o] == (o, v) for o, v in delivered)
        assert not failed_values & set(consumed_values)
        assert len(delivered) + len(failed_values) == COUNT
