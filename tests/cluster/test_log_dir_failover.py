"""A failed log dir on a partition's leader: the controller moves the leadership off it
(issue 32, JBOD in a cluster; Kafka's LogDirEventNotification and OfflineReplica).

Three cluster brokers in process (so that the test can fail one dir's fsyncs, as
tests/integration/test_log_dir_failure.py does: ``Flusher.sync`` replaced for that dir)
on a real ZooKeeper, each with two log dirs. Topic ``failover`` (replicas 1, 2, 3,
min.insync.replicas=2) lives in one of broker 1's dirs, topic ``other`` (led by broker 1
too) in its other dir. A confluent-kafka producer (acks=all, idempotent) keeps producing
and a confluent-kafka consumer keeps consuming ``failover`` while every fsync in the
dir of broker 1 that holds it fails with EIO:

- the dir goes offline; broker 1 tells the controller (cluster/log_dir_events.py) and
  another in-sync broker leads ``failover``, without broker 1 in the ISR;
- ``other``, in broker 1's healthy dir, is still led by broker 1;
- the producer goes on through the new leader, and the consumer reads every
  acknowledged record, in order;
- once fsync works again broker 1's fetcher probes the dir back whole and its replica
  rejoins the ISR by the leader's usual rule.

Without the broker telling the controller, broker 1 stays the leader and answers
KAFKA_STORAGE_ERROR until its dir comes back: the wait for a new leader times out.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.disk_faults import fail_fsyncs_in
from tests.waits import WAIT_S, eventually
from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(600)

TOPIC, OTHER = "failover", "other"
BROKERS = (1, 2, 3)


def broker_config(zookeeper: str, tmp_path: Path, node_id: int) -> BrokerConfig:
    return BrokerConfig(
        host="127.0.0.1", port=0, storage="file", node_id=node_id,
        data_dir=tmp_path / f"broker{node_id}" / "a",
        extra_log_dirs=(tmp_path / f"broker{node_id}" / "b",),
        zookeeper_connect=zookeeper, group_initial_rebalance_delay_ms=0,
        offsets_topic_num_partitions=1,
    )  # fmt: skip


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([
        NewTopic(name, 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"})
        for name in (TOPIC, OTHER)
    ])  # fmt: skip
    for future in futures.values():
        future.result(timeout=60)


class Traffic:
    """A producer and a consumer of ``failover`` partition 0, each in a thread."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.acked: list[int] = []
        self.failed: list[str] = []
        self.consumed: list[int] = []
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        #: The test failed: both threads end at once, whatever is unanswered or unread.
        self.abort = threading.Event()

    def produce(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 300_000,
        })  # fmt: skip

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                self.acked.append(int(msg.value()))
            else:
                self.failed.append(str(err))

        value = 0
        try:
            while not self.stop_producing.is_set():
                for _ in range(10):
                    producer.produce(TOPIC, value=str(value).encode(), partition=0,
                                     on_delivery=delivered)  # fmt: skip
                    value += 1
                # Backpressure: the next ten once these are answered (a failover holds
                # them while the client retries).
                while producer.flush(0.5) and not self.abort.is_set():
                    pass
        finally:
            # Every record sent is answered: only now may the consumer's last check
            # (all acknowledged records read) be final. Told earlier, it could pass
            # before the last ten were acknowledged, and stop short of them.
            self.stop_consuming.set()

    def consume(self) -> None:
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": "log-dir-failover",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
        })  # fmt: skip
        consumer.assign([CTopicPartition(TOPIC, 0, 0)])
        try:
            # Once told to stop: until every acknowledged record is read, for at most
            # WAIT_S (a lost one fails the test's check after this).
            deadline = None
            while not self.abort.is_set():
                if self.stop_consuming.is_set():
                    deadline = deadline or time.monotonic() + WAIT_S
                    if set(self.acked) <= set(self.consumed) or time.monotonic() > deadline:
                        break
                for msg in consumer.consume(100, 0.2):
                    if msg.error() is None:
                        self.consumed.append(int(msg.value()))
        finally:
            consumer.close()


def partition_of(broker: Broker, topic: str) -> Any:
    info = broker.replication.view.topics.get(topic)
    return None if info is None else info.partitions.get(0)


async def test_a_failed_log_dir_on_the_leader_moves_leadership_to_an_in_sync_follower(
    zookeeper: str, tmp_path: Path
) -> None:
    brokers = {i: Broker(broker_config(zookeeper, tmp_path, i)) for i in BROKERS}
    async with trio.open_nursery() as nursery:
        with trio.fail_after(120):
            for broker in brokers.values():
                await nursery.start(broker.run)
        host, port = brokers[1].bound[0]
        bootstrap = f"{host}:{port}"
        await eventually(
            lambda: all(set(b.replication.view.brokers) >= set(BROKERS) for b in brokers.values()),
            "every broker seeing the others",
        )
        await trio.to_thread.run_sync(create_topics, bootstrap)

        for topic in (TOPIC, OTHER):
            await eventually(lambda t=topic: settled(brokers, t, 1, {1, 2, 3}),
                             f"{topic} led by 1")  # fmt: skip
        leader = brokers[1]
        failed_dir = leader.topics.log_dir_of(leader.topics.log(TOPIC, 0))  # type: ignore[arg-type]
        healthy_dir = leader.topics.log_dir_of(leader.topics.log(OTHER, 0))  # type: ignore[arg-type]
        assert failed_dir is not None and healthy_dir not in (None, failed_dir)

        traffic = Traffic(bootstrap)
        async with trio.open_nursery() as clients:
            clients.start_soon(trio.to_thread.run_sync, traffic.produce)
            clients.start_soon(trio.to_thread.run_sync, traffic.consume)
            try:
                new_leader = await failover(brokers, traffic, failed_dir)
            except BaseException:
                traffic.abort.set()
                raise
            finally:
                traffic.stop_producing.set()  # the producer then tells the consumer
        nursery.cancel_scope.cancel()

    assert not traffic.failed, traffic.failed[:5]
    assert traffic.acked, "nothing acknowledged"
    assert set(traffic.acked) <= set(traffic.consumed), "an acknowledged record was lost"
    # In order: the idempotent producer's records as the partition holds them.
    first_seen = list(dict.fromkeys(traffic.consumed))
    assert first_seen == sorted(first_seen)
    print(f"\n{len(traffic.acked)} acknowledged, {len(traffic.consumed)} consumed, "
          f"new leader {new_leader}")  # fmt: skip


def settled(brokers: dict[int, Broker], topic: str, leader: int, isr: set[int]) -> bool:
    """Every broker's view has ``topic``-0 led by ``leader`` with ISR ``isr``."""
    for broker in brokers.values():
        info = partition_of(broker, topic)
        if info is None or info.leader != leader or set(info.isr) != isr:
            return False
    return True


async def failover(brokers: dict[int, Broker], traffic: Traffic, failed_dir: Path) -> int:
    """Fail broker 1's dir of ``failover`` under traffic; wait for a new leader, more
    acknowledged records, the dir's return and broker 1 back in the ISR. The new leader."""
    leader = brokers[1]
    await eventually(lambda: len(traffic.acked) >= 50, "50 records acknowledged")
    failing = [True]
    fail_fsyncs_in(leader, failed_dir, failing)
    await eventually(lambda: leader.topics.dir_states.offline() == [failed_dir],
                     "broker 1's dir offline")  # fmt: skip
    at_failure = len(traffic.acked)

    def moved() -> int | None:
        infos = [partition_of(b, TOPIC) for b in brokers.values()]
        leaders = {info.leader for info in infos}
        if len(leaders) != 1 or leaders & {1, -1} or 1 in infos[0].isr:
            return None
        return int(infos[0].leader)

    new_leader = await eventually(moved, "another broker leading failover")
    assert new_leader in (2, 3)
    assert set(partition_of(brokers[2], TOPIC).isr) == {2, 3}
    # The other dir's partition stays where it was.
    assert settled(brokers, OTHER, 1, {1, 2, 3})
    await eventually(lambda: len(traffic.acked) >= at_failure + 50,
                     "50 more records acknowledged by the new leader")  # fmt: skip

    # The disk works again: the fetcher's probe brings the dir back whole, and broker 1
    # catches up and rejoins the ISR as a follower.
    failing[0] = False
    await eventually(lambda: not leader.topics.dir_states.offline(), "broker 1's dir back")
    await eventually(lambda: settled(brokers, TOPIC, new_leader, {1, 2, 3}),
                     "broker 1 back in the ISR")  # fmt: skip
    return new_leader
