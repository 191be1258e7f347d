"""Three `trio-broker serve` processes and a ZooKeeper: a replicated topic with real clients.

confluent-kafka creates a topic with replication factor 3, an idempotent acks=all
producer writes to it, the leader of a partition is killed with -9, the producer goes
on (librdkafka follows the new leader from Metadata), and every acknowledged record is
read back, once, from the survivors. The killed broker then returns, truncates to its
new leader's log and rejoins every ISR. The ZooKeeper session is test-sized (4 s, not
the 18 s default): the survivors learn of the kill when the killed broker's session
expires.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, ConnectionClosed, start_all, stop_all
from trio_broker.cluster.local_zookeeper import LocalZooKeeper
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(300)

_chroots = itertools.count(1)


#: zookeeper.session.timeout.ms for the kill -9 test (the same as test_cluster_faults).
SESSION_MS = 4000


class ClusterBroker(BrokerProcess):
    def __init__(
        self, data_dir: Path, broker_id: int, zookeeper: str, config: Path | None = None
    ) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.broker_id, self.zookeeper, self.config = broker_id, zookeeper, config

    def command_line(self) -> list[str]:
        config = [] if self.config is None else ["--config", str(self.config)]
        return [
            *super().command_line(), "--broker-id", str(self.broker_id),
            "--zookeeper", self.zookeeper, *config,
        ]  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str) -> Iterator[dict[int, ClusterBroker]]:
    config = tmp_path / "broker.properties"
    config.write_text(f"zookeeper.session.timeout.ms={SESSION_MS}\n")
    brokers = {b: ClusterBroker(tmp_path / f"broker{b}", b, zookeeper, config) for b in (1, 2, 3)}
    try:
        start_all(brokers.values())
        yield brokers
    finally:
        stop_all(brokers.values())


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds. A KafkaException, or a KeyError from a Metadata
    answer that lacks the partition asked for (a broker that has not yet read the topic
    answers UNKNOWN_TOPIC_OR_PARTITION: :func:`partitions` gives ``{}``), means "not yet"."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (KafkaException, KeyError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last error: {last!r})")


def every_broker_lists(
    brokers: Mapping[int, BrokerProcess], ids: set[int] | None = None, timeout_s: float = 60.0
) -> None:
    """Wait until every running broker's Metadata lists exactly ``ids`` (default: the
    running brokers) and names one of them the controller. A broker's list follows its
    ZooKeeper watch, which lags the registration; the broker a CreateTopics reaches
    assigns replicas from its own list (INVALID_REPLICATION_FACTOR or
    INVALID_REPLICA_ASSIGNMENT while it lacks one). The controller comes from another
    watch: an answer naming none (-1) leaves librdkafka's admin client waiting for a
    controller until its next metadata refresh, minutes later (a CreateTopics that
    timed out on a loaded machine, right after a cluster's start)."""
    live = {b: broker for b, broker in brokers.items() if broker.running}
    wanted = set(live) if ids is None else ids

    def lists(broker: BrokerProcess) -> bool:
        try:
            with broker.connect() as conn:
                answer = conn.metadata(topics=[])
        except (OSError, ConnectionClosed):
            return False
        return {b.node_id for b in answer.brokers} == wanted and answer.controller_id in wanted

    for b, broker in live.items():
        eventually(lambda broker=broker: lists(broker),
                   f"broker {b} lists {sorted(wanted)} and one of them as the controller",
                   timeout_s)  # fmt: skip


#: partition -> (leader, replicas, ISR), as :func:`partitions` gives them.
PartitionStates = dict[int, tuple[int, list[int], list[int]]]


def every_broker_knows(
    brokers: Mapping[int, BrokerProcess],
    topic: str,
    partition_count: int,
    timeout_s: float = 60.0,
    *,
    until: Callable[[PartitionStates], bool] = lambda _: True,
    wanted: str = "",
) -> PartitionStates:
    """Wait until every running broker, asked on its own, names a leader for each of
    ``topic``'s ``partition_count`` partitions, all of them the same leaders, replicas
    and ISRs, and ``until`` holds for that state (``wanted`` says what it is); returns
    it. Each broker learns of a topic and of each change of its partitions from its own
    ZooKeeper watches, after the broker that made the change or answered a client about
    it: until then it answers UNKNOWN_TOPIC_OR_PARTITION (DescribeConfigs: "topic ...
    does not exist"), leader -1 (it has read the topic but not yet its partition state),
    or the state before the change. A client's Metadata answer comes from one broker, so
    it does not show this."""
    Req = m.MetadataRequest
    # No auto-creation: asking must not create (or re-create) the topic.
    asked = Req(topics=[Req.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)
    agreed: list[PartitionStates] = []

    def state_at(broker: BrokerProcess) -> PartitionStates | None:
        try:
            with broker.connect() as conn:
                [meta] = conn.request(m.ApiKey.METADATA, 9, asked).topics
        except (OSError, ConnectionClosed):
            return None
        if meta.error_code != ErrorCode.NONE:
            return None
        return {
            p.partition_index: (p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
            for p in meta.partitions
        }

    last: dict[int, PartitionStates | None] = {}  # for the message of a timeout

    def known_everywhere() -> bool:
        last.clear()
        last.update({b: state_at(broker) for b, broker in brokers.items() if broker.running})
        states = list(last.values())
        first = states[0] if states else None
        if first is None or set(first) != set(range(partition_count)):
            return False
        if any(leader < 0 for leader, _, _ in first.values()):
            return False
        if any(state != first for state in states) or not until(first):
            return False
        agreed[:] = [first]
        return True

    what = f"every broker names the same leaders of {topic}" + (f", {wanted}" if wanted else "")
    try:
        eventually(known_everywhere, what, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answers, by broker: {last}") from None
    return agreed[0]


def bootstrap(brokers: dict[int, ClusterBroker]) -> str:
    return ",".join(b.bootstrap for b in brokers.values() if b.proc and b.proc.poll() is None)


def partitions(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    meta = admin.list_topics(topic, timeout=5).topics[topic]
    if meta.error is not None:
        return {}
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in meta.partitions.values()}


def leader_of(admin: AdminClient, topic: str, partition: int = 0, timeout_s: float = 60.0) -> int:
    """The partition's leader, once Metadata names one. Right after a creation, or a read
    that found one, the next answer may come from a broker that has read the topic but
    not yet its partition state: leader -1, or no such partition."""
    found: list[int] = []

    def named() -> bool:
        found[:] = [partitions(admin, topic).get(partition, (-1, [], []))[0]]
        return found[0] >= 1

    eventually(named, f"{topic}-{partition} has a leader", timeout_s)
    return found[0]


def produce(servers: str, topic: str, values: range) -> set[str]:
    """acks=all, idempotent; returns the values the brokers acknowledged."""
    acked: set[str] = set()
    errors: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked.add(msg.value().decode())  # type: ignore[attr-defined]
        else:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": servers, "enable.idempotence": True, "acks": "all",
        "linger.ms": 5, "message.timeout.ms": 60000,
    })  # fmt: skip
    for i in values:
        producer.produce(topic, value=str(i).encode(), key=str(i).encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(90) == 0, "records still in flight"
    assert not errors, errors[:5]
    return acked


def read_all(servers: str, topic: str, count: int, expected: int) -> list[str]:
    consumer = Consumer({
        "bootstrap.servers": servers, "group.id": f"check-{time.monotonic_ns()}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
    values: list[str] = []
    deadline = time.monotonic() + 60
    while len(values) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value().decode())
    consumer.close()
    return values


def test_replicated_topic_survives_its_leaders_kill_9(
    cluster: dict[int, ClusterBroker], zookeeper_server: LocalZooKeeper
) -> None:
    servers = bootstrap(cluster)
    admin = AdminClient({"bootstrap.servers": servers})
    every_broker_lists(cluster)
    [future] = admin.create_topics(
        [NewTopic("replicated", num_partitions=3, replication_factor=3)]
    ).values()
    future.result(timeout=60)
    eventually(
        lambda: (
            len(state := partitions(admin, "replicated")) == 3
            and all(len(isr) == 3 and leader >= 1 for leader, _, isr in state.values())
        ),
        "three partitions, each with three in-sync replicas",
    )
    first = produce(servers, "replicated", range(0, 300))
    assert len(first) == 300

    victim = leader_of(admin, "replicated")
    cluster[victim].kill9()
    survivors = {b: p for b, p in cluster.items() if b != victim}
    servers = bootstrap(survivors)
    admin = AdminClient({"bootstrap.servers": servers})
    eventually(
        lambda: all(
            leader in survivors and victim not in isr
            for leader, _, isr in partitions(admin, "replicated").values()
        ),
        f"new leaders without broker {victim}",
    )
    second = produce(servers, "replicated", range(300, 600))
    assert len(second) == 300

    values = read_all(servers, "replicated", 3, 600)
    assert sorted(values, key=int) == sorted(first | second, key=int), "lost or doubled records"

    cluster[victim].start()
    servers = bootstrap(cluster)
    admin = AdminClient({"bootstrap.servers": servers})
    eventually(
        lambda: all(len(isr) == 3 for _, _, isr in partitions(admin, "replicated").values()),
        f"broker {victim} back in every ISR",
    )
