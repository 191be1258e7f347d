"""KIP-848 (group.protocol=consumer) against a real broker process.

librdkafka (confluent-kafka 2.16) members share a topic through ConsumerGroupHeartbeat,
a third joins and one leaves, with every record read once and the offsets committed;
then raw ConsumerGroupHeartbeat / OffsetCommit / OffsetFetch / ConsumerGroupDescribe
requests over a socket check the errors Kafka gives bad input. The Java client's side
is ``tests/jvm/.../ConsumerProtocolTest.java`` (run by test_java_client.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.waits import wait_until
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

PARTITIONS = 4
WAIT_S = 60
HB = m.ConsumerGroupHeartbeatRequest


def make_topic(bootstrap: str, name: str, records: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(records):
        producer.produce(name, value=f"r{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })  # fmt: skip
        self.consumer.subscribe([topic])
        self.read: list[str] = []

    def step(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is not None:
            assert msg.error() is None, msg.error()
            value = msg.value()
            assert value is not None
            self.read.append(value.decode())
            self.consumer.commit(message=msg, asynchronous=False)

    def owned(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}


def shared(members: list[Member], each: int) -> Callable[[], bool]:
    def check() -> bool:
        for member in members:
            member.step()
        owned = [member.owned() for member in members]
        together = set().union(*owned)
        no_overlap = sum(map(len, owned)) == len(together)
        return no_overlap and all(len(o) == each for o in owned) and len(together) == PARTITIONS

    return check


def test_librdkafka_members_share_move_and_leave(
    fast_heartbeat_broker: BrokerProcess,
) -> None:
    bootstrap = fast_heartbeat_broker.bootstrap
    topic, group = f"kip848-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    make_topic(bootstrap, topic, 40)
    a, b = Member(bootstrap, group, topic, "a"), Member(bootstrap, group, topic, "b")
    try:
        wait_until(shared([a, b], 2), "a and b to own two partitions each")
        wait_until(lambda: _steps([a, b]) or len(a.read) + len(b.read) >= 40, "40 records")
        c = Member(bootstrap, group, topic, "c")
        wait_until(_three_way([a, b, c]), "a, b and c to share the partitions")
        make_topic_more(bootstrap, topic, 40, 40)
        wait_until(lambda: _steps([a, b, c]) or sum(len(x.read) for x in (a, b, c)) >= 80, "80")
        c.consumer.close()
        make_topic_more(bootstrap, topic, 80, 40)
        wait_until(shared([a, b], 2), "a and b to take c's partitions")
        wait_until(lambda: _steps([a, b]) or len(a.read) + len(b.read) + len(c.read) >= 120, "120")
        everything = a.read + b.read + c.read
        assert len(everything) == 120, "a record was read twice"
        assert set(everything) == {f"r{i}" for i in range(120)}
        committed = a.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        assert [tp.offset for tp in committed] == [30] * PARTITIONS
    finally:
        a.consumer.close()
        b.consumer.close()


def _three_way(members: list[Member]) -> Callable[[], bool]:
    """Four partitions over three members: 2/1/1, each partition once."""

    def check() -> bool:
        _steps(members)
        owned = [x.owned() for x in members]
        together = set().union(*owned)
        return (
            sorted(map(len, owned)) == [1, 1, 2]
            and len(together) == PARTITIONS
            and sum(map(len, owned)) == PARTITIONS
        )

    return check


def _steps(members: list[Member]) -> bool:
    """Step each member; False, so that ``_steps(...) or condition`` reads the condition."""
    for member in members:
        member.step()
    return False


def make_topic_more(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def test_bad_heartbeats_commits_and_fetches(broker_process: BrokerProcess) -> None:
    topic, group = f"kip848-raw-{uuid.uuid4().hex[:8]}", f"raw-{uuid.uuid4().hex[:8]}"
    make_topic(broker_process.bootstrap, topic, 0)
    with broker_process.connect() as conn:

        def beat(version: int = 1, **fields: Any) -> m.ConsumerGroupHeartbeatResponse:
            body: dict[str, Any] = {"group_id": group, "member_id": "", "member_epoch": 0,
                    "rebalance_timeout_ms": 30_000, "subscribed_topic_names": [topic],
                    "topic_partitions": []}  # fmt: skip
            body.update(fields)
            answer: m.ConsumerGroupHeartbeatResponse = conn.request(
                m.ApiKey.CONSUMER_GROUP_HEARTBEAT, version, HB(**body)
            )
            return answer

        # A heartbeat for a member nobody knows, and a stale or future epoch.
        assert beat(member_id="ghost", member_epoch=3, topic_partitions=None).error_code == (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        joined = beat(member_id="m1")
        assert joined.error_code == ErrorCode.NONE
        assert joined.member_id == "m1" and joined.member_epoch == 1
        assert joined.heartbeat_interval_ms == 5000
        assert joined.assignment is not None
        assert sorted(joined.assignment.topic_partitions[0].partitions) == list(range(PARTITIONS))
        other = beat(member_id="ghost", member_epoch=1, topic_partitions=None)
        assert other.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        future = beat(member_id="m1", member_epoch=7, topic_partitions=None)
        assert future.error_code == ErrorCode.FENCED_MEMBER_EPOCH
        # Bad requests: an unknown assignor, a bad regex, no subscription.
        bad = beat(member_id="m2", server_assignor="sticky")
        assert bad.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
        assert "uniform, range" in (bad.error_message or "")
        regex = beat(member_id="m2", subscribed_topic_regex="kip848-(")
        assert regex.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
        # Matched with RE2, as Kafka's RE2/J: what needs backtracking (a back-reference,
        # which Python's re would run) is refused, and so is a pattern over 1 KiB.
        for refused in (r"(kip848)\1", "a" * 1025):
            regex = beat(member_id="m2", subscribed_topic_regex=refused)
            assert regex.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION, refused
        empty = beat(member_id="m2", subscribed_topic_names=[])
        assert empty.error_code == ErrorCode.INVALID_REQUEST
        assert beat(member_id="m2", member_epoch=-3).error_code == ErrorCode.INVALID_REQUEST

        # Commits are fenced by the member epoch (OffsetCommit v9); fetches too (v9).
        def commit(member_id: str, epoch: int, version: int = 9) -> int:
            Req = m.OffsetCommitRequest
            answer = conn.request(m.ApiKey.OFFSET_COMMIT, version, Req(
                group_id=group, generation_id_or_member_epoch=epoch, member_id=member_id,
                topics=[Req.OffsetCommitRequestTopic(name=topic, partitions=[
                    Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=5)])]))  # fmt: skip
            code: int = answer.topics[0].partitions[0].error_code
            return code

        assert commit("m1", 1) == ErrorCode.NONE
        assert commit("m1", 0) == ErrorCode.STALE_MEMBER_EPOCH
        assert commit("ghost", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit("m1", 1, version=8) == ErrorCode.UNSUPPORTED_VERSION

        def fetch(member_id: str | None, epoch: int) -> int:
            Req = m.OffsetFetchRequest
            answer = conn.request(m.ApiKey.OFFSET_FETCH, 9, Req(groups=[
                Req.OffsetFetchRequestGroup(group_id=group, member_id=member_id,
                                            member_epoch=epoch, topics=None)]))  # fmt: skip
            code: int = answer.groups[0].error_code
            return code

        assert fetch("m1", 1) == ErrorCode.NONE
        assert fetch("m1", 2) == ErrorCode.STALE_MEMBER_EPOCH
        assert fetch("ghost", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert fetch(None, -1) == ErrorCode.NONE  # an admin's fetch

        described = conn.request(
            m.ApiKey.CONSUMER_GROUP_DESCRIBE, 0,
            m.ConsumerGroupDescribeRequest(group_ids=[group, "no-such-group"]),
        )  # fmt: skip
        mine, missing = described.groups
        assert (mine.error_code, mine.group_state, mine.group_epoch) == (0, "Stable", 1)
        assert mine.assignor_name == "uniform"
        assert [x.member_id for x in mine.members] == ["m1"]
        assert missing.error_code == ErrorCode.GROUP_ID_NOT_FOUND

        listed = conn.request(m.ApiKey.LIST_GROUPS, 5, m.ListGroupsRequest(
            states_filter=[], types_filter=["consumer"]))  # fmt: skip
        assert [(g.group_id, g.group_type, g.protocol_type) for g in listed.groups] == [
            (group, "consumer", "consumer")
        ]

        # OffsetDelete: a topic the members subscribe to keeps its offsets.
        Del = m.OffsetDeleteRequest
        deleted = conn.request(m.ApiKey.OFFSET_DELETE, 0, Del(group_id=group, topics=[
            Del.OffsetDeleteRequestTopic(name=topic, partitions=[
                Del.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
                    partition_index=0)])]))  # fmt: skip
        assert deleted.error_code == ErrorCode.NONE
        assert deleted.topics[0].partitions[0].error_code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC

        # Leaving: the member is gone, the group Empty, a second leave is unknown.
        left = beat(member_id="m1", member_epoch=-1, topic_partitions=None)
        assert (left.error_code, left.member_epoch) == (ErrorCode.NONE, -1)
        again = beat(member_id="m1", member_epoch=-1, topic_partitions=None)
        assert again.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit("m1", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit("", -1) == ErrorCode.NONE  # an admin commit into the empty group


def test_librdkafka_subscribes_by_regex(fast_heartbeat_broker: BrokerProcess) -> None:
    """librdkafka sends a "^..." subscription as SubscribedTopicRegex: the broker resolves
    it, and a matching topic created later joins the subscription."""
    bootstrap = fast_heartbeat_broker.bootstrap
    prefix = f"kip848-re-{uuid.uuid4().hex[:6]}"
    make_topic(bootstrap, f"{prefix}-one", 8)
    make_topic(bootstrap, f"other-{prefix}", 4)  # does not match
    member = Member(bootstrap, f"re-{prefix}", f"^{prefix}-.*", "regex")
    try:
        wait_until(lambda: _steps([member]) or len(member.read) >= 8, "the first topic's records")
        make_topic(bootstrap, f"{prefix}-two", 8)
        wait_until(lambda: _steps([member]) or len(member.read) >= 16, "the second topic's too")
        assert len(member.read) == 16
        topics = {tp.topic for tp in member.consumer.assignment()}
        assert topics == {f"{prefix}-one", f"{prefix}-two"}
    finally:
        member.consumer.close()


# --------------------------------------------------------------------------- timers, static


class ShortSessionBroker(BrokerProcess):
    """Sessions of 3 s, heartbeats every second, ``range`` first among the assignors."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.properties = data_dir.parent / "kip848.properties"
        self.properties.write_text(
            f"group.consumer.session.timeout.ms={SHORT_SESSION_MS}\n"
            "group.consumer.heartbeat.interval.ms=1000\n"
            "group.consumer.assignors=range,uniform\n"
        )

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.properties)]


SHORT_SESSION_MS = 3000
#: How often the tests' members heartbeat: the protocol's cadence, well inside a session.
BEAT_S = 0.3


class FastHeartbeatBroker(BrokerProcess):
    """Heartbeats every second, sessions as shipped (45 s).

    A KIP-848 member learns of a new target assignment, and gives up or takes a partition,
    at its heartbeats: at the default 5 s a move of partitions between librdkafka members
    took several of them (21 s for the test below at load 17, where 1 s gives the same
    moves in less). The session stays long: a loaded machine never fences a member, which
    would read a record twice."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.properties = data_dir.parent / "heartbeat.properties"
        self.properties.write_text("group.consumer.heartbeat.interval.ms=1000\n")

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.properties)]


@pytest.fixture
def fast_heartbeat_broker(tmp_path: Path) -> Iterator[FastHeartbeatBroker]:
    broker = FastHeartbeatBroker(tmp_path / "data")
    broker.start()
    try:
        yield broker
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


@pytest.fixture
def short_session_broker(tmp_path: Path) -> Iterator[ShortSessionBroker]:
    broker = ShortSessionBroker(tmp_path / "data")
    broker.start()
    try:
        yield broker
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


class RawMember:
    """One member speaking ConsumerGroupHeartbeat v1 over a raw connection."""

    def __init__(self, conn: Any, group: str, topic: str, topic_id: uuid.UUID,
                 member_id: str, instance_id: str | None = None,
                 rebalance_timeout_ms: int = 30_000) -> None:  # fmt: skip
        self.conn, self.group, self.topic, self.topic_id = conn, group, topic, topic_id
        self.member_id, self.instance_id = member_id, instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.epoch = 0
        self.owned: set[int] = set()

    def beat(self, epoch: int | None = None) -> m.ConsumerGroupHeartbeatResponse:
        epoch = self.epoch if epoch is None else epoch
        joining = epoch == 0
        answer: m.ConsumerGroupHeartbeatResponse = self.conn.request(
            m.ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, HB(
                group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                instance_id=self.instance_id,
                rebalance_timeout_ms=self.rebalance_timeout_ms if joining else -1,
                subscribed_topic_names=[self.topic] if joining else None,
                topic_partitions=[HB.TopicPartitions(
                    topic_id=self.topic_id, partitions=sorted(self.owned))] if not joining
                else [],
            ),
        )  # fmt: skip
        if answer.error_code == ErrorCode.NONE and epoch >= 0:
            self.epoch = answer.member_epoch
            if answer.assignment is not None:
                given = {p for tp in answer.assignment.topic_partitions for p in tp.partitions}
                # A real consumer drops what it lost and starts on what it got.
                self.owned = given
        return answer


def describe(conn: Any, group: str) -> Any:
    return conn.request(
        m.ApiKey.CONSUMER_GROUP_DESCRIBE, 0, m.ConsumerGroupDescribeRequest(group_ids=[group])
    ).groups[0]


def topic_id_of(conn: Any, topic: str) -> uuid.UUID:
    answer = conn.request(m.ApiKey.METADATA, 12, m.MetadataRequest(
        topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)],
        allow_auto_topic_creation=False))  # fmt: skip
    topic_id: uuid.UUID = answer.topics[0].topic_id
    return topic_id


STALE = ErrorCode.STALE_MEMBER_EPOCH


def commit_errors(
    conn: Any, group: str, topic: str, member_id: str, epoch: int, partitions: list[int]
) -> list[int]:
    Req = m.OffsetCommitRequest
    Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    answer = conn.request(m.ApiKey.OFFSET_COMMIT, 9, Req(
        group_id=group, generation_id_or_member_epoch=epoch, member_id=member_id,
        topics=[Req.OffsetCommitRequestTopic(name=topic, partitions=[
            Part(partition_index=p, committed_offset=0) for p in partitions])]))  # fmt: skip
    return [p.error_code for p in answer.topics[0].partitions]


def beat_until(members: list[RawMember], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for member in members:
            assert member.beat().error_code == ErrorCode.NONE
        if condition():
            return
        time.sleep(BEAT_S)
    raise AssertionError(f"timed out waiting for {what}")


def test_revoke_before_assign_and_the_session_timeout(
    short_session_broker: ShortSessionBroker,
) -> None:
    topic, group = f"kip848-t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    make_topic(short_session_broker.bootstrap, topic, 0)
    with short_session_broker.connect() as conn:
        tid = topic_id_of(conn, topic)
        a = RawMember(conn, group, topic, tid, "a")
        first = a.beat()
        assert (first.member_epoch, first.heartbeat_interval_ms) == (1, 1000)
        assert a.owned == set(range(PARTITIONS))
        b = RawMember(conn, group, topic, tid, "b")
        joined = b.beat()
        # b is in the target (range: b takes 2-3) but a still holds everything: nothing yet.
        assert joined.member_epoch == 2 and b.owned == set()
        assert describe(conn, group).assignor_name == "range"
        # a is told to give up 2-3 and keeps its epoch until it has.
        told = a.beat()
        assert told.member_epoch == 1 and a.owned == {0, 1}
        assert b.beat().assignment is None and b.owned == set()  # 2-3 not released yet
        released = a.beat()  # reports {0, 1}: 2-3 are free
        assert released.member_epoch == 2
        # KIP-1251: a commit still carrying epoch 1 is fine for 0 (a's since epoch 1), not
        # for 2 (gone); epoch 3 is ahead of a's.
        assert commit_errors(conn, group, topic, "a", 1, [0, 2]) == [0, STALE]
        assert commit_errors(conn, group, topic, "a", 3, [0]) == [STALE]
        beat_until([b], lambda: b.owned == {2, 3}, "b to get 2-3")
        # a goes silent: after the session timeout it is fenced and b gets everything.
        beat_until([b], lambda: b.owned == set(range(PARTITIONS)), "b to take a's partitions")
        assert [x.member_id for x in describe(conn, group).members] == ["b"]
        assert a.beat().error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_member_that_does_not_revoke_in_time_is_fenced(
    short_session_broker: ShortSessionBroker,
) -> None:
    topic, group = f"kip848-r-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    make_topic(short_session_broker.bootstrap, topic, 0)
    with short_session_broker.connect() as conn:
        tid = topic_id_of(conn, topic)
        a = RawMember(conn, group, topic, tid, "a", rebalance_timeout_ms=1000)
        a.beat()
        b = RawMember(conn, group, topic, tid, "b")
        b.beat()
        a.beat()  # told to revoke 2-3; it keeps reporting them (it never releases)
        a.owned = set(range(PARTITIONS))
        deadline = time.monotonic() + WAIT_S
        while (answer := a.beat()).error_code == ErrorCode.NONE:
            a.owned = set(range(PARTITIONS))
            assert time.monotonic() < deadline, "a was never fenced"
            b.beat()
            time.sleep(BEAT_S)
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        beat_until([b], lambda: b.owned == set(range(PARTITIONS)), "b to take a's partitions")


def test_a_static_member_leaves_and_comes_back(short_session_broker: ShortSessionBroker) -> None:
    topic, group = f"kip848-s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    make_topic(short_session_broker.bootstrap, topic, 0)
    with short_session_broker.connect() as conn:
        tid = topic_id_of(conn, topic)
        s = RawMember(conn, group, topic, tid, "s1", instance_id="i1")
        d = RawMember(conn, group, topic, tid, "d")
        s.beat()
        d.beat()
        # range orders members by id: d takes 0-1, s1 2-3.
        beat_until([s, d], lambda: d.owned == {0, 1} and s.owned == {2, 3}, "a 2/2 split")
        left = s.beat(-2)
        assert (left.error_code, left.member_epoch) == (ErrorCode.NONE, -2)
        held = describe(conn, group)
        assert {x.member_id: x.member_epoch for x in held.members}["s1"] == -2
        # The instance keeps 2-3 while away: d does not get them.
        for _ in range(3):
            d.beat()
        assert d.owned == {0, 1}
        # Another process with the same instance id and a new member id takes s1's place.
        again = RawMember(conn, group, topic, tid, "s2", instance_id="i1")
        back = again.beat()
        assert back.error_code == ErrorCode.NONE
        beat_until([again, d], lambda: again.owned == {2, 3}, "s2 to get s1's partitions")
        assert sorted(x.member_id for x in describe(conn, group).members) == ["d", "s2"]
        # A third one with the instance id while s2 is alive is refused.
        third = RawMember(conn, group, topic, tid, "s3", instance_id="i1").beat()
        assert third.error_code == ErrorCode.UNRELEASED_INSTANCE_ID
        # And the old member id is fenced by the new one.
        assert s.beat(s.epoch).error_code == ErrorCode.FENCED_INSTANCE_ID


def test_the_group_survives_a_restart(short_session_broker: ShortSessionBroker) -> None:
    """The group's snapshot is in ``__consumer_offsets``: after a restart the members go
    on with their epochs and partitions, no rejoin."""
    topic, group = f"kip848-p-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    make_topic(short_session_broker.bootstrap, topic, 0)
    with short_session_broker.connect() as conn:
        tid = topic_id_of(conn, topic)
        a = RawMember(conn, group, topic, tid, "a")
        b = RawMember(conn, group, topic, tid, "b", instance_id="ib")
        a.beat()
        b.beat()
        beat_until([a, b], lambda: a.owned == {0, 1} and b.owned == {2, 3}, "a 2/2 split")
        before = describe(conn, group)
    assert short_session_broker.stop() == 0
    short_session_broker.start()
    with short_session_broker.connect() as conn:
        a.conn = b.conn = conn
        after = describe(conn, group)
        assert (after.group_epoch, after.assignment_epoch) == (
            before.group_epoch,
            before.assignment_epoch,
        )
        assert sorted((x.member_id, x.member_epoch) for x in after.members) == sorted(
            (x.member_id, x.member_epoch) for x in before.members
        )
        epochs = (a.epoch, b.epoch)
        assert a.beat().error_code == ErrorCode.NONE
        assert b.beat().error_code == ErrorCode.NONE
        assert (a.epoch, b.epoch) == epochs
        assert (a.owned, b.owned) == ({0, 1}, {2, 3})
