"""Capture request frames from real Kafka clients as golden files.

A tiny fake broker (plain blocking sockets, one thread per connection, on
127.0.0.1 with an ephemeral port) records every request frame it receives.
With ``answer=True`` it answers, using our own codec, just enough for a
producer to get going: ApiVersions (our schema ranges), Metadata (one broker:
itself; every topic has one partition led by it), InitProducerId and Produce.
Each client runs in a subprocess of this script (``--client NAME --bootstrap
HOST:PORT``) so that a client that hangs or retries can simply be killed.

Run ``.venv/bin/python tools/capture_golden.py`` to (re)write
``tests/golden/<client>-<api>-v<version>.bin`` (the first frame each client sent
for each API, size prefix included) and the matching fuzz seeds in
``fuzz/corpus/`` (the same frames without the size prefix).
``tests/unit/protocol/test_codec_golden.py`` imports this file for its live tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trio_broker.protocol import messages  # noqa: E402
from trio_broker.protocol.error_codes import ErrorCode  # noqa: E402
from trio_broker.protocol.framing import FrameReader, frame_size_prefix  # noqa: E402
from trio_broker.protocol.schema import REQUESTS, RESPONSES  # noqa: E402

GOLDEN_DIR = ROOT / "tests" / "golden"
CORPUS_DIR = ROOT / "fuzz" / "corpus"

TOPIC = "golden"
TOPIC_ID = uuid.UUID("00000000-0000-4000-8000-00000000601d")
#: A fixed record timestamp, so that captured batches do not depend on the clock.
TIMESTAMP_MS = 1_700_000_000_000
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
CLIENT_IDS = {name: f"golden-{name}" for name in CLIENTS}

ANSWERED = {
    messages.ApiKey.API_VERSIONS,
    messages.ApiKey.METADATA,
    messages.ApiKey.INIT_PRODUCER_ID,
    messages.ApiKey.PRODUCE,
}


class Captured:
    """One request frame as it came off the wire (size prefix included)."""

    __slots__ = ("api_key", "api_version", "connection", "wire")

    def __init__(self, connection: int, wire: bytes) -> None:
        self.connection = connection
        self.wire = wire
        self.api_key, self.api_version, _ = messages.peek_request_ids(wire[4:])

    def __repr__(self) -> str:
        name = messages.API_NAMES.get(self.api_key, str(self.api_key))
        return f"Captured(conn {self.connection}, {name} v{self.api_version}, {len(self.wire)} B)"


class FakeBroker:
    """Records request frames; optionally answers enough for a producer."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.frames: list[Captured] = []
        self.errors: list[BaseException] = []
        self._cond = threading.Condition()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._closed = False
        self._next_offset = 0
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()

    def wait_for(self, predicate: Callable[[list[Captured]], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.frames), timeout)

    def first(self, api_key: int) -> Captured | None:
        return next((f for f in self.frames if f.api_key == api_key), None)

    # -- connection handling

    def _accept_loop(self) -> None:
        index = 0
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()
            index += 1

    def _serve(self, conn: socket.socket, index: int) -> None:
        reader = FrameReader()
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                reader.feed(data)
                while (frame := reader.next_frame()) is not None:
                    wire = frame_size_prefix(len(frame)) + bytes(frame)
                    with self._cond:
                        self.frames.append(Captured(index, wire))
                        self._cond.notify_all()
                    if self.answer:
                        for part in self._respond(bytes(frame)):
                            conn.sendall(part)
        except OSError:
            return
        except Exception as exc:  # a bug in the fake broker: keep it for the test to see
            self.errors.append(exc)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _respond(self, frame: bytes) -> list[Any]:
        api_key, version, corr = messages.peek_request_ids(frame)
        if api_key == messages.ApiKey.API_VERSIONS:
            schema = REQUESTS[api_key]
            if not schema.min_version <= version <= schema.max_version:
                return messages.encode_response(
                    api_key, 0, corr, api_versions_body(ErrorCode.UNSUPPORTED_VERSION)
                )
            return messages.encode_response(api_key, version, corr, api_versions_body())
        if api_key not in ANSWERED:
            return []
        request: Any = messages.decode_request(frame)[1]
        body: Any
        if api_key == messages.ApiKey.METADATA:
            body = self._metadata(request)
        elif api_key == messages.ApiKey.INIT_PRODUCER_ID:
            body = response_class(api_key)(error_code=0, producer_id=4242, producer_epoch=0)
        else:
            if request.acks == 0:
                return []
            body = self._produce(request)
        return messages.encode_response(api_key, version, corr, body)

    def _metadata(self, request: Any) -> Any:
        cls = response_class(messages.ApiKey.METADATA)
        names = [t.name or TOPIC for t in request.topics or []] or [TOPIC]
        partition = cls.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0, partition_index=0, leader_id=0, leader_epoch=0,
            replica_nodes=[0], isr_nodes=[0], offline_replicas=[],
        )  # fmt: skip
        return cls(
            brokers=[cls.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=self.port)],
            cluster_id="golden-cluster",
            controller_id=0,
            topics=[
                cls.MetadataResponseTopic(
                    error_code=0, name=name, topic_id=TOPIC_ID, partitions=[partition]
                )
                for name in names
            ],
        )

    def _produce(self, request: Any) -> Any:
        cls = response_class(messages.ApiKey.PRODUCE)
        T = cls.TopicProduceResponse
        P = T.PartitionProduceResponse
        responses = []
        for topic in request.topic_data:
            parts = []
            for p in topic.partition_data:
                parts.append(P(index=p.index, error_code=0, base_offset=self._next_offset))
                self._next_offset += 1
            responses.append(T(name=topic.name, topic_id=topic.topic_id, partition_responses=parts))
        return cls(responses=responses)


def response_class(api_key: int) -> Any:
    """A generated response class (typed Any: its fields come from the schema table)."""
    return RESPONSES[api_key].cls


def api_versions_body(error: int = 0) -> Any:
    cls = response_class(messages.ApiKey.API_VERSIONS)
    keys = [
        cls.ApiVersion(api_key=k, min_version=s.min_version, max_version=s.max_version)
        for k, s in sorted(REQUESTS.items())
    ]
    if error:  # only our own range, as Kafka does
        keys = [k for k in keys if k.api_key == messages.ApiKey.API_VERSIONS]
    return cls(error_code=error, api_keys=keys)


# --------------------------------------------------------------------------- clients
# Each runs inside a subprocess: ``capture_golden.py --client NAME --bootstrap ...``.


def run_confluent(bootstrap: str, produce: bool) -> None:
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "client.id": CLIENT_IDS["confluent-kafka"],
        "socket.timeout.ms": 3000,
        "message.timeout.ms": 5000,
        "linger.ms": 0,
        "enable.idempotence": False,
        "compression.type": "none",
    })  # fmt: skip
    if produce:
        producer.produce(TOPIC, value=b"golden-value", key=b"golden-key", timestamp=TIMESTAMP_MS)
        remaining = producer.flush(8)
        if remaining:
            raise SystemExit(f"confluent-kafka: {remaining} message(s) not delivered")
    else:
        producer.poll(8)


def run_kafka_python(bootstrap: str, produce: bool) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_IDS["kafka-python"],
        request_timeout_ms=5000,
        max_block_ms=5000,
        linger_ms=0,
        enable_idempotence=False,
    )
    if produce:
        producer.send(
            TOPIC, value=b"golden-value", key=b"golden-key", timestamp_ms=TIMESTAMP_MS
        ).get(timeout=8)
    producer.close(timeout=2)


def run_aiokafka(bootstrap: str, produce: bool) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def go() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=CLIENT_IDS["aiokafka"],
            request_timeout_ms=5000,
            linger_ms=0,
        )
        await producer.start()
        try:
            if produce:
                await producer.send_and_wait(
                    TOPIC, value=b"golden-value", key=b"golden-key", timestamp_ms=TIMESTAMP_MS
                )
        finally:
            await producer.stop()

    asyncio.run(go())


RUNNERS: dict[str, Callable[[str, bool], None]] = {
    "confluent-kafka": run_confluent,
    "kafka-python": run_kafka_python,
    "aiokafka": run_aiokafka,
}


@contextlib.contextmanager
def client_process(client: str, bootstrap: str, produce: bool) -> Iterator[subprocess.Popen]:
    """Run a client in a subprocess; kill it on exit if it is still running."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--client", client]
    cmd += ["--bootstrap", bootstrap] + (["--produce"] if produce else [])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(ROOT)
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def capture_first_frame(client: str, timeout: float = 20.0) -> Captured:
    """The very first request a client sends (the broker never answers)."""
    with FakeBroker(answer=False) as broker, client_process(client, broker.bootstrap, False):
        if not broker.wait_for(bool, timeout):
            raise TimeoutError(f"{client} sent nothing in {timeout} s")
        return broker.frames[0]


def capture_session(client: str, timeout: float = 30.0) -> list[Captured]:
    """Every request of a client that connects, learns metadata and produces one record."""
    with FakeBroker(answer=True) as broker:
        with client_process(client, broker.bootstrap, True) as proc:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            stderr = ""
            if proc.poll() is not None and proc.stderr is not None:
                stderr = proc.stderr.read().decode(errors="replace")
            if proc.returncode not in (0, None):
                raise RuntimeError(f"{client} failed: {stderr[-2000:]}")
        if broker.errors:
            raise broker.errors[0]
        return list(broker.frames)


def golden_name(client: str, frame: Captured) -> str:
    api = messages.API_NAMES[frame.api_key].lower()
    return f"{client}-{api}-v{frame.api_version}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=CLIENTS, help="(internal) run one client")
    parser.add_argument("--bootstrap", help="(internal) broker address for --client")
    parser.add_argument("--produce", action="store_true", help="(internal) produce one record")
    parser.add_argument("--only", choices=CLIENTS, action="append", help="capture these clients")
    args = parser.parse_args()
    if args.client:
        RUNNERS[args.client](args.bootstrap, args.produce)
        return

    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    CORPUS_DIR.mkdir(parents=True, exist_ok=True)
    for client in args.only or CLIENTS:
        frames = capture_session(client)
        seen: set[int] = set()
        for frame in frames:
            if frame.api_key in seen:
                continue
            seen.add(frame.api_key)
            name = golden_name(client, frame)
            (GOLDEN_DIR / f"{name}.bin").write_bytes(frame.wire)
            (CORPUS_DIR / f"golden-{name}").write_bytes(frame.wire[4:])
            print(f"{name}.bin: {len(frame.wire)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
