"""Transactional offset commits against an in-process broker, read by real clients.

The transaction coordinator is built separately; here TxnOffsetCommit is driven
through the raw client (as a transactional producer's ``sendOffsetsToTransaction``
sends it) and the transaction is ended through the broker's group coordinator
(``complete_transaction``, what EndTxn calls). Real consumers then read the result:

* kafka-python and confluent-kafka see nothing of a pending transaction's offsets,
  the staged offsets once it commits, the old ones after an abort;
* confluent-kafka's read_committed consumer (librdkafka sends require_stable) waits
  while offsets are pending -- OffsetFetch answers UNSTABLE_OFFSET_COMMIT -- and gets
  the committed offset the moment the transaction ends;
* every TxnOffsetCommit version, KIP-447 fencing, bad input and ACLs get Kafka's codes;
* pending offsets survive a broker restart.

Blocking clients run in worker threads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

T = TypeVar("T")
TOPIC = "payments"
PARTITIONS = 2
TXN_ID = "payments-app-1"
pytestmark = pytest.mark.timeout(300)

Commit = m.TxnOffsetCommitRequest
CommitTopic = Commit.TxnOffsetCommitRequestTopic
CommitPartition = CommitTopic.TxnOffsetCommitRequestPartition


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", group_initial_rebalance_delay_ms=0)


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


@asynccontextmanager
async def connect(broker: Broker) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream(*broker.bound[0])
    async with stream:
        yield RawClient(stream)


async def producer_id(raw: RawClient) -> tuple[int, int]:
    """A real producer id and epoch from InitProducerId (no transactional id needed here)."""
    init = await raw.call(
        m.ApiKey.INIT_PRODUCER_ID,
        4,
        m.InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=60_000,
            producer_id=-1,
            producer_epoch=-1,
        ),
    )
    assert init.error_code == ErrorCode.NONE
    return init.producer_id, init.producer_epoch


def txn_commit(
    group: str,
    pid: int,
    epoch: int,
    offsets: dict[int, int],
    *,
    topic: str = TOPIC,
    member_id: str = "",
    generation_id: int = -1,
    instance_id: str | None = None,
    metadata: str = "txn",
) -> m.TxnOffsetCommitRequest:
    return Commit(
        transactional_id=TXN_ID,
        group_id=group,
        producer_id=pid,
        producer_epoch=epoch,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=instance_id,
        topics=[
            CommitTopic(
                name=topic,
                partitions=[
                    CommitPartition(
                        partition_index=p,
                        committed_offset=o,
                        committed_leader_epoch=0,
                        committed_metadata=metadata,
                    )
                    for p, o in offsets.items()
                ],
            )
        ],
    )


def errors(response: m.TxnOffsetCommitResponse) -> list[tuple[str, int, int]]:
    return [
        (t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions
    ]


def kafka_python_committed(bootstrap: str, group: str) -> list[int | None]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return [consumer.committed(KTopicPartition(TOPIC, p)) for p in range(PARTITIONS)]
    finally:
        consumer.close(autocommit=False)


def confluent_committed(
    bootstrap: str, group: str, isolation: str, timeout: float = 10.0
) -> list[tuple[int, Any]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation}
    )
    try:
        wanted = [CTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return [(tp.offset, tp.error) for tp in consumer.committed(wanted, timeout=timeout)]
    finally:
        consumer.close()


async def test_staged_offsets_show_only_after_the_transaction_commits(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    group = "txn-commit"
    async with connect(broker) as raw:
        pid, epoch = await producer_id(raw)
        staged = await raw.call(
            m.ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit(group, pid, epoch, {0: 11, 1: 22})
        )
    assert errors(staged) == [(TOPIC, 0, ErrorCode.NONE), (TOPIC, 1, ErrorCode.NONE)]
    assert await in_thread(lambda: kafka_python_committed(bootstrap, group)) == [None, None]
    # read_uncommitted: no require_stable, the (absent) committed offsets at once.
    uncommitted = await in_thread(lambda: confluent_committed(bootstrap, group, "read_uncommitted"))
    assert [offset for offset, _ in uncommitted] == [-1001, -1001]  # librdkafka's "none"

    await broker.groups.complete_transaction(group, pid, epoch, committed=True)
    assert await in_thread(lambda: kafka_python_committed(bootstrap, group)) == [11, 22]
    read = await in_thread(lambda: confluent_committed(bootstrap, group, "read_committed"))
    assert read == [(11, None), (22, None)]


async def test_an_aborted_transaction_leaves_the_old_offsets(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    group = "txn-abort"
    async with connect(broker) as raw:
        pid, epoch = await producer_id(raw)
        first = txn_commit(group, pid, epoch, {0: 5, 1: 6})
        await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 5, first)
        await broker.groups.complete_transaction(group, pid, epoch, committed=True)
        second = txn_commit(group, pid, epoch, {0: 500, 1: 600})
        assert errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 5, second))[0][2] == 0
    await broker.groups.complete_transaction(group, pid, epoch, committed=False)
    assert await in_thread(lambda: kafka_python_committed(bootstrap, group)) == [5, 6]


async def test_read_committed_consumer_waits_for_the_transaction_to_end(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    group = "txn-stable"
    async with connect(broker) as raw:
        pid, epoch = await producer_id(raw)
        await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit(group, pid, epoch, {0: 7, 1: 8}))
        # Raw OffsetFetch: v7 (one group) and v8 (groups) with and without require_stable.
        Fetch = m.OffsetFetchRequest
        v7 = Fetch(
            group_id=group,
            require_stable=True,
            topics=[Fetch.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0, 1])],
        )
        stable = await raw.call(m.ApiKey.OFFSET_FETCH, 7, v7)
        assert [(p.committed_offset, p.error_code) for p in stable.topics[0].partitions] == [
            (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        ] * 2
        v7.require_stable = False
        loose = await raw.call(m.ApiKey.OFFSET_FETCH, 7, v7)
        assert [(p.committed_offset, p.error_code) for p in loose.topics[0].partitions] == [
            (-1, ErrorCode.NONE)
        ] * 2
        Group = Fetch.OffsetFetchRequestGroup
        v8 = Fetch(
            require_stable=True,
            groups=[
                Group(
                    group_id=group,
                    member_id=None,
                    member_epoch=-1,
                    topics=[Group.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=[1])],
                )
            ],
        )
        (answer,) = (await raw.call(m.ApiKey.OFFSET_FETCH, 8, v8)).groups
        assert answer.topics[0].partitions[0].error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT

    # librdkafka retries UNSTABLE_OFFSET_COMMIT until its timeout...
    start = trio.current_time()
    with pytest.raises(KafkaException) as timed_out:
        await in_thread(lambda: confluent_committed(bootstrap, group, "read_committed", 2.0))
    assert timed_out.value.args[0].code() == KafkaError._TIMED_OUT
    assert trio.current_time() - start >= 1.5
    # ...so a consumer asking now is answered as soon as the transaction ends.
    result: list[list[tuple[int, Any]]] = []

    async def ask() -> None:
        result.append(
            await in_thread(lambda: confluent_committed(bootstrap, group, "read_committed", 20.0))
        )

    fetches = broker.handler_pool.latency.count(m.ApiKey.OFFSET_FETCH)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.fail_after(15):  # it asked, was told UNSTABLE_OFFSET_COMMIT, asked again
            while broker.handler_pool.latency.count(m.ApiKey.OFFSET_FETCH) < fetches + 2:  # noqa: ASYNC110
                await trio.sleep(0.02)
        assert not result  # still retrying
        await broker.groups.complete_transaction(group, pid, epoch, committed=True)
    assert result == [[(7, None), (8, None)]]


async def test_txn_offset_commit_checks(broker: Broker) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    async with connect(broker) as raw:
        pid, epoch = await producer_id(raw)
        # Every version: unknown partitions and topics per partition, the rest staged.
        for version in range(6):
            group = f"versions-{version}"
            request = txn_commit(group, pid, epoch, {0: 1, 9: 2})
            request.topics.append(
                CommitTopic(name="nope", partitions=[CommitPartition(partition_index=0)])
            )
            assert errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, version, request)) == [
                (TOPIC, 0, ErrorCode.NONE),
                (TOPIC, 9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("nope", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            ]
            assert broker.groups.has_pending_offset(group, TOPIC, 0)
        # An empty group id, too-long metadata.
        empty = await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit("", pid, epoch, {0: 1}))
        assert errors(empty) == [(TOPIC, 0, ErrorCode.INVALID_GROUP_ID)]
        big = txn_commit("big", pid, epoch, {0: 1}, metadata="x" * 5000)
        assert errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, big)) == [
            (TOPIC, 0, ErrorCode.OFFSET_METADATA_TOO_LARGE)
        ]

        # KIP-447: a real member of a real group (JoinGroup + SyncGroup, static).
        group = "fenced"
        joined = await raw.call(
            m.ApiKey.JOIN_GROUP,
            5,
            m.JoinGroupRequest(
                group_id=group,
                session_timeout_ms=30_000,
                rebalance_timeout_ms=30_000,
                member_id="",
                group_instance_id="instance-0",
                protocol_type="consumer",
                protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
            ),
        )
        member, generation = joined.member_id, joined.generation_id
        assert joined.error_code == ErrorCode.NONE and generation == 1

        async def fenced(
            version: int, member_id: str, generation_id: int, instance: str | None
        ) -> int:
            request = txn_commit(
                group, pid, epoch, {0: 3}, member_id=member_id,
                generation_id=generation_id, instance_id=instance,
            )  # fmt: skip
            return errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, version, request))[0][2]

        assert await fenced(3, member, generation, "instance-0") == ErrorCode.NONE
        assert await fenced(3, member, generation + 1, "instance-0") == ErrorCode.ILLEGAL_GENERATION
        assert await fenced(3, "zombie", generation, "instance-0") == ErrorCode.FENCED_INSTANCE_ID
        assert await fenced(3, "zombie", generation, None) == ErrorCode.UNKNOWN_MEMBER_ID
        # v0-2 carry no group metadata: a producer cannot be fenced by the group.
        assert await fenced(2, "zombie", generation + 1, None) == ErrorCode.NONE

        # A producer with an older epoch than its staged offsets is a zombie.
        stale = txn_commit("versions-0", pid, epoch - 1, {0: 1})
        assert errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, stale)) == [
            (TOPIC, 0, ErrorCode.INVALID_PRODUCER_EPOCH)
        ]


async def test_pending_offsets_survive_a_restart(broker_config: BrokerConfig) -> None:
    group = "txn-restart"
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(broker_config).run)
        broker.topics.create(TOPIC, PARTITIONS)
        async with connect(broker) as raw:
            pid, epoch = await producer_id(raw)
            staged = txn_commit(group, pid, epoch, {1: 42})
            assert errors(await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, staged))[0][2] == 0
        nursery.cancel_scope.cancel()  # stop the broker before the transaction ends

    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(broker_config).run)
        host, port = broker.bound[0]
        bootstrap = f"{host}:{port}"
        assert broker.groups.has_pending_offset(group, TOPIC, 1)
        assert group in broker.groups.groups  # listed (and deletable) with only pending offsets
        await broker.groups.complete_transaction(group, pid, epoch, committed=True)
        assert await in_thread(lambda: kafka_python_committed(bootstrap, group)) == [None, 42]
        nursery.cancel_scope.cancel()


async def test_acls(tmp_path: Path, nursery: trio.Nursery) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "acl", authorizer_class_name="acl")
    broker: Broker = await nursery.start(Broker(config).run)
    assert broker.authorizer is not None
    broker.topics.create(TOPIC, 1)
    me = "User:ANONYMOUS"

    def grant(rtype: RT, name: str, op: Operation) -> None:
        assert broker.authorizer is not None
        broker.authorizer.store.add(
            [AclBinding(rtype, name, PatternType.LITERAL, me, "*", op, Permission.ALLOW)]
        )

    async def attempt() -> list[tuple[str, int, int]]:
        async with connect(broker) as raw:
            return errors(
                await raw.call(m.ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit("g", 1, 0, {0: 1}))
            )

    assert await attempt() == [(TOPIC, 0, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]
    grant(RT.TRANSACTIONAL_ID, TXN_ID, Operation.WRITE)
    assert await attempt() == [(TOPIC, 0, ErrorCode.GROUP_AUTHORIZATION_FAILED)]
    grant(RT.GROUP, "g", Operation.READ)
    assert await attempt() == [(TOPIC, 0, ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    grant(RT.TOPIC, TOPIC, Operation.READ)
    assert await attempt() == [(TOPIC, 0, ErrorCode.NONE)]
    nursery.cancel_scope.cancel()
