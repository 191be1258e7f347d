"""How a connection talks to its socket: plain (unchanged) or TLS.

A PLAINTEXT / SASL_PLAINTEXT connection is the ordinary
:class:`~trio_broker.server.connection.Connection`: raw socket, ``sendmsg`` and
zero-copy ``os.sendfile`` — nothing here touches that path. An SSL / SASL_SSL
connection is a :class:`TlsConnection`: the same reader and writer, but its
``sock`` is a :class:`TlsSocket` (a ``trio.SSLStream`` behind the few socket
methods the connection calls), and file regions are read with ``os.pread``
(big reads in a worker thread) and encrypted instead of sent with sendfile.
"""

from __future__ import annotations

import errno
import logging
import os
import ssl
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

from trio_broker.handlers.base import ClientInfo
from trio_broker.security.listeners import Listener, split_list
from trio_broker.security.pem import load_keystore, load_truststore
from trio_broker.security.principal import NoMatchingRule, Rule, parse_rules, principal_for
from trio_broker.security.sasl import MAX_RECEIVE_SIZE, SaslSession
from trio_broker.server.connection import Connection

if TYPE_CHECKING:
    from trio_broker.server.host import ConnectionHost

log = logging.getLogger("trio_broker.tls")

#: A client has this long to finish the TLS handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: File regions go through TLS in chunks of this size; a chunk this big is read
#: in a worker thread so a cold page cache does not stall the event loop.
FILE_CHUNK = 1 << 20
_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                "required": ssl.CERT_REQUIRED}  # fmt: skip


@attrs.frozen
class TlsSettings:
    context: ssl.SSLContext
    rules: list[Rule]


def server_context(listener: Listener) -> ssl.SSLContext:
    """The SSLContext of a TLS listener from its ssl.* settings (PEM only)."""
    s = listener.settings
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_TLS_VERSIONS[p] for p in split_list(s["ssl.enabled.protocols"]))
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    load_keystore(context, s)
    load_truststore(context, s)
    context.verify_mode = _CLIENT_AUTH[s["ssl.client.auth"]]
    return context


def tls_contexts(listeners: list[Listener]) -> dict[str, TlsSettings]:
    """Build every TLS listener's context at start: a bad file fails the broker at once."""
    out: dict[str, TlsSettings] = {}
    for listener in listeners:
        if not listener.uses_tls:
            continue
        try:
            rules = parse_rules(str(listener.settings["ssl.principal.mapping.rules"]))
            out[listener.name] = TlsSettings(server_context(listener), rules)
        except (OSError, ValueError) as exc:
            raise OSError(f"listener {listener.name}: cannot set up TLS: {exc}") from exc
    return out


def open_connection(
    broker: ConnectionHost, sock: trio.socket.SocketType, client: ClientInfo, listener: Listener
) -> Connection:
    """The connection object for a socket accepted on ``listener``."""
    tls = broker.tls_contexts.get(listener.name)
    if tls is None:
        conn = Connection(broker, sock, client)
    else:
        conn = TlsConnection(broker, sock, client, tls, listener)
    conn.listener = listener
    if listener.uses_sasl:
        conn.sasl = SaslSession(
            listener.mechanisms, broker.credentials, listener.reauth_ms, broker.sasl_decoy_secret
        )
        # Kafka's sasl.server.max.receive.size: no big frames before authentication.
        conn.frames.max_frame_size = min(MAX_RECEIVE_SIZE, conn.frames.max_frame_size)
    return conn


def _as_os_error(exc: BaseException) -> OSError:
    return OSError(errno.ECONNRESET, f"TLS stream broken: {exc.__cause__ or exc}")


class TlsSocket:
    """The socket methods Connection uses, over a server-side ``trio.SSLStream``."""

    def __init__(self, sock: trio.socket.SocketType, context: ssl.SSLContext) -> None:
        self.raw = sock
        self.stream = trio.SSLStream(trio.SocketStream(sock), context, server_side=True)

    async def recv(self, size: int) -> bytes:
        try:
            return bytes(await self.stream.receive_some(size))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _as_os_error(exc) from exc

    async def recv_into(self, target: memoryview) -> int:
        data = await self.recv(len(target))
        target[: len(data)] = data
        return len(data)

    async def sendmsg(self, views: list[memoryview]) -> int:
        data = b"".join(views)
        await self.send_all(data)
        return len(data)

    async def send_all(self, data: bytes | memoryview) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _as_os_error(exc) from exc

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()


class TlsConnection(Connection):
    """A Connection on an SSL / SASL_SSL listener."""

    def __init__(
        self, broker: ConnectionHost, sock: trio.socket.SocketType, client: ClientInfo,
        tls: TlsSettings, listener: Listener,
    ) -> None:  # fmt: skip
        self.tls_socket = TlsSocket(sock, tls.context)
        super().__init__(broker, cast(Any, self.tls_socket), client)
        self._rules = tls.rules
        self._principal_from_certificate = not listener.uses_sasl

    async def run(self) -> None:
        stream = self.tls_socket.stream
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await stream.do_handshake()
        except BaseException as exc:  # also a shutdown's Cancelled: close the socket
            self.closed = True
            self.tls_socket.close()
            if not isinstance(exc, trio.BrokenResourceError | trio.TooSlowError):
                raise
            log.info("connection %d from %s: TLS handshake failed: %s",
                     self.id, self.client.host, exc.__cause__ or exc)  # fmt: skip
            return
        if self._principal_from_certificate:
            try:
                principal = principal_for(stream.getpeercert(), self._rules)
            except NoMatchingRule as exc:
                log.info("connection %d from %s: %s", self.id, self.client.host, exc)
                self.closed = True
                self.tls_socket.close()
                return
            if principal is not None:
                self.transport_principal = principal
                log.info("connection %d: TLS client principal %s", self.id, principal)
        await super().run()

    async def _sendfile(self, fd: int, position: int, length: int) -> None:
        """No sendfile under TLS: read the region and encrypt it, a chunk at a time."""
        while length > 0:
            size = min(length, FILE_CHUNK)
            if size >= FILE_CHUNK:
                data = await trio.to_thread.run_sync(os.pread, fd, size, position)
            else:
                data = os.pread(fd, size, position)
            if not data:
                raise OSError(errno.EIO, "log file shorter than the region being sent")
            await self.tls_socket.send_all(data)
            position += len(data)
            length -= len(data)
            self.broker.stats.bytes_out += len(data)
            self.send_progress = trio.current_time()
