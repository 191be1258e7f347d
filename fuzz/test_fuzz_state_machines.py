"""Fuzz targets: the per-connection state machines fed whatever a peer (or a broken shell)
can produce.

* SASL (``trio_broker.security.sasl.SaslSession``): any sequence of SaslHandshake
  mechanisms and SaslAuthenticate tokens -- random bytes, real PLAIN and SCRAM tokens,
  and real tokens with one byte flipped. Nothing raises; every answer carries a known
  error code; FAILED is terminal and permits nothing; a connection is authenticated
  only through a real login of a real user, and only then may send other APIs; a failed
  login's message never says which part was wrong.
* Mute (``trio_broker.state.mute.ChannelMute``): any byte string read as a sequence of
  mute events. Each event does what ``spec.mute_model`` says or raises
  ``IllegalMuteTransition`` and changes nothing; readable iff no reason is set.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scramp import ScramClient

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import CredentialStore
from trio_broker.security.sasl import (
    API_VERSIONS,
    MAX_TOKEN_BYTES,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    AuthStep,
    SaslSession,
    SaslState,
)
from trio_broker.state.mute import ChannelMute, IllegalMuteTransition, MuteEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.mute_model import model_step

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
USER, PASSWORD = "alice", "alice-secret"
PRODUCE, FETCH = 0, 1
SASL_ERRORS = {
    ErrorCode.NONE,
    ErrorCode.ILLEGAL_SASL_STATE,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM,
    ErrorCode.SASL_AUTHENTICATION_FAILED,
}
FAILED_MESSAGE = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
)

_STORE: CredentialStore | None = None


def store() -> CredentialStore:
    """One in-memory user for every mechanism (salting costs ~10 ms: do it once)."""
    global _STORE
    if _STORE is None:
        _STORE = CredentialStore(None)
        for mechanism in MECHANISMS[1:]:
            _STORE.add(USER, mechanism, PASSWORD)
    return _STORE


GOOD_PLAIN = [b"\x00alice\x00alice-secret", b"alice\x00alice\x00alice-secret"]
BAD_PLAIN = [
    b"\x00alice\x00wrong",
    b"\x00bob\x00alice-secret",
    b"bob\x00alice\x00alice-secret",
    b"\x00alice\x00",
    b"\x00\x00alice-secret",
    b"alice\x00alice-secret",
    b"\x00alice\x00alice-secret\x00",
    b"\x00al\xffice\x00alice-secret",
]
BAD_SCRAM_FIRST = [
    b"n,,n=alice",
    b"p=tls-unique,,n=alice,r=abc",
    b"n,,n=bob,r=abc",
    b"n,a=bob,n=alice,r=abc",
    b"n,,n=al=ice,r=abc",
    b"n,,n=,r=abc",
    b"n,,r=abc",
    b"",
    b"\xff\xfe",
]


def flip(token: bytes, where: int, bit: int) -> bytes:
    if not token:
        return b"\x80"
    i = where % len(token)
    return token[:i] + bytes([token[i] ^ (1 << bit)]) + token[i + 1 :]


@st.composite
def tokens(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "good", "bad", "flipped", "huge"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "good":
        return draw(st.sampled_from(GOOD_PLAIN))
    if kind == "bad":
        return draw(st.sampled_from(BAD_PLAIN + BAD_SCRAM_FIRST))
    if kind == "huge":
        return b"\x00alice\x00" + b"x" * MAX_TOKEN_BYTES
    return flip(
        draw(st.sampled_from(GOOD_PLAIN)), draw(st.integers(0, 40)), draw(st.integers(0, 7))
    )


steps = st.lists(
    st.one_of(
        st.tuples(st.just("handshake"), st.sampled_from([*MECHANISMS, "GSSAPI", "plain", ""])),
        st.tuples(st.just("authenticate"), tokens()),
        # the common case spelled out, so that logins (and re-logins) do succeed
        st.tuples(st.just("plain"), tokens()),
        st.tuples(
            st.just("scram"),
            st.sampled_from(MECHANISMS[1:]),
            st.one_of(st.just(-1), st.just(-1), st.integers(0, 400)),
        ),
    ),
    max_size=12,
)


def scram_login(session: SaslSession, mechanism: str, corrupt_at: int) -> list[AuthStep]:
    """A real SCRAM exchange; ``corrupt_at`` >= 0 flips one bit of the client-final."""
    client = ScramClient([mechanism], USER, PASSWORD)
    answers = [session.authenticate_blocking(client.get_client_first().encode(), 0)]
    if answers[0].error_code != ErrorCode.NONE:
        return answers
    client.set_server_first(answers[0].auth_bytes.decode())
    final = client.get_client_final().encode()
    if corrupt_at >= 0:
        final = flip(final, corrupt_at, corrupt_at % 7)
    answers.append(session.authenticate_blocking(final, 0))
    if answers[-1].error_code == ErrorCode.NONE:
        client.set_server_final(answers[-1].auth_bytes.decode())  # the server proved itself
    return answers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_sasl_session_survives_any_exchange(script: list[tuple[object, ...]]) -> None:
    session = SaslSession(list(MECHANISMS), store())
    for step in script:
        before = session.state
        if step[0] == "handshake":
            mechanism = str(step[1])
            code = session.handshake(mechanism)
            assert code in SASL_ERRORS
            if code == ErrorCode.NONE:
                assert mechanism in MECHANISMS and session.state is SaslState.AWAIT_AUTH
            answers: list[AuthStep] = []
        elif step[0] in ("authenticate", "plain"):
            token = step[1]
            assert isinstance(token, bytes)
            if step[0] == "plain" and session.handshake("PLAIN") != ErrorCode.NONE:
                continue
            answers = [session.authenticate_blocking(token, 0)]
            if answers[0].error_code == ErrorCode.NONE and session.authenticated:
                assert session.mechanism == "PLAIN" and token in GOOD_PLAIN
        else:
            mechanism, corrupt_at = str(step[1]), int(step[2])  # type: ignore[call-overload]
            answers = []
            if session.handshake(mechanism) == ErrorCode.NONE:
                answers = scram_login(session, mechanism, corrupt_at)
                if session.authenticated:
                    assert corrupt_at < 0 or answers[-1].error_code == ErrorCode.NONE
        for answer in answers:
            assert answer.error_code in SASL_ERRORS
            if answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED:
                # the same words whatever was wrong: user, password, or the token itself
                assert answer.error_message == FAILED_MESSAGE.format(session.mechanism)
        if before is SaslState.FAILED:
            assert session.state is SaslState.FAILED, "FAILED is terminal"
        if session.failed:
            assert not any(session.permits(k, 0) for k in (API_VERSIONS, SASL_HANDSHAKE, PRODUCE))
        else:
            assert session.permits(API_VERSIONS, 0) and session.permits(SASL_AUTHENTICATE, 0)
        assert session.permits(FETCH, 0) == session.authenticated
        if session.authenticated:
            assert session.principal == f"User:{USER}"


def test_a_real_scram_login_with_a_flipped_proof_fails() -> None:
    # The deterministic core of the target above, for every SCRAM mechanism.
    for mechanism in MECHANISMS[1:]:
        good = SaslSession(list(MECHANISMS), store())
        assert good.handshake(mechanism) == ErrorCode.NONE
        assert [a.error_code for a in scram_login(good, mechanism, -1)] == [0, 0]
        assert good.authenticated and good.principal == "User:alice"
        bad = SaslSession(list(MECHANISMS), store())
        assert bad.handshake(mechanism) == ErrorCode.NONE
        answers = scram_login(bad, mechanism, 60)
        assert [a.error_code for a in answers] == [0, ErrorCode.SASL_AUTHENTICATION_FAILED]
        assert bad.failed and not bad.permits(PRODUCE, 0)


# ------------------------------------------------------------------ mute


EVENTS = list(MuteEvent)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_mute_follows_the_model_for_any_event_bytes(data: bytes) -> None:
    mute = ChannelMute()
    for byte in data:
        event = EVENTS[byte % len(EVENTS)]
        before = mute.reasons
        expected = model_step(before, event)
        try:
            mute.handle(event)
        except IllegalMuteTransition:
            assert expected is None, f"{event} from {before} is legal in the model"
            assert mute.reasons == before, "an illegal event changed the state"
        else:
            assert mute.reasons == expected, f"{event} from {before}"
        assert mute.readable == (not mute.reasons)
