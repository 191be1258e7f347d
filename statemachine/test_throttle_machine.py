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
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker
from trio_broker.state.mute import MuteReason

API_VERSIONS = 18
WAIT_S = 10.0


class ClockedBroker:
    """A broker on a trio loop (own thread) whose clock moves only when told to."""

    def __init__(self, data_dir: Path) -> None:
        self.config = BrokerConfig(
            port=0, data_dir=data_dir, storage="memory", connections_max_idle_ms=3_600_000
        )
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


class ThrottleMachine(RuleBasedStateMachine):
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

    def teardown(self) -> None:
        self.sock.close()
        self.host.settle()

    def now(self) -> float:
        async def now() -> float:
            return trio.current_time()

        result: float = self.host.call(now)
        return result

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
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    chunk = self.sock.recv(65536)
                except BlockingIOError:
                    break
                assert chunk, "the broker closed the connection"
                self.received += chunk
        finally:
            self.sock.settimeout(WAIT_S)
        cids, data, at = [], bytes(self.received), 0
        while len(data) - at >= 4:
            (size,) = struct.unpack_from(">i", data, at)
            if len(data) - at - 4 < size:
                break
            cids.append(struct.unpack_from(">i", data, at + 4)[0])
            at += 4 + size
        return cids


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
