"""Admin APIs over real sockets: CreateTopics, DeleteTopics, DescribeConfigs,
DescribeCluster, ListOffsets, OffsetForLeaderEpoch, DeleteRecords.

Two kinds of client talk to an in-process broker (see conftest.py):

- real clients (kafka-python's admin client and consumer, confluent-kafka's
  producer and AdminClient), run in worker threads so the broker keeps serving;
- a small raw client built on our codec that sends *every* version of each of
  these APIs and checks that the answer decodes and carries Kafka's error codes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, ResourceType
from confluent_kafka.admin import ConfigResource as CConfigResource
from confluent_kafka.admin import NewTopic as CNewTopic
from confluent_kafka.admin import OffsetSpec as COffsetSpec
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, OffsetSpec
from kafka.errors import (
    InvalidConfigurationError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from tests.integration.raw_client import RawClient as BaseRawClient
from trio_broker.config import BrokerConfig
from trio_broker.handlers import load_handlers
from trio_broker.handlers.base import HANDLERS
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import Record, build_batch
from trio_broker.server.broker import Broker

load_handlers()
T = TypeVar("T")
ZERO_UUID = uuid.UUID(int=0)


@pytest.fixture(params=["file", "memory"])
def broker_config(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    # Both log implementations answer the same questions (offsets, timestamps, deletes).
    return BrokerConfig(port=0, data_dir=tmp_path / "data", storage=request.param)


def versions(api_key: int) -> list[int]:
    spec = HANDLERS[api_key]
    return list(range(spec.min_version, spec.max_version + 1))


async def in_thread(fn: Callable[[], T]) -> T:
    # Blocking clients run in a worker thread; the broker runs on this Trio loop.
    return await trio.to_thread.run_sync(fn)


# ----------------------------------------------------------------------------- raw client


class RawClient(BaseRawClient):
    """The shared raw client plus builders for the admin APIs."""

    # ---- request builders (fields a version lacks are ignored by the encoder)

    async def create_topic(
        self, name: str, partitions: int = 1, *, version: int = 7, rf: int = 1,
        configs: dict[str, str] | None = None, validate_only: bool = False,
    ) -> Any:  # fmt: skip
        Req = m.CreateTopicsRequest
        topic = Req.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=rf, assignments=[],
            configs=[Req.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                     for k, v in (configs or {}).items()],
        )  # fmt: skip
        req = Req(topics=[topic], timeout_ms=5000, validate_only=validate_only)
        response = await self.call(m.ApiKey.CREATE_TOPICS, version, req)
        return response.topics[0]

    async def produce(self, topic: str, partition: int, batch: bytes) -> int:
        Req = m.ProduceRequest
        data = Req.TopicProduceData(
            name=topic,
            partition_data=[
                Req.TopicProduceData.PartitionProduceData(index=partition, records=batch)
            ],
        )
        req = Req(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[data])
        response = await self.call(m.ApiKey.PRODUCE, 9, req)
        part = response.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.NONE
        return int(part.base_offset)

    async def list_offsets(
        self, topic: str, partition: int, timestamp: int, *, version: int = 11,
        current_leader_epoch: int = -1, isolation_level: int = 0,
    ) -> Any:  # fmt: skip
        Req = m.ListOffsetsRequest
        part = Req.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=current_leader_epoch,
            timestamp=timestamp,
        )  # fmt: skip
        req = Req(
            replica_id=-1, isolation_level=isolation_level,
            topics=[Req.ListOffsetsTopic(name=topic, partitions=[part])], timeout_ms=5000,
        )  # fmt: skip
        response = await self.call(m.ApiKey.LIST_OFFSETS, version, req)
        return response.topics[0].partitions[0]


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        yield RawClient(stream)


def batch_at(*timestamps: int) -> bytes:
    """One batch with a record per timestamp (deltas from the first)."""
    base = timestamps[0]
    records = [Record(i, ts - base, None, b"v%d" % i) for i, ts in enumerate(timestamps)]
    return bytes(build_batch(records, base_timestamp=base))


# ------------------------------------------------------------------- real clients


def admin_client(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)


def produce_with_confluent(bootstrap: str, topic: str, items: list[tuple[int, int]]) -> None:
    """(partition, timestamp) per message, acks=all, delivered before returning."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    errors: list[Any] = []
    for i, (partition, ts) in enumerate(items):
        producer.produce(
            topic, value=b"m%d" % i, partition=partition, timestamp=ts,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )  # fmt: skip
        producer.flush(10)  # one batch per message: timestamps map to offsets exactly
    assert producer.flush(10) == 0
    assert not errors


async def test_create_topics_with_kafka_python(broker: Broker, bootstrap: str) -> None:
    def work() -> None:
        admin = admin_client(bootstrap)
        try:
            result = admin.create_topics(
                {"orders": {"num_partitions": 3, "replication_factor": 1,
                            "configs": {"retention.ms": "3600000"}}}
            )  # fmt: skip
            (created,) = result["topics"]
            assert created["error_code"] == 0
            assert created["num_partitions"] == 3 and created["replication_factor"] == 1
            assert created["configs"]["retention.ms"]["value"] == "3600000"
            assert created["configs"]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
            # Defaulted partitions and replication factor (-1) take the broker defaults.
            admin.create_topics({"defaults": {}})
            # validate_only checks everything and creates nothing.
            admin.create_topics({"dry": {"num_partitions": 2}}, validate_only=True)
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics({"orders": {"num_partitions": 1}})
            with pytest.raises(InvalidTopicError):
                admin.create_topics({"bad/name": {"num_partitions": 1}})
            with pytest.raises(InvalidConfigurationError):
                admin.create_topics({"cfg": {"configs": {"no.such.config": "1"}}})
            with pytest.raises(InvalidReplicationFactorError):
                admin.create_topics({"rf3": {"num_partitions": 1, "replication_factor": 3}})
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics({"orders": {}}, validate_only=True)
            assert set(admin.list_topics()) >= {"orders", "defaults"}
        finally:
            admin.close()

    await in_thread(work)
    assert len(broker.topics.get("orders").logs) == 3  # type: ignore[union-attr]
    assert broker.topics.get("orders").info.configs == {"retention.ms": "3600000"}  # type: ignore[union-attr]
    assert len(broker.topics.get("defaults").logs) == broker.config.num_partitions  # type: ignore[union-attr]
    for absent in ("dry", "bad/name", "cfg", "rf3"):
        assert broker.topics.get(absent) is None


async def test_describe_configs_and_cluster_with_kafka_python(
    broker: Broker, bootstrap: str
) -> None:
    def work() -> tuple[Any, Any, Any]:
        admin = admin_client(bootstrap)
        try:
            admin.create_topics(
                {"cfg-topic": {"num_partitions": 1, "configs": {"cleanup.policy": "compact"}}}
            )
            topic_cfg = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "cfg-topic")],
                include_synonyms=True, config_filter="all",
            )  # fmt: skip
            broker_cfg = admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, str(broker.config.node_id))],
                config_filter="all",
            )
            return topic_cfg, broker_cfg, admin.describe_cluster()
        finally:
            admin.close()

    topic_cfg, broker_cfg, cluster = await in_thread(work)
    configs = topic_cfg["topic"]["cfg-topic"]
    assert configs["cleanup.policy"]["value"] == "compact"
    assert configs["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert [s["source"] for s in configs["cleanup.policy"]["synonyms"]] == [
        "DYNAMIC_TOPIC_CONFIG", "DEFAULT_CONFIG",
    ]  # fmt: skip
    expected_defaults = {
        "retention.ms": str(broker.config.retention_ms),
        "retention.bytes": str(broker.config.retention_bytes),
        "segment.bytes": str(broker.config.segment_bytes),
        "message.timestamp.type": "CreateTime",
        "max.message.bytes": "1048588",
        "compression.type": "producer",
        "min.insync.replicas": "1",
    }
    for key, value in expected_defaults.items():
        assert configs[key]["value"] == value, key
        assert configs[key]["config_source"] == "DEFAULT_CONFIG", key
        assert configs[key]["read_only"] is False and configs[key]["is_sensitive"] is False
    node_cfg = broker_cfg["broker"][str(broker.config.node_id)]
    assert node_cfg["num.partitions"]["value"] == str(broker.config.num_partitions)
    host, port = broker.advertised
    assert cluster["cluster_id"] == broker.cluster_id
    assert cluster["controller_id"] == broker.config.node_id
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [
        (broker.config.node_id, host, port)
    ]


async def test_delete_topics_with_kafka_python(broker: Broker, bootstrap: str) -> None:
    def work() -> None:
        admin = admin_client(bootstrap)
        try:
            admin.create_topics({"doomed": {"num_partitions": 2}, "kept": {"num_partitions": 1}})
            result = admin.delete_topics(["doomed"])
            assert [t["error_code"] for t in result["topics"]] == [0]
            with pytest.raises(UnknownTopicOrPartitionError):
                admin.delete_topics(["doomed"])
            assert "doomed" not in admin.list_topics()
        finally:
            admin.close()

    await in_thread(work)
    assert broker.topics.get("doomed") is None
    assert broker.topics.get("kept") is not None
    if broker.config.storage == "file":
        assert not any(p.name.startswith("doomed-") for p in broker.config.data_dir.iterdir())


async def test_list_offsets_and_delete_records_with_real_clients(
    broker: Broker, bootstrap: str
) -> None:
    base = 1_700_000_000_000
    # Partition 0: timestamps 0, 10, 20, ... s past base; partition 1 stays empty.
    items = [(0, base + 10_000 * i) for i in range(5)]

    def work() -> dict[str, Any]:
        admin = admin_client(bootstrap)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            admin.create_topics({"events": {"num_partitions": 2}})
            produce_with_confluent(bootstrap, "events", items)
            p0, p1 = TopicPartition("events", 0), TopicPartition("events", 1)
            out: dict[str, Any] = {
                "begin": consumer.beginning_offsets([p0, p1]),
                "end": consumer.end_offsets([p0, p1]),
                "at": consumer.offsets_for_times({p0: base + 15_000, p1: base}),
                "first": consumer.offsets_for_times({p0: 0}),
                "after": consumer.offsets_for_times({p0: base + 10**9}),
                "max": admin.list_partition_offsets({p0: OffsetSpec.MAX_TIMESTAMP}),
            }
            out["deleted"] = admin.delete_records({p0: 3})
            out["begin2"] = consumer.beginning_offsets([p0])
            out["at2"] = consumer.offsets_for_times({p0: base})
            return out
        finally:
            consumer.close()
            admin.close()

    out = await in_thread(work)
    p0, p1 = TopicPartition("events", 0), TopicPartition("events", 1)
    assert out["begin"] == {p0: 0, p1: 0}
    assert out["end"] == {p0: 5, p1: 0}
    assert (out["at"][p0].offset, out["at"][p0].timestamp) == (2, base + 20_000)
    assert out["at"][p1] is None  # empty partition: nothing at or after the time
    assert (out["first"][p0].offset, out["first"][p0].timestamp) == (0, base)
    assert out["after"][p0] is None
    assert (out["max"][p0].offset, out["max"][p0].timestamp) == (4, base + 40_000)
    assert out["deleted"][p0]["low_watermark"] == 3
    assert out["begin2"] == {p0: 3}
    # Records below the log start offset are gone: the earliest match is now offset 3.
    assert out["at2"][p0].offset == 3


async def test_admin_apis_with_librdkafka(broker: Broker, bootstrap: str) -> None:
    """confluent-kafka's AdminClient (librdkafka) parses our answers too."""

    def work() -> dict[str, Any]:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        out: dict[str, Any] = {}
        futures = admin.create_topics(
            [CNewTopic("lib", 2, 1, config={"retention.ms": "60000"}), CNewTopic("lib-rf", 1, 3)],
            operation_timeout=5,
        )
        futures["lib"].result(10)
        out["rf_error"] = futures["lib-rf"].exception(10)
        produce_with_confluent(bootstrap, "lib", [(0, 1000), (0, 3000), (0, 2000)])
        (cfg_future,) = admin.describe_configs(
            [CConfigResource(ResourceType.TOPIC, "lib")]
        ).values()
        out["configs"] = {k: (v.value, v.source) for k, v in cfg_future.result(10).items()}
        tp = CTopicPartition("lib", 0)
        for name, spec in (
            ("earliest", COffsetSpec.earliest()),
            ("latest", COffsetSpec.latest()),
            ("max", COffsetSpec.max_timestamp()),
            ("at", COffsetSpec.for_timestamp(1500)),
        ):
            info = admin.list_offsets({tp: spec})[tp].result(10)
            out[name] = (info.offset, info.timestamp)
        out["deleted"] = admin.delete_records([CTopicPartition("lib", 0, 1)])[tp].result(10)
        cluster = admin.describe_cluster().result(10)
        out["cluster"] = (cluster.cluster_id, cluster.controller.id, [n.id for n in cluster.nodes])
        admin.delete_topics(["lib"], operation_timeout=5)["lib"].result(10)
        return out

    out = await in_thread(work)
    assert out["rf_error"] is not None  # INVALID_REPLICATION_FACTOR
    assert out["configs"]["retention.ms"][0] == "60000"
    assert out["configs"]["cleanup.policy"][0] == "delete"
    assert out["earliest"][0] == 0 and out["latest"][0] == 3
    assert out["max"] == (1, 3000)
    assert out["at"] == (1, 3000)
    assert out["deleted"].low_watermark == 1
    node = broker.config.node_id
    assert out["cluster"] == (broker.cluster_id, node, [node])
    assert broker.topics.get("lib") is None


# ------------------------------------------------------------- every version, raw codec


def test_advertised_ranges() -> None:
    expected = {
        m.ApiKey.LIST_OFFSETS: (1, 11), m.ApiKey.CREATE_TOPICS: (2, 7),
        m.ApiKey.DELETE_TOPICS: (1, 6), m.ApiKey.DESCRIBE_CONFIGS: (1, 4),
        m.ApiKey.DESCRIBE_CLUSTER: (0, 2), m.ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
        m.ApiKey.DELETE_RECORDS: (0, 2), m.ApiKey.CREATE_PARTITIONS: (0, 3),
        m.ApiKey.DESCRIBE_LOG_DIRS: (1, 5),
    }  # fmt: skip
    for key, (lo, hi) in expected.items():
        spec = HANDLERS[key]
        assert (spec.advertised_min, spec.max_version) == (lo, hi), key


@pytest.mark.parametrize("version", versions(m.ApiKey.LIST_OFFSETS))
async def test_list_offsets_versions(raw: RawClient, version: int) -> None:
    assert (await raw.create_topic("lo")).error_code == ErrorCode.NONE
    # Batch 0: offsets 0-2 at t=1000, 3000, 2000; batch 1: offsets 3-4 at t=5000, 4000.
    await raw.produce("lo", 0, batch_at(1000, 3000, 2000))
    await raw.produce("lo", 0, batch_at(5000, 4000))

    async def lookup(ts: int, **kw: Any) -> tuple[int, int, int, int]:
        p = await raw.list_offsets("lo", 0, ts, version=version, **kw)
        return p.error_code, p.offset, p.timestamp, p.leader_epoch

    epoch = 0 if version >= 4 else -1  # leader_epoch only exists from v4 (decoded default -1)
    assert await lookup(-2) == (0, 0, -1, epoch)
    assert await lookup(-1) == (0, 5, -1, epoch)
    if version >= 2:  # read_committed: the last stable offset, the high watermark here
        assert await lookup(-1, isolation_level=1) == (0, 5, -1, epoch)
    # The first record with timestamp >= t, inside its batch (not the batch's base offset).
    assert await lookup(1500) == (0, 1, 3000, epoch)
    assert await lookup(3500) == (0, 3, 5000, epoch)
    assert await lookup(0) == (0, 0, 1000, epoch)
    assert await lookup(6000) == (0, -1, -1, -1)
    if version >= 7:  # KIP-734: the record with the largest timestamp
        assert await lookup(-3) == (0, 3, 5000, epoch)
    unknown = await raw.list_offsets("nope", 0, -1, version=version)
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    bad_partition = await raw.list_offsets("lo", 7, -1, version=version)
    assert bad_partition.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if version >= 4:
        newer = await lookup(-1, current_leader_epoch=1)
        assert newer[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
        assert (await lookup(-1, current_leader_epoch=0))[0] == ErrorCode.NONE


async def test_list_offsets_empty_log_and_max_timestamp(raw: RawClient) -> None:
    await raw.create_topic("empty")
    for ts, expected in ((-2, 0), (-1, 0), (-3, -1), (-4, 0), (-5, -1), (123, -1)):
        p = await raw.list_offsets("empty", 0, ts)
        assert (p.error_code, p.offset) == (ErrorCode.NONE, expected), ts
    # A tie on the largest timestamp answers the earliest record holding it.
    await raw.produce("empty", 0, batch_at(100, 900))
    await raw.produce("empty", 0, batch_at(900, 200))
    p = await raw.list_offsets("empty", 0, -3)
    assert (p.offset, p.timestamp) == (1, 900)


async def test_list_offsets_duplicate_partition_is_invalid(raw: RawClient) -> None:
    await raw.create_topic("dup")
    Req = m.ListOffsetsRequest
    part = Req.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)
    req = Req(replica_id=-1, topics=[Req.ListOffsetsTopic(name="dup", partitions=[part, part])])
    response = await raw.call(m.ApiKey.LIST_OFFSETS, 7, req)
    codes = [p.error_code for p in response.topics[0].partitions]
    assert codes == [ErrorCode.INVALID_REQUEST] * 2


@pytest.mark.parametrize("version", versions(m.ApiKey.CREATE_TOPICS))
async def test_create_topics_versions(raw: RawClient, broker: Broker, version: int) -> None:
    ok = await raw.create_topic("ct", 2, version=version, configs={"retention.ms": "1000"})
    assert ok.error_code == ErrorCode.NONE
    assert broker.topics.get("ct") is not None
    if version >= 5:
        assert (ok.num_partitions, ok.replication_factor) == (2, 1)
        configs = {c.name: (c.value, c.config_source) for c in ok.configs}
        assert configs["retention.ms"] == ("1000", 1)
        assert configs["cleanup.policy"] == ("delete", 5)
    if version >= 7:
        assert ok.topic_id == broker.topics.get("ct").topic_id  # type: ignore[union-attr]
    dry = await raw.create_topic("dry", -1, version=version, rf=-1, validate_only=True)
    assert dry.error_code == ErrorCode.NONE and broker.topics.get("dry") is None
    if version >= 5:
        assert dry.num_partitions == broker.config.num_partitions
    bad_configs: list[dict[str, str]] = [
        {"bogus": "1"}, {"retention.ms": "x"}, {"cleanup.policy": "x"}, {"compression.type": "x"},
    ]  # fmt: skip
    cases: list[tuple[str, dict[str, Any], ErrorCode]] = [
        ("ct", {}, ErrorCode.TOPIC_ALREADY_EXISTS),
        ("c.t", {}, ErrorCode.NONE),
        ("c_t", {}, ErrorCode.INVALID_TOPIC_EXCEPTION),  # collides with c.t
        ("a b", {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("rf", {"rf": 3}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("rf0", {"rf": 0}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("p0", {"partitions": 0}, ErrorCode.INVALID_PARTITIONS),
        *((f"cfg{i}", {"configs": c}, ErrorCode.INVALID_CONFIG) for i, c in enumerate(bad_configs)),
    ]
    for name, kwargs, code in cases:
        result = await raw.create_topic(name, version=version, **kwargs)
        assert result.error_code == code, (name, result.error_message)
        if code != ErrorCode.NONE:
            assert result.error_message  # every error says why (v1+)
            assert broker.topics.get(name) is None or name == "ct"


async def test_create_topics_assignments_and_duplicates(raw: RawClient, broker: Broker) -> None:
    Req = m.CreateTopicsRequest
    Topic, Assign = Req.CreatableTopic, Req.CreatableTopic.CreatableReplicaAssignment
    node = broker.config.node_id

    def topic(name: str, replicas: list[list[int]], partitions: int = -1) -> Any:
        assignments = [Assign(partition_index=i, broker_ids=r) for i, r in enumerate(replicas)]
        return Topic(name=name, num_partitions=partitions, replication_factor=-1,
                     assignments=assignments, configs=[])  # fmt: skip

    req = Req(
        topics=[
            topic("manual", [[node], [node]]),
            topic("two-replicas", [[node, node + 1]]),
            topic("elsewhere", [[node + 1]]),
            topic("both", [[node]], partitions=1),
            topic("twice", [[node]]),
            topic("twice", [[node]]),
        ],
        timeout_ms=1000,
    )
    response = await raw.call(m.ApiKey.CREATE_TOPICS, 7, req)
    codes = {t.name: t.error_code for t in response.topics}
    assert codes == {
        "manual": ErrorCode.NONE,
        "two-replicas": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "elsewhere": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "both": ErrorCode.INVALID_REQUEST,
        "twice": ErrorCode.INVALID_REQUEST,
    }
    assert len(response.topics) == 5  # a repeated name is answered once
    assert len(broker.topics.get("manual").logs) == 2  # type: ignore[union-attr]
    assert broker.topics.get("twice") is None


@pytest.mark.parametrize("version", versions(m.ApiKey.DELETE_TOPICS))
async def test_delete_topics_versions(raw: RawClient, broker: Broker, version: int) -> None:
    for name in ("d1", "d2"):
        assert (await raw.create_topic(name)).error_code == ErrorCode.NONE
    d2_id = broker.topics.get("d2").topic_id  # type: ignore[union-attr]
    Req = m.DeleteTopicsRequest
    State = Req.DeleteTopicState
    if version >= 6:
        req = Req(
            topics=[State(name="d1", topic_id=ZERO_UUID), State(name=None, topic_id=d2_id),
                    State(name="nope", topic_id=ZERO_UUID), State(name=None, topic_id=uuid.uuid4()),
                    State(name="d1x", topic_id=d2_id)],
            timeout_ms=1000,
        )  # fmt: skip
    else:
        req = Req(topic_names=["d1", "d2", "nope"], timeout_ms=1000)
    response = await raw.call(m.ApiKey.DELETE_TOPICS, version, req)
    got = [(r.name, r.error_code) for r in response.responses]
    expected = [("d1", 0), ("d2", 0), ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    if version >= 6:
        expected += [(None, ErrorCode.UNKNOWN_TOPIC_ID), ("d1x", ErrorCode.INVALID_REQUEST)]
        assert response.responses[1].topic_id == d2_id  # answered with its name and id
    assert got == expected
    assert broker.topics.get("d1") is None and broker.topics.get("d2") is None


@pytest.mark.parametrize("version", [12, 13])
async def test_metadata_by_topic_id(raw: RawClient, broker: Broker, version: int) -> None:
    """A non-zero id names the topic whatever the name says (the Java Admin's describeTopics
    by id sends an empty name); an unknown id gets UNKNOWN_TOPIC_ID with the id echoed."""
    assert (await raw.create_topic("by-id", 2)).error_code == ErrorCode.NONE
    topic_id = broker.topics.get("by-id").topic_id  # type: ignore[union-attr]
    unknown = uuid.uuid4()
    Topic = m.MetadataRequest.MetadataRequestTopic
    req = m.MetadataRequest(
        topics=[Topic(name="", topic_id=topic_id), Topic(name=None, topic_id=topic_id),
                Topic(name="", topic_id=unknown)],
        allow_auto_topic_creation=False,
    )  # fmt: skip
    response = await raw.call(m.ApiKey.METADATA, version, req)
    got = [(t.error_code, t.name, t.topic_id, len(t.partitions)) for t in response.topics]
    assert got == [
        (ErrorCode.NONE, "by-id", topic_id, 2),
        (ErrorCode.NONE, "by-id", topic_id, 2),
        (ErrorCode.UNKNOWN_TOPIC_ID, None, unknown, 0),
    ]


@pytest.mark.parametrize("version", versions(m.ApiKey.DESCRIBE_CONFIGS))
async def test_describe_configs_versions(raw: RawClient, broker: Broker, version: int) -> None:
    await raw.create_topic("dc", configs={"retention.ms": "5000"})
    Req = m.DescribeConfigsRequest
    Res = Req.DescribeConfigsResource
    node = str(broker.config.node_id)
    req = Req(
        resources=[
            Res(resource_type=2, resource_name="dc", configuration_keys=None),
            Res(resource_type=2, resource_name="dc", configuration_keys=["retention.ms", "x"]),
            Res(resource_type=2, resource_name="nope", configuration_keys=None),
            Res(resource_type=4, resource_name=node, configuration_keys=None),
            Res(resource_type=4, resource_name="99", configuration_keys=None),
            Res(resource_type=4, resource_name="", configuration_keys=None),
            Res(resource_type=3, resource_name="g", configuration_keys=None),
            Res(resource_type=2, resource_name="", configuration_keys=None),
        ],
        include_synonyms=True, include_documentation=True,
    )  # fmt: skip
    response = await raw.call(m.ApiKey.DESCRIBE_CONFIGS, version, req)
    codes = [r.error_code for r in response.results]
    assert codes == [0, 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0, ErrorCode.INVALID_REQUEST, 0,
                     ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_TOPIC_EXCEPTION]  # fmt: skip
    full = {c.name: c for c in response.results[0].configs}
    assert full["retention.ms"].value == "5000"
    assert full["retention.ms"].config_source == 1
    assert full["segment.bytes"].value == str(broker.config.segment_bytes)
    assert full["segment.bytes"].config_source == 5
    assert [c.name for c in response.results[1].configs] == ["retention.ms"]
    assert response.results[2].error_message
    assert response.results[3].configs and not response.results[5].configs
    assert all(not c.read_only and not c.is_sensitive for c in full.values())
    if version >= 1:
        assert [s.source for s in full["retention.ms"].synonyms] == [1, 5]
    if version >= 3:
        assert full["retention.ms"].config_type == 5  # LONG
        assert full["retention.ms"].documentation


@pytest.mark.parametrize("version", versions(m.ApiKey.DESCRIBE_CLUSTER))
async def test_describe_cluster_versions(raw: RawClient, broker: Broker, version: int) -> None:
    Req = m.DescribeClusterRequest
    req = Req(include_cluster_authorized_operations=False, endpoint_type=1)
    response = await raw.call(m.ApiKey.DESCRIBE_CLUSTER, version, req)
    host, port = broker.advertised
    assert response.error_code == ErrorCode.NONE
    assert response.cluster_id == broker.cluster_id
    assert response.controller_id == broker.config.node_id
    assert [(b.broker_id, b.host, b.port) for b in response.brokers] == [
        (broker.config.node_id, host, port)
    ]
    assert response.cluster_authorized_operations == -(2**31)
    with_ops = await raw.call(
        m.ApiKey.DESCRIBE_CLUSTER, version, Req(include_cluster_authorized_operations=True)
    )
    assert with_ops.cluster_authorized_operations > 0
    if version >= 1:
        controller = await raw.call(m.ApiKey.DESCRIBE_CLUSTER, version, Req(endpoint_type=2))
        assert controller.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE
        odd = await raw.call(m.ApiKey.DESCRIBE_CLUSTER, version, Req(endpoint_type=7))
        assert odd.error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE


@pytest.mark.parametrize("version", versions(m.ApiKey.OFFSET_FOR_LEADER_EPOCH))
async def test_offset_for_leader_epoch_versions(raw: RawClient, version: int) -> None:
    await raw.create_topic("ep", 2)
    await raw.produce("ep", 0, batch_at(1, 2, 3))
    Req = m.OffsetForLeaderEpochRequest
    Part = Req.OffsetForLeaderTopic.OffsetForLeaderPartition

    async def ask(
        topic: str, partition: int, epoch: int, current: int = -1
    ) -> tuple[int, int, int]:
        p = Part(partition=partition, current_leader_epoch=current, leader_epoch=epoch)
        req = Req(replica_id=-1, topics=[Req.OffsetForLeaderTopic(topic=topic, partitions=[p])])
        response = await raw.call(m.ApiKey.OFFSET_FOR_LEADER_EPOCH, version, req)
        r = response.topics[0].partitions[0]
        return r.error_code, r.leader_epoch, r.end_offset

    assert await ask("ep", 0, 0) == (0, 0, 3)
    assert await ask("ep", 1, 0) == (0, 0, 0)
    assert await ask("ep", 0, 0, current=0) == (0, 0, 3)
    # Epochs never seen (newer than ours, or undefined) end nowhere: -1/-1 and no error.
    assert await ask("ep", 0, 5) == (0, -1, -1)
    assert await ask("ep", 0, -1) == (0, -1, -1)
    assert (await ask("ep", 0, 0, current=1))[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert (await ask("nope", 0, 0))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await ask("ep", 9, 0))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("version", versions(m.ApiKey.DELETE_RECORDS))
async def test_delete_records_versions(raw: RawClient, broker: Broker, version: int) -> None:
    await raw.create_topic("dr", 2)
    await raw.create_topic("compacted", configs={"cleanup.policy": "compact"})
    for _ in range(3):
        await raw.produce("dr", 0, batch_at(10, 20))  # offsets 0-5
    Req = m.DeleteRecordsRequest
    Topic, Part = Req.DeleteRecordsTopic, Req.DeleteRecordsTopic.DeleteRecordsPartition

    async def delete(topic: str, partition: int, offset: int) -> tuple[int, int]:
        req = Req(
            topics=[Topic(name=topic, partitions=[Part(partition_index=partition, offset=offset)])],
            timeout_ms=1000,
        )
        response = await raw.call(m.ApiKey.DELETE_RECORDS, version, req)
        r = response.topics[0].partitions[0]
        return r.error_code, r.low_watermark

    assert await delete("dr", 0, 7) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert await delete("dr", 0, -2) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert await delete("dr", 0, 3) == (0, 3)
    assert await delete("dr", 0, 1) == (0, 3)  # never moves backwards
    assert (await raw.list_offsets("dr", 0, -2)).offset == 3
    assert await delete("dr", 0, -1) == (0, 6)  # -1: up to the high watermark
    assert await delete("dr", 1, -1) == (0, 0)
    assert (await delete("nope", 0, 0))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await delete("dr", 5, 0))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await delete("compacted", 0, 0))[0] == ErrorCode.POLICY_VIOLATION
    assert broker.topics.log("dr", 0).log_start_offset == 6  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "configs",
    [{"segment.bytes": "0"}, {"segment.ms": "-5"}, {"segment.bytes": str(1 << 31)},
     {"compression.type": "brotli"}, {"min.insync.replicas": "0"}, {"preallocate": "maybe"},
     {"no.such.config": "1"}],
)  # fmt: skip
async def test_create_topics_refuses_configs_the_log_cannot_use(
    raw: RawClient, broker: Broker, configs: dict[str, str]
) -> None:
    """One table checks every topic config (storage/topic_configs.py): a value the log
    cannot use is INVALID_CONFIG at CreateTopics, not a topic that breaks the restart."""
    result = await raw.create_topic("bad-config", configs=configs)
    assert result.error_code == ErrorCode.INVALID_CONFIG, result
    assert broker.topics.get("bad-config") is None
    ok = await raw.create_topic("good-config", configs={"segment.bytes": "1048576"})
    assert ok.error_code == ErrorCode.NONE
    assert (await raw.create_topic("good-config")).error_code == ErrorCode.TOPIC_ALREADY_EXISTS
