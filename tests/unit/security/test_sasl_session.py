"""The sans-I/O SASL session: transitions, what it permits, and the credential store."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
from scramp import ScramClient

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import (
    CredentialError,
    CredentialStore,
    credential_from_password,
    credential_from_salted,
)
from trio_broker.security.decoy import DECOY_SALT_BYTES, decoy_credential, decoy_secret
from trio_broker.security.sasl import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    AuthStep,
    PasswordCheck,
    SaslSession,
    SaslState,
)

METADATA, PRODUCE = 3, 0
USER, PASSWORD = "alice", "pencil"
ALL = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    users = CredentialStore(None)
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        users.add(USER, mech, PASSWORD)
    users.add("weird,na=me", "SCRAM-SHA-256", PASSWORD)
    return users


def session(store: CredentialStore, mechanisms: list[str] = ALL, reauth_ms: int = 0) -> SaslSession:
    return SaslSession(list(mechanisms), store, reauth_ms)


def plain_ok(store: CredentialStore, user: str, password: str) -> bool:
    """Does a PLAIN login with these credentials succeed?"""
    s = session(store)
    s.handshake("PLAIN")
    return s.authenticate_blocking(f"\0{user}\0{password}".encode(), 0).error_code == 0


def scram(s: SaslSession, mech: str, user: str = USER, password: str = PASSWORD) -> int:
    """A whole SCRAM exchange; the final error code."""
    assert s.handshake(mech) == ErrorCode.NONE
    client = ScramClient([mech], user, password)
    first = s.authenticate_blocking(client.get_client_first().encode(), now_ms=0)
    if first.error_code:
        return first.error_code
    assert s.state is SaslState.AWAIT_FINAL and first.principal is None
    client.set_server_first(first.auth_bytes.decode())
    final = s.authenticate_blocking(client.get_client_final().encode(), now_ms=0)
    if final.error_code == 0:
        client.set_server_final(final.auth_bytes.decode())  # the server proved its key
    return final.error_code


# --------------------------------------------------------------------------- transitions


def test_before_login_only_sasl_and_api_versions_are_permitted(store: CredentialStore) -> None:
    s = session(store)
    assert s.state is SaslState.AWAIT_HANDSHAKE
    for key in (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE):
        assert s.permits(key, 0)
    for key in (METADATA, PRODUCE, 1, 10, 19):
        assert not s.permits(key, 0)
    assert s.handshake("PLAIN") == 0 and s.state is SaslState.AWAIT_AUTH
    assert not s.permits(METADATA, 0)


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login(store: CredentialStore, mech: str) -> None:
    s = session(store)
    assert scram(s, mech) == ErrorCode.NONE
    assert s.state is SaslState.AUTHENTICATED and s.principal == "User:alice"
    assert s.permits(METADATA, 10**12)


def test_scram_user_names_are_saslname_decoded(store: CredentialStore) -> None:
    s = session(store)
    assert scram(s, "SCRAM-SHA-256", user="weird,na=me") == 0
    assert s.principal == "User:weird,na=me"


def test_plain_login(store: CredentialStore) -> None:
    s = session(store)
    assert s.handshake("PLAIN") == 0
    step = s.authenticate_blocking(b"\0alice\0pencil", now_ms=5)
    assert step.error_code == 0 and step.principal == "User:alice" and step.auth_bytes == b""
    assert s.authenticated


@pytest.mark.parametrize(
    "token",
    [b"\0alice\0pencils", b"\0alice\0", b"\0\0pencil", b"alice\0pencil", b"alicepencil",
     b"\0alice\0pencil\0", b"eve\0alice\0pencil", b"\0bob\0pencil", b"\0alice\0\xc3"],
)  # fmt: skip
def test_plain_failures(store: CredentialStore, token: bytes) -> None:
    s = session(store)
    s.handshake("PLAIN")
    step = s.authenticate_blocking(token, now_ms=0)
    assert step.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert step.principal is None and s.failed and s.principal is None
    # The answer does not say what was wrong.
    assert step.error_message == (
        "Authentication failed during authentication due to invalid credentials "
        "with SASL mechanism PLAIN"
    )
    assert not s.permits(API_VERSIONS, 0) and not s.permits(METADATA, 0)


def test_wrong_scram_password_fails(store: CredentialStore) -> None:
    s = session(store)
    assert scram(s, "SCRAM-SHA-512", password="pencil2") == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert s.failed and s.principal is None


def server_first(s: SaslSession, mech: str, user: str) -> dict[str, str]:
    """The attributes of the server-first message ``user`` gets (r, s, i)."""
    assert s.handshake(mech) == ErrorCode.NONE
    first = s.authenticate(ScramClient([mech], user, PASSWORD).get_client_first().encode(), 0)
    assert isinstance(first, AuthStep) and first.error_code == ErrorCode.NONE
    return dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_unknown_scram_user_looks_like_a_known_one_and_fails_at_the_end(
    store: CredentialStore, mech: str
) -> None:
    # RFC 5802 section 9: the first answer must not tell who exists.
    known = server_first(session(store), mech, USER)
    unknown = server_first(session(store), mech, "bob")
    assert unknown["i"] == known["i"] == "4096"
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(known["s"]))
    assert unknown["s"] != known["s"]
    # The same salt every time, as a real user's: trying twice tells nothing either.
    assert server_first(session(store), mech, "bob")["s"] == unknown["s"]
    assert server_first(session(store), mech, "carol")["s"] != unknown["s"]
    s = session(store)
    assert scram(s, mech, user="bob") == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert s.failed and s.principal is None and "unknown SCRAM user" in s.reason


def test_decoy_salts_are_as_long_as_real_ones() -> None:
    made = credential_from_password("SCRAM-SHA-256", PASSWORD, 4096)
    assert len(made.salt) == DECOY_SALT_BYTES
    decoy = decoy_credential(b"secret", "bob", "SCRAM-SHA-512")
    assert len(decoy.salt) == DECOY_SALT_BYTES and len(decoy.stored_key) == 64
    assert decoy_credential(b"other secret", "bob", "SCRAM-SHA-512") != decoy


def test_plain_salts_the_password_of_an_unknown_user_too(store: CredentialStore) -> None:
    s = session(store)
    s.handshake("PLAIN")
    check = s.authenticate(b"\0bob\0pencil", 0)
    # The same work as for a real user (a PBKDF2 over a decoy), then a refusal.
    assert isinstance(check, PasswordCheck) and not check.known
    assert [c.iterations for _, c, _ in check.credentials] == [4096, 4096]
    assert s.state is SaslState.CHECKING
    assert check.run() is False
    step = s.password_checked(check, True, 0)  # even a forged "ok" cannot log in nobody
    assert step.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and s.principal is None


def test_plain_salts_as_much_whichever_mechanisms_a_user_has(tmp_path: Path) -> None:
    # Timing must not tell a user with one SCRAM mechanism from one with both, or none.
    users = CredentialStore(None)
    users.add("only512", "SCRAM-SHA-512", "pw")
    for user in ("only512", "alice", "nobody"):
        s = session(users)
        s.handshake("PLAIN")
        check = s.authenticate(f"\0{user}\0pw".encode(), 0)
        assert isinstance(check, PasswordCheck)
        assert [m for m, _, _ in check.credentials] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert check.run() is (user == "only512")


def test_a_plain_check_changes_nothing_until_its_result_is_handed_back(
    store: CredentialStore,
) -> None:
    # [auth-race]: the check runs in a worker thread; only password_checked, on the
    # event loop, completes the login, setting state and principal together.
    s = session(store)
    s.handshake("PLAIN")
    check = s.authenticate(b"\0alice\0pencil", 0)
    assert isinstance(check, PasswordCheck)
    assert check.run() is True
    assert s.state is SaslState.CHECKING and s.principal is None
    assert not any(s.permits(k, 0) for k in (METADATA, API_VERSIONS, SASL_HANDSHAKE))
    step = s.password_checked(check, True, 0)
    assert step.error_code == 0 and s.principal == "User:alice" and s.permits(METADATA, 0)


def test_an_expired_session_permits_only_a_reauthentication_handshake(
    store: CredentialStore,
) -> None:
    s = session(store, reauth_ms=1000)
    s.handshake("PLAIN")
    s.authenticate_blocking(b"\0alice\0pencil", now_ms=0)
    assert s.permits(API_VERSIONS, 999)
    # Kafka closes an expired connection on anything but SaslHandshake, ApiVersions too.
    assert not s.permits(API_VERSIONS, 1000) and not s.permits(SASL_AUTHENTICATE, 1000)
    assert s.permits(SASL_HANDSHAKE, 1000)


def test_unsupported_and_disabled_mechanisms(store: CredentialStore) -> None:
    s = session(store, ["SCRAM-SHA-512"])
    assert s.handshake("PLAIN") == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert s.failed
    assert session(store).handshake("GSSAPI") == ErrorCode.UNSUPPORTED_SASL_MECHANISM


def test_out_of_order_requests_are_illegal(store: CredentialStore) -> None:
    s = session(store)
    assert s.authenticate_blocking(b"\0alice\0pencil", 0).error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert s.failed
    s = session(store)
    s.handshake("SCRAM-SHA-256")
    assert s.handshake("SCRAM-SHA-256") == ErrorCode.ILLEGAL_SASL_STATE
    s = session(store)
    s.handshake("PLAIN")
    s.authenticate_blocking(b"\0alice\0pencil", 0)
    assert s.authenticate_blocking(b"\0alice\0pencil", 0).error_code == ErrorCode.ILLEGAL_SASL_STATE


def test_oversized_token_fails(store: CredentialStore) -> None:
    s = session(store)
    s.handshake("SCRAM-SHA-256")
    step = s.authenticate_blocking(b"n,,n=alice,r=" + b"a" * 10_000, 0)
    assert step.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_scram_final_without_first_is_not_possible(store: CredentialStore) -> None:
    s = session(store)
    s.handshake("SCRAM-SHA-256")
    # A client-final as the first token is a malformed client-first.
    step = s.authenticate_blocking(b"c=biws,r=abc,p=AAAA", 0)
    assert step.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


# --------------------------------------------------------------------------- lifetime


def test_session_lifetime_and_reauthentication(store: CredentialStore) -> None:
    s = session(store, reauth_ms=1000)
    s.handshake("PLAIN")
    step = s.authenticate_blocking(b"\0alice\0pencil", now_ms=500)
    assert step.session_lifetime_ms == 1000 and s.expires_at_ms == 1500
    assert s.permits(METADATA, 1499) and not s.permits(METADATA, 1500)
    assert s.permits(SASL_HANDSHAKE, 5000)
    # KIP-368: a new exchange on the same connection renews the session.
    assert s.handshake("PLAIN") == 0 and not s.permits(METADATA, 600)
    assert s.authenticate_blocking(b"\0alice\0pencil", now_ms=6000).error_code == 0
    assert s.permits(METADATA, 6999) and not s.permits(METADATA, 7000)


def test_reauthentication_must_keep_user_and_mechanism(store: CredentialStore) -> None:
    s = session(store)
    assert scram(s, "SCRAM-SHA-256") == 0
    assert s.handshake("SCRAM-SHA-512") == ErrorCode.ILLEGAL_SASL_STATE
    s = session(store)
    assert scram(s, "SCRAM-SHA-256") == 0
    assert scram(s, "SCRAM-SHA-256", user="weird,na=me") == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert s.failed


# --------------------------------------------------------------------------- credentials


def test_store_keeps_salted_keys_only(tmp_path: Path) -> None:
    users = CredentialStore.in_data_dir(tmp_path)
    users.add(USER, "SCRAM-SHA-512", PASSWORD, iterations=8192)
    path = tmp_path / "scram-credentials.json"
    text = path.read_text()
    assert PASSWORD not in text
    entry = json.loads(text)["users"][USER]["SCRAM-SHA-512"]
    assert set(entry) == {"salt", "stored_key", "server_key", "iterations"}
    assert entry["iterations"] == 8192
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Another process (trio-broker users) changes the file: a store sees it.
    other = CredentialStore.in_data_dir(tmp_path)
    other.add("bob", "SCRAM-SHA-256", "pw")
    assert set(users.users()) == {USER, "bob"}
    assert plain_ok(users, "bob", "pw") and not plain_ok(users, "bob", "pW")
    assert users.delete("bob") and not users.delete("bob")
    assert users.delete(USER, "SCRAM-SHA-512") and users.users() == {}


def test_store_rejects_weak_or_unknown(tmp_path: Path) -> None:
    users = CredentialStore.in_data_dir(tmp_path)
    with pytest.raises(CredentialError):
        users.add(USER, "SCRAM-SHA-512", PASSWORD, iterations=1000)
    with pytest.raises(CredentialError):
        users.add(USER, "SCRAM-SHA-1", PASSWORD)
    with pytest.raises(CredentialError):
        users.add("", "SCRAM-SHA-256", PASSWORD)
    with pytest.raises(CredentialError):
        users.add(USER, "SCRAM-SHA-256", "")


def test_salted_credential_equals_password_credential() -> None:
    """AlterUserScramCredentials sends a salted password; the keys must be the same."""
    import hashlib

    made = credential_from_password("SCRAM-SHA-256", PASSWORD, 4096)
    salted = hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), made.salt, 4096)
    assert credential_from_salted("SCRAM-SHA-256", made.salt, salted, 4096) == made


# --------------------------------------------------------------------------- users CLI


def test_users_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trio_broker.cli import main

    data = str(tmp_path / "data")
    (tmp_path / "pw").write_text("from a file\n")
    assert main(["users", "add", "--data-dir", data, "--user", "alice", "--password", "x1"]) == 0
    assert main(["users", "add", "--data-dir", data, "--user", "bob", "--password-file",
                 str(tmp_path / "pw"), "--mechanism", "SCRAM-SHA-512", "--iterations", "8192"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["users", "list", "--data-dir", data]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed == [
        "alice\tSCRAM-SHA-256 (iterations=4096), SCRAM-SHA-512 (iterations=4096)",
        "bob\tSCRAM-SHA-512 (iterations=8192)",
    ]
    store = CredentialStore.in_data_dir(Path(data))
    assert plain_ok(store, "bob", "from a file") and plain_ok(store, "alice", "x1")
    assert main(["users", "delete", "--data-dir", data, "--user", "alice",
                 "--mechanism", "SCRAM-SHA-256"]) == 0  # fmt: skip
    assert main(["users", "delete", "--data-dir", data, "--user", "carol"]) == 1
    assert main(["users", "add", "--data-dir", data, "--user", "dave", "--password", "p",
                 "--iterations", "100"]) == 2  # fmt: skip
    assert set(store.users()) == {"alice", "bob"}
    assert list(store.users()["alice"]) == ["SCRAM-SHA-512"]


def test_the_decoy_secret_survives_a_restart(tmp_path: Path) -> None:
    # A secret made anew at each start would change unknown users' salts while
    # real ones stay: a way to tell them apart again.
    first = decoy_secret(tmp_path)
    assert decoy_secret(tmp_path) == first and len(first) == 32
    assert stat.S_IMODE((tmp_path / "sasl-decoy.secret").stat().st_mode) == 0o600
    (tmp_path / "sasl-decoy.secret").write_bytes(b"torn")
    assert len(decoy_secret(tmp_path)) == 32
    assert decoy_secret(None) != decoy_secret(None)
