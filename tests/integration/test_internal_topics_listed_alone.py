"""A broker alone lists its internal topics in Metadata as Kafka (and a cluster) does.

Issue 32: aiokafka's ``test_exclude_internal_topics`` and Kafka's tools expect
``__consumer_offsets`` with ``is_internal`` true once a group has used it. Against an
in-process broker with file storage:

1. before any group, no client sees ``__consumer_offsets`` (Kafka makes it on first use);
2. once a group has committed, confluent-kafka's ``list_topics`` lists it with one
   partition led by this broker, and a ``__transaction_state`` once a transactional
   producer has started;
3. aiokafka subscribed to the pattern ``.*`` leaves it out by default
   (``exclude_internal_topics=True``) and takes it with ``exclude_internal_topics=False``,
   and then reads the group's records from it (ListOffsets and Fetch, as Kafka's
   ``OffsetsMessageFormatter`` reads it);
4. kafka-python's admin describes it as internal (Metadata by name).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.test_groups_clients import in_thread
from tests.waits import wait_until
from trio_broker.server.broker import Broker

TOPIC = "listed-topic"
GROUP = "listed-group"
INTERNAL = "__consumer_offsets"


def _topics(bootstrap: str) -> dict[str, Any]:
    return dict(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def _produce_and_commit(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(TOPIC, value=b"v%d" % i)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.commit(offsets=[CTopicPartition(TOPIC, 0, 2)], asynchronous=False)
    finally:
        consumer.close()


def _start_transactional_producer(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "listed-txn"})
    producer.init_transactions(10)
    producer.flush(1)


def _pattern_subscription(bootstrap: str, exclude_internal: bool) -> tuple[set[str], int]:
    """The topics aiokafka's pattern ``.*`` takes, and how many records it reads from
    ``__consumer_offsets`` (0 when left out)."""

    async def main() -> tuple[set[str], int]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, exclude_internal_topics=exclude_internal,
            auto_offset_reset="earliest", metadata_max_age_ms=500,
        )  # fmt: skip
        await consumer.start()
        try:
            consumer.subscribe(pattern=".*")
            deadline = asyncio.get_running_loop().time() + 30
            # Polling: the subscription follows a metadata refresh, no event to await.
            while TOPIC not in (consumer.subscription() or set()):
                assert asyncio.get_running_loop().time() < deadline, "no subscription"
                await asyncio.sleep(0.05)
            topics = set(consumer.subscription())
            internal_records = 0
            if INTERNAL in topics:
                while internal_records == 0:
                    assert asyncio.get_running_loop().time() < deadline, "nothing read"
                    batches = await consumer.getmany(timeout_ms=500)
                    internal_records += sum(
                        len(records) for tp, records in batches.items() if tp.topic == INTERNAL
                    )
            return topics, internal_records
        finally:
            await consumer.stop()

    return asyncio.run(main())


def _described_internal(bootstrap: str) -> list[Any]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return [(t["name"], t["is_internal"], len(t["partitions"]))
                for t in admin.describe_topics([INTERNAL])]  # fmt: skip
    finally:
        admin.close()


async def test_internal_topics_are_listed_once_used(broker: Broker, bootstrap: str) -> None:
    before = await in_thread(partial(_topics, bootstrap))
    assert INTERNAL not in before and "__transaction_state" not in before

    await in_thread(partial(_produce_and_commit, bootstrap))
    listed = await in_thread(partial(_topics, bootstrap))
    assert INTERNAL in listed and TOPIC in listed
    [(index, partition)] = listed[INTERNAL].partitions.items()
    assert (index, partition.leader, partition.replicas) == (0, broker.config.node_id,
                                                             [broker.config.node_id])  # fmt: skip
    assert listed[INTERNAL].error is None

    await in_thread(partial(_start_transactional_producer, bootstrap))
    await in_thread(partial(wait_until, lambda: "__transaction_state" in _topics(bootstrap),
                            "__transaction_state listed"))  # fmt: skip

    excluded, _ = await in_thread(partial(_pattern_subscription, bootstrap, True))
    assert TOPIC in excluded and INTERNAL not in excluded
    included, read = await in_thread(partial(_pattern_subscription, bootstrap, False))
    assert {TOPIC, INTERNAL} <= included
    assert read >= 1  # the group's commit, read from the internal topic

    assert await in_thread(partial(_described_internal, bootstrap)) == [(INTERNAL, True, 1)]
