"""Security end to end: real clients over SASL_PLAINTEXT, SASL_SSL and mutual TLS.

One ``trio-broker serve`` process (module scope) with five listeners::

    PLAINTEXT      --listen 127.0.0.1:0 (the first listener)
    SASL_PLAINTEXT PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    SASL_SSL       the same mechanisms over TLS
    MTLS           an SSL listener (listener.security.protocol.map) that requires a
                   client certificate and maps its subject with
                   ssl.principal.mapping.rules: CN=alice,... -> User:alice-cert
    REAUTH         SASL_SSL with connections.max.reauth.ms = 1.5 s (KIP-368)

Clients: confluent-kafka, kafka-python, aiokafka and kcat.

Users are created with ``trio-broker users add`` before the broker starts. ACLs
(allow.everyone.if.no.acl.found = true) protect one topic, ``cert-only``, for
User:alice-cert only: a write there proves the principal came from the certificate.
"""

from __future__ import annotations

import gc
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError

from tests.e2e.conftest import BrokerProcess, add_scram_user
from tests.kafka_python_groups import knows_its_topics
from tests.waits import wait_until
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.security.acl_store import AclStore

KCAT = "/usr/bin/kcat"
USER, PASSWORD, BAD_PASSWORD = "alice", "s3cret-pw", "bad-pw-9x"
CERT_PRINCIPAL = "User:alice-cert"
PROTECTED_TOPIC = "cert-only"
LISTENER_LINE = re.compile(r"listening on 127\.0\.0\.1:(\d+) \((\w+), (\w+)\)")
COUNT = 20
#: connections.max.reauth.ms of the REAUTH listener: clients must log in again this often.
REAUTH_MS = 1500
TIMEOUT_S = 60


class SecureBroker(BrokerProcess):
    def __init__(self, data_dir: Path, config: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.config = config

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.config)]

    def ports(self) -> dict[str, int]:
        return {name: int(port) for port, name, _ in LISTENER_LINE.findall(self.log_text())}

    def wait_for_listeners(self, names: set[str], timeout_s: float = 60.0) -> dict[str, int]:
        """The listeners' ports once the log names each of ``names`` (``start`` returns
        when the first one serves; the others log right after, or later on a loaded
        machine): a deadline, not a count of polls."""
        deadline = time.monotonic() + timeout_s
        while set(self.ports()) != names:
            assert time.monotonic() < deadline, (self.ports(), self.log_tail())
            time.sleep(0.1)  # polling the log, bounded by the deadline
        return self.ports()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    paths = {name: base / f"{name}.pem" for name in
             ("ca", "server", "alice-cert", "alice-key", "bob-cert", "bob-key")}  # fmt: skip
    ca.cert_pem.write_to_path(str(paths["ca"]))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(paths["server"])
    )
    for who in ("alice", "bob"):
        cert = ca.issue_cert(f"{who}@example.com", common_name=who, organization_name="Example")
        cert.cert_chain_pems[0].write_to_path(str(paths[f"{who}-cert"]))
        cert.private_key_pem.write_to_path(str(paths[f"{who}-key"]))
    return paths


@pytest.fixture(scope="module")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]
) -> Iterator[SecureBroker]:
    base = tmp_path_factory.mktemp("secure")
    data_dir = base / "data"
    add_scram_user(data_dir, USER, PASSWORD)
    AclStore(data_dir).add(
        AclBinding(ResourceType.TOPIC, PROTECTED_TOPIC, PatternType.LITERAL, CERT_PRINCIPAL, "*",
                   op, Permission.ALLOW)
        for op in (Operation.WRITE, Operation.DESCRIBE, Operation.CREATE)
    )  # fmt: skip
    config = base / "broker.toml"
    config.write_text(f'''
listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,MTLS://127.0.0.1:0,REAUTH://127.0.0.1:0"
"listener.security.protocol.map" = "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,REAUTH:SASL_SSL"
"sasl.enabled.mechanisms" = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
"ssl.keystore.location" = "{pki["server"]}"
"ssl.truststore.location" = "{pki["ca"]}"
"listener.name.reauth.connections.max.reauth.ms" = {REAUTH_MS}
"listener.name.mtls.ssl.client.auth" = "required"
"listener.name.mtls.ssl.principal.mapping.rules" = "RULE:^CN=([^,]+),.*$/$1-cert/L,DEFAULT"
"group.initial.rebalance.delay.ms" = 0
"authorizer.class.name" = "acl"
"allow.everyone.if.no.acl.found" = true
''')
    broker = SecureBroker(data_dir, config)
    broker.start()
    try:
        ports = broker.wait_for_listeners(
            {"PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "MTLS", "REAUTH"}
        )
        assert ports["PLAINTEXT"] == broker.port
        yield broker
    finally:
        if broker.running:
            assert broker.stop() == 0, broker.log_tail()


def listener(broker: SecureBroker, name: str) -> str:
    return f"127.0.0.1:{broker.ports()[name]}"


def confluent_conf(broker: SecureBroker, pki: dict[str, Path], protocol: str, mech: str,
                   password: str = PASSWORD) -> dict[str, Any]:  # fmt: skip
    conf: dict[str, Any] = {
        "bootstrap.servers": listener(broker, protocol), "security.protocol": protocol,
        "sasl.mechanisms": mech, "sasl.username": USER, "sasl.password": password,
    }  # fmt: skip
    if protocol == "SASL_SSL":
        conf["ssl.ca.location"] = str(pki["ca"])
    return conf


def confluent_roundtrip(conf: dict[str, Any], topic: str) -> list[bytes]:
    errors: list[Any] = []
    producer = Producer({**conf, "error_cb": errors.append})
    for i in range(COUNT):
        producer.produce(topic, f"{topic}-{i}".encode())
    assert producer.flush(TIMEOUT_S) == 0, errors
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "error_cb": errors.append})  # fmt: skip
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(TIMEOUT_S * 2):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) >= COUNT:
                break
    finally:
        consumer.close()
    assert not errors, errors
    return got


def kafka_python_roundtrip(conf: dict[str, Any], topic: str) -> list[bytes]:
    producer = KafkaProducer(**conf)
    try:
        for i in range(COUNT):
            producer.send(topic, f"{topic}-{i}".encode())
        producer.flush(TIMEOUT_S)
    finally:
        producer.close(5)
    consumer = knows_its_topics(KafkaConsumer(
        topic, group_id=f"g-{topic}", auto_offset_reset="earliest", consumer_timeout_ms=10_000,
        **conf,
    ))  # fmt: skip
    got: list[bytes] = []
    try:
        for record in consumer:
            got.append(record.value)
            if len(got) >= COUNT:
                break
    finally:
        consumer.close()
    return got


def refused(conf: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Produce one record with a client the broker refuses: (delivery error, client errors).

    It waits for the client to report an error, then purges the record (which fails).

    The producer is purged and dropped here; otherwise it would keep retrying in
    the background until the test process exits.
    """
    errors: list[Any] = []
    results: list[Any] = []
    producer = Producer({**conf, "error_cb": errors.append, "message.timeout.ms": 5000})
    producer.produce("never", b"x", on_delivery=lambda err, msg: results.append(err))
    for _ in range(TIMEOUT_S * 10):  # until the client reports why it cannot connect
        producer.poll(0.1)
        if errors:
            break
    producer.purge()
    producer.flush(0)
    del producer
    gc.collect()
    return (results[0] if results else None), errors


def expected(topic: str) -> list[bytes]:
    return [f"{topic}-{i}".encode() for i in range(COUNT)]


# --------------------------------------------------------------------------- SASL


@pytest.mark.parametrize(
    ("protocol", "mech"),
    [("SASL_PLAINTEXT", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"),
     ("SASL_SSL", "SCRAM-SHA-512")],
)  # fmt: skip
def test_confluent_kafka(secure_broker: SecureBroker, pki: dict[str, Path], protocol: str,
                         mech: str) -> None:  # fmt: skip
    topic = f"ck-{protocol}-{mech}".lower()
    got = confluent_roundtrip(confluent_conf(secure_broker, pki, protocol, mech), topic)
    assert got == expected(topic)


@pytest.mark.parametrize(
    ("protocol", "mech"),
    [("SASL_PLAINTEXT", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"),
     ("SASL_SSL", "SCRAM-SHA-512")],
)  # fmt: skip
def test_kafka_python(secure_broker: SecureBroker, pki: dict[str, Path], protocol: str,
                      mech: str) -> None:  # fmt: skip
    topic = f"kp-{protocol}-{mech}".lower()
    conf: dict[str, Any] = dict(
        bootstrap_servers=listener(secure_broker, protocol), security_protocol=protocol,
        sasl_mechanism=mech, sasl_plain_username=USER, sasl_plain_password=PASSWORD,
    )  # fmt: skip
    if protocol == "SASL_SSL":
        conf["ssl_cafile"] = str(pki["ca"])
    assert kafka_python_roundtrip(conf, topic) == expected(topic)


@pytest.mark.parametrize(
    ("protocol", "mech"), [("SASL_PLAINTEXT", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256")]
)
def test_aiokafka(secure_broker: SecureBroker, pki: dict[str, Path], protocol: str,
                  mech: str) -> None:  # fmt: skip
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = f"ak-{protocol}-{mech}".lower()
    conf: dict[str, Any] = dict(
        bootstrap_servers=listener(secure_broker, protocol), security_protocol=protocol,
        sasl_mechanism=mech, sasl_plain_username=USER, sasl_plain_password=PASSWORD,
    )  # fmt: skip
    if protocol == "SASL_SSL":
        conf["ssl_context"] = create_ssl_context(cafile=str(pki["ca"]))

    async def roundtrip() -> list[bytes]:
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            for value in expected(topic):
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                                    **conf)  # fmt: skip
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT_S):
                async for record in consumer:
                    got.append(record.value)
                    if len(got) >= COUNT:
                        break
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(roundtrip()) == expected(topic)


def test_librdkafka_reauthenticates_when_the_session_ends(
    secure_broker: SecureBroker, pki: dict[str, Path]
) -> None:
    """KIP-368: the session lifetime makes the client log in again on the same connection."""
    conf = confluent_conf(secure_broker, pki, "SASL_SSL", "SCRAM-SHA-512")
    conf["bootstrap.servers"] = listener(secure_broker, "REAUTH")
    start = len(secure_broker.log_text())
    errors: list[Any] = []
    delivered: list[Any] = []
    producer = Producer({**conf, "error_cb": errors.append})
    for _ in range(4):  # spans several session lifetimes
        producer.produce("reauth", b"x", on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(TIMEOUT_S) == 0
        time.sleep(REAUTH_MS / 1000)
    assert delivered == [None] * 4 and not errors, (delivered, errors)
    log = secure_broker.log_text()[start:]  # this test's part of the log
    # Re-authentication happens on the same connection: some connection logged in
    # again and again (a client that reconnected instead would show each id once).
    logins = Counter(re.findall(r"connection (\d+) authenticated as User:alice\b", log))
    assert logins and max(logins.values()) >= 3, logins
    assert "not permitted in SASL state" not in log


def test_kcat_sasl_ssl_scram_sha_256(secure_broker: SecureBroker, pki: dict[str, Path]) -> None:
    topic = "kcat-sasl-ssl"
    common = [KCAT, "-b", listener(secure_broker, "SASL_SSL"), "-t", topic,
              "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-256",
              "-X", f"sasl.username={USER}", "-X", f"sasl.password={PASSWORD}",
              "-X", f"ssl.ca.location={pki['ca']}"]  # fmt: skip
    lines = "\n".join(f"kcat-{i}" for i in range(COUNT)) + "\n"
    subprocess.run([*common, "-P"], input=lines.encode(), check=True, timeout=TIMEOUT_S)
    out = subprocess.run([*common, "-C", "-o", "beginning", "-e", "-q"], check=True,
                         capture_output=True, timeout=TIMEOUT_S)  # fmt: skip
    assert out.stdout.decode().splitlines() == [f"kcat-{i}" for i in range(COUNT)]


def test_wrong_password_is_rejected_and_others_are_served(
    secure_broker: SecureBroker, pki: dict[str, Path]
) -> None:
    conf = confluent_conf(secure_broker, pki, "SASL_PLAINTEXT", "SCRAM-SHA-512", BAD_PASSWORD)
    delivery, errors = refused(conf)
    assert delivery is not None and delivery.code() == KafkaError._PURGE_QUEUE
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("invalid credentials" in e.str() for e in errors), errors
    # kafka-python is refused too, and the broker answers its PLAIN login with error 58
    # before it closes: the close's reason is logged only once that answer is out
    # (connection.py, _answered). Whether kafka-python then logs
    # SaslAuthenticationFailedError is up to its reading: it drops an answer that comes
    # in one read with the close after it (kafka/net/transport.py: _sock_recv returns the
    # bytes with the error, and abort discards them), which a loaded machine makes
    # common (a busy CI run: 24 refused connections, none logged). Kafka closes the same
    # way; tests/integration/test_sasl.py reads error 58 itself.
    with pytest.raises(KafkaPythonError):
        KafkaProducer(bootstrap_servers=listener(secure_broker, "SASL_PLAINTEXT"),
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username=USER, sasl_plain_password=BAD_PASSWORD,
                      bootstrap_timeout_ms=10_000)  # fmt: skip
    answered_then_closed = re.compile(
        r"closing connection \d+ from \S+: SASL authentication failed: PLAIN: "
    )
    assert answered_then_closed.search(secure_broker.log_text()), secure_broker.log_tail()
    assert secure_broker.running
    topic = "after-bad-logins"
    good = confluent_conf(secure_broker, pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    assert confluent_roundtrip(good, topic) == expected(topic)
    assert "SASL authentication failed" in secure_broker.log_text()
    assert PASSWORD not in secure_broker.log_text() and BAD_PASSWORD not in secure_broker.log_text()


# --------------------------------------------------------------------------- mutual TLS


def mtls_conf(broker: SecureBroker, pki: dict[str, Path], who: str) -> dict[str, Any]:
    return {"bootstrap.servers": listener(broker, "MTLS"), "security.protocol": "SSL",
            "ssl.ca.location": str(pki["ca"]), "ssl.certificate.location": str(pki[f"{who}-cert"]),
            "ssl.key.location": str(pki[f"{who}-key"])}  # fmt: skip


def deliver(conf: dict[str, Any], topic: str) -> Any:
    """Produce one record; the delivery error (None when written)."""
    results: list[Any] = []
    producer = Producer({**conf, "message.send.max.retries": 0, "message.timeout.ms": 10_000})
    producer.produce(topic, b"by-cert", on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    return results[0]


def test_mtls_principal_from_certificate(secure_broker: SecureBroker, pki: dict[str, Path]) -> None:
    alice = mtls_conf(secure_broker, pki, "alice")
    # The topic's ACL names only User:alice-cert: the mapped certificate subject.
    assert deliver(alice, PROTECTED_TOPIC) is None
    assert f"TLS client principal {CERT_PRINCIPAL}" in secure_broker.log_text()
    denied = deliver(mtls_conf(secure_broker, pki, "bob"), PROTECTED_TOPIC)
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    sasl_alice = confluent_conf(secure_broker, pki, "SASL_SSL", "SCRAM-SHA-512")
    denied = deliver(sasl_alice, PROTECTED_TOPIC)
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Unprotected topics work for the certificate user, consuming included.
    topic = "mtls-open"
    assert confluent_roundtrip(alice, topic) == expected(topic)


def test_mtls_without_client_certificate_fails(secure_broker: SecureBroker,
                                               pki: dict[str, Path]) -> None:  # fmt: skip
    conf = {"bootstrap.servers": listener(secure_broker, "MTLS"), "security.protocol": "SSL",
            "ssl.ca.location": str(pki["ca"])}  # fmt: skip
    delivery, errors = refused(conf)
    assert delivery is not None, "a client without a certificate got a record written"
    assert errors, "no error reported for a refused TLS handshake"
    # The client sees the refusal (the TLS alert) before the broker's task, which
    # noticed the failed handshake, may have written its line.
    wait_until(lambda: "TLS handshake failed" in secure_broker.log_text(),
               "the broker to log the failed handshake")  # fmt: skip
    assert secure_broker.running
