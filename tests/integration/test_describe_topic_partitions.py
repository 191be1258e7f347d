"""DescribeTopicPartitions (API 75, KIP-966) over a real socket against the in-process broker.

Raw requests through our codec check Kafka's paging rules (names in order, partitions in
order, the cursor, the page limit and its broker cap), the errors, and authorization; then
Kafka's own kafka-topics.sh (TopicCommand, kafka-tools 4.4, the Java Admin's
describeTopics) pages through a topic with more partitions than its page limit, and so
does kafka-python's describe_topic_partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kafka.admin import KafkaAdminClient

from tests.integration.raw_client import RawClient
from tests.kafka_tools import tool
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

API = m.ApiKey.DESCRIBE_TOPIC_PARTITIONS
Req = m.DescribeTopicPartitionsRequest
NO_ID = uuid.UUID(int=0)
#: Kafka's AclOperation codes as bits: every topic operation, and DESCRIBE alone.
ALL_TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
DESCRIBE_ONLY = 1 << 8


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        yield RawClient(stream)


async def describe(
    raw: RawClient, names: list[str] = [], limit: int = 2000,  # noqa: B006 - never mutated
    cursor: tuple[str, int] | None = None,
) -> Any:  # fmt: skip
    request = Req(
        topics=[Req.TopicRequest(name=n) for n in names],
        response_partition_limit=limit,
        cursor=None if cursor is None else Req.Cursor(topic_name=cursor[0],
                                                      partition_index=cursor[1]),
    )  # fmt: skip
    return await raw.call(API, 0, request)


def page(response: Any) -> list[tuple[str, list[int]]]:
    return [(t.name, [p.partition_index for p in t.partitions]) for t in response.topics]


def next_cursor(response: Any) -> tuple[str, int] | None:
    c = response.next_cursor
    return None if c is None else (c.topic_name, c.partition_index)


async def test_advertised_in_api_versions(raw: RawClient) -> None:
    response = await raw.call(m.ApiKey.API_VERSIONS, 3, m.ApiVersionsRequest(
        client_software_name="raw", client_software_version="1"))  # fmt: skip
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[API] == (0, 0)


async def test_pages_through_every_topic_in_order(raw: RawClient, broker: Broker) -> None:
    for name, count in (("t-c", 3), ("t-a", 5), ("t-b", 2)):
        broker.topics.create(name, count)
    first = await describe(raw, limit=3)
    assert page(first) == [("t-a", [0, 1, 2])]
    assert next_cursor(first) == ("t-a", 3)
    second = await describe(raw, limit=3, cursor=("t-a", 3))
    assert page(second) == [("t-a", [3, 4]), ("t-b", [0])]
    assert next_cursor(second) == ("t-b", 1)
    third = await describe(raw, limit=3, cursor=("t-b", 1))
    assert page(third) == [("t-b", [1]), ("t-c", [0, 1])]
    assert next_cursor(third) == ("t-c", 2)
    last = await describe(raw, limit=3, cursor=("t-c", 2))
    assert page(last) == [("t-c", [2])]
    assert last.next_cursor is None
    # A page that fills up exactly at a topic's end points at the next topic's start.
    full = await describe(raw, limit=5)
    assert page(full) == [("t-a", [0, 1, 2, 3, 4])] and next_cursor(full) == ("t-b", 0)
    # What a single-broker topic looks like, partition by partition.
    node = broker.config.node_id
    topic = full.topics[0]
    assert topic.error_code == ErrorCode.NONE and not topic.is_internal
    assert topic.topic_id == broker.topics.get("t-a").topic_id  # type: ignore[union-attr]
    assert topic.topic_authorized_operations == ALL_TOPIC_OPERATIONS
    p = topic.partitions[0]
    assert (p.error_code, p.leader_id, p.leader_epoch) == (ErrorCode.NONE, node, 0)
    assert (p.replica_nodes, p.isr_nodes, p.offline_replicas) == ([node], [node], [])
    assert (p.eligible_leader_replicas, p.last_known_elr) == ([], [])


async def test_named_topics_missing_and_invalid(raw: RawClient, broker: Broker) -> None:
    broker.topics.create("n-one", 2)
    broker.topics.create("n-two", 1)
    response = await describe(
        raw, ["n-two", "missing", "n-one", "bad/name", "__consumer_offsets", "n-one"]
    )
    assert [(t.name, t.error_code, [p.partition_index for p in t.partitions])
            for t in response.topics] == [
        ("__consumer_offsets", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
        ("bad/name", ErrorCode.INVALID_TOPIC_EXCEPTION, []),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
        ("n-one", ErrorCode.NONE, [0, 1]),
        ("n-two", ErrorCode.NONE, [0]),
    ]  # fmt: skip
    assert [t.is_internal for t in response.topics] == [True, False, False, False, False]
    assert response.topics[2].topic_id == NO_ID
    assert response.next_cursor is None
    # Missing topics take no room on the page; topics before the cursor are left out.
    paged = await describe(raw, ["n-two", "missing", "n-one"], limit=1, cursor=("n-one", 1))
    assert page(paged) == [("n-one", [1])] and next_cursor(paged) == ("n-two", 0)
    rest = await describe(raw, ["n-two", "missing"], limit=1, cursor=("n-two", 0))
    assert page(rest) == [("n-two", [0])] and rest.next_cursor is None
    # A cursor past the topic's last partition: the topic, with no partitions.
    beyond = await describe(raw, ["n-two"], cursor=("n-two", 7))
    assert page(beyond) == [("n-two", [])] and beyond.next_cursor is None


async def test_bad_cursors_refuse_the_request(raw: RawClient, broker: Broker) -> None:
    broker.topics.create("c-one", 2)
    elsewhere = await describe(raw, ["c-one", "nope"], cursor=("other", 0))
    assert [(t.name, t.error_code) for t in elsewhere.topics] == [
        ("c-one", ErrorCode.INVALID_REQUEST), ("nope", ErrorCode.INVALID_REQUEST)]  # fmt: skip
    negative = await describe(raw, ["c-one"], cursor=("c-one", -1))
    assert [(t.name, t.error_code) for t in negative.topics] == [
        ("c-one", ErrorCode.INVALID_REQUEST)]  # fmt: skip
    assert negative.topics[0].partitions == []
    # All topics: a cursor naming a topic that does not exist starts after its place.
    broker.topics.create("c-two", 1)
    gap = await describe(raw, cursor=("c-one-and-more", 3))
    assert page(gap) == [("c-two", [0])]
    # A limit below 1 still answers one partition.
    tiny = await describe(raw, ["c-one"], limit=0)
    assert page(tiny) == [("c-one", [0])] and next_cursor(tiny) == ("c-one", 1)


class TestBrokerCap:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data",
                            max_request_partition_size_limit=2)  # fmt: skip

    async def test_the_broker_caps_the_page(self, raw: RawClient, broker: Broker) -> None:
        broker.topics.create("capped", 5)
        response = await describe(raw, ["capped"], limit=2000)
        assert page(response) == [("capped", [0, 1])]
        assert next_cursor(response) == ("capped", 2)
        smaller = await describe(raw, ["capped"], limit=1, cursor=("capped", 2))
        assert page(smaller) == [("capped", [2])] and next_cursor(smaller) == ("capped", 3)


class TestAuthorization:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")

    async def test_only_describable_topics(self, raw: RawClient, broker: Broker) -> None:
        assert broker.authorizer is not None
        for name in ("vis-a", "vis-b", "hidden"):
            broker.topics.create(name, 2)
        broker.authorizer.store.add([AclBinding(
            RT.TOPIC, "vis-", PatternType.PREFIXED, "User:ANONYMOUS", "*", Operation.DESCRIBE,
            Permission.ALLOW)])  # fmt: skip
        everything = await describe(raw)
        assert page(everything) == [("vis-a", [0, 1]), ("vis-b", [0, 1])]
        assert {t.topic_authorized_operations for t in everything.topics} == {DESCRIBE_ONLY}
        # Named: refused without saying whether it exists (no id), after the others.
        named = await describe(raw, ["hidden", "ghost", "vis-b"], limit=1)
        assert [(t.name, t.error_code, t.topic_id) for t in named.topics] == [
            ("vis-b", ErrorCode.NONE, broker.topics.get("vis-b").topic_id),  # type: ignore[union-attr]
            ("ghost", ErrorCode.TOPIC_AUTHORIZATION_FAILED, NO_ID),
            ("hidden", ErrorCode.TOPIC_AUTHORIZATION_FAILED, NO_ID),
        ]  # fmt: skip
        assert next_cursor(named) == ("vis-b", 1)


# ------------------------------------------------------------------ Kafka's kafka-topics.sh


tools_classpath = tool.tools_classpath


def topic_command(classpath: str, bootstrap: str, *args: str) -> list[str]:
    done = tool.run_tool(classpath, "TopicCommand", "--bootstrap-server", bootstrap, *args)
    return done.stdout.splitlines()


def described_partitions(lines: list[str]) -> list[dict[str, str]]:
    """kafka-topics --describe's partition lines ("\tTopic: t\tPartition: 0\tLeader: 0...")."""
    rows = []
    for line in lines:
        if "Partition: " not in line:
            continue
        fields = [f.split(": ", 1) for f in line.strip().split("\t") if ": " in f]
        rows.append({key: value for key, value in fields})
    return rows


@pytest.mark.timeout(300)
async def test_kafka_topics_describe_pages(
    broker: Broker, bootstrap: str, tools_classpath: str
) -> None:
    broker.topics.create("tool-wide", 7)
    broker.topics.create("tool-narrow", 2)
    lines = await trio.to_thread.run_sync(
        lambda: topic_command(tools_classpath, bootstrap, "--describe", "--topic",
                              "tool-wide,tool-narrow", "--partition-size-limit-per-response", "3")
    )  # fmt: skip
    rows = described_partitions(lines)
    node = str(broker.config.node_id)
    by_topic: dict[str, list[str]] = {}
    for r in rows:  # the tool prints the topics in its own order, each one's partitions in ours
        by_topic.setdefault(r["Topic"], []).append(r["Partition"])
    assert by_topic == {"tool-narrow": ["0", "1"], "tool-wide": [str(i) for i in range(7)]}
    assert {(r["Leader"], r["Replicas"], r["Isr"]) for r in rows} == {(node, node, node)}
    headers = [line for line in lines if line.startswith("Topic: ")]
    assert any("tool-wide" in h and "PartitionCount: 7" in h for h in headers), headers
    # Nine partitions, three a page: three requests, so the tool used this API (a broker
    # without it would have been asked Metadata instead).
    assert broker.handler_pool.latency.count(API) == 3


# ------------------------------------------------------------------ kafka-python's admin


async def test_kafka_python_describe_topic_partitions(broker: Broker, bootstrap: str) -> None:
    """kafka-python 3's KafkaAdminClient.describe_topic_partitions, following the cursor."""
    broker.topics.create("kp-wide", 5)
    broker.topics.create("kp-narrow", 1)

    def walk() -> tuple[list[tuple[str, int, int]], list[Any], list[Any]]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            seen, cursors, cursor = [], [], None
            while True:
                answer = admin.describe_topic_partitions(
                    ["kp-wide", "kp-narrow"], response_partition_limit=2, cursor=cursor
                )
                seen += [(t["name"], t["error_code"], p["partition_index"])
                         for t in answer["topics"] for p in t["partitions"]]  # fmt: skip
                cursor = answer["next_cursor"]
                if cursor is None:
                    break
                cursors.append(cursor)
            missing = admin.describe_topic_partitions(["kp-missing"])["topics"]
            return seen, cursors, missing
        finally:
            admin.close()

    seen, cursors, missing = await trio.to_thread.run_sync(walk)
    assert seen == [("kp-narrow", 0, 0), *(("kp-wide", 0, i) for i in range(5))]
    assert cursors == [{"topic_name": "kp-wide", "partition_index": i} for i in (1, 3)]
    assert [(t["name"], t["error_code"]) for t in missing] == [
        ("kp-missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    ]
