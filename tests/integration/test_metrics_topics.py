"""Per-topic traffic, fsync latency, quota counters and the slow-request log (issue #10).

An in-process broker with ``metrics.listener`` on port 0; confluent-kafka
produces and reads (assign, no group) while /metrics is scraped from a thread.
The relations checked are exact where the broker makes them so: every appended
batch is stored verbatim, so a fresh topic's bytes in equal its partition sizes
and its messages in equal its log end offsets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.raw_client import RawClient
from tests.integration.test_metrics import Key, scrape, value
from trio_broker.config import BrokerConfig, ConfigError, load_config
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker

BIG, SMALL = "traffic-big", "traffic-small"
VALUE_BYTES = 1000
#: Three rounds of produce, each followed by a scrape: counters must only grow.
ROUNDS = 3
PER_ROUND = 40
SLOW_CLIENT = "throttled-client"
SLOW_QUOTA = 1024  # producer_byte_rate of SLOW_CLIENT, bytes/s


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0,
        data_dir=tmp_path / "data",
        storage="file",
        metrics_listener="127.0.0.1:0",
        request_log_slow_ms=1,
        quota_window_num=2,
        quotas={f"client-id={SLOW_CLIENT}": {"producer_byte_rate": SLOW_QUOTA}},
    )


def produce(bootstrap: str, topic: str, count: int, client_id: str = "traffic") -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "client.id": client_id}
    )
    for i in range(count):
        producer.produce(topic, key=b"%d" % i, value=b"v" * VALUE_BYTES, partition=i % 2)
        if i % 10 == 9:
            producer.flush(10)  # several batches, several Produce requests
    assert producer.flush(10) == 0


def consume_all(bootstrap: str, topic: str, expected: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        got = 0
        for _ in range(200):  # bounded: ~200 polls of at most 0.1 s
            if got >= expected:
                break
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got += 1
        return got
    finally:
        consumer.close()


def topic_value(samples: dict[Key, float], name: str, topic: str) -> float:
    return value(samples, name, topic=topic)


def partition_sum(samples: dict[Key, float], name: str, topic: str) -> float:
    return sum(value(samples, name, topic=topic, partition=str(p)) for p in (0, 1))


async def test_topic_traffic_counters_during_produce_and_consume(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(BIG, 2)
    broker.topics.create(SMALL, 2)
    previous = await scrape(broker)
    assert topic_value(previous, "trio_broker_topic_bytes_in_total", BIG) == 0
    for round_ in range(ROUNDS):
        await trio.to_thread.run_sync(produce, bootstrap, BIG, PER_ROUND)
        current = await scrape(broker)
        bytes_in = topic_value(current, "trio_broker_topic_bytes_in_total", BIG)
        # Record batches hold the values plus headers: at least the payload.
        assert bytes_in >= (round_ + 1) * PER_ROUND * VALUE_BYTES
        assert bytes_in > topic_value(previous, "trio_broker_topic_bytes_in_total", BIG)
        # Stored verbatim: bytes in == bytes on disk, records in == log end offsets.
        assert bytes_in == partition_sum(current, "trio_broker_partition_size_bytes", BIG)
        assert (
            topic_value(current, "trio_broker_topic_messages_in_total", BIG)
            == (partition_sum(current, "trio_broker_log_end_offset", BIG))
            == (round_ + 1) * PER_ROUND
        )
        for (name, labels), old in previous.items():
            if name.endswith("_total") and (name, labels) in current:
                assert current[(name, labels)] >= old, name
        previous = current

    # Scrapes while a producer runs: what they see only grows, and never passes
    # what was stored (each scrape is consistent with the logs at that moment).
    seen: list[float] = []
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def produce_small() -> None:
            await trio.to_thread.run_sync(produce, bootstrap, SMALL, 40)
            done.set()

        nursery.start_soon(produce_small)
        for _ in range(1000):  # bounded (~30 s at most); the producer needs ~1 s
            finished = done.is_set()  # looked at before the scrape: the last one sees all
            during = await scrape(broker)
            small_in = topic_value(during, "trio_broker_topic_bytes_in_total", SMALL)
            assert small_in == partition_sum(during, "trio_broker_partition_size_bytes", SMALL)
            seen.append(small_in)
            if finished:
                break
            await trio.sleep(0.02)
        assert finished
    assert seen == sorted(seen) and seen[-1] > 0
    got = await trio.to_thread.run_sync(consume_all, bootstrap, BIG, ROUNDS * PER_ROUND)
    assert got == ROUNDS * PER_ROUND
    after = await scrape(broker)
    big_in = topic_value(after, "trio_broker_topic_bytes_in_total", BIG)
    small_in = topic_value(after, "trio_broker_topic_bytes_in_total", SMALL)
    assert big_in == topic_value(previous, "trio_broker_topic_bytes_in_total", BIG)  # unchanged
    assert small_in == partition_sum(after, "trio_broker_partition_size_bytes", SMALL) > 0
    assert small_in == seen[-1]  # the last scrape came after the producer's flush
    assert topic_value(after, "trio_broker_topic_messages_in_total", SMALL) == 40
    # Every stored batch of BIG went out at least once (whole batches; refetches add more).
    assert topic_value(after, "trio_broker_topic_bytes_out_total", BIG) >= big_in
    assert topic_value(after, "trio_broker_topic_bytes_out_total", SMALL) == 0
    # Record bytes are part of what went out on the sockets.
    assert value(after, "trio_broker_bytes_out_total") >= big_in

    # One fsync latency observation per completed partition sync.
    fsyncs = value(after, "trio_broker_fsyncs_total")
    assert fsyncs >= 1
    assert value(after, "trio_broker_fsync_duration_seconds_count") == fsyncs
    assert value(after, "trio_broker_fsync_duration_seconds_bucket", le="+Inf") == fsyncs
    assert value(after, "trio_broker_fsync_duration_seconds_sum") > 0
    assert ("trio_broker_fsync_duration_seconds_bucket", frozenset({("le", "0.0001")})) in after
    # No quota was hit by these clients.
    assert not any(n == "trio_broker_throttled_responses_total" for n, _ in after)


async def test_throttled_counter_moves_when_a_quota_is_hit(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(BIG, 2)
    before = await scrape(broker)
    assert value(before, "trio_broker_throttled_responses_total", quota="producer_byte_rate") == 0
    # 8 KB in one flush against a 1 KB/s quota: the answer carries a throttle time.
    await trio.to_thread.run_sync(produce, bootstrap, BIG, 8, SLOW_CLIENT)
    after = await scrape(broker)
    throttled = value(after, "trio_broker_throttled_responses_total", quota="producer_byte_rate")
    assert throttled >= 1
    assert value(after, "trio_broker_throttle_time_ms_total", quota="producer_byte_rate") >= (
        throttled
    )  # at least 1 ms per throttled response
    assert value(after, "trio_broker_throttled_responses_total", quota="consumer_byte_rate") == 0


def fetch_request(topic: str, max_wait_ms: int) -> Any:
    partition = m.FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
    )
    return m.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, topics=[m.FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
    )  # fmt: skip


async def test_slow_request_log_line(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """A long poll on an empty partition waits max_wait_ms: over request.log.slow.ms=1."""
    broker.topics.create(SMALL, 1)
    caplog.set_level(logging.INFO, logger="trio_broker.requests")
    host, port = broker.bound[0]
    client = RawClient(await trio.open_tcp_stream(host, port), "slow-log-client")
    response = await client.call(m.ApiKey.FETCH, 4, fetch_request(SMALL, 50))
    assert response.responses[0].partitions[0].error_code == 0
    lines = [r for r in caplog.records if r.name == "trio_broker.requests"]
    fetches = [r for r in lines if r.fields["api"] == "fetch"]  # type: ignore[attr-defined]
    assert len(fetches) == 1, [r.getMessage() for r in lines]
    record = fetches[0]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["version"] == 4 and fields["api_key"] == m.ApiKey.FETCH
    assert fields["correlation_id"] == client.correlation_id
    assert fields["client_id"] == "slow-log-client"
    assert fields["client"].startswith("127.0.0.1:")
    assert fields["principal"] == "User:ANONYMOUS"
    assert fields["throttle_ms"] == 0
    # total = queue + handler + wait; the wait is the long poll (max_wait_ms = 50).
    parts = fields["queue_ms"] + fields["handler_ms"] + fields["wait_ms"]
    assert abs(fields["total_ms"] - parts) < 0.01
    assert fields["wait_ms"] > 0
    message = record.getMessage()
    assert message.startswith("slow request api=fetch api_key=1 version=4 ")
    assert " client_id=slow-log-client " in message and " principal=User:ANONYMOUS " in message
    samples = await scrape(broker)
    assert value(samples, "trio_broker_slow_requests_total") == len(lines)
    await client.stream.aclose()


def test_slow_log_config_key_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[request.log.slow]\nms = 250\n")
    assert load_config(path).request_log_slow_ms == 250
    assert load_config().request_log_slow_ms == 1000
    assert load_config(request_log_slow_ms=0).request_log_slow_ms == 0  # off
    with pytest.raises(ConfigError, match=r"request\.log\.slow\.ms"):
        load_config(request_log_slow_ms=-1)
