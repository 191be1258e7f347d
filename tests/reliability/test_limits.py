"""Connection limits of a real broker process, each configured short to be testable.

- ``connections.max.idle.ms``: a connection with nothing in flight and no bytes
  received for that long is closed by the broker; an active one is not.
- ``max.connections.per.ip``: connections past the limit are closed at accept;
  closing one frees its place.
- slow reader: a client that pipelines fetches and never reads the responses
  does not grow the broker's memory (RSS from /proc) — the in-flight cap mutes
  its reader and fetch responses are file regions sent with sendfile.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from tests.reliability.conftest import (
    BrokerFactory,
    ConfiguredBroker,
    RawConnection,
    many_sockets,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: /metrics on a free port: the tests wait for what it shows, not for a fixed time.
METRICS = {"metrics.listener": "127.0.0.1:0"}


def test_idle_connection_is_closed(make_broker: BrokerFactory) -> None:
    broker = make_broker({"connections.max.idle.ms": 1000})
    with broker.connect() as idle, broker.connect() as busy:
        idle.metadata(topics=None)  # one request, then silence
        assert not idle.closed_by_peer(timeout=0.3), "closed before connections.max.idle.ms"
        started = time.monotonic()
        # ``busy`` sends a request every 300 ms: it must outlive ``idle``.
        while time.monotonic() - started < 2.5:
            busy.metadata(topics=None)
            time.sleep(0.3)
        assert idle.closed_by_peer(timeout=5.0), "idle connection was not closed"
        busy.metadata(topics=None)  # still open
    assert "idle for more than 1000 ms" in broker.log_text()
    broker.assert_serving()


def test_long_poll_is_not_idle(make_broker: BrokerFactory) -> None:
    """A fetch waiting (max_wait_ms) longer than the idle limit keeps its connection."""
    broker = make_broker({"connections.max.idle.ms": 700})
    with broker.connect() as conn:
        conn.metadata(["idle-poll"])  # auto-creates the topic
        conn.produce("idle-poll", bytes(build_batch([(b"k", b"v")])))
        end = conn.end_offset("idle-poll")
        Fetch = m.FetchRequest
        body = Fetch(
            replica_id=-1,
            max_wait_ms=1500,
            min_bytes=1 << 20,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                Fetch.FetchTopic(
                    topic="idle-poll",
                    partitions=[
                        Fetch.FetchTopic.FetchPartition(
                            partition=0, fetch_offset=end, partition_max_bytes=1 << 20
                        )
                    ],
                )
            ],
        )
        response = conn.request(m.ApiKey.FETCH, 4, body)
        answer = response.responses[0].partitions[0]
        # No records and min_bytes unmet: the broker held the fetch for max_wait_ms
        # (1.5 s), longer than the idle limit (0.7 s).
        assert answer.error_code == 0 and not answer.records
        conn.metadata(topics=None)  # not closed by the idle timer


def test_max_connections_per_ip(make_broker: BrokerFactory) -> None:
    broker = make_broker({"max.connections.per.ip": 5})
    with many_sockets(broker.port, 5) as socks:
        # The five are accepted and work: each is answered, so the broker counts it.
        for sock in socks:
            conn = RawConnection.__new__(RawConnection)
            conn.sock, conn._correlation = sock, 0
            conn.metadata(topics=None)
        extra = broker.connect(timeout=5.0)
        assert extra.closed_by_peer(timeout=5.0), "sixth connection from one IP was kept"
        extra.close()
        socks.pop().close()
        _serving_within(broker, 5.0)  # a freed place can be taken again
    _serving_within(broker, 5.0)  # once the broker has seen the closes


def _serving_within(broker: ConfiguredBroker, seconds: float) -> None:
    """Metadata answered on a new connection, retried until ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            broker.assert_serving()
            return
        except RawConnection.Closed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _wait(condition: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)  # polling the broker's metrics, bounded by the deadline


def _settled(broker: ConfiguredBroker, api: str, sent: int) -> None:
    """Until the broker has read all it will of the ``sent`` requests (all of them, or
    it muted the slow client) and handled them (its handler queues are empty): what it
    holds for that client is all there."""
    key = {"produce": 0, "fetch": 1}[api]

    def settled() -> bool:
        handled = broker.metric("trio_broker_requests_total", f'api="{api}",api_key="{key}"')
        read_all = handled >= sent or broker.metric_sum("trio_broker_muted_connections") >= 1
        return read_all and broker.metric_sum("trio_broker_handler_queue_depth") == 0

    _wait(settled, f"the slow client's {api} requests read (or it muted) and handled")


def _fetch_frame(conn: RawConnection, topic: str, max_bytes: int) -> bytes:
    Fetch = m.FetchRequest
    body = Fetch(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=[
            Fetch.FetchTopic(
                topic=topic,
                partitions=[
                    Fetch.FetchTopic.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=max_bytes
                    )
                ],
            )
        ],
    )
    return bytes(m.encode_request(m.ApiKey.FETCH, 4, conn.next_correlation_id(), "slow", body))


@pytest.mark.parametrize("storage", ["file", "memory"])
def test_slow_reader_memory_is_bounded(make_broker: BrokerFactory, storage: str) -> None:
    """Pipelined 4 MiB fetches that are never read: RSS grows by far less than asked for."""
    broker = make_broker(METRICS, storage=storage)
    topic = "slow-reader"
    value = b"x" * 100_000
    with broker.connect() as producer:
        producer.metadata([topic])
        for _ in range(40):  # 4 MB in the log
            assert producer.produce(topic, bytes(build_batch([(b"k", value)]))).error_code == 0
    before = broker.rss()
    asked = 0
    slow = broker.connect()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sock.settimeout(0.5)
    deadline = time.monotonic() + 15.0
    sent = 0
    try:
        for _ in range(2000):  # bounded in count and time
            if time.monotonic() > deadline:
                break
            frame = _fetch_frame(slow, topic, 4 << 20)
            try:
                slow.sock.sendall(frame)
            except TimeoutError:
                break  # the broker stopped reading us: muted
            sent += 1
            asked += 4 << 20
        _settled(broker, "fetch", sent)
        after = broker.rss()
        # The broker still serves everybody else meanwhile.
        broker.assert_serving()
    finally:
        slow.close()
    growth = after - before
    print(
        f"slow reader ({storage}): {sent} fetches sent (~{asked >> 20} MiB of responses "
        f"asked for), RSS {before >> 20} -> {after >> 20} MiB (+{growth >> 20} MiB)"
    )
    assert sent >= 64, "expected the reader to accept at least the in-flight cap"
    assert growth < 64 << 20, f"RSS grew by {growth >> 20} MiB for a client that never reads"
    # The broker has seen the slow reader go (its close, with responses still queued).
    _wait(lambda: broker.metric("trio_broker_connections_open") == 0, "the close is seen")
    broker.assert_serving()


def test_slow_reader_does_not_hold_the_memory_budget(make_broker: BrokerFactory) -> None:
    """A client that never reads cannot mute everybody else with MEMORY_PRESSURE.

    The slow client's fetch responses fill the socket buffers, then it pipelines
    large produce requests (far past ``queued.max.request.bytes``) whose answers
    wait behind the stuck fetches. Their bytes leave the broker-wide budget once
    they are handled, so a second client is still served. (Before the fix the
    bytes were held until the response was sent: the second client hung.)
    """
    broker = make_broker({"queued.max.request.bytes": 2 << 20, **METRICS})
    topic = "pinned-budget"
    with broker.connect() as producer:
        producer.metadata([topic])
        for _ in range(20):
            batch = bytes(build_batch([(b"k", b"x" * 100_000)]))
            assert producer.produce(topic, batch).error_code == 0
    slow = broker.connect()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sock.settimeout(2.0)
    try:
        for _ in range(4):
            slow.sock.sendall(_fetch_frame(slow, topic, 4 << 20))
        big = bytes(build_batch([(b"k", b"y" * 200_000)]))
        sent = 0
        for _ in range(40):  # 8 MB of requests against a 2 MiB budget
            frame = m.encode_request(
                m.ApiKey.PRODUCE,
                9,
                slow.next_correlation_id(),
                "slow",
                slow.produce_body(topic, big, acks=1),
            )
            try:
                slow.sock.sendall(frame)
            except TimeoutError:
                break
            sent += 1
        assert sent * len(big) > 2 << 20, f"only {sent} produce requests got in"
        _settled(broker, "produce", 20 + sent)
        with broker.connect(timeout=5.0) as other:
            for _ in range(3):
                batch = bytes(build_batch([(b"k", b"z" * 1000)]))
                assert other.produce(topic, batch).error_code == 0
    finally:
        slow.close()
    broker.assert_serving()


def test_stalled_reader_is_closed(make_broker: BrokerFactory) -> None:
    """A client that stops reading is closed after connections.max.idle.ms of no progress."""
    broker = make_broker({"connections.max.idle.ms": 1000})
    topic = "stalled-reader"
    with broker.connect() as producer:
        producer.metadata([topic])
        for _ in range(20):
            assert (
                producer.produce(topic, bytes(build_batch([(b"k", b"x" * 100_000)]))).error_code
                == 0
            )
    slow = broker.connect()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        for _ in range(4):
            slow.sock.sendall(_fetch_frame(slow, topic, 4 << 20))
        # The broker's own log names the stall it measured (over its 1000 ms limit); the
        # deadline only bounds the wait.
        deadline = time.monotonic() + 60.0
        while "send stalled for more than 1000 ms" not in broker.log_text():
            assert time.monotonic() < deadline, "stalled connection was not closed"
            time.sleep(0.2)
        # (Not drained here: with a 4 KiB receive buffer the kernel trickles the
        # bytes the broker had already queued before its close.)
    finally:
        slow.close()
    broker.assert_serving()
