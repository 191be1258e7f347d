"""The web console on the metrics listener (trio_broker/server/console.py), over HTTP.

An in-process broker with ``metrics.listener`` on port 0; confluent-kafka creates,
produces and commits; plain urllib (in a worker thread) reads the pages and the JSON
the pages use, and creates and deletes topics, which confluent-kafka then sees. Writes
are off by default, and with an authorizer they need a broker user (HTTP Basic) whose
ACLs allow them.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import RawConnection
from tests.e2e.test_consumer_protocol import topic_id_of
from tests.e2e.test_share_state_restart import acquire, join
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    broker: Broker, method: str, path: str, body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:  # fmt: skip
    assert broker.metrics is not None and broker.metrics.bound is not None
    host, port = broker.metrics.bound
    data = None if body is None else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json"} if body is not None else {}
    all_headers.update(headers or {})
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=data,
                                     method=method, headers=all_headers)  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers), exc.read())


async def call(broker: Broker, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> Answer:  # fmt: skip
    return await trio.to_thread.run_sync(lambda: http(broker, method, path, body, headers))


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def topic_names(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return set(admin.list_topics(timeout=10).topics)


async def wait_for_topics(bootstrap: str, present: str | None = None,
                          absent: str | None = None) -> set[str]:  # fmt: skip
    """confluent-kafka's view of the topics, once it shows ``present`` and not ``absent``."""
    deadline = time.monotonic() + 30
    while True:
        names = await trio.to_thread.run_sync(topic_names, bootstrap)
        if (present is None or present in names) and (absent is None or absent not in names):
            return names
        assert time.monotonic() < deadline, names
        await trio.sleep(0.1)  # polling confluent-kafka's metadata, bounded by the deadline


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", metrics_listener="127.0.0.1:0")


def prepare(bootstrap: str) -> None:
    """A 3-partition topic, 10 keyed records in each partition, and a group that committed
    offset 4 in partitions 0 and 1 (lag 6 each) and nothing in partition 2."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.create_topics([NewTopic("orders", num_partitions=3)]).values()
    future.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce("orders", key=f"key-{i}", value=f"order {i}", partition=i % 3,
                         headers=[("source", b"test")])  # fmt: skip
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.commit(offsets=[TopicPartition("orders", p, 4) for p in (0, 1)],
                        asynchronous=False)  # fmt: skip
    finally:
        consumer.close()


async def test_pages_and_json(broker: Broker, bootstrap: str) -> None:
    await trio.to_thread.run_sync(prepare, bootstrap)
    page = await call(broker, "GET", "/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b'<script src="/console/console.js">' in page.body
    script = await call(broker, "GET", "/console/console.js")
    assert script.status == 200 and script.headers["Content-Type"].startswith("text/javascript")
    assert (await call(broker, "GET", "/console/../metrics.py")).status == 404
    assert (await call(broker, "GET", "/metrics")).status == 200  # still there

    node = broker.config.node_id
    overview = (await call(broker, "GET", "/api/overview")).json()
    assert [(b["id"], b["state"]) for b in overview["brokers"]] == [(node, "controller")]
    assert overview["brokers"][0]["port"] == broker.bound[0][1]
    assert (overview["writes_enabled"], overview["auth_required"]) == (False, False)

    topics = (await call(broker, "GET", "/api/topics")).json()
    [orders] = [t for t in topics["topics"] if t["name"] == "orders"]
    assert (orders["partitions"], orders["replication_factor"]) == (3, 1)
    assert orders["size_bytes"] > 0

    topic = (await call(broker, "GET", "/api/topics/orders")).json()
    assert [(p["partition"], p["leader"], p["isr"], p["start_offset"], p["end_offset"])
            for p in topic["partitions"]] == [(i, node, [node], 0, 10) for i in range(3)]  # fmt: skip
    configs = {c["name"]: c for c in topic["configs"]}
    assert configs["cleanup.policy"]["value"] == "delete"
    assert (await call(broker, "GET", "/api/topics/missing")).status == 404

    records = (await call(broker, "GET",
                          "/api/topics/orders/partitions/1/records?offset=3&limit=2")).json()  # fmt: skip
    assert [(r["offset"], r["key"], r["value"], r["headers"]) for r in records["records"]] == [
        (3, "key-10", "order 10", [["source", "test"]]),
        (4, "key-13", "order 13", [["source", "test"]]),
    ]
    assert (records["high_watermark"], records["log_start_offset"]) == (10, 0)
    capped = (await call(broker, "GET",
                         "/api/topics/orders/partitions/0/records?limit=100000")).json()  # fmt: skip
    assert len(capped["records"]) == 10  # all there are (the cap is 100)

    groups = (await call(broker, "GET", "/api/groups")).json()
    assert [(g["group_id"], g["lag"], g["partitions"]) for g in groups["groups"]] == [
        ("billing", 12, 2)]  # fmt: skip
    group = (await call(broker, "GET", "/api/groups/billing")).json()
    assert [(p["topic"], p["partition"], p["committed"], p["end"], p["lag"])
            for p in group["partitions"]] == [("orders", 0, 4, 10, 6), ("orders", 1, 4, 10, 6)]  # fmt: skip

    stats = (await call(broker, "GET", "/api/stats")).json()
    assert stats["messages_in"] == 30 and stats["apis"]["produce"]["count"] >= 1
    # Pages are bounded: a limit beyond the cap is cut to it.
    assert (await call(broker, "GET", "/api/topics?limit=999999")).json()["limit"] == 200


async def test_writes_are_off_by_default(broker: Broker, bootstrap: str) -> None:
    refused = await call(broker, "POST", "/api/topics", {"name": "from-console"})
    assert refused.status == 403 and "console.writes.enable" in refused.json()["error"]
    broker.topics.create("keep-me", 1)
    assert (await call(broker, "DELETE", "/api/topics/keep-me")).status == 403
    names = await wait_for_topics(bootstrap, present="keep-me")
    assert "from-console" not in names


class TestWrites:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data", metrics_listener="127.0.0.1:0",
                            console_writes_enable=True)  # fmt: skip

    async def test_create_and_delete_a_topic(self, broker: Broker, bootstrap: str) -> None:
        created = await call(broker, "POST", "/api/topics", {
            "name": "from-console", "partitions": 4, "configs": {"retention.ms": "60000"}})  # fmt: skip
        assert created.status == 201, created.body
        await wait_for_topics(bootstrap, present="from-console")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        metadata = await trio.to_thread.run_sync(lambda: admin.list_topics(timeout=10))
        assert len(metadata.topics["from-console"].partitions) == 4
        topic = (await call(broker, "GET", "/api/topics/from-console")).json()
        assert {c["name"]: c["value"] for c in topic["configs"]}["retention.ms"] == "60000"
        again = await call(broker, "POST", "/api/topics", {"name": "from-console"})
        assert (again.status, again.json()["error"]) == (400, "TOPIC_ALREADY_EXISTS")
        bad = await call(broker, "POST", "/api/topics", {"name": "bad/name"})
        assert (bad.status, bad.json()["error"]) == (400, "INVALID_TOPIC_EXCEPTION")
        # Only JSON: a cross-site HTML form cannot send it without CORS letting it.
        form = await call(broker, "POST", "/api/topics", {"name": "x"},
                          {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert form.status == 415
        deleted = await call(broker, "DELETE", "/api/topics/from-console")
        assert deleted.status == 200, deleted.body
        await wait_for_topics(bootstrap, absent="from-console")
        assert (await call(broker, "DELETE", "/api/topics/from-console")).status == 404


class TestWritesWithAuthentication:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data", metrics_listener="127.0.0.1:0",
                            console_writes_enable=True, authorizer_class_name="acl")  # fmt: skip

    async def test_a_write_needs_a_user_whose_acls_allow_it(
        self, broker: Broker, bootstrap: str
    ) -> None:
        assert broker.authorizer is not None
        broker.credentials.add("alice", "SCRAM-SHA-256", "alice-secret")
        overview = (await call(broker, "GET", "/api/overview")).json()
        assert overview["auth_required"] is True
        body = {"name": "guarded", "partitions": 1}
        anonymous = await call(broker, "POST", "/api/topics", body)
        assert anonymous.status == 401
        assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
        wrong = await call(broker, "POST", "/api/topics", body, basic("alice", "nope"))
        assert wrong.status == 401
        stranger = await call(broker, "POST", "/api/topics", body, basic("mallory", "x"))
        assert stranger.status == 401
        # alice is known, but no ACL lets her create topics.
        refused = await call(broker, "POST", "/api/topics", body, basic("alice", "alice-secret"))
        assert (refused.status, refused.json()["error"]) == (403, "TOPIC_AUTHORIZATION_FAILED")
        assert broker.topics.get("guarded") is None
        broker.authorizer.store.add([AclBinding(
            RT.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:alice", "*",
            Operation.CREATE, Permission.ALLOW)])  # fmt: skip
        allowed = await call(broker, "POST", "/api/topics", body, basic("alice", "alice-secret"))
        assert allowed.status == 201, allowed.body
        assert broker.topics.get("guarded") is not None
        # Reads run as the caller too: the anonymous view hides what it may not describe.
        hidden = (await call(broker, "GET", "/api/topics")).json()
        assert hidden["topics"] == []
        delete = await call(broker, "DELETE", "/api/topics/guarded", None,
                            basic("alice", "alice-secret"))  # fmt: skip
        assert delete.status == 403  # CREATE does not imply DELETE


def consume_in_a_consumer_group(bootstrap: str, stop: threading.Event, ready: threading.Event,
                                tmp: dict[str, Any]) -> None:  # fmt: skip
    """A KIP-848 member (group.protocol=consumer) that reads 3 records of "orders" and
    commits, then stays in the group until told to leave."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "modern",
                         "group.protocol": "consumer", "client.id": "modern-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe(["orders"])
    try:
        read = 0
        deadline = time.monotonic() + 60
        while read < 3 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
                tmp["last"] = (message.partition(), message.offset())
        consumer.commit(asynchronous=False)
        ready.set()
        while not stop.is_set():
            consumer.poll(0.2)
    finally:
        consumer.close()


async def test_a_kip_848_group(broker: Broker, bootstrap: str) -> None:
    await trio.to_thread.run_sync(prepare, bootstrap)
    stop, ready, seen = threading.Event(), threading.Event(), {}  # type: ignore[var-annotated]
    member = threading.Thread(target=consume_in_a_consumer_group,
                              args=(bootstrap, stop, ready, seen), daemon=True)  # fmt: skip
    member.start()
    try:
        assert await trio.to_thread.run_sync(ready.wait, 60)
        groups = (await call(broker, "GET", "/api/groups")).json()["groups"]
        assert {g["group_id"]: g["type"] for g in groups}["modern"] == "consumer"
        group = (await call(broker, "GET", "/api/groups/modern")).json()
        assert group["error"] is None and group["protocol_type"] == "consumer"
        assert [mb["client_id"] for mb in group["members"]] == ["modern-reader"]
        partition, offset = seen["last"]
        [row] = [p for p in group["partitions"] if p["partition"] == partition]
        assert (row["committed"], row["end"], row["lag"]) == (offset + 1, 10, 10 - offset - 1)
    finally:
        stop.set()
        await trio.to_thread.run_sync(member.join, 30)


async def test_bad_requests_get_4xx_and_the_listener_lives_on(broker: Broker) -> None:
    bad = await call(broker, "GET", "/api/topics/orders/partitions/abc/records")
    assert bad.status == 400
    assert (await call(broker, "GET", "/api/topics?offset=x")).status == 400
    assert (await call(broker, "PUT", "/api/topics")).status == 405
    assert (await call(broker, "GET", "/api/nothing")).status == 404
    assert (await call(broker, "POST", "/")).status == 405
    assert (await call(broker, "GET", "/health")).status == 200


def share_group_with_acknowledgements(bootstrap: str) -> None:
    """Share group "queue" on a 2-partition topic of 5 records each: partition 0's
    records 0-2 accepted and 3-4 released (the session closed), partition 1 untouched;
    kafka-share-groups describes it as start offsets 3 and 0, lags 2 and 5
    (tests/e2e/test_share_group_tools.py)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("jobs", 2, 1)])["jobs"].result(timeout=60)
    with RawConnection(int(bootstrap.rsplit(":", 1)[1])) as conn:
        join(conn, "queue", "m1", "jobs")
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(10):
            producer.produce("jobs", value=b"job %d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        topic_id = topic_id_of(conn, "jobs")
        assert acquire(conn, "queue", "m1", topic_id) == [(0, 4, 1)]  # partition 0
        Ack = m.ShareAcknowledgeRequest.AcknowledgeTopic
        acked = conn.request(m.ApiKey.SHARE_ACKNOWLEDGE, 1, m.ShareAcknowledgeRequest(
            group_id="queue", member_id="m1", share_session_epoch=-1,
            topics=[Ack(topic_id=topic_id, partitions=[Ack.AcknowledgePartition(
                partition_index=0, acknowledgement_batches=[
                    Ack.AcknowledgePartition.AcknowledgementBatch(
                        first_offset=0, last_offset=2, acknowledge_types=[1])])])]))  # fmt: skip
        assert acked.responses[0].partitions[0].error_code == ErrorCode.NONE


async def test_a_share_groups_start_offsets_and_lag(broker: Broker, bootstrap: str) -> None:
    await trio.to_thread.run_sync(share_group_with_acknowledgements, bootstrap)
    groups = (await call(broker, "GET", "/api/groups")).json()["groups"]
    [listed] = [g for g in groups if g["group_id"] == "queue"]
    assert (listed["type"], listed["partitions"], listed["lag"]) == ("share", 2, 7)
    group = (await call(broker, "GET", "/api/groups/queue")).json()
    assert group["error"] is None and group["protocol_type"] == "share"
    rows = {p["partition"]: (p["committed"], p["end"], p["lag"]) for p in group["partitions"]}
    assert rows == {0: (3, 5, 2), 1: (0, 5, 5)}, group
