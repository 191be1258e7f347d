"""Prometheus ``/metrics`` and ``/health`` over a tiny HTTP/1.1 responder.

Enabled by ``metrics.listener = "HOST:PORT"`` (or ``serve --metrics-listen``).
Everything is read from the broker's existing state at scrape time; the only
hot-path cost is :class:`LatencyHistogram.observe` in the handler pool.
The text exposition format (version 0.0.4) is written here: no dependency.

The responder answers one request per connection (``Connection: close``):
``GET /metrics``, ``GET /health`` (200 "ok" while the broker listens, else 503);
other paths get 404, other methods 405, malformed or oversized requests 400.
``GET /capture`` and ``POST /capture/on|off`` switch the traffic capture
(trio_broker/capture/control.py). ``GET /`` and the paths under ``/console/`` and
``/api/`` are the web console (server/console.py, docs/console.md).
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Iterable
from typing import Any

import trio

from trio_broker.config import parse_host_port
from trio_broker.protocol.messages import API_KEY_NAMES
from trio_broker.server.console import MAX_BODY_BYTES, Console, HttpRequest, is_console_path
from trio_broker.server.gc_policy import PAUSES
from trio_broker.server.histogram import LatencyHistogram
from trio_broker.state.mute import MuteReason

#: The Broker: /metrics reads most of its state, so it is typed loosely here rather
#: than import the module that imports this one.
Broker = Any

log = logging.getLogger("trio_broker.metrics")

#: The largest request head (request line + headers) accepted.
MAX_REQUEST_BYTES = 8192
#: How long a client may take to send its request head.
REQUEST_TIMEOUT_S = 10.0
#: Connections served at once. Each may hold its slot for REQUEST_TIMEOUT_S + LINGER_S;
#: beyond this a connection is closed at once, unanswered, so that a local process
#: opening connections without end cannot take the file descriptors the broker's
#: segments and clients need.
MAX_CONNECTIONS = 64
#: After answering: how long, and how many bytes, to read and discard before closing.
LINGER_S = 1.0
LINGER_BYTES = 1 << 20
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Prometheus label per API key ("produce", "fetch", ...), from the one table of API keys.
API_NAMES: dict[int, str] = {key: name.lower() for key, name in API_KEY_NAMES.items()}


# ---------------------------------------------------------------------- exposition format


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


Sample = tuple[str, dict[str, str], float]


class Exposition:
    """Builds the text format: one ``# HELP`` and ``# TYPE`` per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        """``samples``: (suffix, labels, value); the suffix is appended to ``name``."""
        escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self._lines.append(f"# HELP {name} {escaped}")
        self._lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            if labels:
                text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
                self._lines.append(f"{name}{suffix}{{{text}}} {_format_value(value)}")
            else:
                self._lines.append(f"{name}{suffix} {_format_value(value)}")

    def gauge(self, name: str, help_text: str, value: float) -> None:
        self.family(name, "gauge", help_text, [("", {}, value)])

    def counter(self, name: str, help_text: str, value: float) -> None:
        self.family(name, "counter", help_text, [("", {}, value)])

    def render(self) -> bytes:
        return ("\n".join(self._lines) + "\n").encode()


def _histogram_samples(
    labels: dict[str, str], bounds: Iterable[tuple[str, int]], total: float
) -> list[Sample]:
    """``bounds``: (le, non-cumulative count) in order, ending with "+Inf"."""
    samples: list[Sample] = []
    cumulative = 0
    for le, count in bounds:
        cumulative += count
        samples.append(("_bucket", {**labels, "le": le}, cumulative))
    samples.append(("_sum", labels, total))
    samples.append(("_count", labels, cumulative))
    return samples


def _latency_samples(histogram: LatencyHistogram, key: int, labels: dict[str, str]) -> list[Sample]:
    """One key's series of a :class:`LatencyHistogram` (all zero when it saw nothing)."""
    les = [_format_value(b) for b in histogram.bounds] + ["+Inf"]
    counts = histogram.buckets.get(key, [0] * len(les))
    return _histogram_samples(labels, zip(les, counts), histogram.sums.get(key, 0.0))


def render_metrics(broker: Broker) -> bytes:
    out = Exposition()
    p = "trio_broker_"
    stats = broker.stats
    out.gauge(p + "up", "1 while the broker is serving", 0 if broker.shutting_down else 1)
    out.gauge(p + "connections_open", "open client connections", len(broker.connections))
    out.counter(
        p + "connections_accepted_total", "connections accepted", stats.connections_accepted
    )
    out.counter(
        p + "connections_rejected_total",
        "connections refused (max.connections / max.connections.per.ip)",
        stats.connections_rejected,
    )
    out.counter(p + "responses_sent_total", "responses written to clients", stats.responses_sent)
    out.counter(p + "bytes_out_total", "bytes written to client sockets", stats.bytes_out)

    pool = broker.handler_pool
    out.family(
        p + "handler_requests_total",
        "counter",
        "requests taken from each handler queue",
        [("", {"queue": str(i)}, n) for i, n in enumerate(pool.handled)],
    )
    out.family(
        p + "handler_queue_depth",
        "gauge",
        "requests waiting in each handler queue",
        [("", {"queue": str(i)}, n) for i, n in enumerate(pool.queue_depths())],
    )

    _topic_families(out, broker)

    latency = pool.latency
    keys = sorted(latency.buckets)
    out.family(
        p + "requests_total",
        "counter",
        "requests handled per API",
        [("", _api_labels(k), latency.count(k)) for k in keys],
    )
    histogram: list[Sample] = []
    for key in keys:
        les = [_format_value(b) for b in latency.bounds] + ["+Inf"]
        histogram += _histogram_samples(
            _api_labels(key), zip(les, latency.buckets[key]), latency.sums[key]
        )
    out.family(
        p + "request_duration_seconds",
        "histogram",
        "time from dequeue to handler return, per API",
        histogram,
    )
    stages = pool.stages
    for name, stage, help_text in (
        ("request_queue_seconds", stages.queue, "time from a request read to a handler taking it"),
        ("request_local_seconds", stages.local, "time in the handler call (Kafka's LocalTimeMs)"),
        ("request_remote_seconds", stages.remote,
         "time a deferred response waited after its handler returned (fsync, long poll)"),
        ("response_send_seconds", stages.send,
         "time from a response ready to its bytes written, behind earlier ones on its connection"),
        ("request_total_seconds", stages.total,
         "time from a request read to its response written, per API"),
    ):  # fmt: skip
        out.family(
            p + name,
            "histogram",
            help_text,
            [
                sample
                for key in sorted(stage.buckets)
                for sample in _latency_samples(stage, key, _api_labels(key))
            ],
        )
    watchdog = broker.loop_watchdog
    out.family(
        p + "event_loop_lag_seconds",
        "histogram",
        "how late the loop watchdog's periodic sleep woke (time others held the event loop)",
        _latency_samples(watchdog.lag, 0, {}),
    )
    out.counter(
        p + "event_loop_stalls_total",
        "wakes of the loop watchdog late by 200 ms or more (each logged by trio_broker.loop)",
        watchdog.stalls,
    )
    out.gauge(p + "event_loop_lag_max_seconds", "the longest event loop lag seen", watchdog.max_lag)
    out.counter(
        p + "slow_requests_total",
        "requests slower than request.log.slow.ms (each logged by trio_broker.requests)",
        stats.slow_requests,
    )
    out.counter(
        p + "slow_requests_unlogged_total",
        "slow requests counted but not logged: past 20 lines a second (trio_broker.handlers "
        "logs how many)",
        pool.slow_unlogged,
    )
    sessions = broker.fetch_sessions
    out.gauge(p + "fetch_sessions", "incremental fetch sessions cached (KIP-227)", len(sessions))
    out.gauge(
        p + "fetch_session_partitions", "partitions cached in fetch sessions",
        sessions.cached_partitions,
    )  # fmt: skip
    out.counter(
        p + "fetch_session_evictions_total", "fetch sessions evicted to make room",
        sessions.evictions,
    )  # fmt: skip
    out.counter(
        p + "incremental_fetches_total", "incremental fetch requests taken by their session",
        sessions.incremental_fetches,
    )  # fmt: skip
    out.family(
        p + "fetch_session_errors_total", "counter",
        "incremental fetches refused, per error (FETCH_SESSION_ID_NOT_FOUND, ...)",
        [("", {"error": code.name}, n) for code, n in sorted(sessions.errors.items())],
    )  # fmt: skip
    _fetch_wait_families(out, broker)
    _quota_families(out, broker)

    muted = dict.fromkeys(MuteReason, 0)
    for conn in list(broker.connections.values()):
        for reason in conn.mute.reasons:
            muted[reason] += 1
    out.family(
        p + "muted_connections",
        "gauge",
        "connections not being read, by mute reason",
        [("", {"reason": r.value}, n) for r, n in muted.items()],
    )

    memory = broker.memory
    out.gauge(p + "memory_budget_in_use_bytes", "bytes of queued requests", memory.in_use)
    out.gauge(p + "memory_budget_peak_bytes", "peak bytes of queued requests", memory.peak)
    out.gauge(p + "memory_budget_limit_bytes", "queued.max.request.bytes", memory.limit)

    flush = broker.flusher.statistics()
    out.counter(p + "fsyncs_total", "group-commit fsyncs completed", flush.fsyncs)
    out.counter(p + "fsync_failures_total", "group-commit fsyncs that failed", flush.failures)
    out.gauge(p + "pending_appends", "appends not yet covered by a flush", flush.pending_appends)
    out.gauge(p + "flush_waiters", "requests waiting for a flush", flush.waiters)
    # Bucket b counts flushes covering [b, 2b) appends, i.e. <= 2b - 1 (integers).
    buckets = {0: 0, **{1 << i: 0 for i in range(17)}}
    for bucket, count in flush.appends_per_fsync.items():
        buckets[bucket] = buckets.get(bucket, 0) + count
    fsync_buckets = [(str(max(0, 2 * b - 1)), n) for b, n in sorted(buckets.items())]
    out.family(
        p + "appends_per_fsync",
        "histogram",
        "appends covered by each group-commit fsync",
        _histogram_samples({}, [*fsync_buckets, ("+Inf", 0)], flush.appends),
    )
    out.family(
        p + "fsync_duration_seconds",
        "histogram",
        "time of each successful partition log sync, measured in the flush thread",
        _latency_samples(broker.flusher.fsync_durations, 0, {}),
    )
    _gc_families(out)

    sizes: list[Sample] = []
    ends: list[Sample] = []
    for name, topic in sorted(broker.topics.topics.items()):
        for index, log_ in enumerate(topic.logs):
            labels = {"topic": name, "partition": str(index)}
            sizes.append(("", labels, log_.size_bytes))
            ends.append(("", labels, log_.log_end_offset))
    out.gauge(p + "topics", "topics", len(broker.topics.topics))
    out.family(p + "partition_size_bytes", "gauge", "bytes in a partition's log", sizes)
    out.family(p + "log_end_offset", "gauge", "next offset of a partition's log", ends)
    groups = len(broker.groups.groups) + len(broker.groups.consumer_groups)  # classic + KIP-848
    out.gauge(p + "groups", "consumer groups known to the coordinator", groups)
    return out.render()


def _gc_families(out: Exposition) -> None:
    """The process's cyclic garbage collector (trio_broker/server/gc_policy.py)."""
    p = "trio_broker_gc_"
    generations = range(len(gc.get_threshold()))
    out.family(
        p + "collections_total",
        "counter",
        "collections of each generation since the process started",
        [
            ("", {"generation": str(g)}, stats["collections"])
            for g, stats in zip(generations, gc.get_stats())
        ],
    )
    out.family(
        p + "pause_seconds",
        "histogram",
        "how long each collection held the process (the event loop with it)",
        [
            sample
            for g in generations
            for sample in _latency_samples(PAUSES.histogram, g, {"generation": str(g)})
        ],
    )
    out.gauge(
        p + "frozen_objects", "objects frozen at start, never collected", gc.get_freeze_count()
    )
    out.gauge(
        p + "gen0_threshold", "net allocations between young collections", gc.get_threshold()[0]
    )


def _per_label(label: str, counts: dict[str, int]) -> list[Sample]:
    return [("", {label: name}, n) for name, n in sorted(counts.items())]


def _topic_families(out: Exposition, broker: Broker) -> None:
    p = "trio_broker_topic_"
    stats = broker.stats
    out.family(
        p + "bytes_in_total",
        "counter",
        "record-batch bytes appended by Produce, per topic",
        _per_label("topic", stats.topic_bytes_in),
    )
    out.family(
        p + "messages_in_total",
        "counter",
        "records appended by Produce (batch header record counts), per topic",
        _per_label("topic", stats.topic_messages_in),
    )
    out.family(
        p + "bytes_out_total",
        "counter",
        "record-batch bytes returned by Fetch, per topic",
        _per_label("topic", stats.topic_bytes_out),
    )


#: Upper bounds of the partitions-changed-per-look histogram (powers of two).
CHANGED_PER_LOOK_BOUNDS = [1 << i for i in range(11)]


def _fetch_wait_families(out: Exposition, broker: Broker) -> None:
    """The fetch purgatory (server/fetch_waits.py): long polls waiting, and wake-ups."""
    p = "trio_broker_"
    waits = broker.appends.statistics()
    out.gauge(p + "fetch_waiting", "long-poll fetches waiting for a change", waits.waiters)
    out.gauge(
        p + "fetch_waiting_partitions", "partitions watched by waiting fetches", waits.partitions
    )
    out.counter(p + "fetch_waits_total", "fetches that waited (long polls begun)", waits.registered)
    out.counter(
        p + "fetch_partition_changes_total",
        "partition changes told to the fetch purgatory (appends, HW moves, leadership ends)",
        waits.touches,
    )
    out.counter(
        p + "fetch_wakeups_total",
        "waiting fetches woken by a change to one of their partitions",
        waits.woken,
    )
    per_look = dict.fromkeys(CHANGED_PER_LOOK_BOUNDS, 0)
    beyond = 0
    for bucket, count in waits.changed_per_look.items():
        if bucket in per_look:
            per_look[bucket] += count
        else:
            beyond += count
    out.family(
        p + "fetch_wakeup_partitions",
        "histogram",
        "partitions changed at each look of a woken fetch (it reads only those again)",
        _histogram_samples(
            {}, [*((str(b), n) for b, n in per_look.items()), ("+Inf", beyond)], waits.changed_seen
        ),
    )


def _quota_families(out: Exposition, broker: Broker) -> None:
    p = "trio_broker_"
    stats = broker.stats
    out.family(
        p + "throttled_responses_total",
        "counter",
        "responses with throttle_time_ms > 0, per quota",
        _per_label("quota", stats.throttled_responses),
    )
    out.family(
        p + "throttle_time_ms_total",
        "counter",
        "throttle milliseconds given to clients, per quota",
        _per_label("quota", stats.throttle_ms),
    )
    out.family(
        p + "sasl_failures_total",
        "counter",
        "failed SASL logins, per mechanism (none: failed before one was chosen)",
        _per_label("mechanism", stats.sasl_failures),
    )


def _api_labels(key: int) -> dict[str, str]:
    return {"api": API_NAMES.get(key, f"api_{key}"), "api_key": str(key)}


# ---------------------------------------------------------------------- HTTP


class BadRequest(Exception):
    pass


def parse_request_head(head: bytes) -> tuple[str, str]:
    """Request line and headers (without the blank line) -> (method, path); BadRequest."""
    method, target, _ = parse_request(head)
    return method, target.split("?", 1)[0]


def parse_request(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Request line and headers -> (method, target with its query, headers by lower-case
    name); BadRequest."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("not ASCII") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest("bad request line")
    method, target, version = parts
    if not method.isalpha() or not method.isupper():
        raise BadRequest("bad method")
    if version not in ("HTTP/1.0", "HTTP/1.1") or not target.startswith("/"):
        raise BadRequest("bad target or version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise BadRequest("bad header line")
        headers[name.lower()] = value.strip()
    return method, target, headers


def _response(
    status: str,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in extra)
        + "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class MetricsService:
    """A broker service: serves /metrics and /health on its own listener."""

    def __init__(self, broker: Broker, listener: str) -> None:
        self.broker = broker
        self.host, self.port = parse_host_port(listener, "metrics.listener")
        self.bound: tuple[str, int] | None = None
        self.console = Console(broker)
        self.connections = 0
        self.refused = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        host, port = listeners[0].socket.getsockname()[:2]
        self.bound = (host, port)
        log.info("metrics on %s:%d", host, port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started()

    async def _handle(self, stream: trio.SocketStream) -> None:
        if self.connections >= MAX_CONNECTIONS:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("metrics listener: %d connections open, %d refused so far",
                            self.connections, self.refused)  # fmt: skip
            await stream.aclose()  # no answer: it would need a lingering close
            return
        self.connections += 1
        try:
            await self._serve(stream)
        finally:
            self.connections -= 1

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            async with stream:
                try:
                    answer = await self._answer(stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    raise
                except Exception:
                    # A bug behind one page (a metric that cannot render) answers 500;
                    # it must not end the listener's nursery, and with it the broker.
                    log.exception("metrics listener: answering a request failed")
                    answer = _response("500 Internal Server Error", b"internal error\n")
                await stream.send_all(answer)
                # Lingering close: closing with unread input would reset the
                # connection and could discard the response before it is read.
                await stream.send_eof()
                with trio.move_on_after(LINGER_S):
                    drained = 0
                    while drained < LINGER_BYTES and (chunk := await stream.receive_some(65536)):
                        drained += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def _answer(self, stream: trio.SocketStream) -> bytes:
        data = b""
        with trio.move_on_after(REQUEST_TIMEOUT_S) as scope:
            while b"\r\n\r\n" not in data:
                if len(data) > MAX_REQUEST_BYTES:
                    return _response("400 Bad Request", b"request too large\n")
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return _response("400 Bad Request", b"incomplete request\n")
                data += chunk
        if scope.cancelled_caught:
            return _response("408 Request Timeout", b"timeout\n")
        head = data.split(b"\r\n\r\n", 1)[0]
        if len(head) > MAX_REQUEST_BYTES:
            return _response("400 Bad Request", b"request too large\n")
        try:
            method, target, headers = parse_request(head)
        except BadRequest as exc:
            return _response("400 Bad Request", f"{exc}\n".encode())
        path, _, query = target.partition("?")
        if is_console_path(path):
            return await self._console_answer(stream, data, method, path, query, headers)
        if path == "/capture" or path.startswith("/capture/"):
            from trio_broker.capture.control import http_capture

            status, body = http_capture(self.broker, method, path)
            return _response(status, body, "application/json")
        if method != "GET":
            return _response("405 Method Not Allowed", b"only GET\n")
        if path == "/metrics":
            return _response("200 OK", render_metrics(self.broker), CONTENT_TYPE)
        if path == "/health":
            if self.broker.bound and not self.broker.shutting_down:
                return _response("200 OK", b"ok")
            return _response("503 Service Unavailable", b"not serving\n")
        return _response("404 Not Found", b"not found\n")

    async def _console_answer(
        self, stream: trio.SocketStream, data: bytes, method: str, path: str, query: str,
        headers: dict[str, str],
    ) -> bytes:  # fmt: skip
        """Reads the body (Content-Length, at most MAX_BODY_BYTES) and asks the console."""
        body = data.split(b"\r\n\r\n", 1)[1]
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return _response("400 Bad Request", b"bad Content-Length\n")
        if not 0 <= length <= MAX_BODY_BYTES:
            return _response("413 Content Too Large", b"body too large\n")
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            while len(body) < length:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                body += chunk
        if len(body) < length:
            return _response("400 Bad Request", b"incomplete body\n")
        host = stream.socket.getpeername()[0]
        request = HttpRequest(method, path, query, headers, body[:length], host)
        answer = await self.console.answer(request)
        return _response(answer.status, answer.body, answer.content_type, answer.extra_headers)
