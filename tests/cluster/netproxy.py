"""A fault-injecting TCP proxy for the cluster tests: network faults without root.

``FaultProxy(upstream)`` listens on a free 127.0.0.1 port and forwards every connection
to ``upstream``. On command (from any thread) it can

- ``blackhole()``: stop forwarding in both directions while keeping the sockets open,
  as a network partition does to TCP: nothing arrives, nothing fails; the peers only
  notice through their own timeouts. Bytes already read are held, not dropped (TCP
  would retransmit them), and go through on ``heal()``. ``blackhole(sources=...)`` holds
  only connections whose first Kafka request names one of those client ids (the
  replica fetchers call themselves ``replica-fetcher-<broker id>``): one follower is cut
  from a leader while the others still reach it.
- ``reset()``: close every open connection (both sides see it at once).
- ``delay(seconds)``: hold each chunk that long before passing it on.
- ``heal()``: forward normally again.

It runs a Trio loop in a daemon thread of the test process; every fault is logged
with its wall-clock time, so a failing run can be read against the brokers' logs.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial

import trio

__all__ = ["FaultProxy", "fetcher_of"]

log = logging.getLogger(__name__)

CHUNK = 1 << 16
#: Every connection, whatever its first bytes say.
EVERYONE = None


def fetcher_of(broker_id: int) -> str:
    """The client id the replica fetcher of ``broker_id`` sends (replica_fetcher.py)."""
    return f"replica-fetcher-{broker_id}"


def kafka_client_id(first_bytes: bytes) -> str:
    """The client id of the Kafka request that starts ``first_bytes`` ("" if unreadable):
    size, api key, api version, correlation id, then a length-prefixed string."""
    if len(first_bytes) < 14:
        return ""
    (length,) = struct.unpack_from(">h", first_bytes, 12)
    if length < 0:
        return ""
    return first_bytes[14 : 14 + length].decode("utf-8", "replace")


class _Connection:
    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        #: Who is calling, from its first bytes; None until they arrive.
        self.source: str | None = None


class FaultProxy:
    def __init__(
        self,
        upstream: tuple[str, int],
        name: str,
        *,
        identify: Callable[[bytes], str] = kafka_client_id,
    ) -> None:
        self.upstream, self.name, self.identify = upstream, name, identify
        self.port = 0
        #: Held connections: None = none, EVERYONE (via ``_all``) or a set of sources.
        self._held: frozenset[str] | None = None
        self._hold_all = False
        self._delay_s = 0.0
        self._changed = trio.Event()
        self._connections: set[_Connection] = set()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"proxy-{name}", daemon=True)
        #: (wall-clock time, what) of every command: the fault schedule as it happened.
        self.history: list[tuple[float, str]] = []
        self.connections_made = 0

    # -- commands (any thread) -------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"proxy {self.name} did not start")
        return self

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def blackhole(self, sources: Iterable[str] | None = EVERYONE) -> None:
        chosen = None if sources is None else frozenset(sources)
        what = "everyone" if chosen is None else ",".join(sorted(chosen))
        self._command(f"blackhole {what}", partial(self._set_hold, chosen))

    def reset(self) -> None:
        self._command("reset", self._reset)

    def delay(self, seconds: float) -> None:
        self._command(f"delay {seconds}s", partial(self._set_delay, seconds))

    def heal(self) -> None:
        self._command("heal", self._heal)

    def _command(self, what: str, action: Callable[[], None]) -> None:
        self.history.append((time.time(), what))
        log.info("proxy %s -> %s:%d: %s", self.name, *self.upstream, what)
        assert self._token is not None, "proxy not started"
        trio.from_thread.run_sync(action, trio_token=self._token)

    # -- in the proxy's loop ---------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _set_hold(self, sources: frozenset[str] | None) -> None:
        self._hold_all, self._held = sources is None, sources
        self._wake()

    def _set_delay(self, seconds: float) -> None:
        self._delay_s = seconds
        self._wake()

    def _heal(self) -> None:
        self._hold_all, self._held, self._delay_s = False, None, 0.0
        self._wake()

    def _reset(self) -> None:
        for conn in list(self._connections):
            conn.scope.cancel()

    def _holds(self, conn: _Connection) -> bool:
        if self._hold_all:
            return True
        return self._held is not None and conn.source is not None and conn.source in self._held

    def _main(self) -> None:
        trio.run(self._serve)

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.serve_listeners, self._handle, listeners))
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _handle(self, client: trio.SocketStream) -> None:
        conn = _Connection()
        self._connections.add(conn)
        self.connections_made += 1
        try:
            with conn.scope:
                try:
                    server = await trio.open_tcp_stream(*self.upstream)
                except OSError:
                    return  # the upstream is down: the caller sees its connection close
                async with client, server, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, server, conn, True, nursery)
                    nursery.start_soon(self._pump, server, client, conn, False, nursery)
        finally:
            self._connections.discard(conn)
            with trio.CancelScope(shield=True):
                await client.aclose()

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        conn: _Connection,
        upstream: bool,
        nursery: trio.Nursery,
    ) -> None:
        try:
            while True:
                while self._holds(conn):  # held: read nothing more, pass nothing on
                    await self._changed.wait()
                data = await source.receive_some(CHUNK)
                if not data:
                    break
                if upstream and conn.source is None:
                    conn.source = self.identify(data)
                while self._holds(conn):
                    await self._changed.wait()
                if self._delay_s > 0:
                    await trio.sleep(self._delay_s)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        nursery.cancel_scope.cancel()  # one side gone: close both
