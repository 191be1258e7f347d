"""ACL enforcement and the ACL APIs with real clients against an in-process broker.

Without SASL every client is ``User:ANONYMOUS``, so these tests grant and deny
that principal. The enforcement tests seed bindings straight into the broker's
store (the setup, not the subject); the ACL API tests create, list and delete
them through kafka-python's and confluent-kafka's admin clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import KafkaError, Producer, TopicCollection
from confluent_kafka.admin import AclBinding as CAclBinding
from confluent_kafka.admin import AclBindingFilter as CAclBindingFilter
from confluent_kafka.admin import AclOperation as CAclOperation
from confluent_kafka.admin import AclPermissionType as CAclPermissionType
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ResourcePatternType as CPatternType
from confluent_kafka.admin import ResourceType as CResourceType
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from tests.integration.raw_client import RawClient
from tests.kafka_python_groups import knows_its_topics
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

T = TypeVar("T")
ME = "User:ANONYMOUS"
pytestmark = pytest.mark.timeout(300)


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


@asynccontextmanager
async def connect(broker: Broker) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream(*broker.bound[0])
    async with stream:
        yield RawClient(stream)


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", authorizer_class_name="acl",
        group_initial_rebalance_delay_ms=0,
    )  # fmt: skip


def grant(
    broker: Broker, rtype: RT, name: str, *ops: Operation, pattern: PatternType = PatternType.LITERAL,
    permission: Permission = Permission.ALLOW,
) -> None:  # fmt: skip
    assert broker.authorizer is not None
    broker.authorizer.store.add(
        AclBinding(rtype, name, pattern, ME, "*", op, permission) for op in ops
    )


def grant_cluster_admin(broker: Broker) -> None:
    grant(broker, RT.CLUSTER, "kafka-cluster", Operation.ALL)


# ----------------------------------------------------------------------------- enforcement


async def test_denied_produce_is_topic_authorization_failed(broker: Broker, bootstrap: str) -> None:
    grant_cluster_admin(broker)
    broker.topics.create("allowed", 1)
    broker.topics.create("readonly", 1)
    grant(broker, RT.TOPIC, "allowed", Operation.WRITE)
    grant(broker, RT.TOPIC, "readonly", Operation.DESCRIBE, Operation.READ)

    def kafka_python() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, retries=0, linger_ms=0)
        try:
            assert producer.send("allowed", b"ok").get(timeout=20).offset == 0
            with pytest.raises(TopicAuthorizationFailedError):
                producer.send("readonly", b"no").get(timeout=20)
        finally:
            producer.close(timeout=5)

    def confluent() -> dict[str, Any]:
        # By topic: the two topics' delivery reports may come in either order (each
        # topic's answer comes when its own request does).
        errors: dict[str, Any] = {}

        def delivered(err: Any, msg: Any) -> None:
            errors[msg.topic()] = err

        producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0})
        producer.produce("allowed", b"ok", on_delivery=delivered)
        producer.produce("readonly", b"no", on_delivery=delivered)
        assert producer.flush(60) == 0
        return errors

    await in_thread(kafka_python)
    errors = await in_thread(confluent)
    assert errors["allowed"] is None
    assert errors["readonly"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert broker.topics.log("readonly", 0).log_end_offset == 0
    assert broker.topics.log("allowed", 0).log_end_offset == 2


async def test_metadata_hides_undescribable_topics(broker: Broker, bootstrap: str) -> None:
    grant_cluster_admin(broker)
    for name in ("visible-a", "visible-b", "hidden"):
        broker.topics.create(name, 1)
    grant(broker, RT.TOPIC, "visible-", Operation.DESCRIBE, pattern=PatternType.PREFIXED)

    def both() -> tuple[set[str], dict[str, Any]]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            listed = set(admin.list_topics())
        finally:
            admin.close()
        # librdkafka asks topic by topic here: its all-topics Metadata v13 request is not
        # decoded by this broker yet (a codec issue outside ACLs, noted in docs/compatibility.md).
        confluent = AdminClient({"bootstrap.servers": bootstrap})
        errors = {
            name: confluent.list_topics(topic=name, timeout=10).topics[name].error
            for name in ("visible-a", "hidden")
        }
        return listed, errors

    kafka_python, confluent = await in_thread(both)
    assert kafka_python == {"visible-a", "visible-b"}
    assert confluent["visible-a"] is None
    assert confluent["hidden"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Named explicitly, an undescribable topic is reported, not created or revealed.
    async with connect(broker) as raw:
        Req = m.MetadataRequest
        response = await raw.call(
            m.ApiKey.METADATA, 12,
            Req(topics=[Req.MetadataRequestTopic(name=n) for n in ("hidden", "new-topic")],
                allow_auto_topic_creation=True),
        )  # fmt: skip
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("hidden", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        ("new-topic", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    ]
    assert broker.topics.get("new-topic") is None


async def test_denied_group_is_group_authorization_failed(broker: Broker, bootstrap: str) -> None:
    grant_cluster_admin(broker)
    broker.topics.create("events", 1)
    grant(broker, RT.TOPIC, "events", Operation.READ)
    grant(broker, RT.GROUP, "*", Operation.READ)
    grant(broker, RT.GROUP, "forbidden", Operation.ALL, permission=Permission.DENY)

    def consume(group: str) -> None:
        consumer = knows_its_topics(KafkaConsumer(
            "events", bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            consumer_timeout_ms=3000, session_timeout_ms=6000, heartbeat_interval_ms=1000,
        ))  # fmt: skip
        try:
            consumer.poll(timeout_ms=5000)
            consumer.commit()
        finally:
            consumer.close(autocommit=False)

    await in_thread(lambda: consume("permitted"))
    with pytest.raises(GroupAuthorizationFailedError):
        await in_thread(lambda: consume("forbidden"))

    # Each group API answers 30 for the denied group (raw, so every error is visible).
    async with connect(broker) as raw:
        join = await raw.call(m.ApiKey.JOIN_GROUP, 5, m.JoinGroupRequest(
            group_id="forbidden", session_timeout_ms=6000, rebalance_timeout_ms=6000,
            member_id="", protocol_type="consumer", protocols=[],
        ))  # fmt: skip
        heartbeat = await raw.call(m.ApiKey.HEARTBEAT, 3, m.HeartbeatRequest(
            group_id="forbidden", generation_id=1, member_id="x"
        ))  # fmt: skip
        fetch = await raw.call(m.ApiKey.OFFSET_FETCH, 5, m.OffsetFetchRequest(
            group_id="forbidden", topics=None
        ))  # fmt: skip
        coordinator = await raw.call(m.ApiKey.FIND_COORDINATOR, 3, m.FindCoordinatorRequest(
            key="forbidden", key_type=0
        ))  # fmt: skip
    denied = ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert (join.error_code, heartbeat.error_code, fetch.error_code) == (denied,) * 3
    assert coordinator.error_code == denied


async def test_super_user_passes_everything(tmp_path: Path) -> None:
    config = BrokerConfig(
        port=0,
        data_dir=tmp_path / "data",
        authorizer_class_name="acl",
        super_users=f"User:ops;{ME}",
    )
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        # A DENY of everything to everyone does not stop a super user.
        for rtype in (RT.TOPIC, RT.GROUP, RT.CLUSTER):
            broker.authorizer.store.add(  # type: ignore[union-attr]
                [AclBinding(rtype, "*", PatternType.LITERAL, "User:*", "*", Operation.ALL,
                            Permission.DENY)]
            )  # fmt: skip

        def round_trip() -> list[bytes]:
            producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
            for i in range(5):
                producer.send("su-topic", f"v{i}".encode())
            producer.flush(20)
            producer.close(timeout=5)
            consumer = knows_its_topics(KafkaConsumer(
                "su-topic", bootstrap_servers=bootstrap, group_id="su-group",
                auto_offset_reset="earliest", consumer_timeout_ms=5000,
            ))  # fmt: skip
            try:
                values: list[bytes] = []
                for record in consumer:  # ends after 5 s without records (bounded)
                    values.append(record.value)
                    if len(values) == 5:
                        break
                return values
            finally:
                consumer.close()

        assert await in_thread(round_trip) == [f"v{i}".encode() for i in range(5)]
        nursery.cancel_scope.cancel()


async def test_without_authorizer_acl_apis_answer_security_disabled(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        assert broker.authorizer is None
        async with connect(broker) as raw:
            response = await raw.call(
                m.ApiKey.DESCRIBE_ACLS, 3,
                m.DescribeAclsRequest(resource_type_filter=1, pattern_type_filter=1,
                                      operation=1, permission_type=1),
            )  # fmt: skip
        assert response.error_code == ErrorCode.SECURITY_DISABLED
        nursery.cancel_scope.cancel()


async def test_acl_apis_need_cluster_permissions(broker: Broker) -> None:
    async with connect(broker) as raw:
        described = await raw.call(
            m.ApiKey.DESCRIBE_ACLS, 3,
            m.DescribeAclsRequest(resource_type_filter=1, pattern_type_filter=1,
                                  operation=1, permission_type=1),
        )  # fmt: skip
        Creation = m.CreateAclsRequest.AclCreation
        created = await raw.call(
            m.ApiKey.CREATE_ACLS, 3,
            m.CreateAclsRequest(creations=[Creation(
                resource_type=2, resource_name="t", resource_pattern_type=3, principal=ME,
                host="*", operation=2, permission_type=3,
            )]),
        )  # fmt: skip
    assert described.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert created.results[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert broker.authorizer is not None and len(broker.authorizer.store) == 0


# ----------------------------------------------------------------------------- ACL APIs


def _kp_acl(name: str, op: ACLOperation, pattern: ACLResourcePatternType) -> ACL:
    return ACL(
        principal="User:alice", host="*", operation=op, permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(ResourceType.TOPIC, name, pattern),
    )  # fmt: skip


async def test_acls_with_kafka_python_admin(broker: Broker, bootstrap: str) -> None:
    grant_cluster_admin(broker)

    def run() -> None:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            created = admin.create_acls([
                _kp_acl("orders", ACLOperation.READ, ACLResourcePatternType.LITERAL),
                _kp_acl("ord", ACLOperation.WRITE, ACLResourcePatternType.PREFIXED),
            ])  # fmt: skip
            assert len(created["succeeded"]) == 2 and not created["failed"]
            alice = ACLFilter(
                principal="User:alice", host=None, operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.ANY, None, ACLResourcePatternType.ANY
                ),
            )  # fmt: skip
            acls, error = admin.describe_acls(alice)
            assert error.errno == 0
            assert {(a.resource_pattern.resource_name, a.operation) for a in acls} == {
                ("orders", ACLOperation.READ), ("ord", ACLOperation.WRITE),
            }  # fmt: skip
            # MATCH: the bindings that apply to topic "orders" (literal and prefixed).
            match = ACLFilter(
                principal=None, host=None, operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.TOPIC, "orders", ACLResourcePatternType.MATCH
                ),
            )  # fmt: skip
            assert len(admin.describe_acls(match)[0]) == 2
            prefixed = ACLFilter(
                principal=None, host=None, operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.TOPIC, "ord", ACLResourcePatternType.PREFIXED
                ),
            )  # fmt: skip
            [(_, deleted, error)] = admin.delete_acls([prefixed])
            assert error.errno == 0
            assert [acl.operation for acl in deleted] == [ACLOperation.WRITE]
            acls, _ = admin.describe_acls(alice)
            assert [a.resource_pattern.resource_name for a in acls] == ["orders"]
        finally:
            admin.close()

    await in_thread(run)


async def test_acls_with_confluent_admin_survive_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")
    binding = CAclBinding(
        CResourceType.GROUP, "billing", CPatternType.PREFIXED, "User:bob", "10.0.0.7",
        CAclOperation.READ, CAclPermissionType.DENY,
    )  # fmt: skip
    everything = CAclBindingFilter(
        CResourceType.ANY, None, CPatternType.ANY, None, None, CAclOperation.ANY,
        CAclPermissionType.ANY,
    )  # fmt: skip

    def admin_for(broker: Broker) -> AdminClient:
        return AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.bound[0][1]}"})

    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        grant_cluster_admin(broker)

        def create() -> list[Any]:
            admin = admin_for(broker)
            for future in admin.create_acls([binding]).values():
                future.result(timeout=60)
            bad = CAclBinding(
                CResourceType.TOPIC, "x", CPatternType.LITERAL, "nocolon", "*",
                CAclOperation.READ, CAclPermissionType.ALLOW,
            )  # fmt: skip
            with pytest.raises(Exception, match="Type:name"):
                for future in admin.create_acls([bad]).values():
                    future.result(timeout=10)
            return list(admin.describe_acls(everything).result(timeout=60))

        listed = await in_thread(create)
        assert binding in listed and len(listed) == 2  # plus the cluster grant
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(config).run)
        assert broker.authorizer is not None and len(broker.authorizer.store) == 2

        def delete() -> tuple[list[Any], list[Any]]:
            admin = admin_for(broker)
            only_bob = CAclBindingFilter(
                CResourceType.ANY, None, CPatternType.ANY, "User:bob", None, CAclOperation.ANY,
                CAclPermissionType.ANY,
            )  # fmt: skip
            [future] = admin.delete_acls([only_bob]).values()
            deleted = list(future.result(timeout=60))
            return deleted, list(admin.describe_acls(everything).result(timeout=60))

        deleted, left = await in_thread(delete)
        assert deleted == [binding]
        assert binding not in left and len(left) == 1
        nursery.cancel_scope.cancel()
    assert (tmp_path / "data" / "acls.json").exists()


async def test_authorized_operations_are_reported(broker: Broker, bootstrap: str) -> None:
    broker.topics.create("reported", 1)
    grant(broker, RT.CLUSTER, "kafka-cluster", Operation.DESCRIBE)
    grant(broker, RT.TOPIC, "reported", Operation.READ, Operation.ALTER_CONFIGS)

    def run() -> tuple[set[Any], set[Any]]:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        [future] = admin.describe_topics(
            TopicCollection(["reported"]), include_authorized_operations=True
        ).values()
        topic = future.result(timeout=60)
        cluster = admin.describe_cluster(include_authorized_operations=True).result(timeout=60)
        return set(topic.authorized_operations), set(cluster.authorized_operations)

    topic_ops, cluster_ops = await in_thread(run)
    # READ implies DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS.
    assert topic_ops == {
        CAclOperation.READ, CAclOperation.DESCRIBE, CAclOperation.ALTER_CONFIGS,
        CAclOperation.DESCRIBE_CONFIGS,
    }  # fmt: skip
    assert cluster_ops == {CAclOperation.DESCRIBE}

    grant(broker, RT.GROUP, "g-", Operation.READ, pattern=PatternType.PREFIXED)
    async with connect(broker) as raw:
        described = await raw.call(
            m.ApiKey.DESCRIBE_GROUPS, 5,
            m.DescribeGroupsRequest(groups=["g-ops"], include_authorized_operations=True),
        )  # fmt: skip
    [group] = described.groups
    assert group.authorized_operations == (1 << Operation.READ) | (1 << Operation.DESCRIBE)


async def test_aiokafka_and_kcat_see_a_denied_produce(broker: Broker, bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed

    grant_cluster_admin(broker)
    broker.topics.create("ok-topic", 1)
    broker.topics.create("ro-topic", 1)
    grant(broker, RT.TOPIC, "ok-topic", Operation.WRITE)
    grant(broker, RT.TOPIC, "ro-topic", Operation.DESCRIBE)

    def with_aiokafka() -> None:
        import asyncio

        async def main() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
            await producer.start()
            try:
                assert (await producer.send_and_wait("ok-topic", b"a")).offset == 0
                with pytest.raises(AioTopicAuthorizationFailed):
                    await producer.send_and_wait("ro-topic", b"a")
            finally:
                await producer.stop()

        asyncio.run(main())

    await in_thread(with_aiokafka)
    with trio.fail_after(30):
        results = [
            await trio.run_process(
                ["kcat", "-b", bootstrap, "-P", "-t", topic, "-X", "message.send.max.retries=0"],
                stdin=b"k\n",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            for topic in ("ok-topic", "ro-topic")
        ]
    ok, denied = (r.stderr.decode() for r in results)
    assert results[0].returncode == 0 and "failed" not in ok.lower(), ok
    assert "Topic authorization failed" in denied or "TOPIC_AUTHORIZATION_FAILED" in denied, denied
    assert broker.topics.log("ok-topic", 0).log_end_offset == 2
    assert broker.topics.log("ro-topic", 0).log_end_offset == 0
