"""SASL and TLS listeners on a real in-process broker, spoken to on the wire.

One broker with four listeners (PLAINTEXT, SASL_PLAINTEXT, SSL with required client
certificates, SASL_SSL); raw requests check the exchange, the hostile inputs
(oversized, garbage, tampered SCRAM, requests before authentication) and the
principal each connection ends up with (read from the broker: a test hook).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trustme
from scramp import ScramClient

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

USER, PASSWORD = "alice", "wonder land"
MECHS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def broker_config(tmp_path: Path, ca: trustme.CA) -> BrokerConfig:
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    from trio_broker.security.credentials import CredentialStore

    data_dir = tmp_path / "data"
    store = CredentialStore.in_data_dir(data_dir)
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.add(USER, mech, PASSWORD)
    return BrokerConfig(
        port=0,
        data_dir=data_dir,
        storage="memory",
        listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
        "SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        security={
            "sasl.enabled.mechanisms": MECHS,
            "ssl.keystore.location": str(tmp_path / "server.pem"),
            "ssl.truststore.location": str(tmp_path / "ca.pem"),
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_ssl.connections.max.reauth.ms": 60_000,
        },
    )


def port_of(broker: Broker, name: str) -> int:
    return broker.listener_bound[name][1]


@pytest.fixture
async def sasl(broker: Broker) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SASL_PLAINTEXT"))
    async with stream:
        yield RawClient(stream)


def connection_of(broker: Broker, client: RawClient) -> Any:
    """The broker's Connection for a client socket (matched by the client's port)."""
    stream = client.stream
    sock = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket  # type: ignore[attr-defined]
    local_port = sock.getsockname()[1]
    (conn,) = [c for c in broker.connections.values() if c.client.port == local_port]
    return conn


async def handshake(client: RawClient, mechanism: str, version: int = 1) -> Any:
    return await client.call(17, version, m.SaslHandshakeRequest(mechanism=mechanism))


async def authenticate(client: RawClient, token: bytes, version: int = 2) -> Any:
    return await client.call(36, version, m.SaslAuthenticateRequest(auth_bytes=token))


async def assert_closed(client: RawClient) -> None:
    """The broker closes the connection (EOF) within a bounded time, answering nothing
    more: any byte that arrives first (a response the test did not read) fails it."""
    received = bytes(client.buf)
    with trio.fail_after(10):
        while True:
            try:
                data = await client.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if not data:
                break
            received += data
    assert received == b"", f"the broker answered {len(received)} bytes before closing"


async def scram_login(client: RawClient, mech: str, password: str = PASSWORD) -> Any:
    assert (await handshake(client, mech)).error_code == 0
    scram = ScramClient([mech], USER, password)
    first = await authenticate(client, scram.get_client_first().encode())
    assert first.error_code == 0, first
    scram.set_server_first(first.auth_bytes.decode())
    final = await authenticate(client, scram.get_client_final().encode())
    if final.error_code == 0:
        scram.set_server_final(final.auth_bytes.decode())  # checks the server's signature
    return final


async def metadata(client: RawClient) -> Any:
    return await client.call(3, 9, m.MetadataRequest(topics=None, allow_auto_topic_creation=False))


# --------------------------------------------------------------------------- logins


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_login_then_requests(broker: Broker, sasl: RawClient, mech: str) -> None:
    versions = await sasl.call(18, 3, m.ApiVersionsRequest(client_software_name="t",
                                                          client_software_version="1"))  # fmt: skip
    keys = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert keys[17] == (0, 1) and keys[36] == (0, 2)
    final = await scram_login(sasl, mech)
    assert final.error_code == 0 and final.session_lifetime_ms == 0
    assert connection_of(broker, sasl).principal == f"User:{USER}"
    answer = await metadata(sasl)
    # Metadata advertises the listener this client came in on.
    assert [(b.host, b.port) for b in answer.brokers] == [
        ("127.0.0.1", port_of(broker, "SASL_PLAINTEXT"))
    ]


async def test_plain_login_and_handshake_v0(broker: Broker, sasl: RawClient) -> None:
    answer = await handshake(sasl, "PLAIN", version=0)
    assert answer.error_code == 0 and answer.mechanisms == MECHS.split(",")
    ok = await authenticate(sasl, f"\0{USER}\0{PASSWORD}".encode(), version=0)
    assert ok.error_code == 0
    assert connection_of(broker, sasl).principal == f"User:{USER}"
    assert (await metadata(sasl)).brokers[0].port == port_of(broker, "SASL_PLAINTEXT")


async def test_plaintext_listener_is_anonymous_and_refuses_sasl(broker: Broker) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "PLAINTEXT")) as s:
        client = RawClient(s)
        assert (await handshake(client, "PLAIN")).error_code == ErrorCode.ILLEGAL_SASL_STATE
        answer = await metadata(client)
        assert answer.brokers[0].port == port_of(broker, "PLAINTEXT") == broker.bound[0][1]
        assert connection_of(broker, client).principal == "User:ANONYMOUS"


async def test_sasl_ssl_session_lifetime(broker: Broker, ca: trustme.CA) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    tcp = await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SASL_SSL"))
    async with trio.SSLStream(tcp, context, server_hostname="127.0.0.1") as stream:
        client = RawClient(stream)
        final = await scram_login(client, "SCRAM-SHA-512")
        assert final.error_code == 0 and final.session_lifetime_ms == 60_000
        assert final.session_lifetime_ms == 60_000
        assert (await metadata(client)).brokers[0].port == port_of(broker, "SASL_SSL")
        # KIP-368 re-authentication on the same connection, same user.
        assert (await scram_login(client, "SCRAM-SHA-512")).error_code == 0
        assert connection_of(broker, client).principal == f"User:{USER}"


# --------------------------------------------------------------------------- mTLS


async def test_mtls_principal_is_the_certificate_subject(broker: Broker, ca: trustme.CA) -> None:
    cert = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Example",
                         organization_unit_name="eng")  # fmt: skip
    context = ssl.create_default_context()
    ca.configure_trust(context)
    cert.configure_cert(context)
    tcp = await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SSL"))
    async with trio.SSLStream(tcp, context, server_hostname="127.0.0.1") as stream:
        client = RawClient(stream)
        answer = await metadata(client)
        assert answer.brokers[0].port == port_of(broker, "SSL")
        assert connection_of(broker, client).principal == "User:CN=alice,OU=eng,O=Example"


async def test_mtls_without_client_certificate_is_refused(broker: Broker, ca: trustme.CA) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    tcp = await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SSL"))
    stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
    with pytest.raises(trio.BrokenResourceError):
        with trio.fail_after(10):
            # TLS 1.3: the refusal arrives after the client's side of the handshake.
            await stream.do_handshake()
            await RawClient(stream).call(18, 0, m.ApiVersionsRequest())
    await tcp.aclose()
    # The broker still serves others.
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "PLAINTEXT")) as s:
        assert (await RawClient(s).call(18, 0, m.ApiVersionsRequest())).error_code == 0


# --------------------------------------------------------------------------- hostile input


async def test_wrong_password_fails_and_closes(broker: Broker, sasl: RawClient) -> None:
    final = await scram_login(sasl, "SCRAM-SHA-512", password="not it")
    assert final.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "invalid credentials" in final.error_message
    await assert_closed(sasl)
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SASL_PLAINTEXT")) as s:
        assert (await scram_login(RawClient(s), "SCRAM-SHA-256")).error_code == 0


async def test_a_failed_login_is_answered_after_the_configured_delay(
    broker_config: BrokerConfig, nursery: trio.Nursery
) -> None:
    """connection.failed.authentication.delay.ms, as in Kafka (KIP-306): the failure
    answer waits for the delay, then the connection closes with nothing more read."""
    config = attrs.evolve(broker_config, connection_failed_authentication_delay_ms=700)
    broker: Broker = await nursery.start(Broker(config).run)
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SASL_PLAINTEXT")) as s:
        client = RawClient(s)
        assert (await handshake(client, "PLAIN")).error_code == 0
        asked = trio.current_time()
        final = await authenticate(client, b"\x00" + USER.encode() + b"\x00not it")
        # A lower bound only (a loaded machine can only make the answer later).
        assert trio.current_time() - asked >= 0.6
        assert final.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert broker.stats.sasl_failures == {"PLAIN": 1}
        await assert_closed(client)


async def test_unknown_mechanism_lists_the_enabled_ones(sasl: RawClient) -> None:
    answer = await handshake(sasl, "GSSAPI")
    assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert answer.mechanisms == MECHS.split(",")
    await assert_closed(sasl)


@pytest.mark.parametrize("api_key", [3, 0, 1, 10, 19])
async def test_requests_before_authentication_disconnect(sasl: RawClient, api_key: int) -> None:
    schema = m.request_schema(api_key)
    frame = m.encode_request(api_key, schema.min_version if api_key else 3, 1, "x",
                             _empty_request(api_key))  # fmt: skip
    await sasl.stream.send_all(frame)
    await assert_closed(sasl)


def _empty_request(api_key: int) -> Any:
    if api_key == 3:
        return m.MetadataRequest(topics=None)
    if api_key == 0:
        return m.ProduceRequest(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[])
    if api_key == 1:
        return m.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, topics=[])
    if api_key == 10:
        return m.FindCoordinatorRequest(key="g")
    return m.CreateTopicsRequest(topics=[], timeout_ms=1000)


async def test_metadata_between_handshake_and_authenticate_disconnects(sasl: RawClient) -> None:
    assert (await handshake(sasl, "SCRAM-SHA-256")).error_code == 0
    await sasl.stream.send_all(m.encode_request(3, 9, 7, "x", m.MetadataRequest(topics=None)))
    await assert_closed(sasl)


@pytest.mark.parametrize(
    ("mech", "token"),
    [
        ("PLAIN", b"alice-wonder land"),  # no NUL separators
        ("PLAIN", b"alice\0wonder land"),  # one separator
        ("PLAIN", b"\0alice\0wonder land\0"),  # three
        ("PLAIN", b"bob\0alice\0wonder land"),  # authzid of someone else
        ("PLAIN", b"\0alice\0\xff\xfe"),  # not UTF-8
        ("PLAIN", b"\0nobody\0wonder land"),
        ("PLAIN", b"\0" + b"a" * 100_000 + b"\0x"),  # oversized
        ("SCRAM-SHA-256", b"bm9ub25jZQ=="),  # base64 garbage instead of client-first
        ("SCRAM-SHA-256", b"\xff\x00\x01"),
        ("SCRAM-SHA-256", b"n,,n=alice"),  # no nonce
        ("SCRAM-SHA-256", b"p=tls-unique,,n=alice,r=abc"),  # channel binding
        ("SCRAM-SHA-256", b"n,a=bob,n=alice,r=abc"),  # authzid of someone else
        ("SCRAM-SHA-512", b"n,,n=al=ice,r=abcdef"),  # bad saslname escape
        ("SCRAM-SHA-512", b"n,,n=alice,r=" + b"x" * 20_000),  # oversized
    ],
)
async def test_bad_first_tokens_fail(sasl: RawClient, mech: str, token: bytes) -> None:
    assert (await handshake(sasl, mech)).error_code == 0
    answer = await authenticate(sasl, token)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    await assert_closed(sasl)


@pytest.mark.parametrize("tamper", ["proof", "nonce", "garbage", "channel"])
async def test_tampered_scram_final_fails(sasl: RawClient, tamper: str) -> None:
    mech = "SCRAM-SHA-256"
    assert (await handshake(sasl, mech)).error_code == 0
    scram = ScramClient([mech], USER, PASSWORD)
    first = await authenticate(sasl, scram.get_client_first().encode())
    assert first.error_code == 0
    scram.set_server_first(first.auth_bytes.decode())
    final = scram.get_client_final()
    fields = dict(part.split("=", 1) for part in final.split(","))
    if tamper == "proof":
        proof = bytearray(fields["p"].encode())
        proof[3] = ord("A") if proof[3] != ord("A") else ord("B")
        fields["p"] = proof.decode()
    elif tamper == "nonce":
        # CVE-2024-56128: a final message whose nonce is not the server's must fail.
        fields["r"] = fields["r"][:-4] + "AAAA"
    elif tamper == "channel":
        fields["c"] = "eSws"  # "y,," instead of "n,,"
    token = b"c=biws,r=zz,p=!!" if tamper == "garbage" else ",".join(
        f"{k}={v}" for k, v in fields.items()).encode()  # fmt: skip
    answer = await authenticate(sasl, token)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    await assert_closed(sasl)


def signed_final(mech: str, client_first_bare: str, server_first: str, nonce: str) -> bytes:
    """A client-final with a valid proof for any nonce (RFC 5802 by hand)."""
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    name = "sha256" if mech == "SCRAM-SHA-256" else "sha512"
    salted = hashlib.pbkdf2_hmac(name, PASSWORD.encode(), base64.b64decode(fields["s"]),
                                 int(fields["i"]))  # fmt: skip
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


@pytest.mark.parametrize(
    ("variant", "accepted"),
    [("exact", True), ("librdkafka", True), ("changed", False), ("prefixed", False),
     ("suffixed", False), ("client-only", False)],
)  # fmt: skip
async def test_scram_final_nonce_is_checked(
    broker: Broker, sasl: RawClient, variant: str, accepted: bool
) -> None:
    """CVE-2024-56128: a valid proof over a wrong nonce must fail.

    The one tolerated variant is librdkafka's before 2.6.1 (kcat 1.7): its own nonce
    again in front of the full server nonce (librdkafka#4895).
    """
    mech = "SCRAM-SHA-256"
    assert (await handshake(sasl, mech)).error_code == 0
    client_nonce = "fyko+d2lbbFgONRv9qkxdawL"
    client_first_bare = f"n={USER},r={client_nonce}"
    first = await authenticate(sasl, f"n,,{client_first_bare}".encode())
    assert first.error_code == 0
    server_first = first.auth_bytes.decode()
    server_nonce = dict(part.split("=", 1) for part in server_first.split(","))["r"]
    assert server_nonce.startswith(client_nonce) and len(server_nonce) > len(client_nonce)
    nonce = {
        "exact": server_nonce, "librdkafka": client_nonce + server_nonce,
        "changed": server_nonce[:-4] + "AAAA", "prefixed": "x" + server_nonce,
        "suffixed": server_nonce + "x", "client-only": client_nonce,
    }[variant]  # fmt: skip
    final = await authenticate(sasl, signed_final(mech, client_first_bare, server_first, nonce))
    if accepted:
        assert final.error_code == 0, final
        assert connection_of(broker, sasl).principal == f"User:{USER}"
    else:
        assert final.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        await assert_closed(sasl)


async def test_authenticate_without_handshake_is_illegal(sasl: RawClient) -> None:
    answer = await authenticate(sasl, b"\0alice\0wonder land")
    assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
    await assert_closed(sasl)


async def test_oversized_frame_before_authentication_closes(sasl: RawClient) -> None:
    # 1 MiB announced: over sasl.server.max.receive.size (512 KiB) before login.
    await sasl.stream.send_all(struct.pack(">i", 1 << 20) + b"\0" * 64)
    await assert_closed(sasl)


# --------------------------------------------------------------------------- capture


async def test_capture_keeps_no_secrets(broker_config: BrokerConfig, tmp_path: Path) -> None:
    """With --capture on, SASL frames keep only their ids: no password, no proof."""
    import attrs
    import pyarrow.parquet as pq

    capture_dir = tmp_path / "capture"
    config = attrs.evolve(broker_config, capture_dir=capture_dir)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        port = port_of(broker, "SASL_PLAINTEXT")
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            client = RawClient(stream)
            assert (await handshake(client, "PLAIN")).error_code == 0
            token = f"\0{USER}\0{PASSWORD}".encode()
            assert (await authenticate(client, token)).error_code == 0
            assert (await metadata(client)).brokers
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            assert (await scram_login(RawClient(stream), "SCRAM-SHA-512")).error_code == 0
        nursery.cancel_scope.cancel()  # Broker.run's finally writes the capture
    rows = [row for path in sorted(capture_dir.glob("*.parquet"))
            for row in pq.read_table(path).to_pylist()]  # fmt: skip
    sasl_rows = [row for row in rows if row["api_key"] in (17, 36)]
    assert {row["api_key"] for row in sasl_rows} == {17, 36}
    assert any(row["api_key"] == 3 for row in rows)  # the capture did record the rest
    for row in sasl_rows:
        assert len(row["frame"]) <= 8, row
    everything = b"".join(bytes(row["frame"]) for row in rows)
    assert PASSWORD.encode() not in everything


# --------------------------------------------------------------------------- KIP-554 admin


async def test_user_scram_credentials_with_kafka_python_admin(broker: Broker) -> None:
    """AlterUserScramCredentials adds a user that can then log in; Describe lists it."""
    from kafka import KafkaAdminClient
    from kafka.admin import UserScramCredentialDeletion, UserScramCredentialUpsertion

    def admin_calls() -> tuple[Any, Any, Any, Any]:
        admin = KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{port_of(broker, 'SASL_PLAINTEXT')}",
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=USER, sasl_plain_password=PASSWORD,
        )  # fmt: skip
        try:
            added = admin.alter_user_scram_credentials(
                [
                    UserScramCredentialUpsertion(
                        "bob", "SCRAM-SHA-256", "bobs password", iterations=8192
                    )
                ]
            )
            described = admin.describe_user_scram_credentials(["bob", "nobody"])
            weak = admin.alter_user_scram_credentials(
                [UserScramCredentialDeletion("bob", "SCRAM-SHA-256"),
                 UserScramCredentialUpsertion("carol", "SCRAM-SHA-512", "pw", iterations=1000)]
            )  # fmt: skip
            everyone = admin.describe_user_scram_credentials()
            return added, described, weak, everyone
        finally:
            admin.close()

    async def bob_logs_in() -> str:
        port = port_of(broker, "SASL_PLAINTEXT")
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            client = RawClient(stream)
            assert (await handshake(client, "SCRAM-SHA-256")).error_code == 0
            scram = ScramClient(["SCRAM-SHA-256"], "bob", "bobs password")
            first = await authenticate(client, scram.get_client_first().encode())
            scram.set_server_first(first.auth_bytes.decode())
            assert (await authenticate(client, scram.get_client_final().encode())).error_code == 0
            return str(connection_of(broker, client).principal)

    added, described, weak, everyone = await trio.to_thread.run_sync(admin_calls)
    assert added == {"bob": None}
    assert described["bob"]["error"] is None
    assert [
        (int(i["mechanism"]), i["iterations"]) for i in described["bob"]["credential_infos"]
    ] == [(1, 8192)]
    assert described["nobody"]["error"] is not None
    assert weak["bob"] is None and weak["carol"] is not None  # 1000 < 4096 iterations
    assert set(everyone) == {USER}
    assert broker.credentials.lookup("bob", "SCRAM-SHA-256") is None

    # Add bob again (the admin logs in with PLAIN this time) and log in as him.
    def readd() -> Any:
        admin = KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{port_of(broker, 'SASL_PLAINTEXT')}",
            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
            sasl_plain_username=USER, sasl_plain_password=PASSWORD,
        )  # fmt: skip
        try:
            return admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion("bob", "SCRAM-SHA-256", "bobs password")]
            )
        finally:
            admin.close()

    assert await trio.to_thread.run_sync(readd) == {"bob": None}
    assert await bob_logs_in() == "User:bob"


async def read_response(client: RawClient, api_key: int, version: int) -> Any:
    """The next response on ``client`` (for requests sent pipelined, without ``call``)."""
    with trio.fail_after(10):
        (size,) = struct.unpack(">i", await client._read_exactly(4))
        body = await client._read_exactly(size)
    return m.decode_response(api_key, version, body)


async def test_requests_pipelined_behind_a_plain_login_wait_for_it(broker: Broker) -> None:
    """PLAIN is checked in a thread; what the client sent behind it is read once the
    login is done (as Kafka's authenticator does), as the user it logged in."""
    token = f"\0{USER}\0{PASSWORD}".encode()
    login = m.encode_request(36, 2, 10, "x", m.SaslAuthenticateRequest(auth_bytes=token))
    port = port_of(broker, "SASL_PLAINTEXT")
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = RawClient(stream)
        assert (await handshake(client, "PLAIN")).error_code == 0
        metadata_request = m.MetadataRequest(topics=None, allow_auto_topic_creation=False)
        await stream.send_all(login + m.encode_request(3, 9, 11, "x", metadata_request))
        assert (await read_response(client, 36, 2))[1].error_code == 0
        correlation_id, answer = await read_response(client, 3, 9)
        assert correlation_id == 11 and answer.brokers
        assert connection_of(broker, client).principal == f"User:{USER}"
    # A second SaslAuthenticate behind the first is out of turn once the first succeeded.
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = RawClient(stream)
        assert (await handshake(client, "PLAIN")).error_code == 0
        await stream.send_all(login + login)
        assert (await read_response(client, 36, 2))[1].error_code == 0
        second = (await read_response(client, 36, 2))[1]
        assert second.error_code == ErrorCode.ILLEGAL_SASL_STATE
        await assert_closed(client)
    # A SaslHandshake behind it starts a re-authentication (KIP-368).
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = RawClient(stream)
        assert (await handshake(client, "PLAIN")).error_code == 0
        again = m.SaslHandshakeRequest(mechanism="PLAIN")
        await stream.send_all(login + m.encode_request(17, 1, 11, "x", again))
        assert (await read_response(client, 36, 2))[1].error_code == 0
        assert (await read_response(client, 17, 1))[1].error_code == 0
        assert (await authenticate(client, token)).error_code == 0
        assert (await metadata(client)).brokers


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_unknown_scram_user_gets_a_salt_and_fails_at_the_end(
    broker: Broker, sasl: RawClient, mech: str
) -> None:
    """No answer tells an unknown user from a known one before the proof (RFC 5802 s. 9)."""
    assert (await handshake(sasl, mech)).error_code == 0
    scram = ScramClient([mech], "nobody", PASSWORD)
    first = await authenticate(sasl, scram.get_client_first().encode())
    assert first.error_code == 0 and b",s=" in first.auth_bytes and b",i=4096" in first.auth_bytes
    scram.set_server_first(first.auth_bytes.decode())
    final = await authenticate(sasl, scram.get_client_final().encode())
    assert final.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert final.error_message == (
        "Authentication failed during authentication due to invalid credentials "
        f"with SASL mechanism {mech}"
    )
    await assert_closed(sasl)


async def test_plaintext_request_on_a_tls_listener_is_dropped(broker: Broker) -> None:
    for name in ("SSL", "SASL_SSL"):
        async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, name)) as stream:
            client = RawClient(stream)
            await stream.send_all(m.encode_request(18, 0, 1, "x", m.ApiVersionsRequest()))
            await assert_closed(client)
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "PLAINTEXT")) as s:
        assert (await RawClient(s).call(18, 0, m.ApiVersionsRequest())).error_code == 0


async def test_user_scram_credentials_with_confluent_admin(broker: Broker) -> None:
    """confluent-kafka's AdminClient: upsert, describe, log in as the user, delete."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({
        "bootstrap.servers": f"127.0.0.1:{port_of(broker, 'SASL_PLAINTEXT')}",
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": USER, "sasl.password": PASSWORD,
    })  # fmt: skip
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 10_000)

    def upsert_and_describe() -> list[tuple[Any, int]]:
        upsertion = UserScramCredentialUpsertion("carol", info, b"carols password")
        admin.alter_user_scram_credentials([upsertion])["carol"].result(20)
        described = admin.describe_user_scram_credentials(["carol"])["carol"].result(20)
        return [(i.mechanism, i.iterations) for i in described.scram_credential_infos]

    assert await trio.to_thread.run_sync(upsert_and_describe) == [
        (ScramMechanism.SCRAM_SHA_512, 10_000)
    ]
    async with await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SASL_PLAINTEXT")) as s:
        client = RawClient(s)
        assert (await handshake(client, "SCRAM-SHA-512")).error_code == 0
        scram = ScramClient(["SCRAM-SHA-512"], "carol", "carols password")
        first = await authenticate(client, scram.get_client_first().encode())
        scram.set_server_first(first.auth_bytes.decode())
        assert (await authenticate(client, scram.get_client_final().encode())).error_code == 0
        assert connection_of(broker, client).principal == "User:carol"

    def delete() -> None:
        deletion = UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)
        admin.alter_user_scram_credentials([deletion])["carol"].result(20)

    await trio.to_thread.run_sync(delete)
    assert "carol" not in broker.credentials.users()


async def test_mtls_mapping_rules_map_or_refuse(
    broker_config: BrokerConfig, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    import attrs

    caplog.set_level(logging.INFO, logger="trio_broker.tls")
    rules = {"listener.name.ssl.ssl.principal.mapping.rules": "RULE:^CN=(bob),.*$/$1/U"}
    config = attrs.evolve(broker_config, security={**broker_config.security, **rules})

    async def connect_as(broker: Broker, who: str) -> str | None:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        ca.issue_cert(f"{who}@example.com", common_name=who,
                      organization_name="Example").configure_cert(context)  # fmt: skip
        tcp = await trio.open_tcp_stream("127.0.0.1", port_of(broker, "SSL"))
        async with trio.SSLStream(tcp, context, server_hostname="127.0.0.1") as stream:
            client = RawClient(stream)
            try:
                await metadata(client)
            except (trio.BrokenResourceError, AssertionError):
                return None  # refused: no rule matches
            return str(connection_of(broker, client).principal)

    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        assert await connect_as(broker, "bob") == "User:BOB"
        assert await connect_as(broker, "alice") is None
        nursery.cancel_scope.cancel()
    assert "no ssl.principal.mapping.rules rule matches 'CN=alice," in caplog.text


async def test_an_expired_session_is_closed_even_for_api_versions(
    broker_config: BrokerConfig, nursery: trio.Nursery
) -> None:
    """KIP-368: past connections.max.reauth.ms only a re-login's SaslHandshake is taken."""
    config = attrs.evolve(
        broker_config,
        security={**broker_config.security,
                  "listener.name.sasl_plaintext.connections.max.reauth.ms": 300},
    )  # fmt: skip
    running: Broker = await nursery.start(Broker(config).run)
    for then in ("api_versions", "handshake"):
        port = port_of(running, "SASL_PLAINTEXT")
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            client = RawClient(stream)
            assert (await scram_login(client, "SCRAM-SHA-256")).session_lifetime_ms == 300
            await client.call(18, 0, m.ApiVersionsRequest())  # within the session
            await trio.sleep(0.4)
            if then == "handshake":  # re-authentication is still welcome
                assert (await scram_login(client, "SCRAM-SHA-256")).error_code == 0
                assert (await metadata(client)).brokers
                continue
            await stream.send_all(m.encode_request(18, 0, 99, "x", m.ApiVersionsRequest()))
            await assert_closed(client)
