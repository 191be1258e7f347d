"""``acks.all.fsync``: acks=all on an RF=3 topic with and without an fsync before it counts.

Three ``trio-broker serve`` processes share a ZooKeeper; each exposes ``metrics.listener``.
An idempotent acks=all producer writes 300 records to a topic of replication factor 3
(``min.insync.replicas=2``), and every acknowledged record is read back once, in order.

- By default every replica syncs before it counts a write: the leader's HW covers only
  its synced log end, a follower syncs what it fetched before it fetches on. Every
  broker's flusher has fsynced (``trio_broker_fsyncs_total`` > 0).
- With ``acks.all.fsync=false`` and ``log.flush.interval.messages`` at Kafka's default
  (never), a write counts once every ISR member has appended it: no broker's flusher
  fsyncs at all, and still every acknowledged record is there, on all three replicas.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_e2e import ClusterBroker, eventually, every_broker_lists, produce
from tests.e2e.conftest import BrokerProcess, start_all, stop_all
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)

TOPIC = "durability"
RECORDS = 300
NEVER = "9223372036854775807"


class MeteredBroker(ClusterBroker):
    """A cluster broker with a config file: metrics.listener on a port of its own, and more."""

    def __init__(
        self, data_dir: Path, broker_id: int, zookeeper: str, keys: dict[str, str]
    ) -> None:
        config = data_dir.parent / f"broker{broker_id}.properties"
        super().__init__(data_dir, broker_id, zookeeper, config)
        self.metrics_port = free_port()
        keys = {"min.insync.replicas": "2", **keys}
        keys["metrics.listener"] = f"127.0.0.1:{self.metrics_port}"
        config.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))

    def fsyncs(self) -> int:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        found = re.search(r"^trio_broker_fsyncs_total (\d+)", text, re.MULTILINE)
        assert found, text[:500]
        return int(found[1])


@pytest.fixture(params=["fsync", "replication"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, zookeeper: str
) -> Iterator[tuple[str, dict[int, MeteredBroker]]]:
    mode = str(request.param)
    keys = (
        {} if mode == "fsync" else {"acks.all.fsync": "false", "log.flush.interval.messages": NEVER}
    )
    brokers = {b: MeteredBroker(tmp_path / f"broker{b}", b, zookeeper, keys) for b in (1, 2, 3)}
    try:
        start_all(brokers.values())
        yield mode, brokers
    finally:
        stop_all(brokers.values())


def _read_from(broker: BrokerProcess, expected: int) -> list[str]:
    """Every record of partition 0, through the cluster (the leader answers consumers)."""
    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": "durability-check",
        "enable.auto.commit": False,
    })  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[str] = []
    try:
        for _ in range(200):
            if len(values) >= expected:
                break
            for msg in consumer.consume(500, 0.5):
                if msg.error() is None:
                    values.append(msg.value().decode())
    finally:
        consumer.close()
    return values


def test_acks_all_counts_with_or_without_fsync(
    cluster: tuple[str, dict[int, MeteredBroker]],
) -> None:
    mode, brokers = cluster
    servers = ",".join(b.bootstrap for b in brokers.values())
    admin = AdminClient({"bootstrap.servers": servers})
    every_broker_lists(brokers)
    for future in admin.create_topics([NewTopic(TOPIC, 1, replication_factor=3)]).values():
        future.result(30)

    def all_in_sync() -> bool:
        meta = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
        return meta.error is None and len(meta.partitions[0].isrs) == 3

    eventually(all_in_sync, "every replica in sync")
    acked = produce(servers, TOPIC, range(RECORDS))
    assert len(acked) == RECORDS
    assert _read_from(brokers[1], RECORDS) == [str(i) for i in range(RECORDS)]
    # The HW passed every record with all three in the ISR: every replica holds them.
    eventually(all_in_sync, "every replica still in sync")
    fsyncs = {b: broker.fsyncs() for b, broker in brokers.items()}
    if mode == "fsync":
        assert all(n > 0 for n in fsyncs.values()), fsyncs
    else:
        assert fsyncs == {1: 0, 2: 0, 3: 0}
