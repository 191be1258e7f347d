"""Kafka 4.4's own decoders read our ``__consumer_offsets`` (issue 32).

``kafka-console-consumer.sh --topic __consumer_offsets --from-beginning --formatter
org.apache.kafka.tools.consumer.OffsetsMessageFormatter`` (and ``GroupMetadataMessageFormatter``)
against an in-process broker alone (its internal topic is listed and readable,
services/own_partition.py) that holds a classic group's commits and its generation, a
transaction's committed offset, a KIP-848 group and a share group: the tool reads every
record without stopping (our own records carry types Kafka's deserializer does not know,
which its formatters skip), its offsets (group, topic, partition, offset) are the ones
committed, and the classic group's metadata is the generation the broker stored.
"""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from tests.integration.test_acl_clients import connect
from tests.kafka_tools.classpath import TOOL_JVM, kafka_tools_classpath
from tests.waits import wait_until
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(600)

TOPIC = "fmt"
CONSOLE = "org.apache.kafka.tools.consumer.ConsoleConsumer"
FORMATTERS = "org.apache.kafka.tools.consumer."


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", group_initial_rebalance_delay_ms=0,
        group_consumer_heartbeat_interval_ms=500,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tools_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return kafka_tools_classpath(tmp_path_factory.mktemp("kafka-tools"))


def _produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        producer.produce(TOPIC, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(10) == 0


def _classic_group(bootstrap: str) -> None:
    """A classic member joins (the generation is stored), commits, and stays."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "classic-g",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.subscribe([TOPIC])
        wait_until(lambda: consumer.poll(0.2) is not None or consumer.assignment(), "assignment")
        consumer.commit(offsets=[CTopicPartition(TOPIC, 0, 3, "m0"), CTopicPartition(TOPIC, 1, 2)],
                        asynchronous=False)  # fmt: skip
    finally:
        consumer.close()


def _consumer_protocol_group(bootstrap: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kip848-g",
                         "group.protocol": "consumer", "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.subscribe([TOPIC])
        wait_until(lambda: consumer.poll(0.2) is not None or consumer.assignment(), "assignment")
        consumer.commit(offsets=[CTopicPartition(TOPIC, 1, 1)], asynchronous=False)
    finally:
        consumer.close()


def _transactional_commit(bootstrap: str) -> None:
    """The group's offset committed by a transaction (TxnOffsetCommit, then the end)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fmt-txn"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"t", partition=0)
    metadata = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-g"})
    try:
        producer.send_offsets_to_transaction(
            [CTopicPartition(TOPIC, 0, 5)], metadata.consumer_group_metadata(), 30
        )
    finally:
        metadata.close()
    producer.commit_transaction(30)


async def _share_group(broker: Broker) -> None:
    async with connect(broker) as raw:
        joined = await raw.call(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, m.ShareGroupHeartbeatRequest(
            group_id="share-g", member_id="sm-1", member_epoch=0,
            subscribed_topic_names=[TOPIC]))  # fmt: skip
        assert joined.error_code == ErrorCode.NONE


def console(classpath: str, bootstrap: str, formatter: str, records: int) -> list[dict[str, Any]]:
    """Kafka's console consumer over the whole of ``__consumer_offsets`` (``records`` of
    them) with one of its formatters; the JSON lines it printed."""
    argv = ["java", *TOOL_JVM, "-cp", classpath, CONSOLE, "--bootstrap-server", bootstrap,
            "--topic", "__consumer_offsets", "--from-beginning", "--max-messages", str(records),
            "--timeout-ms", "60000", "--formatter", FORMATTERS + formatter,
            "--command-property", "enable.auto.commit=false"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Processed a total of {records} messages" in done.stderr, done.stderr
    # The formatters print one JSON object a record, with no separator after it.
    text = done.stdout[done.stdout.find("{") :].strip() if "{" in done.stdout else ""
    decoder, at, printed = json.JSONDecoder(), 0, []
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        printed.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return printed


async def test_kafkas_formatters_read_our_consumer_offsets(
    broker: Broker, tools_classpath: str
) -> None:
    host, port = broker.bound[0]
    bootstrap = f"{host}:{port}"
    broker.topics.create(TOPIC, 2)
    await trio.to_thread.run_sync(partial(_produce, bootstrap))
    await trio.to_thread.run_sync(partial(_classic_group, bootstrap))
    await trio.to_thread.run_sync(partial(_transactional_commit, bootstrap))
    await trio.to_thread.run_sync(partial(_consumer_protocol_group, bootstrap))
    await _share_group(broker)
    store = broker.groups.store_for("classic-g")
    records = store.log.log_end_offset  # every record written so far, ours included
    assert records > 0

    offsets = await trio.to_thread.run_sync(
        console, tools_classpath, bootstrap, "OffsetsMessageFormatter", records
    )
    latest: dict[tuple[str, str, int], int | None] = {}
    for line in offsets:
        assert line["key"]["type"] == 1, line  # the formatter prints OffsetCommit only
        key = line["key"]["data"]
        value = line["value"]
        latest[key["group"], key["topic"], key["partition"]] = (
            None if value is None else value["data"]["offset"]
        )
        if value is not None:
            assert value["version"] == 4, line
    assert latest == {
        ("classic-g", TOPIC, 0): 3,
        ("classic-g", TOPIC, 1): 2,
        ("txn-g", TOPIC, 0): 5,
        ("kip848-g", TOPIC, 1): 1,
    }
    # As the broker answers OffsetFetch, the commit's metadata too (librdkafka sends "m0"
    # with its terminating NUL).
    for (group, topic, partition), offset in latest.items():
        stored = broker.groups.store_for(group).get(group, topic, partition)
        assert stored is not None and stored.offset == offset
    [metadata] = {
        line["value"]["data"]["metadata"]
        for line in offsets
        if line["key"]["data"] == {"group": "classic-g", "topic": TOPIC, "partition": 0}
    }
    stored = store.get("classic-g", TOPIC, 0)
    assert stored is not None and metadata == stored.metadata and metadata.startswith("m0")

    groups = await trio.to_thread.run_sync(
        console, tools_classpath, bootstrap, "GroupMetadataMessageFormatter", records
    )
    classic = [line for line in groups if line["key"]["data"]["group"] == "classic-g"]
    assert classic and all(line["key"]["type"] == 2 for line in groups)
    last = classic[-1]["value"]
    stored_group = store.group_metadata("classic-g")
    if stored_group is None:  # the member left: the group's last record is its tombstone
        assert last is None
    else:
        assert last["version"] == 3
        data = last["data"]
        assert (data["protocolType"], data["generation"], data["protocol"]) == (
            stored_group.protocol_type, stored_group.generation_id, stored_group.protocol_name,
        )  # fmt: skip
        assert [member["memberId"] for member in data["members"]] == [
            member.member_id for member in stored_group.members
        ]
    # The generation the member joined is there, with its member, before it left.
    joined = [line["value"]["data"] for line in classic if line["value"] is not None]
    assert any(data["members"] and data["protocolType"] == "consumer" for data in joined), classic
