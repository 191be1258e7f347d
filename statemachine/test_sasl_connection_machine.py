"""The SASL session and the connection together, against a model of who each request runs as.

[auth-race]: a request pipelined behind a PLAIN login ran as User:ANONYMOUS, because
the login's worker thread marked the session authenticated before the event loop
set the connection's principal, and the reader admitted the next request in
between. This machine drives a real in-process broker over a real socket with
pipelined frames: every step of PLAIN and SCRAM logins and re-logins, ApiVersions,
a request that needs a login (Metadata), a session that expires, and the worker
thread of a PLAIN check split in two steps that other rules interleave with:

* ``thread_runs``: the function the broker handed to ``trio.to_thread.run_sync``
  runs (the broker's own code, whatever it does);
* ``loop_resumes``: the broker's task that waited for that thread gets its result.

The reference model reads the frames in the order they were sent, as Kafka's
authenticator does (a request sent behind a login step is handled once the step
is done). Checked after every rule: every request a handler ran was expected, with
the principal the model says was authenticated when it was read, and nothing but
ApiVersions, SaslHandshake and SaslAuthenticate ran before a login completed.
Checked whenever nothing is parked in a thread: every request expected to be
handled was, every answer came in order with the expected error codes, and the
connection is closed exactly when the model says so.

The broker, its trio loop (in a thread of its own) and one connection per example
are real; the only stand-ins are the thread split above and a failed-login delay
of zero.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from scramp import ScramClient

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import CredentialStore
from trio_broker.server.broker import Broker

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
SASL_APIS = {API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}
ANONYMOUS = "User:ANONYMOUS"
VERSIONS = {API_VERSIONS: 0, METADATA: 4, SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 1}
WAIT_S = 10.0


# --------------------------------------------------------------------------- the real side


@attrs.define
class Parked:
    """One call the broker made to ``trio.to_thread.run_sync`` for a SASL step."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    ran: bool = False
    result: Any = None
    error: BaseException | None = None
    resume: trio.Event = attrs.Factory(trio.Event)


class BrokerHost:
    """A broker on a trio loop of its own thread; the machine calls into it through a portal."""

    def __init__(self, data_dir: Path, processing_model: str) -> None:
        store = CredentialStore.in_data_dir(data_dir)
        for user, password in PASSWORDS.items():
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                store.add(user, mech, password)
        self.config = BrokerConfig(
            port=0,
            data_dir=data_dir,
            storage="memory",
            processing_model=processing_model,
            listeners="SASL_PLAINTEXT://127.0.0.1:0",
            security={"sasl.enabled.mechanisms": ",".join(MECHANISMS)},
            connections_max_idle_ms=3_600_000,
            # A failed login answered at once: the machine settles on "every task
            # blocked", which the delay's sleep would pass before the answer.
            connection_failed_authentication_delay_ms=0,
        )
        #: (connection port, api key, correlation id, principal) of every handler call.
        self.calls: list[tuple[int, int, int, str]] = []
        self.parked: list[Parked] = []
        self.broker: Broker | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    def __enter__(self) -> BrokerHost:
        self._thread.start()
        assert self._started.wait(WAIT_S), "the broker did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._shutdown)
        self._thread.join(WAIT_S)

    async def _shutdown(self) -> None:
        for parked in self.parked:
            parked.resume.set()
        assert self._stop is not None
        self._stop.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        real_run_sync = trio.to_thread.run_sync

        async def split_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if getattr(fn, "__module__", "") != "trio_broker.security.sasl":
                return await real_run_sync(fn, *args, **kwargs)
            parked = Parked(fn, args)
            self.parked.append(parked)
            await parked.resume.wait()
            self.parked.remove(parked)
            if parked.error is not None:
                raise parked.error
            return parked.result

        trio.to_thread.run_sync = split_thread  # type: ignore[assignment]
        try:
            async with trio.open_nursery() as nursery:
                broker: Broker = await nursery.start(Broker(self.config).run)
                self.broker = broker
                for key, spec in list(broker.router.items()):
                    broker.router[key] = attrs.evolve(spec, fn=self._recording(spec.fn))
                self._started.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            trio.to_thread.run_sync = real_run_sync

    def _recording(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def recorded(ctx: Any, request: Any) -> Any:
            header = ctx.header
            self.calls.append((ctx.client.port, header.api_key, header.correlation_id,
                               ctx.principal))  # fmt: skip
            return await fn(ctx, request)

        return recorded

    def call(self, afn: Callable[[], Awaitable[Any]]) -> Any:
        return trio.from_thread.run(afn, trio_token=self._token)

    def settle(self) -> None:
        """Let the broker do all it can (until every task waits for something)."""

        async def settle() -> None:
            await trio.testing.wait_all_tasks_blocked(cushion=0.002)

        self.call(settle)

    @property
    def port(self) -> int:
        assert self.broker is not None
        return self.broker.bound[0][1]

    def connection(self, client_port: int) -> Any:
        assert self.broker is not None
        found = [c for c in self.broker.connections.values() if c.client.port == client_port]
        return found[0] if found else None


# --------------------------------------------------------------------------- the model


@attrs.define
class Expected:
    """What should become of one frame the client sent."""

    api_key: int
    correlation_id: int
    #: "handled" (run by a handler, answered), "refused" (the connection closes unread)
    #: or "unread" (sent after the connection was bound to close).
    fate: str
    principal: str | None = None
    error_code: int | None = None


@attrs.define
class LoginModel:
    """Who the connection is, as Kafka's authenticator would have it, frame by frame."""

    state: str = "start"  # start, await_auth, await_final, authenticated, failed
    mechanism: str | None = None
    logged_in_as: str | None = None
    expired: bool = False
    #: SCRAM: the user named in client-first, and whether it exists.
    scram_user: str | None = None
    ended: bool = False  # failed, refused a request, or closed

    def read(self, api_key: int, correlation_id: int, token: Any = None) -> Expected:
        def done(fate: str, principal: str | None = None, error: int | None = None) -> Expected:
            return Expected(api_key, correlation_id, fate, principal, error)

        if self.ended:
            return done("unread")
        authenticated = self.state == "authenticated"
        principal = f"User:{self.logged_in_as}" if authenticated else ANONYMOUS
        if authenticated and self.expired and api_key != SASL_HANDSHAKE:
            self.ended = True  # KIP-368: an expired session takes only a re-login
            return done("refused")
        if api_key == API_VERSIONS:
            return done("handled", principal, ErrorCode.NONE)
        if api_key == METADATA:
            if not authenticated:
                self.ended = True
                return done("refused")
            return done("handled", principal)
        if api_key == SASL_HANDSHAKE:
            return done("handled", principal, self._handshake(token))
        return done("handled", principal, self._authenticate(token))

    def _fail(self, code: int) -> int:
        self.state, self.ended = "failed", True
        return code

    def _handshake(self, mechanism: str) -> int:
        if self.state not in ("start", "authenticated"):
            return self._fail(ErrorCode.ILLEGAL_SASL_STATE)
        if mechanism not in MECHANISMS:
            return self._fail(ErrorCode.UNSUPPORTED_SASL_MECHANISM)
        if self.state == "authenticated" and mechanism != self.mechanism:
            return self._fail(ErrorCode.ILLEGAL_SASL_STATE)
        self.state, self.mechanism = "await_auth", mechanism
        return ErrorCode.NONE

    def _login(self, user: str) -> int:
        if self.logged_in_as not in (None, user):  # a re-login may not change the user
            return self._fail(ErrorCode.SASL_AUTHENTICATION_FAILED)
        self.state, self.logged_in_as, self.expired = "authenticated", user, False
        return ErrorCode.NONE

    def _authenticate(self, token: tuple[str, ...]) -> int:
        kind = token[0]
        if self.state not in ("await_auth", "await_final"):
            return self._fail(ErrorCode.ILLEGAL_SASL_STATE)
        if self.state == "await_auth" and self.mechanism == "PLAIN" and kind == "plain":
            _, user, password = token
            if PASSWORDS.get(user) != password:
                return self._fail(ErrorCode.SASL_AUTHENTICATION_FAILED)
            return self._login(user)
        if self.state == "await_auth" and self.mechanism != "PLAIN" and kind == "scram-first":
            self.state, self.scram_user = "await_final", token[1]
            return ErrorCode.NONE  # a server-first even for an unknown user
        if self.state == "await_final" and kind == "scram-final":
            user, right = token[1], token[2] == "right"
            if user not in PASSWORDS or not right:
                return self._fail(ErrorCode.SASL_AUTHENTICATION_FAILED)
            return self._login(user)
        return self._fail(ErrorCode.SASL_AUTHENTICATION_FAILED)


# --------------------------------------------------------------------------- the machine


# Weighted towards logins that succeed, so that examples get past the first steps.
USERS = st.sampled_from(["alice", "alice", "bob", "mallory"])
RIGHT = st.sampled_from([True, True, True, False])


class SaslConnectionMachine(RuleBasedStateMachine):
    host: BrokerHost  # set by the test function

    def __init__(self) -> None:
        super().__init__()
        self.model = LoginModel()
        self.expected: dict[int, Expected] = {}
        self.sent: list[int] = []
        self.correlation_id = 0
        self.received = bytearray()
        self.eof = False
        self.scram: ScramClient | None = None
        self.scram_user = ""
        self.scram_right = False
        self.awaiting_server_first: int | None = None
        self.calls_seen = len(self.host.calls)
        self.sock = socket.create_connection(("127.0.0.1", self.host.port), timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = self.sock.getsockname()[1]

    def teardown(self) -> None:
        self.sock.close()

        # A parked step of this connection must not hold the next example up.
        async def release() -> None:
            for parked in list(self.host.parked):
                if not parked.ran:
                    parked.result = parked.fn(*parked.args)
                    parked.ran = True
                parked.resume.set()

        self.host.call(release)
        self.host.settle()

    # ------------------------------------------------------------------ sending

    def _send(self, api_key: int, request: Any, token: Any = None) -> int:
        self.correlation_id += 1
        cid = self.correlation_id
        frame = m.encode_request(api_key, VERSIONS[api_key], cid, "machine", request)
        expected = self.model.read(api_key, cid, token)
        with contextlib.suppress(InvalidArgument):  # outside Hypothesis: the step test
            note(f"send {api_key} #{cid} {token!r}: expect {expected}")
        self.expected[cid] = expected
        self.sent.append(cid)
        with contextlib.suppress(OSError):  # the broker may have closed it already
            self.sock.sendall(frame)
        self.host.settle()
        return cid

    @precondition(lambda self: not self.model.ended)
    @rule()
    def api_versions(self) -> None:
        self._send(API_VERSIONS, m.ApiVersionsRequest())

    @precondition(lambda self: not self.model.ended)
    @rule()
    def metadata(self) -> None:
        request = m.MetadataRequest(topics=[], allow_auto_topic_creation=False)
        self._send(METADATA, request)

    @precondition(lambda self: not self.model.ended)
    @rule(mechanism=st.sampled_from([*MECHANISMS, "GSSAPI"]))
    def handshake(self, mechanism: str) -> None:
        self._send(SASL_HANDSHAKE, m.SaslHandshakeRequest(mechanism=mechanism), mechanism)

    @precondition(lambda self: not self.model.ended)
    @rule(user=USERS, right=RIGHT)
    def plain_login(self, user: str, right: bool) -> None:
        """SaslHandshake and the PLAIN token, pipelined (what a client may send)."""
        self.handshake("PLAIN")
        self.plain_token(user, right)

    @precondition(lambda self: not self.model.ended)
    @rule(user=USERS, right=RIGHT, mechanism=st.sampled_from(MECHANISMS[1:]))
    def scram_login(self, user: str, right: bool, mechanism: str) -> None:
        """SaslHandshake and SCRAM's client-first, pipelined; client-final is scram_final."""
        self.handshake(mechanism)
        self.scram_first(user, right, mechanism)

    @precondition(lambda self: not self.model.ended)
    @rule(user=USERS, right=RIGHT)
    def plain_token(self, user: str, right: bool) -> None:
        password = PASSWORDS.get(user, "guess") if right else "wrong"
        token = f"\0{user}\0{password}".encode()
        self._send(SASL_AUTHENTICATE, m.SaslAuthenticateRequest(auth_bytes=token),
                   ("plain", user, password))  # fmt: skip

    @precondition(lambda self: not self.model.ended)
    @rule(user=USERS, right=RIGHT, mechanism=st.sampled_from(MECHANISMS[1:]))
    def scram_first(self, user: str, right: bool, mechanism: str) -> None:
        # A client computes its proof with the mechanism it handshook (the model does
        # not know a proof made with another hash fails).
        if self.model.mechanism in MECHANISMS[1:]:
            mechanism = self.model.mechanism
        password = PASSWORDS.get(user, "guess") if right else "wrong"
        self.scram = ScramClient([mechanism], user, password)
        self.scram_user = user
        self.scram_right = right
        first = self.scram.get_client_first().encode()
        self.awaiting_server_first = self._send(
            SASL_AUTHENTICATE, m.SaslAuthenticateRequest(auth_bytes=first), ("scram-first", user)
        )

    @precondition(lambda self: not self.model.ended and self.model.state == "await_final")
    @rule()
    def scram_final(self) -> None:
        # Needs the server-first: the client reads it before it can answer.
        server_first = self._answer_to(self.awaiting_server_first)
        assert self.scram is not None and server_first is not None
        self.scram.set_server_first(server_first.auth_bytes.decode())
        final = self.scram.get_client_final().encode()
        self._send(SASL_AUTHENTICATE, m.SaslAuthenticateRequest(auth_bytes=final),
                   ("scram-final", self.scram_user, "right" if self.scram_right else "wrong"))  # fmt: skip

    # ------------------------------------------------------------------ the worker thread

    def _parked(self, ran: bool) -> list[Parked]:
        return [p for p in self.host.parked if p.ran == ran]

    @precondition(lambda self: bool(self._parked(ran=False)))
    @rule()
    def thread_runs(self) -> None:
        """The thread's function runs; the task waiting for it does not resume yet."""
        parked = self._parked(ran=False)[0]

        async def run() -> None:
            try:
                parked.result = parked.fn(*parked.args)
            except BaseException as exc:
                parked.error = exc
            parked.ran = True

        self.host.call(run)
        self.host.settle()

    @precondition(lambda self: bool(self._parked(ran=True)))
    @rule()
    def loop_resumes(self) -> None:
        parked = self._parked(ran=True)[0]

        async def resume() -> None:
            parked.resume.set()

        self.host.call(resume)
        self.host.settle()

    # ------------------------------------------------------------------ time

    @rule()
    def time_passes(self) -> None:
        """Nothing new from the client (also what is left once the connection ended)."""
        self.host.settle()

    @precondition(
        lambda self: (
            self.model.state == "authenticated" and not self.model.ended and not self.host.parked
        )
    )
    @rule()
    def session_expires(self) -> None:
        """connections.max.reauth.ms runs out (set on the real session, then modelled)."""
        conn = self.host.connection(self.port)
        if conn is None or conn.sasl is None:
            return  # closed: the quiescent check below says whether that was right

        async def expire() -> None:
            conn.sasl.expires_at_ms = trio.current_time() * 1000 - 1

        self.host.call(expire)
        self.model.expired = True

    # ------------------------------------------------------------------ checks

    @invariant()
    def every_handled_request_ran_as_who_was_logged_in_when_read(self) -> None:
        for port, api_key, cid, principal in self.host.calls[self.calls_seen :]:
            if port != self.port:
                continue
            expected = self.expected.get(cid)
            assert expected is not None, f"a handler ran request #{cid} that was never sent"
            assert expected.fate == "handled", (
                f"API {api_key} #{cid} ran as {principal}; expected it {expected.fate}"
            )
            assert principal == expected.principal, (
                f"API {api_key} #{cid} ran as {principal}, "
                f"but {expected.principal} was authenticated when it was read"
            )

    @invariant()
    def when_nothing_waits_for_a_thread_everything_expected_happened(self) -> None:
        if self.host.parked:
            return
        self._read_available()
        ran = {c[2] for c in self.host.calls[self.calls_seen :] if c[0] == self.port}
        should = {cid for cid, e in self.expected.items() if e.fate == "handled"}
        assert ran == should, f"handled {sorted(ran)}, expected {sorted(should)}"
        answers = self._answers()
        assert [cid for cid, _ in answers] == [c for c in self.sent if c in should]
        for cid, answer in answers:
            expected = self.expected[cid]
            if expected.error_code is not None:
                assert answer.error_code == expected.error_code, (cid, answer, expected)
        assert self.eof == self.model.ended, (
            "connection closed" if self.eof else "connection open",
            "the model says " + ("closed" if self.model.ended else "open"),
        )

    # ------------------------------------------------------------------ reading answers

    def _read_available(self) -> None:
        if self.eof:
            return
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    chunk = self.sock.recv(65536)
                except BlockingIOError:
                    return
                except OSError:
                    self.eof = True
                    return
                if not chunk:
                    self.eof = True
                    return
                self.received += chunk
        finally:
            self.sock.settimeout(WAIT_S)

    def _answers(self) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        data, at = bytes(self.received), 0
        by_cid = {cid: self.expected[cid].api_key for cid in self.sent}
        while len(data) - at >= 4:
            (size,) = struct.unpack_from(">i", data, at)
            if len(data) - at - 4 < size:
                break
            body = data[at + 4 : at + 4 + size]
            (cid,) = struct.unpack_from(">i", body)
            api_key = by_cid[cid]
            out.append(m.decode_response(api_key, VERSIONS[api_key], body))
            at += 4 + size
        return out

    def _answer_to(self, cid: int | None) -> Any:
        self._read_available()
        return next((answer for c, answer in self._answers() if c == cid), None)

    @initialize()
    def connected(self) -> None:
        self.host.settle()


@pytest.fixture(params=["pipelined", "serial"], scope="module")
def host(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerHost]:
    with BrokerHost(tmp_path_factory.mktemp("sasl-machine"), request.param) as running:
        yield running


def test_requests_run_as_who_was_authenticated_when_read(host: BrokerHost) -> None:
    SaslConnectionMachine.host = host
    run_state_machine_as_test(
        SaslConnectionMachine, settings=settings(max_examples=150, stateful_step_count=30)
    )


def test_a_request_behind_a_plain_login_whose_thread_finished(host: BrokerHost) -> None:
    """The [auth-race] interleaving, step by step: the PLAIN thread has finished, its
    result has not reached the event loop, and a Metadata request arrives."""
    SaslConnectionMachine.host = host
    machine = SaslConnectionMachine()
    try:
        machine.connected()
        machine.handshake("PLAIN")
        machine.plain_token("bob", right=True)
        machine.thread_runs()
        machine.metadata()
        machine.every_handled_request_ran_as_who_was_logged_in_when_read()
        machine.loop_resumes()
        machine.every_handled_request_ran_as_who_was_logged_in_when_read()
        machine.when_nothing_waits_for_a_thread_everything_expected_happened()
    finally:
        machine.teardown()


def test_a_relogin_handshake_is_answered_before_a_refused_request_closes(
    host: BrokerHost,
) -> None:
    """Found with a random seed (pipelined): after a PLAIN login, a re-login's
    SaslHandshake and then a Metadata request that the handshake makes unpermitted.
    The reader closed the connection on reading the Metadata request while the
    handshake's answer could still be queued (trio runs the reader and the writer in
    a random order), so the client never got it; Kafka answers what it read before
    and then closes. Repeated: the old code lost the answer about one time in three."""
    SaslConnectionMachine.host = host
    for _ in range(20):
        machine = SaslConnectionMachine()
        try:
            machine.connected()
            machine.plain_login(user="alice", right=True)
            machine.handshake(mechanism="PLAIN")
            machine.metadata()
            machine.thread_runs()
            machine.loop_resumes()
            machine.every_handled_request_ran_as_who_was_logged_in_when_read()
            machine.when_nothing_waits_for_a_thread_everything_expected_happened()
        finally:
            machine.teardown()


def test_scram_first_uses_the_handshaked_mechanism(host: BrokerHost) -> None:
    """Found with a random seed: a SCRAM-SHA-512 handshake, then scram_first drawn
    with SCRAM-SHA-256. The machine's client hashed its proof with SHA-256, the broker
    rightly refused it, and the model expected a login: the machine was wrong."""
    SaslConnectionMachine.host = host
    machine = SaslConnectionMachine()
    try:
        machine.connected()
        machine.handshake(mechanism="SCRAM-SHA-512")
        machine.scram_first(mechanism="SCRAM-SHA-256", right=True, user="alice")
        machine.scram_final()
        while machine._parked(ran=False) or machine._parked(ran=True):
            if machine._parked(ran=False):
                machine.thread_runs()
            else:
                machine.loop_resumes()
        machine.every_handled_request_ran_as_who_was_logged_in_when_read()
        machine.when_nothing_waits_for_a_thread_everything_expected_happened()
    finally:
        machine.teardown()
