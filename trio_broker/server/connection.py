"""One client connection: a reader task and a writer task in the connection's nursery.

The reader parses frames and hands requests to the handler pool; it reads only
while the connection's :class:`~trio_broker.state.mute.ChannelMute` has no
reason set. The writer sends responses strictly in request order
(:class:`~trio_broker.state.response_order.ResponseSequencer`), using
``sendmsg`` for buffers and ``os.sendfile`` for log file regions.

Serial model: the reader mutes with RESPONSE_PENDING after each request and the
writer unmutes after sending its response — Kafka's behaviour. Pipelined model:
the reader keeps going until a limit (in-flight cap, memory budget) mutes it.

Who a request runs as is decided when it is read (:meth:`Connection._admit`) and
travels with it to the handler: a login step (SaslHandshake, SaslAuthenticate)
mutes the reader with AUTHENTICATING until it is handled, so the next request is
read, and authorized, as whoever that step made the connection.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from trio_broker.handlers.base import ANONYMOUS, ClientInfo
from trio_broker.protocol.codec import part_length
from trio_broker.protocol.errors import ProtocolError, UnsupportedVersionError
from trio_broker.protocol.framing import FrameReader
from trio_broker.protocol.messages import (
    API_VERSIONS_KEY,
    RequestHeader,
    decode_request,
    encode_response,
    peek_request_ids,
)
from trio_broker.protocol.schema import Message
from trio_broker.security.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from trio_broker.state.mute import ChannelMute, MuteEvent, MuteReason
from trio_broker.state.response_order import ResponseSequencer

#: Requests that move a SASL login on; the reader waits for each to be handled.
LOGIN_STEP_APIS = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

if TYPE_CHECKING:
    from trio_broker.security.listeners import Listener
    from trio_broker.security.sasl import SaslSession
    from trio_broker.server.host import ConnectionHost

log = logging.getLogger("trio_broker.connection")

RECEIVE_SIZE = 256 * 1024
#: A request frame this large is decoded in a worker thread, a response whose top-level
#: lists hold this many entries encoded in one: the codec is pure Python (~0.2 s for
#: 100,000 DescribeTransactions ids each way) and would hold the event loop; a thread
#: holds the GIL only for the interpreter's switch interval (5 ms) at a time. Produce
#: is decoded in place (its records stay bytes): cheap at any size.
OFF_LOOP_DECODE_BYTES = 256 * 1024
OFF_LOOP_ENCODE_ENTRIES = 1000
_PRODUCE_KEY = b"\x00\x00"
#: Reads of a plain socket that found bytes waiting, in a row, before the reader lets
#: other tasks run (Connection._receive_plain).
READS_WITHOUT_YIELD = 8


@attrs.define
class PendingRequest:
    """What the writer needs to encode a response, kept per sequencer slot."""

    header: RequestHeader
    response_version: int
    frame_size: int
    #: perf_counter() when the frame was read (the slow-request log's queue/total times).
    received: float = 0.0
    #: A login step: handling it ends the reader's AUTHENTICATING mute.
    login_step: bool = False
    #: The login step that failed the session: close once its answer is sent.
    failed_login: bool = False
    #: perf_counter() stamps of the later stages (RequestStages): a handler took it,
    #: the handler returned, the response was ready. 0.0 until then.
    started: float = 0.0
    handled: float = 0.0
    completed: float = 0.0


class Connection:
    def __init__(
        self, broker: ConnectionHost, sock: trio.socket.SocketType, client: ClientInfo
    ) -> None:
        self.broker = broker
        self.sock = sock
        #: A kernel socket (not TLS's stream nor the simulator's): written with writev.
        self._plain_socket = isinstance(sock, trio.socket.SocketType)
        self.client = client
        self.id = client.connection_id
        #: Who the connection is without SASL: ANONYMOUS, or the TLS client
        #: certificate's principal. On a SASL listener the session decides (_admit).
        self.transport_principal = ANONYMOUS
        #: The listener it came in on (Metadata advertises its address); set on accept.
        self.listener: Listener | None = None
        #: On a SASL listener: the login's state; requests wait for it (see _on_frame).
        self.sasl: SaslSession | None = None
        self.mute = ChannelMute()
        self.sequencer: ResponseSequencer[Message | None] = ResponseSequencer()
        self.pending: dict[int, PendingRequest] = {}
        self.frames = FrameReader(broker.config.socket_request_max_bytes)
        self.serial = broker.config.processing_model == "serial"
        self.max_in_flight = broker.config.max_in_flight_per_connection
        #: connections.max.idle.ms: close after this long with nothing in flight and
        #: no bytes received (trio clock; refreshed on receive and on each response).
        self.max_idle_s = broker.config.connections_max_idle_ms / 1000
        self.last_active = trio.current_time()
        #: When the writer's current send began or last moved bytes; None when idle.
        #: A send stalled for connections.max.idle.ms closes the connection.
        self.send_progress: float | None = None
        self._unmuted = trio.Event()
        self._responses_ready = trio.Event()
        #: trio clock time until which a quota throttle mutes the reader (KIP-219).
        self.throttled_until = 0.0
        self.closed = False
        #: A refused request was read: close with this reason once every request
        #: read before it is answered.
        self._close_when_answered: str | None = None
        self._cancel_scope: trio.CancelScope | None = None
        self._reader_scope = trio.CancelScope()
        #: Reads in a row that did not wait for the socket (Connection._receive_plain).
        self._reads_without_yield = 0
        self.client_address = f"{client.host}:{client.port}"

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        try:
            with trio.CancelScope() as scope:
                self._cancel_scope = scope
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_loop)
                    nursery.start_soon(self._write_loop)
                    nursery.start_soon(self._idle_watch)
        finally:
            self.closed = True
            self._release_all_memory()
            # Share sessions this connection opened end with it (as in Kafka).
            self.broker.shares.connection_closed(self.id)
            self.sock.close()

    def close(self, reason: str) -> None:
        """Stop both tasks and drop the socket (Kafka's answer to undecodable input)."""
        if not self.closed:
            level = logging.DEBUG if reason == "peer closed" else logging.INFO
            log.log(level, "closing connection %d from %s: %s", self.id, self.client.host, reason)
        self.closed = True
        if not self.mute.closing:
            self.mute.handle(MuteEvent.CLOSE)
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    def stop_reading(self) -> None:
        """Graceful shutdown: take no new requests; the writer still answers queued ones."""
        self._reader_scope.cancel()

    async def _idle_watch(self) -> None:
        """Close the connection once idle for connections.max.idle.ms (as Kafka does)."""
        while True:
            await trio.sleep_until(self.last_active + self.max_idle_s)
            now = trio.current_time()
            if now < self.last_active + self.max_idle_s:
                continue  # activity while we slept
            sending = self.send_progress
            if sending is not None:
                if now - sending >= self.max_idle_s:
                    # The peer has not read for that long: Kafka closes it as idle too.
                    self.close(f"send stalled for more than {self.max_idle_s * 1000:.0f} ms")
                    return
                # A send the peer still reads is activity (Kafka counts writes too): the
                # answer being written is no longer in flight, so without this a slow
                # reader of a large answer was closed as idle while it read.
                self.last_active = sending
                continue
            if self.sequencer.in_flight:
                self.last_active = now  # a request (e.g. a long poll) is still running
                continue
            self.close(f"idle for more than {self.max_idle_s * 1000:.0f} ms")
            return

    # ------------------------------------------------------------------ muting

    def _mute_event(self, event: MuteEvent) -> None:
        self.mute.handle(event)
        if self.mute.readable:
            self._unmuted.set()

    async def _wait_readable(self) -> None:
        while not self.mute.readable:
            self._unmuted = trio.Event()
            await self._unmuted.wait()

    def throttle(self, delay_ms: int) -> None:
        """A quota was exceeded: read nothing more for ``delay_ms`` (KIP-219, reason THROTTLED).

        The response that carries ``throttle_time_ms`` still goes out at once; a
        throttle already running is extended, never shortened.
        """
        if delay_ms <= 0 or self.closed:
            return
        until = trio.current_time() + delay_ms / 1000
        if MuteReason.THROTTLED in self.mute.reasons:
            self.throttled_until = max(self.throttled_until, until)
            return
        self.throttled_until = until
        self._mute_event(MuteEvent.THROTTLE_STARTED)
        self.broker.root_nursery.start_soon(self._end_throttle)

    async def _end_throttle(self) -> None:
        # Bounded: throttled_until only moves later while this runs, by at most a window.
        while not self.closed and trio.current_time() < self.throttled_until:  # noqa: ASYNC110
            await trio.sleep_until(self.throttled_until)
        if not self.closed and MuteReason.THROTTLED in self.mute.reasons:
            self._mute_event(MuteEvent.THROTTLE_ENDED)

    def memory_available(self) -> None:
        """Called by the broker's memory budget when queued bytes drop below it."""
        if MuteReason.MEMORY_PRESSURE in self.mute.reasons and not self.mute.closing:
            self._mute_event(MuteEvent.MEMORY_AVAILABLE)

    # ------------------------------------------------------------------ reading

    async def _read_loop(self) -> None:
        with self._reader_scope:
            await self._read_frames()

    async def _read_frames(self) -> None:
        while True:
            await self._wait_readable()
            try:
                frame = self.frames.next_frame()
            except ProtocolError as exc:
                self.close(f"bad frame: {exc}")
                return
            if frame is not None:
                await self._on_frame(frame)
                continue
            target = self.frames.body_target()
            try:
                if self._plain_socket:
                    count = await self._receive_plain(target)
                elif target is not None:
                    count = await self.sock.recv_into(target)
                    self.frames.body_advance(count)
                else:
                    data = await self.sock.recv(RECEIVE_SIZE)
                    count = len(data)
                    self.frames.feed(data)
            except OSError as exc:
                self.close(f"receive failed: {exc}")
                return
            if count == 0:
                self.close("peer closed")
                return
            self.last_active = trio.current_time()

    async def _on_frame(self, frame: bytearray) -> None:
        broker = self.broker
        try:
            if len(frame) >= OFF_LOOP_DECODE_BYTES and frame[:2] != _PRODUCE_KEY:
                header, body = await trio.to_thread.run_sync(decode_request, frame)
            else:
                header, body = decode_request(frame)
            response_version = header.api_version
        except UnsupportedVersionError as exc:
            if exc.api_key != API_VERSIONS_KEY:
                self.close(str(exc))
                return
            # Clients probe ApiVersions with their newest version; answer in v0
            # with UNSUPPORTED_VERSION so they can retry (KAFKA-FACTS.md).
            api_key, version, correlation_id = peek_request_ids(frame)
            header = RequestHeader(api_key, version, correlation_id, None)
            body, response_version = None, 0
        except ProtocolError as exc:
            self.close(f"undecodable request: {exc}")
            return
        if broker.capture is not None:
            broker.capture.request(self.id, self.client_address, header, frame)
        spec = broker.router.get(header.api_key)
        if spec is None or not (
            spec.min_version <= header.api_version <= spec.max_version or body is None
        ):
            self.close(f"API {header.api_key} v{header.api_version} not supported")
            return
        principal = self._admit(header.api_key)
        if principal is None:
            assert self.sasl is not None
            if self.sasl.failed:
                # The writer closes once the failed step's answer is out: read no more.
                self.stop_reading()
                return
            # Kafka closes a connection that skips (or outlives) SASL authentication,
            # after answering what it read before (it reads one request at a time):
            # the writer closes once those answers are out.
            self.stop_reading()
            self._close_when_answered = (
                f"API {header.api_key} not permitted in SASL state {self.sasl.state.value}"
            )
            self._responses_ready.set()
            return
        size = len(frame)
        slot = self.sequencer.register(header.correlation_id)
        login_step = self.sasl is not None and header.api_key in LOGIN_STEP_APIS
        self.pending[slot] = PendingRequest(
            header, response_version, size, time.perf_counter(), login_step
        )
        if self.serial:
            self._mute_event(MuteEvent.REQUEST_RECEIVED_SERIAL)
        if self.sequencer.in_flight >= self.max_in_flight:
            self._mute_event(MuteEvent.IN_FLIGHT_FULL)
        if broker.memory.acquire(size):
            self._mute_event(MuteEvent.MEMORY_EXHAUSTED)
            broker.memory.notify_when_available(self)
        if login_step:
            self._mute_event(MuteEvent.SASL_REQUEST_READ)
        if broker.handler_pool.try_submit(self, slot, header, body, principal):
            return
        # Shielded: a request that has a slot must reach a handler, or the
        # writer would wait for its response forever (shutdown cancels readers).
        with trio.CancelScope(shield=True):
            await broker.handler_pool.submit(self, slot, header, body, principal)

    async def _receive_plain(self, target: memoryview | None) -> int:
        """Read a plain socket directly into the frame reader; the bytes read (0: the
        peer closed).

        trio's ``recv`` adds a scheduler pass after every read that did not have to wait
        (a pipelined producer's next request is often there already); here the reader
        yields when it waits for the socket, and after READS_WITHOUT_YIELD reads in a
        row that did not, so that a connection that keeps sending cannot hold the
        loop. Cancellation is still checked before every read.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._reads_without_yield >= READS_WITHOUT_YIELD:
            self._reads_without_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        fd = self.sock.fileno()
        while True:
            try:
                if target is not None:
                    count = os.readv(fd, [target])
                    self.frames.body_advance(count)
                else:
                    data = os.read(fd, RECEIVE_SIZE)
                    count = len(data)
                    self.frames.feed(data)
            except BlockingIOError:
                self._reads_without_yield = 0
                await trio.lowlevel.wait_readable(self.sock)
                continue
            self._reads_without_yield += 1
            return count

    def _admit(self, api_key: int) -> str | None:
        """The principal a request just read runs as, or None: refused (close).

        Decided now, at read time, from state only the event loop changes: a later
        login step cannot change who an already-read request runs as.
        """
        session = self.sasl
        if session is not None and not session.permits(api_key, trio.current_time() * 1000):
            return None
        return self.principal

    @property
    def principal(self) -> str:
        """Who the connection is now. Before a SASL login completes only ApiVersions
        and the SASL requests are permitted, which authorize nothing: ANONYMOUS."""
        if self.sasl is None:
            return self.transport_principal
        return self.sasl.principal or ANONYMOUS

    # ------------------------------------------------------------------ completing

    def complete(self, slot: int, response: Message | None) -> None:
        """A handler (or a deferred task) finished the request in ``slot``."""
        if self.closed:
            return
        # The request's bytes leave the memory budget once it is handled, not
        # once its response is sent: a client that never reads its responses
        # must not hold the broker-wide budget (and so mute everyone else).
        pending = self.pending[slot]
        pending.completed = time.perf_counter()
        self.broker.memory.release(pending.frame_size)
        pending.frame_size = 0
        self.sequencer.complete(slot, response)
        self._responses_ready.set()
        if pending.login_step:
            # The session holds the step's outcome now: read on, as whoever it says.
            assert self.sasl is not None
            pending.failed_login = self.sasl.failed
            if self.sasl.authenticated:  # big frames only after a login
                self.frames.max_frame_size = self.broker.config.socket_request_max_bytes
            self._mute_event(MuteEvent.SASL_REQUEST_HANDLED)

    # ------------------------------------------------------------------ writing

    async def _write_loop(self) -> None:
        while True:
            ready = self.sequencer.pop_ready()
            if not ready:
                if self._close_when_answered is not None and not self.sequencer.in_flight:
                    self.close(self._close_when_answered)
                    return
                self._responses_ready = trio.Event()
                await self._responses_ready.wait()
                continue
            # Responses that are bytes only (no log file regions), on a plain socket and
            # with capture off, go out together: one writev for all that are ready, not a
            # send (and a wake-up of the client) each. ``answered`` are their requests,
            # acks=0's (no response) among them, finished in order once the bytes are out.
            unsent: list[Any] = []
            answered: list[PendingRequest] = []
            for slot, response in ready:
                pending = self.pending.pop(slot)
                if response is not None:
                    h = pending.header
                    args = (h.api_key, pending.response_version, h.correlation_id, response)
                    if _entries(response) >= OFF_LOOP_ENCODE_ENTRIES:
                        parts = await trio.to_thread.run_sync(encode_response, *args)
                    else:
                        parts = encode_response(*args)
                    tap = self.broker.capture
                    if (
                        tap is None
                        and self._plain_socket
                        and not pending.failed_login
                        and all(isinstance(p, bytes | bytearray | memoryview) for p in parts)
                    ):
                        unsent.extend(parts)
                        answered.append(pending)
                        continue
                    if (unsent or answered) and not await self._send_answered(unsent, answered):
                        return
                    unsent, answered = [], []
                    staged = None
                    if tap is not None:
                        staged = tap.stage_response(
                            self.id, self.client_address, h, pending.response_version, parts,
                            response,
                        )  # fmt: skip
                    self.send_progress = trio.current_time()
                    whole = False
                    try:
                        await self._send_parts(parts)
                        whole = True
                    except OSError as exc:
                        self.close(f"send failed: {exc}")
                        return
                    finally:  # captured only if it went out whole (not cut by a close)
                        if staged is not None:
                            (tap.sent if whole else tap.not_sent)(staged)
                    self.send_progress = None
                elif not pending.failed_login:
                    answered.append(pending)
                    continue
                else:  # what was answered before it goes out first
                    if (unsent or answered) and not await self._send_answered(unsent, answered):
                        return
                    unsent, answered = [], []
                if not self._answered(pending):
                    return
            if (unsent or answered) and not await self._send_answered(unsent, answered):
                return

    async def _send_answered(self, unsent: list[Any], answered: list[PendingRequest]) -> bool:
        """Send the bytes of the responses to ``answered`` in one go, then finish each;
        False when the connection closed."""
        if unsent:
            self.send_progress = trio.current_time()
            try:
                await self._send_buffers(unsent)
            except OSError as exc:
                self.close(f"send failed: {exc}")
                return False
            self.send_progress = None
        return all(self._answered(pending) for pending in answered)

    def _answered(self, pending: PendingRequest) -> bool:
        """A request's answer is out (or it has none): count it, unmute what it held;
        False when the connection closed (the answer of a failed login)."""
        if pending.failed_login:
            # The step that failed the login has its answer; the requests
            # answered before it went out first, in order.
            assert self.sasl is not None
            failures = self.broker.stats.sasl_failures
            mechanism = self.sasl.mechanism or "none"
            failures[mechanism] = failures.get(mechanism, 0) + 1
            self.close(f"SASL authentication failed: {self.sasl.reason}")
            return False
        self.broker.stats.responses_sent += 1
        if pending.started:  # went through a handler: its stages are known
            self.broker.handler_pool.stages.observe(
                pending.header.api_key, pending.received, pending.started, pending.handled,
                pending.completed, time.perf_counter(),
            )  # fmt: skip
        self.last_active = trio.current_time()
        if self.serial:
            self._mute_event(MuteEvent.RESPONSE_SENT)
        if (
            MuteReason.IN_FLIGHT_LIMIT in self.mute.reasons
            and self.sequencer.in_flight < self.max_in_flight
        ):
            self._mute_event(MuteEvent.IN_FLIGHT_AVAILABLE)
        return True

    async def _send_parts(self, parts: list[Any]) -> None:
        buffers: list[Any] = []
        for part in parts:
            if isinstance(part, bytes | bytearray | memoryview):
                buffers.append(part)
                continue
            if buffers:
                await self._send_buffers(buffers)
                buffers = []
            fd = getattr(part, "fd", None)
            if fd is None:  # a memory-log region
                await self._send_buffers([part.read_bytes()])
            else:
                await self._sendfile(fd, part.position, part.length)
        if buffers:
            await self._send_buffers(buffers)

    async def _send_buffers(self, buffers: list[Any]) -> None:
        views = [memoryview(b).cast("B") for b in buffers]
        while views:
            if self._plain_socket:
                # A plain socket is written directly: trio's sendmsg adds a scheduler
                # pass after every send. The writer still yields whenever it waits (for
                # the socket here, for the next response), and cancellation is still
                # checked.
                await trio.lowlevel.checkpoint_if_cancelled()
                try:
                    sent = os.writev(self.sock.fileno(), views[:512])
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.sock)
                    continue
            else:
                sent = await self.sock.sendmsg(views[:512])
            self.broker.stats.bytes_out += sent
            self.send_progress = trio.current_time()
            while sent and views:
                first = views[0]
                if sent >= len(first):
                    sent -= len(first)
                    views.pop(0)
                else:
                    views[0] = first[sent:]
                    sent = 0
            while views and len(views[0]) == 0:
                views.pop(0)

    async def _sendfile(self, fd: int, position: int, length: int) -> None:
        """Zero-copy: the kernel moves log bytes from the page cache to the socket."""
        out = self.sock.fileno()
        while length > 0:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                sent = os.sendfile(out, fd, position, length)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                continue
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    await trio.lowlevel.wait_writable(self.sock)
                    continue
                raise
            if sent == 0:
                raise OSError(errno.EIO, "log file shorter than the region being sent")
            position += sent
            length -= sent
            self.broker.stats.bytes_out += sent
            self.send_progress = trio.current_time()

    def _release_all_memory(self) -> None:
        for pending in self.pending.values():
            self.broker.memory.release(pending.frame_size)
        self.pending.clear()
        self.broker.memory.forget(self)


def response_size(parts: list[Any]) -> int:
    return sum(part_length(p) for p in parts)


def _entries(message: Message) -> int:
    """Entries in a message's top-level lists: how big its encoding will be, roughly."""
    total = 0
    for field in message._fields:
        value = getattr(message, field.attr, None)
        if isinstance(value, list):
            total += len(value)
    return total
