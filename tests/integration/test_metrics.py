"""The Prometheus /metrics and /health endpoints (trio_broker.server.metrics).

An in-process broker with ``metrics.listener`` on port 0; confluent-kafka
produces; plain urllib scrapes from a thread before and after. The exposition
is parsed strictly: every line is a HELP, a TYPE or a ``name{labels} value``
sample of a family whose TYPE came first.
"""

from __future__ import annotations

import math
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer

from tests.integration.raw_client import RawClient
from tests.waits import eventually
from trio_broker.config import BrokerConfig, ConfigError, load_config
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker
from trio_broker.server.metrics import MAX_CONNECTIONS, BadRequest, parse_request_head

TOPIC = "metrics-topic"
RECORDS = 50

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)"
SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? ({_VALUE})$")
HELP = re.compile(rf"^# HELP ({_NAME}) .*$")
TYPE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')

Key = tuple[str, frozenset[tuple[str, str]]]


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage="file", metrics_listener="127.0.0.1:0"
    )


def parse_exposition(text: str) -> dict[Key, float]:
    """Strict parse; returns {(name, labels): value}."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[Key, float] = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            m = HELP.match(line)
            assert m, line
            assert m.group(1) not in helps, f"second HELP for {m.group(1)}"
            helps.add(m.group(1))
            continue
        if line.startswith("# TYPE "):
            m = TYPE.match(line)
            assert m, line
            assert m.group(1) not in types, f"second TYPE for {m.group(1)}"
            types[m.group(1)] = m.group(2)
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels_text, value = m.groups()
        family = name
        if name not in types:
            for suffix in ("_bucket", "_sum", "_count"):
                base = name.removesuffix(suffix)
                if base != name and types.get(base) == "histogram":
                    family = base
        assert family in types, f"sample {name} without a TYPE before it"
        assert family in helps, f"sample {name} without a HELP"
        labels = frozenset(LABEL.findall(labels_text or ""))
        if types[family] == "histogram" and name.endswith("_bucket"):
            assert "le" in dict(labels), line
        key = (name, labels)
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = math.inf if value == "+Inf" else float(value)
    check_histograms(types, samples)
    return samples


def check_histograms(types: dict[str, str], samples: dict[Key, float]) -> None:
    """Buckets are cumulative, end with +Inf, and +Inf equals _count."""
    for family, kind in types.items():
        if kind != "histogram":
            continue
        series: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
        for (name, labels), value in samples.items():
            if name == family + "_bucket":
                rest = frozenset(kv for kv in labels if kv[0] != "le")
                le = dict(labels)["le"]
                series.setdefault(rest, []).append((float(le), value))
        for rest, buckets in series.items():
            bounds = [b for b, _ in buckets]
            counts = [c for _, c in buckets]
            assert bounds == sorted(bounds) and bounds[-1] == math.inf, family
            assert counts == sorted(counts), f"{family} buckets not cumulative"
            assert counts[-1] == samples[(family + "_count", rest)]
            assert (family + "_sum", rest) in samples


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def http_get(address: tuple[str, int], path: str) -> tuple[int, str, str]:
    url = f"http://{address[0]}:{address[1]}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


async def scrape(broker: Broker) -> dict[Key, float]:
    assert broker.metrics.bound is not None
    status, content_type, body = await trio.to_thread.run_sync(
        http_get, broker.metrics.bound, "/metrics"
    )
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return parse_exposition(body)


def produce(bootstrap: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i in range(count):
        producer.produce(TOPIC, key=b"k%d" % i, value=b"v" * 100, partition=0)
        producer.flush(10)  # one Produce request per record
    assert producer.flush(10) == 0


async def test_counters_move_consistently_during_produce(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, 1)
    before = await scrape(broker)
    assert value(before, "trio_broker_up") == 1
    assert value(before, "trio_broker_log_end_offset", topic=TOPIC, partition="0") == 0
    assert value(before, "trio_broker_partition_size_bytes", topic=TOPIC, partition="0") == 0
    for reason in ("response_pending", "in_flight_limit", "memory_pressure", "closing"):
        assert ("trio_broker_muted_connections", frozenset({("reason", reason)})) in before

    await trio.to_thread.run_sync(produce, bootstrap, RECORDS)
    after = await scrape(broker)

    produce_labels = {"api": "produce", "api_key": "0"}
    produced = value(after, "trio_broker_requests_total", **produce_labels) - value(
        before, "trio_broker_requests_total", **produce_labels
    )
    assert produced >= RECORDS  # one request per record (flush after each)
    assert value(after, "trio_broker_request_duration_seconds_count", **produce_labels) == value(
        after, "trio_broker_requests_total", **produce_labels
    )
    assert value(after, "trio_broker_request_duration_seconds_sum", **produce_labels) > 0
    # Every produce answered went through each stage once; acks=all waits for the fsync
    # after its handler returns, so the remote stage holds time; the total is the sum.
    answered = value(after, "trio_broker_request_total_seconds_count", **produce_labels)
    assert answered >= RECORDS
    stage_sums = {}
    for stage in ("queue", "local", "remote"):
        family = f"trio_broker_request_{stage}_seconds"
        assert value(after, family + "_count", **produce_labels) == answered, stage
        stage_sums[stage] = value(after, family + "_sum", **produce_labels)
    assert value(after, "trio_broker_response_send_seconds_count", **produce_labels) == answered
    stage_sums["send"] = value(after, "trio_broker_response_send_seconds_sum", **produce_labels)
    assert stage_sums["local"] > 0 and stage_sums["remote"] > 0
    total = value(after, "trio_broker_request_total_seconds_sum", **produce_labels)
    assert math.isclose(sum(stage_sums.values()), total, rel_tol=1e-6)
    assert value(after, "trio_broker_log_end_offset", topic=TOPIC, partition="0") == RECORDS
    assert value(after, "trio_broker_partition_size_bytes", topic=TOPIC, partition="0") >= (
        RECORDS * 100
    )
    assert broker.topics.get(TOPIC).logs[0].log_end_offset == RECORDS  # type: ignore[union-attr]

    for counter in (
        "trio_broker_connections_accepted_total",
        "trio_broker_responses_sent_total",
        "trio_broker_bytes_out_total",
    ):
        assert value(after, counter) > value(before, counter), counter
    # Every response is at least a 4-byte size prefix and a correlation id.
    assert value(after, "trio_broker_bytes_out_total") >= 8 * value(
        after, "trio_broker_responses_sent_total"
    )
    assert value(after, "trio_broker_responses_sent_total") >= produced
    # Per-API counts add up to what the handler queues took.
    per_api = sum(v for (n, _), v in after.items() if n == "trio_broker_requests_total")
    per_queue = sum(v for (n, _), v in after.items() if n == "trio_broker_handler_requests_total")
    assert per_api <= per_queue
    assert per_queue - per_api <= value(after, "trio_broker_connections_accepted_total")
    # acks=all on a file log: fsyncs happened and covered the appends.
    assert value(after, "trio_broker_fsyncs_total") >= 1
    assert value(after, "trio_broker_appends_per_fsync_sum") >= RECORDS
    assert value(after, "trio_broker_appends_per_fsync_count") == value(
        after, "trio_broker_fsyncs_total"
    )
    assert value(after, "trio_broker_memory_budget_peak_bytes") > 0
    assert value(after, "trio_broker_groups") == 0
    # Counters never go down.
    for (name, labels), old in before.items():
        if name.endswith("_total") and (name, labels) in after:
            assert after[(name, labels)] >= old, name


async def test_health(broker: Broker) -> None:
    assert broker.metrics.bound is not None
    status, _, body = await trio.to_thread.run_sync(http_get, broker.metrics.bound, "/health")
    assert (status, body) == (200, "ok")
    status, _, _ = await trio.to_thread.run_sync(http_get, broker.metrics.bound, "/nope")
    assert status == 404


def raw_exchange(address: tuple[str, int], payload: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):  # the server closes after answering
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x00\x00\x10garbage, not http\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX: \xff\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000,  # oversized, never ends
        b"GET /metr",  # then EOF
    ],
)
async def test_malformed_request_gets_400_and_close(broker: Broker, payload: bytes) -> None:
    assert broker.metrics.bound is not None
    answer = await trio.to_thread.run_sync(raw_exchange, broker.metrics.bound, payload)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:100]
    assert b"\r\nConnection: close\r\n" in answer


def closed_unanswered(address: tuple[str, int]) -> bool:
    """A GET /health whose connection the server closes without a byte of answer."""
    with socket.create_connection(address, timeout=10) as sock:
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            return sock.recv(65536) == b""
        except ConnectionResetError:
            return True


async def test_connections_beyond_the_cap_are_refused_at_once(broker: Broker) -> None:
    """A local process that opens connections without end gets 503 past the cap, and
    the listener serves again once they close: it cannot take every descriptor."""
    assert broker.metrics.bound is not None
    idle = [socket.create_connection(broker.metrics.bound) for _ in range(MAX_CONNECTIONS)]
    try:
        await eventually(lambda: broker.metrics.connections >= MAX_CONNECTIONS, "every slot taken")
        refused = await trio.to_thread.run_sync(closed_unanswered, broker.metrics.bound)
        assert refused
        assert broker.metrics.refused == 1
    finally:
        for sock in idle:
            sock.close()
    await eventually(lambda: not broker.metrics.connections, "the idle connections to go")
    status, _, body = await trio.to_thread.run_sync(http_get, broker.metrics.bound, "/health")
    assert (status, body) == (200, "ok")


async def test_post_is_not_allowed(broker: Broker) -> None:
    assert broker.metrics.bound is not None
    answer = await trio.to_thread.run_sync(
        raw_exchange, broker.metrics.bound, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 405 ")


def test_parse_request_head() -> None:
    assert parse_request_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a:1") == ("GET", "/metrics")
    with pytest.raises(BadRequest):
        parse_request_head(b"GET  /metrics HTTP/1.1")


def test_config_key_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[metrics]\nlistener = "127.0.0.1:0"\n')
    assert load_config(path).metrics_listener == "127.0.0.1:0"
    assert load_config().metrics_listener is None
    with pytest.raises(ConfigError, match=r"metrics\.listener"):
        load_config(metrics_listener="nohost")


async def test_a_long_poll_shows_in_the_fetch_purgatory_metrics(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(TOPIC, 3)
    Req = m.FetchRequest
    parts = [
        Req.FetchTopic.FetchPartition(
            partition=p, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
        )
        for p in range(3)
    ]
    request = Req(replica_id=-1, max_wait_ms=20_000, min_bytes=1, max_bytes=1 << 20,
                  isolation_level=0, session_id=0, session_epoch=-1,
                  topics=[Req.FetchTopic(topic=TOPIC, partitions=parts)],
                  forgotten_topics_data=[], rack_id="")  # fmt: skip
    answers: list[m.FetchResponse] = []
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream, trio.open_nursery() as nursery:

        async def long_poll() -> None:
            answers.append(await RawClient(stream).call(m.ApiKey.FETCH, 12, request))

        nursery.start_soon(long_poll)
        with trio.fail_after(10):  # scraped over HTTP until the fetch shows as waiting
            while value(waiting := await scrape(broker), "trio_broker_fetch_waiting") != 1:  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert value(waiting, "trio_broker_fetch_waiting_partitions") == 3
        assert value(waiting, "trio_broker_fetch_waits_total") == 1
        assert value(waiting, "trio_broker_fetch_wakeups_total") == 0
        await trio.to_thread.run_sync(produce, bootstrap, 1)  # to partition 0
        with trio.fail_after(10):
            while not answers:  # noqa: ASYNC110
                await trio.sleep(0.01)
    after = await scrape(broker)
    assert value(after, "trio_broker_fetch_waiting") == 0
    assert value(after, "trio_broker_fetch_waiting_partitions") == 0
    assert value(after, "trio_broker_fetch_partition_changes_total") >= 1
    # Woken by partition 0 alone: by its append and by its sync (a node alone's high
    # watermark is its durable end), one look or two, each at one changed partition.
    wakeups = value(after, "trio_broker_fetch_wakeups_total")
    assert wakeups in (1, 2)
    assert value(after, "trio_broker_fetch_wakeup_partitions_bucket", le="1") == wakeups
    assert value(after, "trio_broker_fetch_wakeup_partitions_count") == wakeups
    assert value(after, "trio_broker_fetch_wakeup_partitions_sum") == wakeups
    assert answers[0].responses[0].partitions[0].records


async def test_a_page_that_fails_answers_500_and_the_broker_serves_on(
    broker: Broker, bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug behind one page (here: /metrics cannot render) is that request's 500,
    not the end of the metrics listener's nursery and with it the broker's."""
    import trio_broker.server.metrics as metrics_module

    def broken(_broker: object) -> bytes:
        raise ValueError("a metric that cannot render")

    monkeypatch.setattr(metrics_module, "render_metrics", broken)
    assert broker.metrics.bound is not None
    status, _, _ = await trio.to_thread.run_sync(http_get, broker.metrics.bound, "/metrics")
    assert status == 500
    status, _, body = await trio.to_thread.run_sync(http_get, broker.metrics.bound, "/health")
    assert (status, body) == (200, "ok")
    host, port = bootstrap.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        answer = await RawClient(stream).call(m.ApiKey.METADATA, 9, m.MetadataRequest(topics=[]))
    assert answer.brokers, answer
