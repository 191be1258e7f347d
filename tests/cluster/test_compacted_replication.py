"""Compacted topics with three replicas, and a topic's own min.insync.replicas.

Real ``serve`` processes (three brokers, a private ZooKeeper) and confluent-kafka:

- a follower stopped while its leader writes many updates of few keys and cleans them
  comes back, copies the leader's log across the offset holes the cleaner left, rejoins
  the ISR (also after a kill -9 with holes in its own log), cleans its own copy, and,
  leading after the others stop, serves the latest value of each key at the offset it
  was written at;
- ``min.insync.replicas=3`` set on an RF=3 topic refuses acks=all with one broker down
  although the brokers' default is 2, and IncrementalAlterConfigs lowering it to 2 lets
  the writes through without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.cluster.test_cluster_e2e import (
    eventually,
    every_broker_knows,
    every_broker_lists,
    leader_of,
    partitions,
)
from tests.cluster.test_cluster_faults import Cluster, full_isr, servers, three_brokers
from trio_broker.protocol import batch_header
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

CONFIG = (
    "min.insync.replicas=2\n"
    "replica.lag.time.max.ms=3000\n"
    "default.replication.factor=3\n"
    "zookeeper.session.timeout.ms=4000\n"
    "log.cleaner.backoff.ms=300\n"
)
TOPIC = "table"
KEYS = 8
#: A small segment and an eager cleaner: many closed segments, cleaned soon after.
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "4096",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as brokers:
        yield brokers


def create(cluster: Cluster, topic: str, configs: dict[str, str]) -> tuple[int, int, int]:
    """One partition on all three brokers: (leader, follower to stop, the other one)."""
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    every_broker_lists(cluster)
    new = NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2, 3]], config=configs)
    [future] = admin.create_topics([new]).values()
    future.result(timeout=60)
    full_isr(admin, topic, 1)
    leader = leader_of(admin, topic)
    follower, other = (b for b in (3, 2, 1) if b != leader)
    return leader, follower, other


def produce_updates(bootstrap: str, values: range) -> dict[int, int]:
    """Value i under key ``k{i % KEYS}``, acks=all, small batches; value -> its offset."""
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is None:
            offsets[int(msg.value().decode()[1:])] = msg.offset()  # type: ignore[attr-defined]
        else:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "linger.ms": 2, "batch.num.messages": 20, "message.timeout.ms": 60000,
        "metadata.max.age.ms": 2000,
    })  # fmt: skip
    for i in values:
        producer.produce(TOPIC, key=b"k%d" % (i % KEYS), value=b"v%d" % i, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(90) == 0, "records still in flight"
    assert not errors, errors[:5]
    return offsets


def batch_spans(directory: Path) -> list[tuple[int, int]]:
    """(base, last offset) of every whole batch in a partition directory's segments."""
    spans = []
    for path in sorted(directory.glob("*.log")):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # a cleaner swap renamed it meanwhile
            continue
        pos = 0
        while pos + batch_header.HEADER_SIZE <= len(data):
            base, size = batch_header.base_offset_and_size(data, pos)
            if size < batch_header.HEADER_SIZE or pos + size > len(data):
                break
            spans.append((base, base + batch_header.last_offset_delta(data, pos)))
            pos += size
    return sorted(spans)


def hole_at(directory: Path, offset: int) -> bool:
    """Whether the cleaner removed the batch at ``offset``: the next one starts later."""
    after = [span for span in batch_spans(directory) if span[1] >= offset]
    return bool(after) and after[0][0] > offset


def cleaned_up_to(directory: Path) -> int:
    """Where this replica's own cleaner's last pass ended (0: it never cleaned)."""
    try:
        return int((directory / "cleaner-offset.checkpoint").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def read_records(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record below ``end`` a consumer of it gets."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got: list[tuple[int, bytes, bytes]] = []
        position, deadline = 0, time.monotonic() + 60
        while position < end and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            got.append((msg.offset(), msg.key(), msg.value()))
            position = msg.offset() + 1
        assert position >= end, f"read up to {position} of {end}"
        return got
    finally:
        consumer.close()


def high_watermark(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=5)[1])
    finally:
        consumer.close()


def test_a_follower_catches_up_across_the_leaders_cleaned_holes(cluster: Cluster) -> None:
    leader, stopped, other = create(cluster, TOPIC, TOPIC_CONFIGS)
    offsets = produce_updates(servers(cluster), range(200))
    follower = cluster[stopped]
    follower_end = max(offsets.values()) + 1  # acks=all with a full ISR: the follower has all
    follower.kill9()
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    two = sorted((leader, other))
    eventually(lambda: sorted(partitions(admin, TOPIC)[0][2]) == two, f"ISR shrunk to {two}", 60)

    offsets |= produce_updates(servers(cluster), range(200, 4000))
    leader_dir = cluster[leader].data_dir / f"{TOPIC}-0"
    eventually(
        lambda: hole_at(leader_dir, follower_end),
        f"the leader's cleaner removed the batch at the follower's end {follower_end}",
        60,
    )

    follower.start()
    full_isr(admin, TOPIC, 1, timeout_s=60)
    follower_dir = follower.data_dir / f"{TOPIC}-0"
    gaps = int((follower_dir / "replica-gaps.checkpoint").read_text())
    assert gaps > follower_end, "the follower stored no batch past a hole"
    assert "fetched batches refused" not in follower.log_text()
    # The follower's own cleaner works on its copy (below its high watermark): the
    # checkpoint is its own, never copied, and passes what it had before it stopped.
    eventually(
        lambda: cleaned_up_to(follower_dir) > follower_end, "the follower cleaned its copy", 60
    )

    # A kill -9 now: recovery must keep the batches stored after holes.
    follower.kill9()
    # Its old registration must expire first (zookeeper.session.timeout.ms).
    eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 2, "two brokers listed", 60)
    follower.start()
    full_isr(admin, TOPIC, 1, timeout_s=60)
    assert "fetched batches refused" not in follower.log_text()

    # The follower leads once the others stop; a consumer reads the table from it.
    end = max(offsets.values()) + 1
    for b in (leader, other):
        assert cluster[b].stop() == 0
    only = follower.bootstrap
    single = AdminClient({"bootstrap.servers": only})
    eventually(lambda: partitions(single, TOPIC)[0][0] == stopped, "the follower leads", 60)
    eventually(lambda: high_watermark(only) == end, f"its high watermark at {end}", 60)
    records = read_records(only, end)
    value_at = {offset: value for value, offset in offsets.items()}
    for offset, key, value in records:  # every record where it was written
        written = value_at[offset]
        assert (key, value) == (b"k%d" % (written % KEYS), b"v%d" % written), offset
    latest = {key: (offset, value) for offset, key, value in records}
    assert latest == {b"k%d" % k: (offsets[i], b"v%d" % i) for k in range(KEYS) for i in [3992 + k]}
    assert len(records) < 1000, f"{len(records)} records: the copy was not compacted"


def test_topic_min_insync_replicas_is_the_leaders_rule_and_follows_alter_configs(
    cluster: Cluster,
) -> None:
    leader, stopped, other = create(cluster, "strict", {"min.insync.replicas": "3"})

    def accepted() -> bool:
        with cluster[leader].connect() as conn:
            return conn.produce("strict", build_batch([(b"a", b"1")]), acks=-1).error_code == 0

    # (NOT_LEADER_OR_FOLLOWER until the leader has taken up its term: Metadata, read from
    # ZooKeeper, may name it a moment earlier.)
    eventually(accepted, "acks=all accepted with three in sync", 60)
    assert cluster[stopped].stop() == 0
    two = sorted((leader, other))
    # The controller shrinks the ISR when the follower's session ends; the leader, asked
    # below, applies that from its own watch, maybe after the other broker answered.
    every_broker_knows(
        cluster, "strict", 1, 60,
        until=lambda state: sorted(state[0][2]) == two, wanted=f"ISR shrunk to {two}",
    )  # fmt: skip
    with cluster[leader].connect() as conn:
        answer = conn.produce("strict", build_batch([(b"a", b"2")]), acks=-1)
        assert answer.error_code == 19, answer  # NOT_ENOUGH_REPLICAS, with 2 of 3 in sync
        # acks=1 is not the rule's business.
        assert conn.produce("strict", build_batch([(b"a", b"3")]), acks=1).error_code == 0

    # Sent to the live follower: the change reaches the leader through ZooKeeper.
    follower_admin = AdminClient({"bootstrap.servers": cluster[other].bootstrap})
    change = ConfigResource(
        "TOPIC",
        "strict",
        incremental_configs=[
            ConfigEntry("min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    [future] = follower_admin.incremental_alter_configs([change]).values()
    future.result(timeout=60)

    eventually(accepted, "acks=all accepted with min.insync.replicas=2", 60)
    # Every live replica's copy of the topic has the new setting.
    for b in (leader, other):
        one = AdminClient({"bootstrap.servers": cluster[b].bootstrap})
        [described] = one.describe_configs([ConfigResource("TOPIC", "strict")]).values()
        assert described.result(timeout=60)["min.insync.replicas"].value == "2"
