"""CreatePartitions and DescribeLogDirs over real sockets, against an in-process broker.

A raw client on our codec sends every version of both APIs and checks Kafka's
error codes on the edges (shrink, unknown topic, repeated name, deadline,
assignments, internal topics, ACLs); the grown topic is then used through
Metadata, Produce, ListOffsets and Fetch, in both storage modes, and (file mode)
across a restart. Real clients are in tests/e2e/test_admin_partitions.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.handlers import load_handlers
from trio_broker.handlers.base import HANDLERS
from trio_broker.handlers.describe_log_dirs import MEMORY_LOG_DIR
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.server.broker import Broker
from trio_broker.services import topics as topics_module
from trio_broker.services.topics import MAX_PARTITIONS
from trio_broker.storage import catalogue as catalogue_module
from trio_broker.storage.log import PartitionLog

load_handlers()
CP = m.CreatePartitionsRequest
LD = m.DescribeLogDirsRequest


def versions(api_key: int) -> list[int]:
    spec = HANDLERS[api_key]
    return list(range(spec.min_version, spec.max_version + 1))


@pytest.fixture(params=["file", "memory"])
def broker_config(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", storage=request.param)


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        yield RawClient(stream)


def grow(name: str, count: int, assignments: list[list[int]] | None = None) -> Any:
    return CP.CreatePartitionsTopic(
        name=name, count=count,
        assignments=None if assignments is None
        else [CP.CreatePartitionsTopic.CreatePartitionsAssignment(broker_ids=a)
              for a in assignments],
    )  # fmt: skip


async def create_partitions(
    raw: RawClient, *topics: Any, version: int = 3, timeout_ms: int = 5000,
    validate_only: bool = False,
) -> dict[str, tuple[int, str | None]]:  # fmt: skip
    request = CP(topics=list(topics), timeout_ms=timeout_ms, validate_only=validate_only)
    response = await raw.call(m.ApiKey.CREATE_PARTITIONS, version, request)
    assert response.throttle_time_ms == 0
    results = {r.name: (r.error_code, r.error_message) for r in response.results}
    assert len(results) == len(response.results), "one result per topic name"
    return results


async def partition_count(raw: RawClient, name: str) -> int:
    request = m.MetadataRequest(
        topics=[m.MetadataRequest.MetadataRequestTopic(name=name)],
        allow_auto_topic_creation=False,
    )
    (topic,) = (await raw.call(m.ApiKey.METADATA, 9, request)).topics
    assert topic.error_code == ErrorCode.NONE
    indexes = sorted(p.partition_index for p in topic.partitions)
    assert indexes == list(range(len(indexes)))
    return len(indexes)


async def produce(raw: RawClient, topic: str, partition: int, values: list[bytes]) -> Any:
    Req = m.ProduceRequest
    data = Req.TopicProduceData(
        name=topic,
        partition_data=[
            Req.TopicProduceData.PartitionProduceData(
                index=partition, records=bytes(build_batch([(None, v) for v in values]))
            )
        ],
    )
    request = Req(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[data])
    response = await raw.call(m.ApiKey.PRODUCE, 9, request)
    return response.responses[0].partition_responses[0]


async def fetch_values(raw: RawClient, topic: str, partition: int) -> list[bytes]:
    part = m.FetchRequest.FetchTopic.FetchPartition(
        partition=partition, fetch_offset=0, partition_max_bytes=1 << 20
    )
    request = m.FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        topics=[m.FetchRequest.FetchTopic(topic=topic, partitions=[part])],
    )  # fmt: skip
    (answer,) = (await raw.call(m.ApiKey.FETCH, 11, request)).responses[0].partitions
    assert answer.error_code == ErrorCode.NONE
    return [
        bytes(r.value)
        for batch in iter_batches(answer.records or b"")
        for r in batch.records()
        if r.value is not None
    ]


async def latest_offset(raw: RawClient, topic: str, partition: int) -> int:
    Req = m.ListOffsetsRequest
    part = Req.ListOffsetsTopic.ListOffsetsPartition(partition_index=partition, timestamp=-1)
    request = Req(replica_id=-1, topics=[Req.ListOffsetsTopic(name=topic, partitions=[part])])
    (answer,) = (await raw.call(m.ApiKey.LIST_OFFSETS, 5, request)).topics[0].partitions
    assert answer.error_code == ErrorCode.NONE
    return int(answer.offset)


# ----------------------------------------------------------------------------- CreatePartitions


@pytest.mark.parametrize("version", versions(m.ApiKey.CREATE_PARTITIONS))
async def test_grow_then_use_the_new_partitions(
    broker: Broker, raw: RawClient, version: int
) -> None:
    broker.topics.create("t", 1)
    assert await create_partitions(raw, grow("t", 3), version=version) == {
        "t": (ErrorCode.NONE, None)
    }
    assert await partition_count(raw, "t") == 3
    for partition in (1, 2):
        answer = await produce(raw, "t", partition, [b"p%d-a" % partition, b"p%d-b" % partition])
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert await latest_offset(raw, "t", partition) == 2
        assert await fetch_values(raw, "t", partition) == [
            b"p%d-a" % partition,
            b"p%d-b" % partition,
        ]
    assert await latest_offset(raw, "t", 0) == 0  # the old partition is untouched


async def test_validate_only_changes_nothing(broker: Broker, raw: RawClient) -> None:
    broker.topics.create("t", 2)
    assert await create_partitions(raw, grow("t", 5), validate_only=True) == {
        "t": (ErrorCode.NONE, None)
    }
    # validate_only runs every check: a bad request is refused just the same.
    bad = await create_partitions(raw, grow("t", 1), validate_only=True)
    assert bad["t"][0] == ErrorCode.INVALID_PARTITIONS
    assert await partition_count(raw, "t") == 2


async def test_counts_that_do_not_grow_are_invalid_partitions(
    broker: Broker, raw: RawClient
) -> None:
    broker.topics.create("t", 3)
    for count in (3, 2, 0, -1):
        code, message = (await create_partitions(raw, grow("t", count)))["t"]
        assert code == ErrorCode.INVALID_PARTITIONS, count
        assert message and "3 partition(s)" in message
    code, message = (await create_partitions(raw, grow("t", MAX_PARTITIONS + 1)))["t"]
    assert code == ErrorCode.INVALID_PARTITIONS and str(MAX_PARTITIONS) in (message or "")
    assert await partition_count(raw, "t") == 3


async def test_each_topic_is_judged_on_its_own(broker: Broker, raw: RawClient) -> None:
    broker.topics.create("a", 1)
    broker.topics.create("b", 1)
    results = await create_partitions(
        raw, grow("a", 2), grow("dup", 2), grow("nope", 2), grow("dup", 3), grow("b", 1),
        grow("__consumer_offsets", 50),
    )  # fmt: skip
    assert {name: code for name, (code, _) in results.items()} == {
        "a": ErrorCode.NONE,
        "dup": ErrorCode.INVALID_REQUEST,
        "nope": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "b": ErrorCode.INVALID_PARTITIONS,
        "__consumer_offsets": ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
    assert await partition_count(raw, "a") == 2
    assert await partition_count(raw, "b") == 1


async def test_a_repeated_existing_topic_is_not_grown(broker: Broker, raw: RawClient) -> None:
    broker.topics.create("t", 1)
    results = await create_partitions(raw, grow("t", 2), grow("t", 3))
    assert results["t"][0] == ErrorCode.INVALID_REQUEST
    assert await partition_count(raw, "t") == 1


@pytest.mark.parametrize("timeout_ms", [0, -1])
async def test_a_deadline_already_passed_times_out_and_changes_nothing(
    broker: Broker, raw: RawClient, timeout_ms: int
) -> None:
    broker.topics.create("t", 1)
    results = await create_partitions(raw, grow("t", 2), timeout_ms=timeout_ms)
    assert results["t"][0] == ErrorCode.REQUEST_TIMED_OUT
    assert await partition_count(raw, "t") == 1


async def test_manual_assignments_must_name_this_broker_once(
    broker: Broker, raw: RawClient
) -> None:
    broker.topics.create("t", 1)
    node = broker.config.node_id
    refused = {
        "too few": [[node]],
        "too many": [[node], [node], [node]],
        "empty": [[node], []],
        "other broker": [[node], [node + 1]],
        "twice": [[node, node], [node]],
    }
    for why, assignments in refused.items():
        code, message = (await create_partitions(raw, grow("t", 3, assignments)))["t"]
        assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT, why
        assert message, why
    assert await partition_count(raw, "t") == 1
    assert (await create_partitions(raw, grow("t", 3, [[node], [node]])))["t"][0] == 0
    assert await partition_count(raw, "t") == 3


async def test_a_disk_error_is_kafka_storage_error_and_changes_nothing(
    broker: Broker, raw: RawClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.topics.create("t", 1)

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    # Where the growth does its file I/O: the new logs (file mode) or the catalogue.
    monkeypatch.setattr(catalogue_module, "write_file_atomically", full_disk)
    monkeypatch.setattr(topics_module, "MemoryLog", full_disk)
    code, message = (await create_partitions(raw, grow("t", 2)))["t"]
    assert code == ErrorCode.KAFKA_STORAGE_ERROR and "No space left" in (message or "")
    monkeypatch.undo()
    assert await partition_count(raw, "t") == 1
    assert (await create_partitions(raw, grow("t", 2)))["t"][0] == ErrorCode.NONE


async def test_growth_needs_alter_on_the_topic(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        for name in ("guarded", "open"):
            broker.topics.create(name, 1)
        assert broker.authorizer is not None
        broker.authorizer.store.add([
            AclBinding(ResourceType.TOPIC, name, PatternType.LITERAL, "User:ANONYMOUS", "*", op,
                       Permission.ALLOW)
            for name, op in (("guarded", Operation.DESCRIBE), ("open", Operation.ALTER))
        ])  # fmt: skip
        host, port = broker.bound[0]
        async with await trio.open_tcp_stream(host, port) as stream:
            raw = RawClient(stream)
            results = await create_partitions(
                raw, grow("guarded", 2), grow("open", 2), grow("unknown", 2)
            )
            # Refused before existence is revealed: an unknown topic is refused the same way.
            assert {name: code for name, (code, _) in results.items()} == {
                "guarded": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "open": ErrorCode.NONE,
                "unknown": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            }
        assert len(broker.topics.get("guarded").logs) == 1  # type: ignore[union-attr]
        assert len(broker.topics.get("open").logs) == 2  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_the_grown_count_and_its_data_survive_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    for run in range(2):
        async with trio.open_nursery() as nursery:
            broker: Broker = await nursery.start(Broker(config).run)
            host, port = broker.bound[0]
            async with await trio.open_tcp_stream(host, port) as stream:
                raw = RawClient(stream)
                if run == 0:
                    broker.topics.create("t", 1)
                    assert (await create_partitions(raw, grow("t", 4)))["t"][0] == 0
                    assert (await produce(raw, "t", 3, [b"kept"])).error_code == 0
                else:
                    assert await partition_count(raw, "t") == 4
                    assert await fetch_values(raw, "t", 3) == [b"kept"]
                    assert (await produce(raw, "t", 2, [b"after"])).base_offset == 0
            nursery.cancel_scope.cancel()


async def test_leftover_directories_do_not_leak_into_new_partitions(tmp_path: Path) -> None:
    """A directory by a new partition's name (a crashed attempt, an old topic) is discarded."""
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create("t", 1)
        nursery.cancel_scope.cancel()
    # What an attempt that crashed before its catalogue write could leave, with data in it.
    leftover = PartitionLog.open(config.data_dir / "t-1")
    leftover.append(build_batch([(None, b"stale")]), now_ms=0)
    leftover.close()
    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(config).run)
        host, port = broker.bound[0]
        async with await trio.open_tcp_stream(host, port) as stream:
            raw = RawClient(stream)
            assert await partition_count(raw, "t") == 1  # the catalogue decides, not the dirs
            assert (await create_partitions(raw, grow("t", 2)))["t"][0] == 0
            assert await latest_offset(raw, "t", 1) == 0
            assert await fetch_values(raw, "t", 1) == []
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------- DescribeLogDirs


def describe(topics: dict[str, list[int]] | None) -> Any:
    if topics is None:
        return LD(topics=None)
    return LD(topics=[LD.DescribableLogDirTopic(topic=t, partitions=p) for t, p in topics.items()])


def on_disk_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.log"))


@pytest.mark.parametrize("version", versions(m.ApiKey.DESCRIBE_LOG_DIRS))
async def test_describe_log_dirs_reports_each_partitions_size(
    broker: Broker, raw: RawClient, version: int
) -> None:
    broker.topics.create("t", 2)
    broker.topics.create("u", 1)
    assert (await produce(raw, "t", 1, [b"x" * 100, b"y" * 50])).error_code == 0
    response = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, version, describe(None))
    assert response.error_code == ErrorCode.NONE and response.throttle_time_ms == 0
    (log_dir,) = response.results
    assert log_dir.error_code == ErrorCode.NONE
    sizes = {
        (topic.name, p.partition_index): p.partition_size
        for topic in log_dir.topics
        for p in topic.partitions
    }
    for topic in log_dir.topics:
        for p in topic.partitions:
            assert (p.offset_lag, p.is_future_key) == (0, False)
    assert {("t", 0), ("t", 1), ("u", 0)} <= set(sizes)
    assert sizes[("t", 0)] == 0 and sizes[("u", 0)] == 0 and sizes[("t", 1)] > 150
    if broker.config.storage == "file":
        assert log_dir.log_dir == str(broker.config.data_dir.absolute())
        assert sizes[("t", 1)] == on_disk_size(broker.config.data_dir / "t-1")
        # Null topics: every partition, the committed-offsets log included (as Kafka).
        assert ("__consumer_offsets", 0) in sizes
        assert ("__transaction_state", 0) in sizes
    else:
        assert log_dir.log_dir == MEMORY_LOG_DIR
    if version >= 4 and broker.config.storage == "file":
        assert log_dir.total_bytes > 0 and 0 <= log_dir.usable_bytes <= log_dir.total_bytes
    elif version >= 4:
        assert log_dir.total_bytes == log_dir.usable_bytes == -1


async def test_describe_log_dirs_lists_only_the_partitions_asked_for(
    broker: Broker, raw: RawClient
) -> None:
    broker.topics.create("t", 3)
    broker.topics.create("u", 1)
    response = await raw.call(
        m.ApiKey.DESCRIBE_LOG_DIRS, 4, describe({"t": [2, 0, 7], "nope": [0], "u": []})
    )
    (log_dir,) = response.results
    # Unknown topics and partitions are left out, as are topics with nothing asked for.
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in log_dir.topics] == [
        ("t", [0, 2])
    ]
    empty = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, 4, describe({}))
    assert empty.results[0].topics == []


async def test_describe_log_dirs_sees_partitions_added_since(
    broker: Broker, raw: RawClient
) -> None:
    broker.topics.create("t", 1)
    assert (await create_partitions(raw, grow("t", 3)))["t"][0] == 0
    response = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, 2, describe({"t": [0, 1, 2]}))
    (topic,) = response.results[0].topics
    assert [p.partition_index for p in topic.partitions] == [0, 1, 2]


async def test_describe_log_dirs_needs_describe_on_the_cluster(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create("t", 1)
        host, port = broker.bound[0]
        async with await trio.open_tcp_stream(host, port) as stream:
            raw = RawClient(stream)
            for version in versions(m.ApiKey.DESCRIBE_LOG_DIRS):
                refused = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, version, describe(None))
                assert refused.results == []
                if version >= 3:  # earlier versions have no top-level error code
                    assert refused.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert broker.authorizer is not None
            broker.authorizer.store.add([
                AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                           "User:ANONYMOUS", "*", Operation.DESCRIBE, Permission.ALLOW)
            ])  # fmt: skip
            allowed = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, 4, describe(None))
            assert allowed.error_code == ErrorCode.NONE
            assert "t" in [t.name for t in allowed.results[0].topics]
        nursery.cancel_scope.cancel()
