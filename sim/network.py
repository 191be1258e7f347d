"""An in-memory network with TCP's faults, for brokers and clients in one Trio run.

Nodes are names ("b1", "b2", "b3", "client"). A connection is two ordered byte pipes.
What TCP can do to them, and nothing else (bytes are never reordered, lost or
duplicated inside a connection; TCP retransmits):

- **delay**: every send arrives after the link's latency (a base plus seeded jitter,
  more while the link is "slow");
- **partition**: while two nodes are cut off, nothing flows between them either way,
  and new connections time out; bytes already sent arrive once the cut heals (TCP
  retransmission), unless the connection was reset meanwhile;
- **loss**: on a lossy link a send now and then waits for TCP's retransmission timeout
  (200 ms to 1 s; the bytes after it wait too, as TCP delivers in order): the stalls
  that open windows between two steps of a protocol;
- **reset**: a connection breaks; both ends see ECONNRESET on their next read or write.
  A crashed node's connections are reset.
- **hold**: one direction of a link delivers nothing until released (a retransmission
  stall as long as the simulation wants: an answer held past a leader change); new
  connections still open.

The broker side of a connection is a socket-like object (``recv``, ``recv_into``,
``sendmsg``, ``close``), which is what ``server/connection.py``'s ``Connection`` reads
and writes, so requests take the broker's real path: framing, mute, handler pool,
response order. The other side is a ``trio.abc.Stream`` (BrokerClient's and the
simulated producer's).
"""

from __future__ import annotations

import errno
import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from sim import timers as wakes

__all__ = ["Network", "SimSocket", "SimStream"]

#: Base one-way latency and jitter of every link (seconds).
BASE_LATENCY_S = 0.0005
JITTER_S = 0.0005
#: A connection attempt across a partition fails after this long (SYN retries).
CONNECT_TIMEOUT_S = 1.0
#: On a lossy link: the share of sends that wait for a retransmission, and how long.
LOSS_RATE = 0.2
RTO_S = (0.2, 1.0)


class _Pipe:
    """One direction of a connection: bytes in order, each chunk due at its time.

    Delivery is the receiver's work: a reader moves the chunks that are due (on a link
    that is not cut) and otherwise waits until the first one is due or the pipe
    changes. No task of the network's own wakes for every chunk, which keeps a
    simulated second cheap. A reader that waits on an empty pipe is not woken by a send:
    the send sets its wake-up to the chunk's due time, so each delivery is one wake of
    the reader, not two (one to learn the due time, one when it comes). Under the
    simulation's clock the reader is parked on its wake-ups (sim/timers.py: no cancel
    scope per wait, no ``Cancelled`` per delivery); under any other clock (a test's
    ``MockClock``) it waits in a cancel scope whose deadline is the due time."""

    def __init__(self, network: Network, src: str, dst: str) -> None:
        self.network, self.src, self.dst = network, src, dst
        self.link = frozenset((src, dst))
        self.direction = (src, dst)
        self.in_flight: deque[tuple[float, bytes]] = deque()  # (due time, chunk), in send order
        self.arrived = bytearray()
        self.eof_sent = False  # the sender closed: EOF after the bytes in flight
        self.reset = False
        #: The simulation clock's wake-ups, or None (then the reader waits in a scope).
        self.timers = wakes.current_timers()
        #: The parked reader (simulation clock) and when it wakes at the latest.
        self.parked: wakes.Parked | None = None
        self.parked_until = math.inf
        self.changed = trio.Event()  # EOF, reset or a heal (the scope's wait)
        #: The reader's wait while it waits (its deadline: when the next chunk is due).
        self.waiting: trio.CancelScope | None = None

    def wake(self) -> None:
        if self.parked is not None:
            wakes.wake(self.parked)
        self.changed.set()
        self.changed = trio.Event()

    def send(self, data: bytes) -> None:
        if self.reset:
            raise OSError(errno.ECONNRESET, "connection reset")
        due = trio.current_time() + self.network.latency(self.src, self.dst)
        if self.in_flight:  # TCP keeps order: never before the previous chunk
            due = max(due, self.in_flight[-1][0])
            self.in_flight.append((due, bytes(data)))
            return
        # A reader may be waiting with no wake-up time: give it this one.
        self.in_flight.append((due, bytes(data)))
        if self.parked is not None:
            if due < self.parked_until and self.timers is not None:
                self.parked_until = due
                self.timers.add(due, self.parked)
        elif self.waiting is not None and due < self.waiting.deadline:
            self.waiting.deadline = due

    def _next_due(self) -> float:
        """Move the chunks due by now; when the next one is due (inf: none, or cut)."""
        network = self.network
        if self.link in network.partitions or self.direction in network.held:
            return math.inf
        now = trio.current_time()
        in_flight = self.in_flight
        while in_flight and in_flight[0][0] <= now:
            self.arrived += in_flight.popleft()[1]
        return in_flight[0][0] if in_flight else math.inf

    @property
    def at_eof(self) -> bool:
        return self.eof_sent and not self.in_flight and not self.arrived

    async def receive(self, max_bytes: int) -> bytes:
        while True:
            if self.reset:
                raise OSError(errno.ECONNRESET, "connection reset")
            next_due = self._next_due()
            if self.arrived:
                chunk = bytes(self.arrived[:max_bytes])
                del self.arrived[:max_bytes]
                return chunk
            if self.at_eof:
                return b""
            if self.timers is not None:
                self.parked = [trio.lowlevel.current_task()]
                self.parked_until = next_due
                try:
                    await wakes.park(self.timers, next_due, self.parked)
                finally:
                    self.parked = None
                continue
            with trio.CancelScope(deadline=next_due) as self.waiting:
                try:
                    await self.changed.wait()
                finally:
                    self.waiting = None


class _Connection:
    def __init__(self, network: Network, client: str, server: str) -> None:
        self.client, self.server = client, server
        self.to_server = _Pipe(network, client, server)
        self.to_client = _Pipe(network, server, client)

    def reset(self) -> None:
        for pipe in (self.to_server, self.to_client):
            pipe.reset = True
            pipe.in_flight.clear()
            pipe.wake()

    def wake(self) -> None:
        self.to_server.wake()
        self.to_client.wake()

    @property
    def done(self) -> bool:
        return (self.to_server.reset or self.to_server.eof_sent) and (
            self.to_client.reset or self.to_client.eof_sent
        )


class SimStream(trio.abc.Stream):
    """The connecting side: a ``trio.abc.Stream``."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        try:
            self._connection.to_server.send(bytes(data))
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self._connection.to_client.receive(max_bytes or 65536)

    async def aclose(self) -> None:
        self._connection.to_server.eof_sent = True
        self._connection.to_server.wake()
        await trio.lowlevel.checkpoint()


class SimSocket:
    """The accepting side, shaped as the few socket methods ``Connection`` calls."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def recv(self, size: int) -> bytes:
        return await self._connection.to_server.receive(size)

    async def recv_into(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        chunk = await self._connection.to_server.receive(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)

    async def sendmsg(self, buffers: list[Any]) -> int:
        # As the broker's writer on a kernel socket (os.writev, server/connection.py):
        # no scheduler pass for a send that does not block, which an in-memory one never
        # does; only cancellation is checked.
        await trio.lowlevel.checkpoint_if_cancelled()
        data = b"".join(bytes(b) for b in buffers)
        self._connection.to_client.send(data)
        return len(data)

    def close(self) -> None:
        self._connection.to_client.eof_sent = True
        self._connection.to_client.wake()

    def fileno(self) -> int:  # only sendfile asks, and memory logs never send files
        raise OSError(errno.EBADF, "an in-memory connection has no file descriptor")


class Network:
    """Links between named nodes and their faults; readers deliver their own bytes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        #: node -> accept(SimSocket, client node); absent while the node is down.
        self.listeners: dict[str, Callable[[SimSocket, str], None]] = {}
        self.partitions: set[frozenset[str]] = set()
        self.slow: dict[frozenset[str], float] = {}  # extra latency per link
        self.lossy: set[frozenset[str]] = set()
        self.held: set[tuple[str, str]] = set()  # (from, to): bytes wait there
        self.connections: list[_Connection] = []
        self.bytes_sent = 0

    # ---------------------------------------------------------------- faults
    def cut(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.partitions

    def partition(self, a: str, b: str) -> None:
        self.partitions.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self.partitions.discard(frozenset((a, b)))
        self._wake_between(a, b)

    def heal_all(self) -> None:
        self.partitions.clear()
        self.slow.clear()
        self.lossy.clear()
        self.held.clear()
        for conn in self.connections:
            conn.wake()

    def hold(self, src: str, dst: str) -> None:
        self.held.add((src, dst))

    def release(self, src: str, dst: str) -> None:
        self.held.discard((src, dst))
        self._wake_between(src, dst)

    def _wake_between(self, a: str, b: str) -> None:
        """Readers across a healed cut look again: bytes held there now flow."""
        for conn in self.connections:
            if {conn.client, conn.server} == {a, b}:
                conn.wake()

    def reset_between(self, a: str, b: str) -> None:
        for conn in self.connections:
            if {conn.client, conn.server} == {a, b}:
                conn.reset()

    def reset_node(self, node: str) -> None:
        for conn in self.connections:
            if node in (conn.client, conn.server):
                conn.reset()

    def latency(self, a: str, b: str) -> float:
        link = frozenset((a, b))
        extra = self.slow.get(link, 0.0) * (0.5 + self.rng.random())
        if link in self.lossy and self.rng.random() < LOSS_RATE:
            extra += self.rng.uniform(*RTO_S)
        return BASE_LATENCY_S + self.rng.random() * JITTER_S + extra

    # ---------------------------------------------------------------- connecting
    async def connect(self, src: str, dst: str) -> SimStream:
        """A connection from ``src`` to node ``dst``; OSError if it is down or cut off."""
        if self.cut(src, dst):
            await wakes.sleep(CONNECT_TIMEOUT_S)
            raise OSError(errno.ETIMEDOUT, f"{src} -> {dst}: connection timed out")
        await wakes.sleep(self.latency(src, dst) * 2)  # SYN, SYN-ACK
        accept = self.listeners.get(dst)
        if accept is None or self.cut(src, dst):
            raise OSError(errno.ECONNREFUSED, f"{src} -> {dst}: connection refused")
        connection = _Connection(self, src, dst)
        self.connections = [c for c in self.connections if not c.done]
        self.connections.append(connection)
        accept(SimSocket(connection), src)
        return SimStream(connection)
