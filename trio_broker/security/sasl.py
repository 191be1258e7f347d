"""The SASL exchange of one connection, sans I/O (no trio): a small state machine.

::

    AWAIT_HANDSHAKE --SaslHandshake(enabled mechanism)--> AWAIT_AUTH
    AWAIT_AUTH --PLAIN token ok / SCRAM client-first ok--> AUTHENTICATED / AWAIT_FINAL
    AWAIT_FINAL --SCRAM client-final with a valid proof--> AUTHENTICATED
    AUTHENTICATED --SaslHandshake (re-authentication, KIP-368)--> AWAIT_AUTH
    any state --bad input, wrong password, unknown mechanism--> FAILED (terminal)

Before AUTHENTICATED only ApiVersions, SaslHandshake and SaslAuthenticate are
permitted (:meth:`SaslSession.permits`); anything else closes the connection, as
Kafka's SaslServerAuthenticator does. A FAILED session permits nothing: the
connection answers the failing request and closes. Every failure of a login
gives the same message, so the answer does not tell which part was wrong.

Requests are framed as KIP-152 describes: SaslHandshake v1 then SaslAuthenticate
requests carrying the tokens (what librdkafka, kafka-python and aiokafka send).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs
from scramp import ScramMechanism

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import CredentialStore

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
PRE_AUTH_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
#: Kafka's sasl.server.max.receive.size: the largest request before authentication.
MAX_RECEIVE_SIZE = 524_288
#: SCRAM and PLAIN tokens are short; a bigger one is hostile.
MAX_TOKEN_BYTES = 8192


class SaslState(enum.Enum):
    AWAIT_HANDSHAKE = "await_handshake"
    AWAIT_AUTH = "await_auth"
    AWAIT_FINAL = "await_final"  # SCRAM: server-first sent, waiting for client-final
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


@attrs.frozen
class AuthStep:
    """The answer to one SaslAuthenticate: error, server token and, on success, the user."""

    error_code: int
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    principal: str | None = None


class SaslFailure(Exception):
    """A login that must fail; the message is logged, clients get a generic one."""


def _failed_message(mechanism: str | None) -> str:
    return (
        "Authentication failed during authentication due to invalid credentials "
        f"with SASL mechanism {mechanism}"
    )


@attrs.define
class SaslSession:
    mechanisms: list[str]
    store: CredentialStore
    #: connections.max.reauth.ms: 0 = sessions never expire.
    reauth_ms: int = 0
    state: SaslState = SaslState.AWAIT_HANDSHAKE
    mechanism: str | None = None
    principal: str | None = None
    #: Monotonic ms after which only re-authentication is permitted; None = never.
    expires_at_ms: float | None = None
    #: Why the session failed (logged by the shell, never sent).
    reason: str = ""
    #: A PLAIN check is running in a worker thread: nothing else may touch the session.
    busy: bool = False
    _scram: tuple[Any, str, str] | None = None

    @property
    def failed(self) -> bool:
        return self.state is SaslState.FAILED

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.AUTHENTICATED

    def permits(self, api_key: int, now_ms: float) -> bool:
        """May a request with ``api_key`` be handled now?"""
        if self.state is SaslState.FAILED:
            return False
        if api_key in PRE_AUTH_APIS:
            return True
        if self.state is not SaslState.AUTHENTICATED or self.principal is None:
            # Mid re-authentication (KIP-368) a client sends only SASL requests.
            return False
        return self.expires_at_ms is None or now_ms < self.expires_at_ms

    def _fail(self, reason: str) -> None:
        self.state = SaslState.FAILED
        self.reason = reason
        self._scram = None

    # ------------------------------------------------------------------ SaslHandshake

    def handshake(self, mechanism: str) -> int:
        """Choose the mechanism; returns the error code for SaslHandshakeResponse."""
        if self.state not in (SaslState.AWAIT_HANDSHAKE, SaslState.AUTHENTICATED):
            self._fail(f"SaslHandshake in state {self.state.value}")
            return ErrorCode.ILLEGAL_SASL_STATE
        if mechanism not in self.mechanisms:
            self._fail(f"unsupported SASL mechanism {mechanism!r}")
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM
        if self.state is SaslState.AUTHENTICATED and mechanism != self.mechanism:
            # Kafka: re-authentication must use the mechanism of the first login.
            self._fail(f"re-authentication with {mechanism}, first login used {self.mechanism}")
            return ErrorCode.ILLEGAL_SASL_STATE
        self.mechanism = mechanism
        self.state = SaslState.AWAIT_AUTH
        return ErrorCode.NONE

    # ------------------------------------------------------------------ SaslAuthenticate

    def authenticate(self, token: bytes, now_ms: float) -> AuthStep:
        """Consume one client token. Failures move to FAILED and answer error 58."""
        if self.state not in (SaslState.AWAIT_AUTH, SaslState.AWAIT_FINAL):
            state = self.state
            self._fail(f"SaslAuthenticate in state {state.value}")
            return AuthStep(ErrorCode.ILLEGAL_SASL_STATE,
                            f"Unexpected SaslAuthenticate request in state {state.value}")  # fmt: skip
        try:
            if len(token) > MAX_TOKEN_BYTES:
                raise SaslFailure(f"token of {len(token)} bytes")
            if self.mechanism == "PLAIN":
                user = self._plain(token)
                return self._succeed(user, b"", now_ms)
            if self.state is SaslState.AWAIT_AUTH:
                return AuthStep(ErrorCode.NONE, auth_bytes=self._scram_first(token))
            user, server_final = self._scram_final(token)
            return self._succeed(user, server_final, now_ms)
        except Exception as exc:  # scramp and the decoders raise many kinds; all mean no
            self._fail(f"{type(exc).__name__}: {exc}")
            return AuthStep(ErrorCode.SASL_AUTHENTICATION_FAILED, _failed_message(self.mechanism))

    def _succeed(self, user: str, auth_bytes: bytes, now_ms: float) -> AuthStep:
        principal = f"User:{user}"
        if self.principal is not None and principal != self.principal:
            # KIP-368: a re-authentication may not change who the connection is.
            raise SaslFailure(f"re-authentication as {principal}, was {self.principal}")
        self.principal = principal
        self.state = SaslState.AUTHENTICATED
        self._scram = None
        lifetime = self.reauth_ms
        self.expires_at_ms = now_ms + lifetime if lifetime > 0 else None
        return AuthStep(ErrorCode.NONE, None, auth_bytes, lifetime, principal)

    def _plain(self, token: bytes) -> str:
        """RFC 4616: [authzid] NUL authcid NUL passwd."""
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslFailure("PLAIN token without exactly two NUL separators")
        authzid, user, password = (part.decode("utf-8") for part in parts)
        if not user or not password:
            raise SaslFailure("PLAIN token with an empty user or password")
        if authzid and authzid != user:
            raise SaslFailure("PLAIN authorization id differs from the user")
        if not self.store.verify_plain(user, password):
            raise SaslFailure(f"PLAIN: wrong password or unknown user {user!r}")
        return user

    def _scram_first(self, token: bytes) -> bytes:
        text = token.decode("utf-8")
        gs2, _, bare = text.partition(",")
        authzid, _, bare = bare.partition(",")
        if gs2 not in ("n", "y"):
            raise SaslFailure("SCRAM channel binding is not supported")
        user = _saslname(_attribute(bare, "n"))
        if authzid and _saslname(authzid.removeprefix("a=")) != user:
            raise SaslFailure("SCRAM authorization id differs from the user")
        assert self.mechanism is not None
        credential = self.store.lookup(user, self.mechanism)
        if credential is None:
            raise SaslFailure(f"unknown SCRAM user {user!r}")

        def auth_fn(_: str) -> tuple[bytes, bytes, bytes, int]:
            return (credential.salt, credential.stored_key, credential.server_key,
                    credential.iterations)  # fmt: skip

        server = ScramMechanism(self.mechanism).make_server(auth_fn)
        server.set_client_first(text)
        self._scram = (server, user, _attribute(bare, "r"))
        self.state = SaslState.AWAIT_FINAL
        return str(server.get_server_first()).encode()

    def _scram_final(self, token: bytes) -> tuple[str, bytes]:
        if self._scram is None:
            raise SaslFailure("SCRAM client-final without client-first")
        server, user, client_nonce = self._scram
        text = token.decode("utf-8")
        if _attribute(text, "r") == client_nonce + str(server.nonce):
            # librdkafka before 2.6.1 (kcat 1.7 on Debian) repeats its own nonce in front
            # of the server's (librdkafka#4895); Kafka 3.8.1-3.9 accepts that. The server
            # nonce is still there in full, so replay protection holds: accept exactly
            # this form. The proof covers the message as sent, so it still verifies.
            server.nonce = type(server.nonce)(client_nonce + str(server.nonce))
        server.set_client_final(text)  # checks the nonce and the proof
        return user, str(server.get_server_final()).encode()


def _attribute(message: str, name: str) -> str:
    for part in message.split(","):
        if part.startswith(name + "="):
            return part[len(name) + 1 :]
    raise SaslFailure(f"SCRAM message without {name}=")


def _saslname(value: str) -> str:
    """RFC 5802 saslname: '=2C' is ',' and '=3D' is '='; any other '=' is invalid."""
    out = value.replace("=2C", ",").replace("=3D", "=")
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise SaslFailure("SCRAM user name with a bad '=' escape")
    if not out:
        raise SaslFailure("SCRAM message with an empty user name")
    return out
