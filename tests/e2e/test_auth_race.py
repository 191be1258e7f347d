"""[auth-race] as an attacker tried it: raw frames against a real ``trio-broker serve``.

The broker has a SASL_PLAINTEXT listener (PLAIN and SCRAM-SHA-512), the ACL
authorizer on, and ``super.users = "User:admin;User:ANONYMOUS"`` (an admin over
PLAINTEXT, as docs/acls.md suggests). User bob has no ACLs. He logs in with PLAIN
and sends CreateAcls (bob: ALL on the cluster) 0-3 ms behind his SaslAuthenticate,
on the same connection with TCP_NODELAY. Before the fix, one of a few dozen tries
ran as User:ANONYMOUS, succeeded, and made bob a cluster admin. Every try must be
refused (bob is not authorized), and no ACL for bob may exist afterwards.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import SOCKET_TIMEOUT_S, add_scram_user
from tests.e2e.test_security import SecureBroker
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import Operation, PatternType, Permission, ResourceType

PASSWORDS = {"bob": "bob-pw", "admin": "admin-pw"}
#: Bounded: this many login + CreateAcls tries, or this many seconds, whichever first.
ATTEMPTS = 150
BUDGET_S = 60.0
SASL_HANDSHAKE, SASL_AUTHENTICATE, CREATE_ACLS, DESCRIBE_ACLS = 17, 36, 30, 29


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    base = tmp_path_factory.mktemp("auth-race")
    data_dir = base / "data"
    for user, password in PASSWORDS.items():
        add_scram_user(data_dir, user, password, ("SCRAM-SHA-512",))
    config = base / "broker.toml"
    config.write_text("""
listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
"sasl.enabled.mechanisms" = "PLAIN,SCRAM-SHA-512"
"authorizer.class.name" = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"super.users" = "User:admin;User:ANONYMOUS"
""")
    running = SecureBroker(data_dir, config)
    running.start()
    try:
        running.wait_for_listeners({"PLAINTEXT", "SASL_PLAINTEXT"})
        yield running
    finally:
        if running.running:
            assert running.stop() == 0, running.log_tail()


class Wire:
    """A blocking socket speaking frames; answers are read by correlation id order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0

    def frame(self, api_key: int, version: int, body: Any) -> bytes:
        self.correlation_id += 1
        return m.encode_request(api_key, version, self.correlation_id, "bob", body)

    def read(self, api_key: int, version: int) -> Any | None:
        """The next answer, or None if the broker closed the connection."""
        head = self._exactly(4)
        if head is None:
            return None
        body = self._exactly(struct.unpack(">i", head)[0])
        return None if body is None else m.decode_response(api_key, version, body)[1]

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except (ConnectionResetError, TimeoutError):
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def bob_is_admin() -> Any:
    return m.CreateAclsRequest(
        creations=[
            m.CreateAclsRequest.AclCreation(
                resource_type=int(ResourceType.CLUSTER), resource_name="kafka-cluster",
                resource_pattern_type=int(PatternType.LITERAL), principal="User:bob", host="*",
                operation=int(Operation.ALL), permission_type=int(Permission.ALLOW),
            )
        ]
    )  # fmt: skip


def acls_of_bob(port: int) -> list[Any]:
    """What the broker holds for User:bob, asked over PLAINTEXT (ANONYMOUS is a super user)."""
    wire = Wire(port)
    try:
        request = m.DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter="User:bob", host_filter=None, operation=1, permission_type=1,
        )  # fmt: skip
        wire.sock.sendall(wire.frame(DESCRIBE_ACLS, 2, request))
        answer = wire.read(DESCRIBE_ACLS, 2)
        assert answer is not None and answer.error_code == 0, answer
        return list(answer.resources)
    finally:
        wire.close()


def test_a_request_pipelined_behind_a_plain_login_runs_as_that_user(
    broker: SecureBroker,
) -> None:
    ports = broker.ports()
    token = b"\0bob\0" + PASSWORDS["bob"].encode()
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + BUDGET_S
    for attempt in range(ATTEMPTS):
        if time.monotonic() > deadline:
            break
        wire = Wire(ports["SASL_PLAINTEXT"])
        try:
            wire.sock.sendall(
                wire.frame(SASL_HANDSHAKE, 1, m.SaslHandshakeRequest(mechanism="PLAIN"))
            )
            assert wire.read(SASL_HANDSHAKE, 1).error_code == 0
            login = wire.frame(SASL_AUTHENTICATE, 2, m.SaslAuthenticateRequest(auth_bytes=token))
            create = wire.frame(CREATE_ACLS, 2, bob_is_admin())
            wire.sock.sendall(login)
            time.sleep((attempt % 4) / 1000)  # 0-3 ms behind the login, as the attacker did
            wire.sock.sendall(create)
            logged_in = wire.read(SASL_AUTHENTICATE, 2)
            answer = None if logged_in is None else wire.read(CREATE_ACLS, 2)
            assert logged_in is None or logged_in.error_code == 0, logged_in
        finally:
            wire.close()
        if answer is None:
            outcomes["closed"] = outcomes.get("closed", 0) + 1
            continue
        code = answer.results[0].error_code
        outcomes[ErrorCode(code).name] = outcomes.get(ErrorCode(code).name, 0) + 1
        assert code != ErrorCode.NONE, (
            f"try {attempt}: CreateAcls behind bob's login succeeded: it ran as someone else"
        )
    # Bob was authorized as bob every time (Kafka's answer, not a closed connection).
    assert set(outcomes) == {"CLUSTER_AUTHORIZATION_FAILED"}, outcomes
    assert sum(outcomes.values()) >= 20, outcomes
    assert acls_of_bob(ports["PLAINTEXT"]) == []
