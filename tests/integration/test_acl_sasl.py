"""ACLs per authenticated user: real clients log in with SASL/SCRAM and are held to
the bindings of their own principal (``User:alice``, ``User:bob``), a super user
(``User:admin``) passes everything, and the plaintext listener stays ANONYMOUS."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from trio_broker.config import BrokerConfig
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.security.credentials import CredentialStore
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)
MECH = "SCRAM-SHA-256"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    data_dir = tmp_path / "data"
    store = CredentialStore.in_data_dir(data_dir)
    for user, password in PASSWORDS.items():
        store.add(user, MECH, password)
    return BrokerConfig(
        port=0, data_dir=data_dir,
        listeners="SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        security={"sasl.enabled.mechanisms": MECH},
        authorizer_class_name="acl", super_users="User:admin",
    )  # fmt: skip


def sasl_bootstrap(broker: Broker) -> str:
    return f"127.0.0.1:{broker.listener_bound['SASL_PLAINTEXT'][1]}"


def confluent_produce(bootstrap: str, user: str, topic: str) -> Any:
    errors: list[Any] = []
    producer = Producer({
        "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECH, "sasl.username": user, "sasl.password": PASSWORDS[user],
        "message.send.max.retries": 0, "enable.idempotence": False,
    })  # fmt: skip
    producer.produce(topic, b"v", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(20) == 0
    return errors[0]


def kafka_python_produce(bootstrap: str, user: str, topic: str) -> int:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=MECH,
        sasl_plain_username=user, sasl_plain_password=PASSWORDS[user], retries=0,
    )  # fmt: skip
    try:
        offset: int = producer.send(topic, b"v").get(timeout=20).offset
        return offset
    finally:
        producer.close(timeout=5)


async def test_each_user_gets_its_own_acls(broker: Broker) -> None:
    for name in ("alice-only", "shared"):
        broker.topics.create(name, 1)
    assert broker.authorizer is not None
    broker.authorizer.store.add([
        AclBinding(ResourceType.TOPIC, "alice-", PatternType.PREFIXED, "User:alice", "*",
                   Operation.WRITE, Permission.ALLOW),
        AclBinding(ResourceType.TOPIC, "shared", PatternType.LITERAL, "User:*", "*",
                   Operation.WRITE, Permission.ALLOW),
        AclBinding(ResourceType.TOPIC, "shared", PatternType.LITERAL, "User:bob", "*",
                   Operation.WRITE, Permission.DENY),
    ])  # fmt: skip
    bootstrap = sasl_bootstrap(broker)

    def run(fn: Any, user: str, topic: str) -> Any:
        return trio.to_thread.run_sync(fn, bootstrap, user, topic)

    assert await run(confluent_produce, "alice", "alice-only") is None
    assert await run(confluent_produce, "alice", "shared") is None
    denied = await run(confluent_produce, "bob", "shared")
    assert denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert await run(kafka_python_produce, "alice", "alice-only") == 1
    with pytest.raises(TopicAuthorizationFailedError):
        await run(kafka_python_produce, "bob", "alice-only")
    # The super user needs no binding at all.
    assert await run(kafka_python_produce, "admin", "shared") == 1
    assert broker.topics.log("shared", 0).log_end_offset == 2  # bob wrote nothing

    # The plaintext listener's clients are User:ANONYMOUS: only the User:* grant applies.
    plain = f"127.0.0.1:{broker.listener_bound['PLAINTEXT'][1]}"

    def anonymous() -> Any:
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": plain, "message.send.max.retries": 0})
        for topic in ("shared", "alice-only"):
            producer.produce(topic, b"a", on_delivery=lambda err, msg: errors.append(err))
            producer.flush(20)
        return errors

    shared, alice_only = await trio.to_thread.run_sync(anonymous)
    assert shared is None
    assert alice_only.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def regex_member_topics(bootstrap: str, user: str, pattern: str, want: int) -> set[str]:
    """A KIP-848 member logged in as ``user`` subscribing to ``pattern``: the topics of
    its assignment once it holds ``want`` partitions (or the deadline passed)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECH, "sasl.username": user, "sasl.password": PASSWORDS[user],
        "group.id": "regex-acl", "group.protocol": "consumer",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.subscribe([pattern])
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < want and time.monotonic() < deadline:
            consumer.poll(0.2)
        # A little longer: a topic it must not get would have come in the same beat.
        for _ in range(10):
            consumer.poll(0.1)
        return {tp.topic for tp in consumer.assignment()}
    finally:
        consumer.close()


async def test_a_regex_subscription_gets_only_topics_its_user_may_describe(
    broker: Broker,
) -> None:
    """KIP-848: a regex matches every topic named for it, but the member is assigned
    only those its principal may DESCRIBE (Kafka filters the matches by DESCRIBE);
    before, a member could learn of and be given partitions of topics hidden from it."""
    for name in ("re-open", "re-closed"):
        broker.topics.create(name, 2)
    assert broker.authorizer is not None
    broker.authorizer.store.add([
        AclBinding(ResourceType.GROUP, "regex-acl", PatternType.LITERAL, "User:alice", "*",
                   Operation.READ, Permission.ALLOW),
        AclBinding(ResourceType.TOPIC, "re-open", PatternType.LITERAL, "User:alice", "*",
                   Operation.READ, Permission.ALLOW),
    ])  # fmt: skip
    topics = await trio.to_thread.run_sync(
        regex_member_topics, sasl_bootstrap(broker), "alice", "^re-.*", 2
    )
    assert topics == {"re-open"}  # READ implies DESCRIBE; re-closed is hidden
    # The super user may describe both: the same regex gives it both topics.
    topics = await trio.to_thread.run_sync(
        regex_member_topics, sasl_bootstrap(broker), "admin", "^re-.*", 4
    )
    assert topics == {"re-open", "re-closed"}
