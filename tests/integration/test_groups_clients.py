"""Consumer groups end to end: real clients, real sockets, an in-process broker.

* three client libraries (confluent-kafka, kafka-python, aiokafka) share one group
  on a 6-partition topic while members join and leave: every record is consumed and
  no partition is owned by two members of the same generation;
* committed offsets survive a broker restart (and the emptied group's generation);
* kcat's balanced consumer (``-G``) and a static member (group.instance.id);
* a raw client walks every version of every group and offset API.

Blocking clients run in worker threads (aiokafka with its own asyncio loop in one).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.kafka_python_groups import knows_its_topics
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import StableGeneration
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

T = TypeVar("T")
TOPIC = "orders"
PARTITIONS = 6


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", group_initial_rebalance_delay_ms=0)


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def produce(bootstrap: str, topic: str, values: list[str], partitions: int = PARTITIONS) -> None:
    from confluent_kafka import Producer

    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % partitions, on_delivery=delivered)
    assert producer.flush(15) == 0 and not errors, errors


def assigned(assignment: bytes) -> Iterator[tuple[str, int]]:
    """The (topic, partition) pairs of a ConsumerProtocolAssignment."""
    if not assignment:
        return
    pos = 2  # version
    (topics,) = struct.unpack_from(">i", assignment, pos)
    pos += 4
    for _ in range(topics):
        (size,) = struct.unpack_from(">h", assignment, pos)
        topic = assignment[pos + 2 : pos + 2 + size].decode()
        pos += 2 + size
        (count,) = struct.unpack_from(">i", assignment, pos)
        pos += 4
        for partition in struct.unpack_from(f">{count}i", assignment, pos):
            yield topic, partition
        pos += 4 * count


def check_generations(stable: list[StableGeneration]) -> None:
    """No partition is owned by two members of the same generation."""
    for generation in stable:
        owners: dict[tuple[str, int], str] = {}
        for member_id, assignment in generation.assignments.items():
            for tp in assigned(assignment):
                assert tp not in owners, f"gen {generation.generation_id}: {tp} owned twice"
                owners[tp] = member_id


@contextlib.asynccontextmanager
async def stopping(*stops: threading.Event) -> AsyncIterator[None]:
    """Tell the client threads to stop when the block ends, by a failed wait too.

    Entered after the nursery that runs them (so left before it waits for them): a wait
    that times out then fails the test at once, instead of the nursery waiting for
    consumers that nobody told to stop until pytest-timeout ends the whole worker's
    Trio run (ci16: the next test on that worker failed with "run() inside a run()").
    """
    try:
        yield
    finally:
        for stop in stops:
            stop.set()


# ----------------------------------------------------------------------------- consumers


class Consumed:
    """Values consumed by each client, shared between worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_client: dict[str, list[str]] = {}

    def add(self, client: str, values: list[str]) -> None:
        with self.lock:
            self.by_client.setdefault(client, []).extend(values)

    def all(self) -> set[str]:
        with self.lock:
            return {v for values in self.by_client.values() for v in values}

    def count(self, client: str) -> int:
        with self.lock:
            return len(self.by_client.get(client, []))


def run_confluent(bootstrap: str, group: str, consumed: Consumed, stop: threading.Event,
                  extra: dict[str, Any] | None = None, name: str = "confluent") -> None:  # fmt: skip
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 500, **(extra or {}),
    })  # fmt: skip
    consumer.subscribe([TOPIC])
    try:
        while not stop.is_set():
            messages = consumer.consume(100, timeout=0.2)
            values = [bytes(msg.value() or b"").decode() for msg in messages if not msg.error()]
            if values:
                consumed.add(name, values)
                try:
                    consumer.commit(asynchronous=False)
                except KafkaException:
                    pass  # a rebalance got in the way; the next commit covers it
    finally:
        consumer.close()


def run_kafka_python(bootstrap: str, group: str, consumed: Consumed, stop: threading.Event) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    consumer = knows_its_topics(KafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, heartbeat_interval_ms=500, session_timeout_ms=10_000,
    ))  # fmt: skip
    try:
        while not stop.is_set():
            batches = consumer.poll(timeout_ms=200)
            values = [r.value.decode() for records in batches.values() for r in records]
            if values:
                consumed.add("kafka-python", values)
                try:
                    consumer.commit()
                except KafkaError:
                    pass
    finally:
        consumer.close()  # sends LeaveGroup


def run_aiokafka(bootstrap: str, group: str, consumed: Consumed, stop: threading.Event) -> None:
    async def main() -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.errors import KafkaError

        consumer = AIOKafkaConsumer(
            TOPIC, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=False, heartbeat_interval_ms=500, session_timeout_ms=10_000,
        )  # fmt: skip
        await consumer.start()
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                values = [r.value.decode() for records in batches.values() for r in records]
                if values:
                    consumed.add("aiokafka", values)
                    try:
                        await consumer.commit()
                    except KafkaError:
                        pass
        finally:
            await consumer.stop()

    asyncio.run(main())


# ----------------------------------------------------------------------------- tests


@pytest.mark.timeout(300)
async def test_three_client_libraries_share_a_group(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    stable: list[StableGeneration] = []
    broker.groups.observers.append(stable.append)
    consumed = Consumed()
    produced = [f"first-{i}" for i in range(120)]
    await in_thread(lambda: produce(bootstrap, TOPIC, produced))

    def members_now() -> int:
        return len(stable[-1].assignments) if stable else 0

    stop_all, stop_kp = threading.Event(), threading.Event()
    async with trio.open_nursery() as nursery, stopping(stop_all, stop_kp):
        nursery.start_soon(in_thread, lambda: run_confluent(bootstrap, "mixed", consumed, stop_all))
        await eventually(lambda: members_now() == 1, "confluent-kafka alone")
        nursery.start_soon(
            in_thread, lambda: run_kafka_python(bootstrap, "mixed", consumed, stop_kp)
        )
        await eventually(lambda: members_now() == 2, "kafka-python to join")
        nursery.start_soon(in_thread, lambda: run_aiokafka(bootstrap, "mixed", consumed, stop_all))
        await eventually(lambda: members_now() == 3, "aiokafka to join")
        # aiokafka only speaks roundrobin: the one protocol every member supports.
        assert stable[-1].protocol_name == "roundrobin"
        three_members = stable[-1]
        more = [f"second-{i}" for i in range(120)]
        await in_thread(lambda: produce(bootstrap, TOPIC, more))
        produced += more
        await eventually(lambda: set(produced) <= consumed.all(), "three members to consume")
        stop_kp.set()  # kafka-python leaves; its partitions move to the others
        await eventually(lambda: members_now() == 2, "kafka-python to leave")
        last = [f"third-{i}" for i in range(120)]
        await in_thread(lambda: produce(bootstrap, TOPIC, last))
        produced += last
        await eventually(lambda: set(produced) <= consumed.all(), "every record")
        stop_all.set()
    check_generations(stable)
    covered = {tp for a in three_members.assignments.values() for tp in assigned(a)}
    assert covered == {(TOPIC, p) for p in range(PARTITIONS)}
    assert all(consumed.count(c) > 0 for c in ("confluent", "kafka-python", "aiokafka"))
    # Everyone left: the group is Empty, its offsets cover everything produced.
    group = broker.groups.groups["mixed"]
    await eventually(lambda: group.is_empty(), "the group to empty")
    committed = broker.groups.committed_for_group("mixed")
    assert sum(v.offset for v in committed.values()) == len(produced)


@pytest.mark.timeout(300)
async def test_committed_offsets_survive_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", group_initial_rebalance_delay_ms=0)
    first = [f"before-{i}" for i in range(60)]
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        broker.topics.create(TOPIC, PARTITIONS)
        await in_thread(lambda: produce(bootstrap, TOPIC, first))
        consumed, stop = Consumed(), threading.Event()
        async with trio.open_nursery() as clients, stopping(stop):  # closed before the broker stops
            clients.start_soon(
                in_thread, lambda: run_confluent(bootstrap, "resume", consumed, stop)
            )
            await eventually(lambda: sum(v.offset for v in broker.groups.committed_for_group("resume").values())
                == len(first), "the first records to be committed")  # fmt: skip
            stop.set()
        nursery.cancel_scope.cancel()  # stop the broker

    second = [f"after-{i}" for i in range(60)]
    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(config).run)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        # Offsets are loaded before the first client can connect; the group is Empty (its
        # member left) at the generation stored when it emptied: 1 Stable, 2 Empty.
        group = broker.groups.groups["resume"]
        assert group.is_empty() and group.generation_id == 2
        committed = broker.groups.committed_for_group("resume")
        assert {p: v.offset for (_, p), v in committed.items()} == dict.fromkeys(range(6), 10)
        await in_thread(lambda: produce(bootstrap, TOPIC, second))
        consumed, stop = Consumed(), threading.Event()
        async with trio.open_nursery() as clients, stopping(stop):
            clients.start_soon(
                in_thread, lambda: run_kafka_python(bootstrap, "resume", consumed, stop)
            )
            await eventually(lambda: set(second) <= consumed.all(), "records after restart")
            stop.set()
        nursery.cancel_scope.cancel()
    assert not consumed.all() & set(first), "resumed from before the committed offsets"


@pytest.mark.timeout(300)
async def test_kcat_balanced_consumer(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, 3)
    values = [f"kcat-{i}" for i in range(30)]
    await in_thread(lambda: produce(bootstrap, TOPIC, values, partitions=3))
    with trio.fail_after(30):
        done = await trio.run_process(
            ["kcat", "-b", bootstrap, "-G", "kcat-group", TOPIC, "-o", "beginning", "-e", "-q",
             "-f", "%s\\n"],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(done.stdout.decode().split()) == sorted(values)
    # kcat commits what it consumed when it closes.
    committed = broker.groups.committed_for_group("kcat-group")
    assert {p: v.offset for (_, p), v in committed.items()} == {0: 10, 1: 10, 2: 10}


@pytest.mark.timeout(300)
async def test_static_member_restart_keeps_its_assignment(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    stable: list[StableGeneration] = []
    broker.groups.observers.append(stable.append)
    consumed = Consumed()
    stop_a, stop_b = threading.Event(), threading.Event()
    static_a = {"group.instance.id": "instance-a", "session.timeout.ms": 6000}
    static_b = {"group.instance.id": "instance-b", "session.timeout.ms": 6000}
    a_closed = trio.Event()

    async def member_a() -> None:
        await in_thread(lambda: run_confluent(bootstrap, "static", consumed, stop_a, static_a, "a"))
        a_closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(member_a)
        nursery.start_soon(in_thread, lambda: run_confluent(
            bootstrap, "static", consumed, stop_b, static_b, "b"))  # fmt: skip
        await eventually(
            lambda: bool(stable) and len(stable[-1].assignments) == 2, "two static members"
        )
        group = broker.groups.groups["static"]
        generation = group.generation_id
        old_id = group.static_members["instance-a"]
        old_assignment = group.members[old_id].assignment
        stop_a.set()  # a static member closes without leaving the group...
        with trio.fail_after(30):
            await a_closed.wait()
        restarted = threading.Event()
        nursery.start_soon(in_thread, lambda: run_confluent(
            bootstrap, "static", consumed, restarted, static_a, "a2"))  # fmt: skip
        await eventually(lambda: group.static_members["instance-a"] != old_id, "a restart")
        # ...and comes back within its session: same generation, same partitions.
        new_id = group.static_members["instance-a"]
        assert group.generation_id == generation and group.members[new_id].assignment == (
            old_assignment
        )
        restarted.set()
        stop_b.set()


# ----------------------------------------------------------------------------- raw protocol


async def raw_client(broker: Broker) -> RawClient:
    return RawClient(await trio.open_tcp_stream(*broker.bound[0]), client_id="raw")


def version_of(api_key: int, i: int) -> int:
    schema = m.request_schema(api_key)
    return max(schema.min_version, min(i, schema.max_version))


@pytest.mark.parametrize("i", range(11))
async def test_every_version_of_the_group_apis(broker: Broker, i: int) -> None:
    """One member's life at version i of each API (clamped to what the API has)."""
    broker.topics.create(TOPIC, 2)
    topic_id = broker.topics.get(TOPIC).topic_id  # type: ignore[union-attr]
    client = await raw_client(broker)
    group = f"raw-{i}"
    v = {key: version_of(key, i) for key in (
        m.ApiKey.FIND_COORDINATOR, m.ApiKey.JOIN_GROUP, m.ApiKey.SYNC_GROUP, m.ApiKey.HEARTBEAT,
        m.ApiKey.LEAVE_GROUP, m.ApiKey.LIST_GROUPS, m.ApiKey.DESCRIBE_GROUPS,
        m.ApiKey.DELETE_GROUPS, m.ApiKey.OFFSET_COMMIT, m.ApiKey.OFFSET_FETCH,
    )}  # fmt: skip

    found = await client.call(
        m.ApiKey.FIND_COORDINATOR, v[m.ApiKey.FIND_COORDINATOR],
        m.FindCoordinatorRequest(key=group, key_type=0, coordinator_keys=[group, "other"]),
    )  # fmt: skip
    if v[m.ApiKey.FIND_COORDINATOR] >= 4:
        assert [(c.key, c.error_code, c.port) for c in found.coordinators] == [
            (group, 0, broker.bound[0][1]), ("other", 0, broker.bound[0][1]),
        ]  # fmt: skip
    else:
        assert (found.error_code, found.port) == (ErrorCode.NONE, broker.bound[0][1])
    if v[m.ApiKey.FIND_COORDINATOR] >= 1:
        txn = await client.call(
            m.ApiKey.FIND_COORDINATOR, v[m.ApiKey.FIND_COORDINATOR],
            m.FindCoordinatorRequest(key="tx", key_type=1, coordinator_keys=["tx"]),
        )  # fmt: skip
        error = (
            txn.coordinators[0].error_code
            if v[m.ApiKey.FIND_COORDINATOR] >= 4
            else (txn.error_code)
        )
        assert error == ErrorCode.NONE  # this broker is the transaction coordinator too

    Join = m.JoinGroupRequest
    join = Join(
        group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000, member_id="",
        group_instance_id=None, protocol_type="consumer", reason=None,
        protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"meta")],
    )  # fmt: skip
    jv = v[m.ApiKey.JOIN_GROUP]
    joined = await client.call(m.ApiKey.JOIN_GROUP, jv, join)
    if jv >= 4:  # KIP-394
        assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED and joined.member_id
        join.member_id = joined.member_id
        joined = await client.call(m.ApiKey.JOIN_GROUP, jv, join)
    assert joined.error_code == ErrorCode.NONE and joined.generation_id == 1
    assert joined.leader == joined.member_id and joined.protocol_name == "range"
    assert [(x.member_id, bytes(x.metadata)) for x in joined.members] == [
        (joined.member_id, b"meta")
    ]
    member_id = joined.member_id

    Sync = m.SyncGroupRequest
    synced = await client.call(m.ApiKey.SYNC_GROUP, v[m.ApiKey.SYNC_GROUP], Sync(
        group_id=group, generation_id=1, member_id=member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[Sync.SyncGroupRequestAssignment(member_id=member_id, assignment=b"mine")],
    ))  # fmt: skip
    assert (synced.error_code, bytes(synced.assignment)) == (ErrorCode.NONE, b"mine")

    beat = m.HeartbeatRequest(group_id=group, generation_id=1, member_id=member_id)
    hv = v[m.ApiKey.HEARTBEAT]
    assert (await client.call(m.ApiKey.HEARTBEAT, hv, beat)).error_code == ErrorCode.NONE
    beat.generation_id = 0
    assert (await client.call(m.ApiKey.HEARTBEAT, hv, beat)).error_code == (
        ErrorCode.ILLEGAL_GENERATION
    )

    cv, fv = v[m.ApiKey.OFFSET_COMMIT], v[m.ApiKey.OFFSET_FETCH]
    Commit = m.OffsetCommitRequest
    commit = Commit(
        group_id=group, generation_id_or_member_epoch=1, member_id=member_id,
        group_instance_id=None, retention_time_ms=-1,
        topics=[Commit.OffsetCommitRequestTopic(name=TOPIC, topic_id=topic_id, partitions=[
            Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=40 + p, committed_leader_epoch=0,
                committed_metadata=f"m{p}")
            for p in (0, 1, 7)
        ])],
    )  # fmt: skip
    committed = await client.call(m.ApiKey.OFFSET_COMMIT, cv, commit)
    assert [x.error_code for x in committed.topics[0].partitions] == [
        ErrorCode.NONE, ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]  # fmt: skip
    commit.generation_id_or_member_epoch = 0  # a zombie of an older generation
    stale = await client.call(m.ApiKey.OFFSET_COMMIT, cv, commit)
    assert stale.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION

    Fetch = m.OffsetFetchRequest
    if fv >= 8:
        Group = Fetch.OffsetFetchRequestGroup
        fetch = Fetch(require_stable=True, groups=[
            Group(group_id=group, member_id=None, member_epoch=-1, topics=[
                Group.OffsetFetchRequestTopics(name=TOPIC, topic_id=topic_id,
                                               partition_indexes=[0, 1, 5])]),
            Group(group_id="nobody", member_id=None, member_epoch=-1, topics=None),
        ])  # fmt: skip
        fetched = await client.call(m.ApiKey.OFFSET_FETCH, fv, fetch)
        ours, nobody = fetched.groups
        assert [(x.partition_index, x.committed_offset, x.metadata)
                for x in ours.topics[0].partitions] == [(0, 40, "m0"), (1, 41, "m1"), (5, -1, "")]  # fmt: skip
        assert nobody.topics == [] and nobody.error_code == ErrorCode.NONE
    else:
        fetch = Fetch(group_id=group, require_stable=True, topics=[
            Fetch.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0, 1, 5])
        ])  # fmt: skip
        fetched = await client.call(m.ApiKey.OFFSET_FETCH, fv, fetch)
        assert [(x.partition_index, x.committed_offset, x.metadata)
                for x in fetched.topics[0].partitions] == [(0, 40, "m0"), (1, 41, "m1"), (5, -1, "")]  # fmt: skip
        if fv >= 2:  # all topics
            everything = await client.call(
                m.ApiKey.OFFSET_FETCH, fv, Fetch(group_id=group, topics=None)
            )
            assert [len(t.partitions) for t in everything.topics] == [2]

    lv = v[m.ApiKey.LIST_GROUPS]
    listed = await client.call(
        m.ApiKey.LIST_GROUPS, lv, m.ListGroupsRequest(states_filter=["stable"], types_filter=[])
    )
    assert [(g.group_id, g.protocol_type) for g in listed.groups] == [(group, "consumer")]
    if lv >= 4:
        assert listed.groups[0].group_state == "Stable"
        empty_only = await client.call(
            m.ApiKey.LIST_GROUPS, lv, m.ListGroupsRequest(states_filter=["Empty"], types_filter=[])
        )
        assert empty_only.groups == []

    dv = v[m.ApiKey.DESCRIBE_GROUPS]
    described = await client.call(m.ApiKey.DESCRIBE_GROUPS, dv, m.DescribeGroupsRequest(
        groups=[group, "nobody"], include_authorized_operations=False))  # fmt: skip
    ours_d, nobody_d = described.groups
    assert (ours_d.group_state, ours_d.protocol_data) == ("Stable", "range")
    assert [(x.member_id, x.client_id, bytes(x.member_assignment)) for x in ours_d.members] == [
        (member_id, "raw", b"mine")
    ]
    assert nobody_d.error_code == (ErrorCode.GROUP_ID_NOT_FOUND if dv >= 6 else ErrorCode.NONE)

    deleted = await client.call(m.ApiKey.DELETE_GROUPS, v[m.ApiKey.DELETE_GROUPS],
                                m.DeleteGroupsRequest(groups_names=[group]))  # fmt: skip
    assert deleted.results[0].error_code == ErrorCode.NON_EMPTY_GROUP

    leave_v = v[m.ApiKey.LEAVE_GROUP]
    Leave = m.LeaveGroupRequest
    left = await client.call(m.ApiKey.LEAVE_GROUP, leave_v, Leave(
        group_id=group, member_id=member_id,
        members=[Leave.MemberIdentity(member_id=member_id, group_instance_id=None, reason="bye")],
    ))  # fmt: skip
    assert left.error_code == ErrorCode.NONE
    if leave_v >= 3:
        assert [x.error_code for x in left.members] == [ErrorCode.NONE]

    deleted = await client.call(m.ApiKey.DELETE_GROUPS, v[m.ApiKey.DELETE_GROUPS],
                                m.DeleteGroupsRequest(groups_names=[group, "nobody"]))  # fmt: skip
    assert [x.error_code for x in deleted.results] == [
        ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND,
    ]  # fmt: skip
    assert broker.groups.committed_for_group(group) == {}


async def test_simple_consumer_commits_and_offset_delete(broker: Broker) -> None:
    broker.topics.create(TOPIC, 2)
    client = await raw_client(broker)
    Commit = m.OffsetCommitRequest
    commit = Commit(
        group_id="simple", generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, retention_time_ms=-1,
        topics=[Commit.OffsetCommitRequestTopic(name=TOPIC, partitions=[
            Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=5, committed_metadata="x" * 5000),
            Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=1, committed_offset=6, committed_metadata=None),
        ])],
    )  # fmt: skip
    response = await client.call(m.ApiKey.OFFSET_COMMIT, 8, commit)
    assert [x.error_code for x in response.topics[0].partitions] == [
        ErrorCode.OFFSET_METADATA_TOO_LARGE, ErrorCode.NONE,
    ]  # fmt: skip
    assert broker.groups.committed("simple", TOPIC, 1).offset == 6  # type: ignore[union-attr]
    Delete = m.OffsetDeleteRequest
    deleted = await client.call(m.ApiKey.OFFSET_DELETE, 0, Delete(group_id="simple", topics=[
        Delete.OffsetDeleteRequestTopic(name=TOPIC, partitions=[
            Delete.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=1)]),
        Delete.OffsetDeleteRequestTopic(name="missing", partitions=[
            Delete.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)]),
    ]))  # fmt: skip
    assert deleted.error_code == ErrorCode.NONE
    assert [t.partitions[0].error_code for t in deleted.topics] == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]  # fmt: skip
    assert broker.groups.committed("simple", TOPIC, 1) is None
    nobody = await client.call(m.ApiKey.OFFSET_DELETE, 0, Delete(group_id="nobody", topics=[]))
    assert nobody.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_assignment_decoder() -> None:
    raw = struct.pack(">hih", 0, 1, 1) + b"t" + struct.pack(">iii", 2, 0, 3) + struct.pack(">i", -1)
    assert list(assigned(raw)) == [("t", 0), ("t", 3)]
    assert list(assigned(b"")) == []


#: A group member in its own process, so the test can kill -9 it: it prints each
#: value it consumed (after committing it) and never leaves the group politely.
KILLABLE_MEMBER = """
import sys
from confluent_kafka import Consumer
consumer = Consumer({
    "bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "auto.offset.reset": "earliest",
    "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
})
consumer.subscribe([sys.argv[3]])
print("started", flush=True)
while True:
    for msg in consumer.consume(100, timeout=0.2):
        if not msg.error():
            consumer.commit(message=msg, asynchronous=False)
            print(msg.value().decode(), flush=True)
"""


@pytest.mark.timeout(300)
async def test_a_killed_member_is_expired_and_its_partitions_move(
    broker: Broker, bootstrap: str
) -> None:
    """kill -9 one member: its session expires, the survivor takes over every partition."""
    import subprocess
    import sys

    broker.topics.create(TOPIC, PARTITIONS)
    stable: list[StableGeneration] = []
    broker.groups.observers.append(stable.append)
    before = [f"before-kill-{i}" for i in range(120)]
    await in_thread(lambda: produce(bootstrap, TOPIC, before))
    victim = await in_thread(
        lambda: subprocess.Popen(
            [sys.executable, "-c", KILLABLE_MEMBER, bootstrap, "killed", TOPIC],
            stdout=subprocess.PIPE, text=True,
        )
    )  # fmt: skip
    victim_values: list[str] = []
    reader = threading.Thread(
        target=lambda: victim_values.extend(line.strip() for line in victim.stdout or []),
        daemon=True,
    )
    reader.start()
    consumed, stop = Consumed(), threading.Event()
    try:
        await eventually(lambda: bool(stable) and len(stable[-1].assignments) == 1, "victim")
        async with trio.open_nursery() as nursery, stopping(stop):
            nursery.start_soon(
                in_thread, lambda: run_confluent(bootstrap, "killed", consumed, stop)
            )
            await eventually(lambda: len(stable[-1].assignments) == 2, "two members")
            two_members = stable[-1]
            victim.kill()  # no LeaveGroup: only the session timeout can notice
            victim.wait(10)
            await eventually(
                lambda: (
                    stable[-1].generation_id > two_members.generation_id
                    and len(stable[-1].assignments) == 1
                ),
                "the killed member's session to expire",
            )
            after = [f"after-kill-{i}" for i in range(120)]
            await in_thread(lambda: produce(bootstrap, TOPIC, after))
            await eventually(lambda: set(after) <= consumed.all(), "records after the kill")
            # Whatever the victim did not commit before dying is read by the survivor.
            await eventually(
                lambda: set(before) <= consumed.all() | set(victim_values), "every record"
            )
            stop.set()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    check_generations(stable)
    survivor = stable[-1]
    covered = {tp for a in survivor.assignments.values() for tp in assigned(a)}
    assert covered == {(TOPIC, p) for p in range(PARTITIONS)}
