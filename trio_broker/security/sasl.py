"""The SASL exchange of one connection, sans I/O (no trio): a small state machine.

::

    AWAIT_HANDSHAKE --SaslHandshake(enabled mechanism)--> AWAIT_AUTH
    AWAIT_AUTH --PLAIN token parsed--> CHECKING --password_checked(ok)--> AUTHENTICATED
    AWAIT_AUTH --SCRAM client-first--> AWAIT_FINAL --valid client-final--> AUTHENTICATED
    AUTHENTICATED --SaslHandshake (re-authentication, KIP-368)--> AWAIT_AUTH
    any state --bad input, wrong password, unknown mechanism--> FAILED (terminal)

"Authenticated" and "as whom" are one fact: :attr:`SaslSession.principal` is the
user while the state is AUTHENTICATED and None in every other state, and both change
together in one call on the event loop. The slow part of a PLAIN login (salting the
password) is a :class:`PasswordCheck`: plain data whose ``run`` the shell calls in a
worker thread and which touches no session, so a thread never changes what the
connection's reader or the handler pool see (the [auth-race] defect was a thread
marking the session authenticated before the principal was set).

Before AUTHENTICATED only ApiVersions, SaslHandshake and SaslAuthenticate are
permitted (:meth:`SaslSession.permits`); anything else closes the connection, as
Kafka's SaslServerAuthenticator does. Once the session has expired
(connections.max.reauth.ms) only a SaslHandshake that starts re-authentication is
permitted; Kafka closes the connection on anything else, ApiVersions included. A
FAILED session permits nothing: the connection answers the failing request and
closes. Every failure of a login gives the same message, so the answer does not
tell which part was wrong, and an unknown user is not told apart from a known one:
SCRAM answers it with a decoy salt and iteration count derived from a server secret
(RFC 5802, section 9) and fails at client-final, and PLAIN salts its password too.

Requests are framed as KIP-152 describes: SaslHandshake v1 then SaslAuthenticate
requests carrying the tokens (what librdkafka, kafka-python and aiokafka send).
"""

from __future__ import annotations

import contextlib
import enum
import hmac
from typing import Any

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import ApiKey
from trio_broker.security.credentials import SCRAM_MECHANISMS, CredentialStore, ScramCredential
from trio_broker.security.decoy import decoy_credential

API_VERSIONS, SASL_HANDSHAKE = ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE
SASL_AUTHENTICATE = ApiKey.SASL_AUTHENTICATE
PRE_AUTH_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
#: Kafka's sasl.server.max.receive.size: the largest request before authentication.
MAX_RECEIVE_SIZE = 524_288
#: SCRAM and PLAIN tokens are short; a bigger one is hostile.
MAX_TOKEN_BYTES = 8192


class SaslState(enum.Enum):
    AWAIT_HANDSHAKE = "await_handshake"
    AWAIT_AUTH = "await_auth"
    AWAIT_FINAL = "await_final"  # SCRAM: server-first sent, waiting for client-final
    CHECKING = "checking"  # PLAIN: the password is being salted off the event loop
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


@attrs.frozen
class PasswordCheck:
    """A PLAIN password to compare with stored credentials: slow, so the shell runs
    :meth:`run` in a worker thread. Plain data: running it changes no session."""

    user: str
    password: str
    #: One (mechanism, credential, real) per SCRAM mechanism, in a fixed order: the
    #: user's credential where it has one, a decoy where not. All are salted, so the
    #: time taken tells neither whether the user exists nor which mechanisms it has.
    credentials: tuple[tuple[str, ScramCredential, bool], ...]

    @property
    def known(self) -> bool:
        return any(real for _, _, real in self.credentials)

    def run(self) -> bool:
        """True iff the password matches the user's first real credential (constant time)."""
        matches = [
            hmac.compare_digest(_stored_key(mechanism, self.password, credential),
                                credential.stored_key) and real
            for mechanism, credential, real in self.credentials
        ]  # fmt: skip
        first_real = next((i for i, (_, _, real) in enumerate(self.credentials) if real), None)
        return first_real is not None and matches[first_real]


def _stored_key(mechanism: str, password: str, credential: ScramCredential) -> bytes:
    """The password salted and hashed as ``credential`` was made (RFC 5802 StoredKey)."""
    from scramp import ScramMechanism  # deferred: see credentials.credential_from_password

    _, stored_key, _, _ = ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=credential.iterations, salt=credential.salt
    )
    return bytes(stored_key)


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
    #: Derives the decoy credentials of unknown users (see :func:`decoy_credential`).
    decoy_secret: bytes = b""
    state: SaslState = SaslState.AWAIT_HANDSHAKE
    mechanism: str | None = None
    #: Who the first login proved to be; kept through re-authentication, which may
    #: not change it (KIP-368). Not "who the connection is now": see :attr:`principal`.
    logged_in_as: str | None = None
    #: Monotonic ms after which only re-authentication is permitted; None = never.
    expires_at_ms: float | None = None
    #: Why the session failed (logged by the shell, never sent).
    reason: str = ""
    _scram: tuple[Any, str, str, bool] | None = None

    @property
    def failed(self) -> bool:
        return self.state is SaslState.FAILED

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.AUTHENTICATED

    @property
    def principal(self) -> str | None:
        """The principal requests run as: the user while AUTHENTICATED, else None."""
        return self.logged_in_as if self.state is SaslState.AUTHENTICATED else None

    def permits(self, api_key: int, now_ms: float) -> bool:
        """May a request with ``api_key``, read now, be handled?"""
        if self.state in (SaslState.FAILED, SaslState.CHECKING):
            # CHECKING: the shell reads nothing while a login step runs (the
            # AUTHENTICATING mute); a request that got here anyway is refused.
            return False
        if self.state is SaslState.AUTHENTICATED:
            if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
                # Expired: only the SaslHandshake that begins re-authentication.
                return api_key == SASL_HANDSHAKE
            return True
        # Before a login completes (or mid re-authentication) only SASL and ApiVersions.
        return api_key in PRE_AUTH_APIS

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

    def authenticate(self, token: bytes, now_ms: float) -> AuthStep | PasswordCheck:
        """Consume one client token. Failures move to FAILED and answer error 58.

        A PLAIN token gives a :class:`PasswordCheck` (state CHECKING): run it off the
        event loop, then hand its result to :meth:`password_checked`.
        """
        if self.state not in (SaslState.AWAIT_AUTH, SaslState.AWAIT_FINAL):
            return self._illegal("SaslAuthenticate")
        try:
            if len(token) > MAX_TOKEN_BYTES:
                raise SaslFailure(f"token of {len(token)} bytes")
            if self.mechanism == "PLAIN":
                check = self._plain(token)
                self.state = SaslState.CHECKING
                return check
            if self.state is SaslState.AWAIT_AUTH:
                return AuthStep(ErrorCode.NONE, auth_bytes=self._scram_first(token))
            user, server_final = self._scram_final(token)
            return self._succeed(user, server_final, now_ms)
        except Exception as exc:  # scramp and the decoders raise many kinds; all mean no
            return self._refuse(f"{type(exc).__name__}: {exc}")

    def authenticate_blocking(self, token: bytes, now_ms: float) -> AuthStep:
        """:meth:`authenticate`, running a PLAIN password check in the caller (it blocks)."""
        outcome = self.authenticate(token, now_ms)
        if isinstance(outcome, PasswordCheck):
            return self.password_checked(outcome, outcome.run(), now_ms)
        return outcome

    def password_checked(self, check: PasswordCheck, ok: bool, now_ms: float) -> AuthStep:
        """The result of a :class:`PasswordCheck` this session handed out."""
        if self.state is not SaslState.CHECKING:
            return self._illegal("a password check result")
        if not (ok and check.known):
            wrong = "wrong password" if check.known else "unknown user"
            return self._refuse(f"PLAIN: {wrong} {check.user!r}")
        try:
            return self._succeed(check.user, b"", now_ms)
        except SaslFailure as exc:
            return self._refuse(str(exc))

    def _illegal(self, what: str) -> AuthStep:
        state = self.state
        self._fail(f"{what} in state {state.value}")
        return AuthStep(ErrorCode.ILLEGAL_SASL_STATE,
                        f"Unexpected SaslAuthenticate request in state {state.value}")  # fmt: skip

    def _refuse(self, reason: str) -> AuthStep:
        self._fail(reason)
        return AuthStep(ErrorCode.SASL_AUTHENTICATION_FAILED, _failed_message(self.mechanism))

    def _succeed(self, user: str, auth_bytes: bytes, now_ms: float) -> AuthStep:
        principal = f"User:{user}"
        if self.logged_in_as is not None and principal != self.logged_in_as:
            # KIP-368: a re-authentication may not change who the connection is.
            raise SaslFailure(f"re-authentication as {principal}, was {self.logged_in_as}")
        # The one place a login completes: who and "authenticated" change together.
        self.logged_in_as = principal
        self.state = SaslState.AUTHENTICATED
        self._scram = None
        lifetime = self.reauth_ms
        self.expires_at_ms = now_ms + lifetime if lifetime > 0 else None
        return AuthStep(ErrorCode.NONE, None, auth_bytes, lifetime, principal)

    def _credential(self, user: str, mechanism: str) -> tuple[ScramCredential, bool]:
        """The user's credential for ``mechanism``, or a decoy (and False) if none."""
        credential = self.store.lookup(user, mechanism)
        if credential is not None:
            return credential, True
        return decoy_credential(self.decoy_secret, user, mechanism), False

    def _plain(self, token: bytes) -> PasswordCheck:
        """RFC 4616: [authzid] NUL authcid NUL passwd."""
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslFailure("PLAIN token without exactly two NUL separators")
        authzid, user, password = (part.decode("utf-8") for part in parts)
        if not user or not password:
            raise SaslFailure("PLAIN token with an empty user or password")
        if authzid and authzid != user:
            raise SaslFailure("PLAIN authorization id differs from the user")
        # A PLAIN user is checked against its first SCRAM credential (credentials.py).
        credentials = tuple(
            (mechanism, *self._credential(user, mechanism))
            for mechanism in sorted(SCRAM_MECHANISMS)
        )
        return PasswordCheck(user, password, credentials)

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
        # An unknown user gets a decoy's server-first and fails at client-final,
        # like a wrong password: the first answer does not tell users apart.
        credential, known = self._credential(user, self.mechanism)

        def auth_fn(_: str) -> tuple[bytes, bytes, bytes, int]:
            return (credential.salt, credential.stored_key, credential.server_key,
                    credential.iterations)  # fmt: skip

        from scramp import ScramMechanism  # deferred: see credentials.credential_from_password

        server = ScramMechanism(self.mechanism).make_server(auth_fn)
        server.set_client_first(text)
        self._scram = (server, user, _attribute(bare, "r"), known)
        self.state = SaslState.AWAIT_FINAL
        return str(server.get_server_first()).encode()

    def _scram_final(self, token: bytes) -> tuple[str, bytes]:
        if self._scram is None:
            raise SaslFailure("SCRAM client-final without client-first")
        server, user, client_nonce, known = self._scram
        text = token.decode("utf-8")
        if _attribute(text, "r") == client_nonce + str(server.nonce):
            # librdkafka before 2.6.1 (kcat 1.7 on Debian) repeats its own nonce in front
            # of the server's (librdkafka#4895); Kafka 3.8.1-3.9 accepts that. The server
            # nonce is still there in full, so replay protection holds: accept exactly
            # this form. The proof covers the message as sent, so it still verifies.
            server.nonce = type(server.nonce)(client_nonce + str(server.nonce))
        if not known:
            # The same work as for a real user, then the refusal (no proof can match
            # a decoy's keys, but the log should say why).
            with contextlib.suppress(Exception):
                server.set_client_final(text)
            raise SaslFailure(f"unknown SCRAM user {user!r}")
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
