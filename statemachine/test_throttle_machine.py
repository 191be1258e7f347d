"""A real connection's quota throttle (KIP-219) against a clock the machine moves.

No other model throttles: the broker and SASL connection machines configure no quota,
so nothing drove ``Connection.throttle`` (issue 31's third planted set missed
``throttle-extension-shortens`` for that reason). Here a real in-process broker runs on
a trio loop of its own thread with a ``MockClock`` that only the machine moves, and one
plaintext connection over a real socket. Rules: a quota breach with a delay (through
the broker's own ``_throttle_connection``, the callback the quota service calls), time
passing, and a pipelined ApiVersions request.

The model is KIP-219's: a breach while throttled extends the throttle to the later of
the two ends, never shortens it; a breach outside one starts one. Checked after every
rule, once the broker is idle: the connection is muted for THROTTLED exactly while the
clock is before the model's end, and when it is not, every request sent has been
answered, in order.

A second machine, on a broker of its own whose cap is 3 and connections.max.idle.ms
5,000, drives the same connection's in-flight cap and idle close
(:class:`InFlightIdleMachine`): no other model ran the idle close, and none stated the
cap (issue 31's seventeenth set missed ``in-flight-cap-one-over`` and
``idle-close-ignores-in-flight``).
"""

from __future__ import annotations

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
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.state.mute import MuteReason

API_VERSIONS = 18
WAIT_S = 10.0


class ClockedBroker:
    """A broker on a trio loop (own thread) whose clock moves only when told to."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        settings_ = {"connections_max_idle_ms": 3_600_000, **overrides}
        self.config = BrokerConfig(port=0, data_dir=data_dir, storage="memory", **settings_)
        self.clock = trio.testing.MockClock(rate=0)
        self.broker: Broker | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        trio.run(self._main, clock=self.clock)

    def __enter__(self) -> ClockedBroker:
        self._thread.start()
        assert self._started.wait(WAIT_S), "the broker did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._stop is not None
            self._stop.set()

        self.call(stop)
        self._thread.join(WAIT_S)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.broker = await nursery.start(Broker(self.config).run)
            self._started.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, afn: Callable[[], Awaitable[Any]]) -> Any:
        return trio.from_thread.run(afn, trio_token=self._token)

    def settle(self) -> None:
        """Let the broker do all it can (until every task waits for something)."""

        async def settle() -> None:
            await trio.testing.wait_all_tasks_blocked(cushion=0.002)

        self.call(settle)

    def connection(self, client_port: int) -> tuple[int, Any] | None:
        assert self.broker is not None
        found = [(k, c) for k, c in self.broker.connections.items() if c.client.port == client_port]
        return found[0] if found else None


class _OneConnection(RuleBasedStateMachine):
    """A machine over one client socket to a :class:`ClockedBroker`: closes both at its
    end, and reads the broker's trio clock."""

    sock: socket.socket
    host: ClockedBroker

    def teardown(self) -> None:
        self.sock.close()
        self.host.settle()

    def now(self) -> float:
        async def now() -> float:
            return trio.current_time()

        result: float = self.host.call(now)
        return result


class ThrottleMachine(_OneConnection):
    host: ClockedBroker  # set by the test function

    def __init__(self) -> None:
        super().__init__()
        assert self.host.broker is not None
        self.sock = socket.create_connection(
            ("127.0.0.1", self.host.broker.bound[0][1]), timeout=WAIT_S
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = self.sock.getsockname()[1]
        self.host.settle()
        found = self.host.connection(self.port)
        assert found is not None, "the broker did not accept the connection"
        self.conn_id, self.conn = found
        #: the model: the trio clock time the throttle ends at (0: none yet).
        self.until = 0.0
        self.sent: list[int] = []
        self.received = bytearray()

    @rule(delay_ms=st.integers(1, 3000))
    def quota_breach(self, delay_ms: int) -> None:
        broker = self.host.broker
        assert broker is not None

        async def breach() -> float:
            now = trio.current_time()
            broker._throttle_connection(self.conn_id, delay_ms)
            return now

        now: float = self.host.call(breach)
        end = now + delay_ms / 1000  # the connection's own arithmetic, so ends compare exactly
        self.until = max(self.until, end) if now < self.until else end
        note(f"breach at {now:.3f} for {delay_ms} ms: throttled until {self.until:.3f}")
        self.host.settle()

    @rule(ms=st.sampled_from([1, 50, 200, 700, 1500, 3000]))
    def time_passes(self, ms: int) -> None:
        async def jump() -> None:
            self.host.clock.jump(ms / 1000)

        self.host.call(jump)
        self.host.settle()

    @rule()
    def request(self) -> None:
        cid = len(self.sent) + 1
        self.sent.append(cid)
        self.sock.sendall(m.encode_request(API_VERSIONS, 0, cid, "machine", m.ApiVersionsRequest()))
        self.host.settle()

    @invariant()
    def throttled_exactly_until_the_later_end(self) -> None:
        now = self.now()
        throttled = MuteReason.THROTTLED in self.conn.mute.reasons
        assert throttled == (now < self.until), (
            f"at {now:.3f}: {'throttled' if throttled else 'not throttled'}, "
            f"the throttle ends at {self.until:.3f}"
        )
        if not throttled:
            answered = self._answered()
            assert answered == self.sent, f"answered {answered}, sent {self.sent}"

    def _answered(self) -> list[int]:
        cids, closed = read_answers(self.sock, self.received)
        assert not closed, "the broker closed the connection"
        return cids


def read_answers(sock: socket.socket, received: bytearray) -> tuple[list[int], bool]:
    """The correlation ids of every whole response received so far (``received`` keeps
    the bytes), and whether the broker closed the connection."""
    sock.setblocking(False)
    closed = False
    try:
        while True:
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    finally:
        sock.settimeout(WAIT_S)
    cids, data, at = [], bytes(received), 0
    while len(data) - at >= 4:
        (size,) = struct.unpack_from(">i", data, at)
        if len(data) - at - 4 < size:
            break
        cids.append(struct.unpack_from(">i", data, at + 4)[0])
        at += 4 + size
    return cids, closed


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClockedBroker]:
    with ClockedBroker(tmp_path_factory.mktemp("throttle-machine")) as running:
        yield running


def test_a_throttle_is_extended_never_shortened(host: ClockedBroker) -> None:
    ThrottleMachine.host = host
    run_state_machine_as_test(
        ThrottleMachine,
        settings=settings(max_examples=60, stateful_step_count=15, deadline=None),
    )


# ---------------------------------------------------------------------------------------
# The in-flight cap and the idle close on the same kind of clocked connection.

CAP = 3
IDLE_MS = 5_000
CAPPED_TOPIC = "capped"
#: Every duration is a multiple of 250 ms, so the trio clock's sums compare exactly.
WAITS_MS = (1_000, 2_500, 7_500)
JUMPS_MS = (250, 1_000, 2_500, 5_000)


def long_poll(max_wait_ms: int) -> m.FetchRequest:
    """A Fetch from the empty topic's start: it waits ``max_wait_ms``, then answers empty."""
    Req = m.FetchRequest
    partition = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=CAPPED_TOPIC, partitions=[partition])],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


@attrs.define
class Sent:
    """The model's view of one request: when the broker reads and answers it."""

    cid: int
    wait_s: float  # 0: answered as soon as it is read (ApiVersions)
    read_at: float | None = None
    answered_at: float | None = None


class InFlightIdleMachine(_OneConnection):
    """max.in.flight.requests.per.connection and connections.max.idle.ms on one real
    connection, pipelined, whose clock only the machine moves.

    Rules: a long-polling Fetch of the empty topic (it waits its max_wait_ms), an
    ApiVersions (answered at once once read), time passing. The model replays the
    broker at each instant the clock stops at: the reader takes requests in order while
    fewer than the cap are read and unanswered (Kafka mutes the channel once the cap is
    reached), answers go out in request order once due, and the connection is closed
    once it has had no request in progress and nothing to send for connections.max.idle.ms
    since its last read or answer (Kafka's idle expiry; a long poll in progress is not
    idleness). Checked after every rule, once the broker is idle: the close, the count
    of requests read and unanswered, the in-flight mute, and the answers received.
    """

    host: ClockedBroker  # set by the test function

    def __init__(self) -> None:
        super().__init__()
        assert self.host.broker is not None
        self.sock = socket.create_connection(
            ("127.0.0.1", self.host.broker.bound[0][1]), timeout=WAIT_S
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        port = self.sock.getsockname()[1]
        self.host.settle()
        found = self.host.connection(port)
        assert found is not None, "the broker did not accept the connection"
        self.conn = found[1]
        self.opened_at = self.now()
        self.sent: list[Sent] = []
        self.closed_at: float | None = None
        self.received = bytearray()

    def _send(self, api_key: int, version: int, body: Any, wait_ms: int) -> None:
        cid = len(self.sent) + 1
        self.sent.append(Sent(cid, wait_ms / 1000))
        self.sock.sendall(m.encode_request(api_key, version, cid, "machine", body))
        self.host.settle()
        self._model_at(self.now())

    @precondition(lambda self: self.closed_at is None)
    @rule(wait_ms=st.sampled_from(WAITS_MS))
    def fetch_long_poll(self, wait_ms: int) -> None:
        self._send(m.ApiKey.FETCH, 12, long_poll(wait_ms), wait_ms)

    @precondition(lambda self: self.closed_at is None)
    @rule()
    def api_versions(self) -> None:
        self._send(API_VERSIONS, 0, m.ApiVersionsRequest(), 0)

    @rule(ms=st.sampled_from(JUMPS_MS))
    def time_passes(self, ms: int) -> None:
        async def jump() -> None:
            self.host.clock.jump(ms / 1000)

        self.host.call(jump)
        self.host.settle()
        self._model_at(self.now())

    def _in_flight(self) -> list[Sent]:
        return [s for s in self.sent if s.read_at is not None and s.answered_at is None]

    def _model_at(self, now: float) -> None:
        """Everything the broker does at ``now``: reads, answers, and the idle close."""
        if self.closed_at is not None:
            return
        changed = True
        while changed:
            changed = False
            in_flight = len(self._in_flight())
            for s in self.sent:
                if s.read_at is None:
                    if in_flight >= CAP:
                        break
                    s.read_at, in_flight, changed = now, in_flight + 1, True
            for s in self.sent:  # in request order: a later answer waits for an earlier one
                if s.answered_at is not None:
                    continue
                if s.read_at is None or s.read_at + s.wait_s > now:
                    break
                s.answered_at, changed = now, True
        last = max(
            [self.opened_at]
            + [t for s in self.sent for t in (s.read_at, s.answered_at) if t is not None]
        )
        idle = all(s.answered_at is not None for s in self.sent)
        if idle and now >= last + IDLE_MS / 1000:
            self.closed_at = now
        note(
            f"at {now:.3f}: read {[s.cid for s in self.sent if s.read_at is not None]}, "
            f"answered {[s.cid for s in self.sent if s.answered_at is not None]}, "
            f"last active {last:.3f}, closed {self.closed_at}"
        )

    @invariant()
    def the_cap_and_the_idle_close_hold(self) -> None:
        now = self.now()
        conn = self.conn
        reading = [s for s in self.sent if s.read_at is not None]
        in_flight = self._in_flight()
        if conn.closed and self.closed_at is None:
            running = ", ".join(
                f"{s.cid} (read at {s.read_at:.3f}, waits {s.wait_s * 1000:.0f} ms)"
                for s in in_flight
            )
            assert not in_flight, (
                f"at {now:.3f} the connection was closed with requests in progress: "
                f"{running}; connections.max.idle.ms ({IDLE_MS} ms) closes only a "
                "connection with no request in progress and nothing to send"
            )
            raise AssertionError(
                f"at {now:.3f} the connection was closed; the model's last activity was "
                f"within connections.max.idle.ms ({IDLE_MS} ms)"
            )
        if self.closed_at is not None:
            assert conn.closed, (
                f"at {now:.3f} the connection is open, idle since before "
                f"{now - IDLE_MS / 1000:.3f} with nothing in progress: "
                f"connections.max.idle.ms is {IDLE_MS} ms"
            )
            return
        read = conn.sequencer.in_flight
        assert read <= CAP, (
            f"{read} requests read and unanswered on a connection whose cap "
            f"(max.in.flight.requests.per.connection) is {CAP}: reading stops once the cap "
            "is reached"
        )
        assert read == len(in_flight), (
            f"{read} requests read and unanswered, the model has {len(in_flight)} "
            f"(of {len(self.sent)} sent, {len(reading)} read): reading goes on below the cap"
        )
        muted = MuteReason.IN_FLIGHT_LIMIT in conn.mute.reasons
        assert muted == (read == CAP), (
            f"{read} requests read and unanswered, the cap (max.in.flight.requests.per."
            f"connection) is {CAP}, and the reader is {'muted' if muted else 'not muted'} "
            "for it: reading stops once the cap is reached, and goes on below it"
        )
        answered, eof = read_answers(self.sock, self.received)
        expected = [s.cid for s in self.sent if s.answered_at is not None]
        assert not eof, "the broker closed the connection (the model did not)"
        assert answered == expected, f"answered {answered}, the model answered {expected}"


@pytest.fixture(scope="module")
def capped_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClockedBroker]:
    data_dir = tmp_path_factory.mktemp("in-flight-idle-machine")
    with ClockedBroker(
        data_dir, max_in_flight_per_connection=CAP, connections_max_idle_ms=IDLE_MS
    ) as running:

        async def create() -> None:
            assert running.broker is not None
            running.broker.topics.create(CAPPED_TOPIC, 1)

        running.call(create)
        yield running


def test_the_in_flight_cap_and_the_idle_close(capped_host: ClockedBroker) -> None:
    InFlightIdleMachine.host = capped_host
    run_state_machine_as_test(
        InFlightIdleMachine,
        settings=settings(max_examples=40, stateful_step_count=15, deadline=None),
    )


def test_a_large_answer_read_slowly_is_not_idleness(tmp_path: Path) -> None:
    """connections.max.idle.ms counts a send the peer still reads as activity (Kafka's
    idle expiry counts writes), and closes a send the peer stopped reading as stalled.
    The answer here (a Fetch of 16 MB) outlasts the socket buffers, so it is written over
    several seconds of the broker's clock while the client reads 2 MB at a time (enough
    for the broker's socket to take more: the kernel tells a writer only once its send
    buffer has drained by a third or so)."""
    idle_s = 1.0
    with ClockedBroker(tmp_path, connections_max_idle_ms=int(idle_s * 1000)) as host:
        assert host.broker is not None
        port = host.broker.bound[0][1]
        topic = "read-slowly"

        async def create() -> None:
            assert host.broker is not None
            host.broker.topics.create(topic, 1)

        host.call(create)
        Topic = m.ProduceRequest.TopicProduceData
        batch = bytes(build_batch([(b"k", b"x" * 100_000)]))
        produce = m.ProduceRequest(
            transactional_id=None, acks=1, timeout_ms=10_000,
            topic_data=[Topic(name=topic, partition_data=[
                Topic.PartitionProduceData(index=0, records=batch)])],
        )  # fmt: skip
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as producer:
            for cid in range(160):  # 16 MB, one 100 kB batch a request, each answered
                producer.sendall(m.encode_request(m.ApiKey.PRODUCE, 9, cid, "p", produce))
                (size,) = struct.unpack(">i", _read_exactly(producer, 4))
                _read_exactly(producer, size)
        host.settle()
        slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the handshake
        slow.settimeout(WAIT_S)
        slow.connect(("127.0.0.1", port))
        client_port = slow.getsockname()[1]
        host.settle()
        found = host.connection(client_port)
        assert found is not None
        conn = found[1]
        fetch = m.FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=16 << 20, isolation_level=0,
            topics=[m.FetchRequest.FetchTopic(topic=topic, partitions=[
                m.FetchRequest.FetchTopic.FetchPartition(
                    partition=0, fetch_offset=0, partition_max_bytes=16 << 20)])],
        )  # fmt: skip
        try:
            slow.sendall(m.encode_request(m.ApiKey.FETCH, 4, 1, "slow", fetch))
            host.settle()
            assert conn.send_progress is not None, "the answer fitted the socket buffers"

            async def time_passes() -> None:
                host.clock.jump(idle_s * 0.6)

            # Read 2 MB of the answer every 0.6 s of the broker's clock: 3 s in all,
            # three times connections.max.idle.ms since the request was read.
            for _ in range(5):
                host.call(time_passes)
                read = 0
                while read < 2 << 20:
                    chunk = slow.recv(1 << 20)
                    assert chunk, "the broker closed the connection"
                    read += len(chunk)
                host.settle()
                assert not conn.closed, (
                    "a connection whose answer the client is reading was closed "
                    "(connections.max.idle.ms counts a send that progresses as activity)"
                )
            # The client stops reading: the send stalls and the connection closes.
            host.call(time_passes)
            host.settle()
            host.call(time_passes)
            host.settle()
            assert conn.closed, "a send stalled for 1.2 s outlived connections.max.idle.ms"
        finally:
            slow.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return bytes(data)
