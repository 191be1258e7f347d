"""A share group with ``share.isolation.level=read_committed`` (librdkafka's test 0177).

As Kafka 4.2: its members get records below the last stable offset only (an open
transaction holds back what follows it), and the records of aborted transactions are
archived as they are reached, never delivered. A group left at the default
(read_uncommitted) gets every record up to the high watermark, the aborted ones too.
confluent-kafka's ``ShareConsumer`` and a transactional ``Producer`` against a broker
process.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_share_consumer_librdkafka import make_topic

DEADLINE_S = 30.0


def configure(bootstrap: str, group: str, isolation: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        for key, value in (("share.auto.offset.reset", "earliest"),
                           ("share.isolation.level", isolation))
    ])  # fmt: skip
    admin.incremental_alter_configs([resource])[resource].result(timeout=60)


def transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0  # in the log before the marker (abort purges the unsent)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def values_until(consumer: ShareConsumer, wanted: set[bytes]) -> list[bytes]:
    """Every value the consumer gets (accepted, implicit mode) until it has ``wanted``,
    then one more poll to show nothing else is coming."""
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while not wanted <= set(got):
        assert time.monotonic() < deadline, f"timed out with {got}"
        for msg in consumer.poll(0.5):
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    for msg in consumer.poll(1.0):
        got.append(msg.value())
    return got


def test_read_committed_share_group_skips_aborted_and_open_transactions(
    broker_process: BrokerProcess,
) -> None:
    bootstrap = broker_process.bootstrap
    suffix = uuid.uuid4().hex[:8]
    topic, committed_group, uncommitted_group = (
        f"share-txn-{suffix}", f"share-rc-{suffix}", f"share-ru-{suffix}"
    )  # fmt: skip
    make_topic(bootstrap, topic, 1)
    configure(bootstrap, committed_group, "read_committed")
    configure(bootstrap, uncommitted_group, "read_uncommitted")

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{suffix}"})
    producer.init_transactions(30)
    transaction(producer, topic, [b"c1-0", b"c1-1", b"c1-2"], commit=True)
    transaction(producer, topic, [b"a-0", b"a-1", b"a-2"], commit=False)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, value=b"plain", partition=0)
    assert plain.flush(30) == 0
    transaction(producer, topic, [b"c2-0", b"c2-1"], commit=True)
    # An open transaction: the last stable offset stays at its first record.
    producer.begin_transaction()
    producer.produce(topic, value=b"open-0", partition=0)
    assert producer.flush(30) == 0

    committed = {b"c1-0", b"c1-1", b"c1-2", b"plain", b"c2-0", b"c2-1"}
    reader = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": committed_group})
    reader.subscribe([topic])
    try:
        got = values_until(reader, committed)
        assert sorted(got) == sorted(committed)
        producer.commit_transaction(30)
        assert values_until(reader, {b"open-0"}) == [b"open-0"]
    finally:
        reader.close()

    everyone = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": uncommitted_group})
    everyone.subscribe([topic])
    try:
        got = values_until(everyone, committed | {b"a-0", b"a-1", b"a-2", b"open-0"})
        assert sorted(got) == sorted(committed | {b"a-0", b"a-1", b"a-2", b"open-0"})
    finally:
        everyone.close()
