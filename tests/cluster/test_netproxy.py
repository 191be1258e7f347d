"""The fault proxy itself, against a plain echo server: forward, hold, heal, reset."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from tests.cluster.netproxy import FaultProxy, fetcher_of, kafka_client_id

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


@pytest.fixture
def proxy(echo: int) -> Iterator[FaultProxy]:
    p = FaultProxy(("127.0.0.1", echo), "echo").start()
    try:
        yield p
    finally:
        p.close()


def request_bytes(client_id: str) -> bytes:
    """The start of a Kafka request from ``client_id`` (what the proxy identifies by)."""
    body = struct.pack(">hhih", 1, 12, 7, len(client_id)) + client_id.encode()
    return struct.pack(">i", len(body)) + body


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    return sock


def test_client_id_is_read_from_the_first_request() -> None:
    assert kafka_client_id(request_bytes("replica-fetcher-2")) == fetcher_of(2)
    assert kafka_client_id(b"\x00\x00") == ""


def test_forwards_holds_while_blackholed_and_delivers_on_heal(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert sock.recv(100) == b"hello"
        proxy.blackhole()
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(100)  # nothing comes back, nothing fails
        proxy.heal()
        sock.settimeout(5)
        assert sock.recv(100) == b"held"  # what was held goes through, as TCP would


def test_blackhole_of_one_source_holds_only_its_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as cut, connect(proxy) as other:
        cut.sendall(request_bytes(fetcher_of(2)))
        other.sendall(request_bytes(fetcher_of(3)))
        assert cut.recv(100) and other.recv(100)
        proxy.blackhole([fetcher_of(2)])
        cut.sendall(b"x")
        other.sendall(b"y")
        assert other.recv(100) == b"y"
        cut.settimeout(0.5)
        with pytest.raises(TimeoutError):
            cut.recv(100)
        proxy.heal()
        cut.settimeout(5)
        assert cut.recv(100) == b"x"


def test_reset_closes_open_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert sock.recv(100) == b"a"
        proxy.reset()
        try:
            assert sock.recv(100) == b""  # closed by the proxy
        except ConnectionResetError:
            pass
    with connect(proxy) as again:  # new connections go through
        again.sendall(b"b")
        assert again.recv(100) == b"b"


def test_delay_holds_each_chunk(proxy: FaultProxy) -> None:
    import time

    proxy.delay(0.3)
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"slow")
        assert sock.recv(100) == b"slow"
        assert time.monotonic() - started >= 0.5  # 0.3 s each way
