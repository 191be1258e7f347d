"""Client quotas against a real in-process broker: KIP-219 throttling, runtime changes.

Quotas are measured over ``quota.window.num`` = 2 one-second samples here (Kafka:
11) so that a few seconds of traffic show the steady state rather than the
first-burst allowance. Rates are checked loosely (at most about twice the
quota): this is behaviour, not a benchmark.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.services.quotas import STORE_NAME, QuotaService
from trio_broker.state.mute import MuteReason

PRODUCE_QUOTA = 1 << 20  # client-id=bench
FETCH_QUOTA = 512 << 10  # client-id=reader
RUN_S = 3.0


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0,
        data_dir=tmp_path / "data",
        storage="file",
        quota_window_num=2,
        quotas={
            "client-id=bench": {"producer_byte_rate": PRODUCE_QUOTA},
            "client-id=reader": {"consumer_byte_rate": FETCH_QUOTA},
        },
    )


async def raw(broker: Broker, client_id: str) -> RawClient:
    host, port = broker.bound[0]
    return RawClient(await trio.open_tcp_stream(host, port), client_id)


def produce_body(topic: str, value: bytes, acks: int = -1, timeout_ms: int = 10_000) -> Any:
    part = m.ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(build_batch([(b"k", value)]))
    )
    return m.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[m.ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )


def fetch_body(topic: str, offset: int, max_bytes: int = 1 << 20) -> Any:
    F = m.FetchRequest
    return F(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
        topics=[F.FetchTopic(topic=topic, partitions=[
            F.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                        partition_max_bytes=max_bytes)])],
    )  # fmt: skip


def produce_for(bootstrap: str, client_id: str, topic: str, seconds: float) -> tuple[int, float]:
    """A confluent-kafka producer writing 16 KiB records flat out; acked bytes and time."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all",
         "linger.ms": 5, "queue.buffering.max.kbytes": 2048}
    )  # fmt: skip
    value = b"q" * (16 << 10)
    acked = [0]
    start = time.monotonic()
    end = start + seconds

    def delivered(err: Any, msg: Any) -> None:
        if err is None and time.monotonic() <= end:
            acked[0] += len(msg.value())

    while time.monotonic() < end:
        try:
            producer.produce(topic, value, on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    producer.purge()
    producer.flush(10)
    return acked[0], time.monotonic() - start


async def test_produce_quota_slows_a_confluent_producer(broker: Broker, bootstrap: str) -> None:
    broker.topics.create("pq", 1)
    acked, _elapsed = await trio.to_thread.run_sync(produce_for, bootstrap, "bench", "pq", RUN_S)
    rate = acked / RUN_S
    print(f"bench producer under a {PRODUCE_QUOTA} B/s quota: {rate:.0f} B/s acked ({acked} B)")
    assert acked > 0
    assert rate <= 2 * PRODUCE_QUOTA
    # Counted by the quota service: the producer's connections may be gone by now (a
    # count of muted connections raced their close and read 0 under load).
    assert broker.stats.throttled_responses.get("producer_byte_rate", 0) >= 1


async def test_produce_responses_carry_throttle_time(broker: Broker) -> None:
    broker.topics.create("pt", 1)
    bench, free = await raw(broker, "bench"), await raw(broker, "free")
    value = b"x" * (900 << 10)
    with trio.fail_after(30):
        throttles = []
        for _ in range(6):
            response = await bench.call(m.ApiKey.PRODUCE, 9, produce_body("pt", value))
            assert response.responses[0].partition_responses[0].error_code == 0
            throttles.append(response.throttle_time_ms)
            if response.throttle_time_ms > 0:
                break
        assert throttles[0] == 0 and throttles[-1] > 0, throttles
        assert throttles[-1] <= 2000  # never longer than the window (2 x 1 s)
        # A client under no quota is not throttled however much it sends.
        for _ in range(6):
            response = await free.call(m.ApiKey.PRODUCE, 9, produce_body("pt", value))
            assert response.throttle_time_ms == 0
    muted = {
        c.client.port: c.mute.statistics().times_set[MuteReason.THROTTLED]
        for c in broker.connections.values()
    }
    assert sorted(muted.values()) == [0, 1]  # bench's connection was muted, free's never


def consume_for(bootstrap: str, client_id: str, topic: str, seconds: float) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": client_id,
         "auto.offset.reset": "earliest", "enable.auto.commit": False,
         "max.partition.fetch.bytes": 65536}
    )  # fmt: skip
    consumer.subscribe([topic])
    got = 0
    end = None
    deadline = time.monotonic() + 20  # the group join comes first
    try:
        while time.monotonic() < (end or deadline):
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            if end is None:
                end = time.monotonic() + seconds
            got += len(msg.value())
    finally:
        consumer.close()
    return got


async def test_fetch_quota_slows_a_consumer(broker: Broker, bootstrap: str) -> None:
    broker.topics.create("fq", 1)
    loader = await raw(broker, "loader")
    with trio.fail_after(30):
        for _ in range(64):  # 8 MiB: more than the quota lets through in RUN_S
            response = await loader.call(
                m.ApiKey.PRODUCE, 9, produce_body("fq", b"f" * (128 << 10), acks=1)
            )
            assert response.throttle_time_ms == 0
    got = await trio.to_thread.run_sync(consume_for, bootstrap, "reader", "fq", RUN_S)
    print(f"reader under a {FETCH_QUOTA} B/s fetch quota: {got / RUN_S:.0f} B/s")
    assert got > 0
    assert got / RUN_S <= 2 * FETCH_QUOTA
    # The raw protocol shows the throttle time in the response.
    reader = await raw(broker, "reader")
    offset, throttles = 0, []
    with trio.fail_after(30):
        for _ in range(8):
            response = await reader.call(m.ApiKey.FETCH, 11, fetch_body("fq", offset))
            part = response.responses[0].partitions[0]
            assert part.error_code == 0
            records = bytes(part.records or b"")
            # One response never carries more than the quota allows in the window (1 s).
            assert len(records) <= FETCH_QUOTA + (129 << 10)  # + the one batch always sent
            throttles.append(response.throttle_time_ms)
            if response.throttle_time_ms > 0:
                # Over the quota the answer is empty (as Kafka), to be fetched again later.
                assert records == b""
                break
            offset = list(iter_batches(records))[-1].next_offset
    assert throttles[-1] > 0, throttles


async def alter(client: RawClient, entity: list[tuple[str, str | None]], key: str,
                value: float | None) -> Any:  # fmt: skip
    Req = m.AlterClientQuotasRequest
    body = Req(
        entries=[Req.EntryData(
            entity=[Req.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=[Req.EntryData.OpData(key=key, value=value or 0.0, remove=value is None)],
        )],
        validate_only=False,
    )  # fmt: skip
    return await client.call(m.ApiKey.ALTER_CLIENT_QUOTAS, 1, body)


async def describe(client: RawClient, match: str | None = None) -> dict[str, dict[str, float]]:
    Req = m.DescribeClientQuotasRequest
    components = [] if match is None else [
        Req.ComponentData(entity_type="client-id", match_type=0, match=match)
    ]  # fmt: skip
    response = await client.call(
        m.ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, Req(components=components, strict=False)
    )
    assert response.error_code == 0, response.error_message
    return {
        ",".join(f"{e.entity_type}={e.entity_name}" for e in entry.entity): {
            v.key: v.value for v in entry.values
        }
        for entry in response.entries
    }


async def test_quota_changed_at_runtime(broker: Broker, broker_config: BrokerConfig) -> None:
    broker.topics.create("rt", 1)
    admin, live = await raw(broker, "admin"), await raw(broker, "live")
    value = b"r" * (300 << 10)
    with trio.fail_after(30):
        assert (
            await live.call(m.ApiKey.PRODUCE, 9, produce_body("rt", value))
        ).throttle_time_ms == 0
        response = await alter(admin, [("client-id", "live")], "producer_byte_rate", 100_000)
        assert [e.error_code for e in response.entries] == [0]
        assert await describe(admin, "live") == {"client-id=live": {"producer_byte_rate": 100_000}}
        assert "client-id=bench" in await describe(admin)  # the config file's quotas too
        response = await live.call(m.ApiKey.PRODUCE, 9, produce_body("rt", value))
        assert response.throttle_time_ms > 0
        # Bad changes are refused per entry and change nothing.
        bad = await alter(admin, [("client-id", "live")], "producer_byte_rate", -5)
        assert bad.entries[0].error_code == 42  # INVALID_REQUEST
        bad = await alter(admin, [("group", "x")], "producer_byte_rate", 5)
        assert bad.entries[0].error_code == 42
        # Kept in the data dir for the next start, then removed again.
        store = broker_config.data_dir / STORE_NAME
        assert json.loads(store.read_text())["entities"] == [
            {"entity": "client-id=live", "quotas": {"producer_byte_rate": 100_000}}
        ]
        reloaded = QuotaService(broker_config)
        assert reloaded.table.lookup("producer_byte_rate", "ANONYMOUS", "live") is not None
        response = await alter(admin, [("client-id", "bench")], "producer_byte_rate", None)
        assert response.entries[0].error_code == 0
        assert await describe(admin, "bench") == {}  # removal hides the config file's value
        reloaded = QuotaService(broker_config)
        assert reloaded.table.lookup("producer_byte_rate", "ANONYMOUS", "bench") is None


async def test_request_percentage_throttles_handler_time(broker: Broker) -> None:
    admin, busy, idle = (
        await raw(broker, "admin"),
        await raw(broker, "busy"),
        await raw(broker, "idle"),
    )
    # 0.01 % of one handler thread: a tenth of a millisecond of handler time per second.
    response = await alter(admin, [("client-id", "busy")], "request_percentage", 0.01)
    assert response.entries[0].error_code == 0
    body = m.MetadataRequest(topics=None, allow_auto_topic_creation=False)
    throttles = []
    with trio.fail_after(30):
        for _ in range(50):
            response = await busy.call(m.ApiKey.METADATA, 9, body)
            throttles.append(response.throttle_time_ms)
            if response.throttle_time_ms > 0:
                break
        assert throttles[-1] > 0, throttles
        for _ in range(20):  # a client without the quota is never throttled
            assert (await idle.call(m.ApiKey.METADATA, 9, body)).throttle_time_ms == 0
        # ApiVersions is exempt, as in Kafka, even for the throttled client (after its mute).
        versions = await busy.call(m.ApiKey.API_VERSIONS, 3, m.ApiVersionsRequest(
            client_software_name="t", client_software_version="1"))  # fmt: skip
        assert versions.throttle_time_ms == 0


async def test_a_long_poll_over_the_request_quota_still_ends_at_its_max_wait(
    broker: Broker,
) -> None:
    # The request quota's throttle used to make a waiting fetch a Deferred without its
    # max wait: an idle long poll then waited until data came (forever, here).
    broker.topics.create("idle", 1)
    admin, busy = await raw(broker, "admin"), await raw(broker, "busy")
    response = await alter(admin, [("client-id", "busy")], "request_percentage", 0.01)
    assert response.entries[0].error_code == 0
    body = m.MetadataRequest(topics=None, allow_auto_topic_creation=False)
    with trio.fail_after(30):
        while (await busy.call(m.ApiKey.METADATA, 9, body)).throttle_time_ms == 0:
            pass  # until the handler time is over the quota
    long_poll = fetch_body("idle", 0)
    long_poll.max_wait_ms, long_poll.min_bytes = 1000, 1
    with trio.fail_after(9):  # under the raw client's own 10 s
        answer = await busy.call(m.ApiKey.FETCH, 11, long_poll)
    assert answer.throttle_time_ms > 0  # still over the quota: throttled, and answered
    assert answer.responses[0].partitions[0].records in (b"", None)
