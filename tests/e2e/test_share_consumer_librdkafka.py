"""librdkafka's share consumer (KIP-932, confluent-kafka's ``ShareConsumer``) end to end.

Against a real broker process whose acquisition locks last a few seconds: implicit
acknowledgement (two members, every record once), explicit ACCEPT / RELEASE / REJECT
sent by ``close()`` (a second member gets only the released records, with delivery count
2), a record whose lock runs out goes to the other member, and accepted records stay
accepted across a ``kill -9`` and restart (durable share state).

``close()`` sends its last acknowledgements (ShareAcknowledge, epoch -1) and its leave
(ShareGroupHeartbeat, epoch -1) at once, on two connections: the broker must apply the
acknowledgements whichever comes first (docs/share-groups.md, "Share sessions").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.test_fetch_sessions import MetricsBroker, running_metrics_broker
from trio_broker.protocol import messages as m

LOCK_MS = 3000
PARTITIONS = 2
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsBroker]:
    tmp = tmp_path_factory.mktemp("share-librdkafka")
    with running_metrics_broker(
        tmp,
        f'"group.share.record.lock.duration.ms" = {LOCK_MS}\n'
        '"group.share.heartbeat.interval.ms" = 500\n',
    ) as process:
        yield process


def names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"share-rdk-{suffix}", f"share-rdk-g-{suffix}"


def make_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = PARTITIONS) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions)
    assert producer.flush(30) == 0


def member(bootstrap: str, group: str, topic: str, mode: str = "explicit") -> ShareConsumer:
    consumer = ShareConsumer({
        "bootstrap.servers": bootstrap, "group.id": group,
        "share.acknowledgement.mode": mode,
    })  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def assigned_members(broker: MetricsBroker, group: str) -> int:
    """Members of the group that hold an assignment (ShareGroupDescribe)."""
    with broker.connect() as conn:
        described = conn.request(m.ApiKey.SHARE_GROUP_DESCRIBE, 1, m.ShareGroupDescribeRequest(
            group_ids=[group], include_authorized_operations=False)).groups[0]  # fmt: skip
    return sum(1 for mb in described.members if mb.assignment.topic_partitions)


def join(
    broker: MetricsBroker, group: str, consumers: list[ShareConsumer], members: int = 0
) -> list[Record]:
    """Poll ``consumers`` until ``members`` (all of them by default) are assigned: a share
    partition starts at the log end when first assigned, so new records are produced
    only after this. Returns what they got meanwhile (records given back by an earlier
    member), accepted."""
    got: list[Record] = []
    deadline = time.monotonic() + DEADLINE_S
    while assigned_members(broker, group) < (members or len(consumers)):
        assert time.monotonic() < deadline, "members not assigned"
        for consumer in consumers:
            got += take(consumer, 0.2, consumer.acknowledge)
    return got


Record = tuple[int, int, bytes, int]  # partition, offset, value, delivery count


def take(
    consumer: ShareConsumer, timeout: float, on_message: Callable[[Any], None] | None
) -> list[Record]:
    got: list[Record] = []
    for msg in consumer.poll(timeout):
        assert msg.error() is None, msg.error()
        got.append((msg.partition(), msg.offset(), msg.value(), msg.delivery_count()))
        if on_message is not None:
            on_message(msg)
    return got


def poll_until(
    consumer: ShareConsumer,
    done: Callable[[list[Record]], bool],
    on_message: Callable[[Any], None] | None = None,
) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + DEADLINE_S
    while not done(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} records: {got}"
        got += take(consumer, 0.5, on_message)
    return got


def sentinels_seen(got: list[Record]) -> bool:
    return sum(1 for r in got if r[2].startswith(b"sentinel")) == PARTITIONS


def sentinels() -> list[bytes]:
    return [b"sentinel-%d" % p for p in range(PARTITIONS)]


@pytest.mark.timeout(300)
def what_a_new_member_gets(broker: MetricsBroker, group: str, topic: str) -> list[Record]:
    """A fresh member's records (accepting each), up to the sentinels produced after it
    joined: what the group held back for it, then the sentinels."""
    newcomer = member(broker.bootstrap, group, topic)
    try:
        got = join(broker, group, [newcomer])
        produce(broker.bootstrap, topic, sentinels())
        got += poll_until(newcomer, sentinels_seen, newcomer.acknowledge)
    finally:
        newcomer.close()
    return got


def test_two_implicit_members_get_every_record_once(broker: MetricsBroker) -> None:
    topic, group = names()
    make_topic(broker.bootstrap, topic)
    a, b = (member(broker.bootstrap, group, topic, "implicit") for _ in range(2))
    try:
        assert join(broker, group, [a, b]) == []
        values = [b"r%d" % i for i in range(100)]
        produce(broker.bootstrap, topic, values)
        got: list[Record] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(values):
            assert time.monotonic() < deadline, f"{len(got)} of {len(values)}"
            for consumer in (a, b):  # implicit: this poll accepts the last poll's records
                got += [(x.partition(), x.offset(), x.value(), x.delivery_count())
                        for x in consumer.poll(0.3) if x.error() is None]  # fmt: skip
        assert sorted(r[2] for r in got) == sorted(values)  # each once
        assert {r[3] for r in got} == {1}
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(300)
def test_explicit_acknowledgements_sent_by_close(broker: MetricsBroker) -> None:
    """ACCEPT, RELEASE and REJECT: the acknowledgements of each poll ride on the next
    poll's fetch, those of the last poll on close(). Released records come back (to this
    member while it polls, then to the next member) with the next delivery count;
    accepted and rejected ones never. Before the fix the broker could take close()'s
    leave first, end the share session with it and answer the last acknowledgements
    SHARE_SESSION_NOT_FOUND: the last poll's records came back, accepted ones too."""
    topic, group = names()
    make_topic(broker.bootstrap, topic)
    first = member(broker.bootstrap, group, topic)
    kinds = [AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT]
    values = [b"r%d" % i for i in range(30)]
    last: dict[bytes, tuple[AcknowledgeType, int]] = {}  # value: last acknowledgement, count
    try:
        assert join(broker, group, [first]) == []
        produce(broker.bootstrap, topic, values)
        deadline = time.monotonic() + DEADLINE_S
        while set(last) != set(values):
            assert time.monotonic() < deadline, f"got {sorted(last)}"
            for msg in first.poll(0.5):
                assert msg.error() is None, msg.error()
                value, count = msg.value(), msg.delivery_count()
                assert count == (1 if value not in last else last[value][1] + 1)
                # Released once already: accepted this time.
                kind = kinds[int(value[1:]) % 3] if count == 1 else AcknowledgeType.ACCEPT
                first.acknowledge(msg, kind)
                last[value] = (kind, count)
    finally:
        first.close()  # the last poll's acknowledgements go with it
    again = what_a_new_member_gets(broker, group, topic)
    released = {v: c + 1 for v, (k, c) in last.items() if k == AcknowledgeType.RELEASE}
    assert {r[2]: r[3] for r in again if not r[2].startswith(b"sentinel")} == released
    assert sorted(r[2] for r in again if r[3] == 1) == sorted(sentinels())
    assert len(again) == len(released) + PARTITIONS


@pytest.mark.timeout(300)
def test_a_record_whose_lock_runs_out_goes_to_the_other_member(broker: MetricsBroker) -> None:
    topic, group = names()
    make_topic(broker.bootstrap, topic, 1)  # both members are assigned its one partition
    holder = member(broker.bootstrap, group, topic)
    other = member(broker.bootstrap, group, topic)
    try:
        assert join(broker, group, [holder]) == []
        produce(broker.bootstrap, topic, [b"held-0", b"held-1"], 1)
        held = poll_until(holder, lambda got: len(got) >= 2)
        held_at = time.monotonic()
        assert sorted(r[2] for r in held) == [b"held-0", b"held-1"]
        # The holder never acknowledges them nor polls again: when their locks run out
        # the other member gets them, with delivery count 2.
        again = join(broker, group, [other], members=2)
        again += poll_until(other, lambda got: len(again) + len(got) >= 2, other.acknowledge)
        assert sorted((r[2], r[3]) for r in again) == [(b"held-0", 2), (b"held-1", 2)]
        assert time.monotonic() - held_at >= LOCK_MS / 1000 * 0.8  # not before the lock ran out
    finally:
        other.close()
        holder.close()


@pytest.mark.timeout(300)
def test_accepted_records_stay_accepted_across_a_restart(broker: MetricsBroker) -> None:
    topic, group = names()
    make_topic(broker.bootstrap, topic)
    first = member(broker.bootstrap, group, topic)
    try:
        assert join(broker, group, [first]) == []
        produce(broker.bootstrap, topic, [b"r%d" % i for i in range(20)])
        got = poll_until(first, lambda got: len(got) >= 20, first.acknowledge)
        assert len(got) == 20
        # Answered once the acknowledgements are synced.
        results = first.commit_sync(30)
        assert all(err is None for err in results.values()), results
    finally:
        first.close()
    broker.kill9()
    broker.start()
    again = what_a_new_member_gets(broker, group, topic)
    assert sorted(r[2] for r in again) == sorted(sentinels())
