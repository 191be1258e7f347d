"""End-to-end fixtures: a real ``trio-broker serve`` process on an ephemeral port.

``broker_process`` (one broker per test) and ``shared_broker_process`` (one per
module) start the broker CLI as a subprocess with a temporary data dir, wait
(bounded) for its ``listening on HOST:PORT`` line and yield a
:class:`BrokerProcess`. Both are parametrizable indirectly with a
``(processing_model, storage)`` pair, e.g.::

    @pytest.mark.parametrize("broker_process", [("serial", "memory")], indirect=True)

At teardown the broker gets SIGTERM and must exit with code 0 within
``STOP_TIMEOUT_S``; one that hangs is killed (by its PID) and the test fails.
A thread drains the broker's stderr into a log file so the pipe never blocks;
when a test fails, the tail of that log is attached to the report.

:class:`RawConnection` is a small blocking client on our own codec for tests
that speak the wire protocol directly (hostile input, pipelining, checks of
what the broker stored).
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.broker_fork import ForkedProcess, start_broker
from tests.ports import restartable_port
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import iter_batches

#: Bounded waits (seconds).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
SOCKET_TIMEOUT_S = 30.0

BROKER_EXE = Path(sys.executable).with_name("trio-broker")


def add_scram_user(
    data_dir: Path,
    user: str,
    password: str,
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512"),
) -> None:
    """``trio-broker users add`` for each mechanism, before the broker starts."""
    for mechanism in mechanisms:
        subprocess.run(
            [
                str(BROKER_EXE),
                "users",
                "add",
                "--data-dir",
                str(data_dir),
                "--user",
                user,
                "--password",
                password,
                "--mechanism",
                mechanism,
            ],
            check=True,
            timeout=60,
            capture_output=True,
        )


LISTENING = re.compile(r"listening on (\S+):(\d+)")
METRICS_LINE = re.compile(r"metrics on 127\.0\.0\.1:(\d+)")
DEFAULT_PARAMS = ("pipelined", "file")
LOG_TAIL_LINES = 60

_SIZE = struct.Struct(">i")


# --------------------------------------------------------------------------- raw client


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset)."""


class RawConnection:
    """A blocking Kafka wire-protocol client built on trio_broker's codec."""

    #: Raised by the receive methods when the broker closes the connection.
    Closed = ConnectionClosed

    def __init__(self, port: int, timeout: float = SOCKET_TIMEOUT_S) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation = 0

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_request(
        self, api_key: int, version: int, body: Any, correlation_id: int | None = None
    ) -> int:
        cid = self.next_correlation_id() if correlation_id is None else correlation_id
        self.send(m.encode_request(api_key, version, cid, "e2e-raw", body))
        return cid

    def _recv_exact(self, size: int) -> bytes:
        chunks, have = [], 0
        while have < size:
            try:
                chunk = self.sock.recv(min(size - have, 1 << 20))
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise ConnectionClosed(str(exc)) from None
            if not chunk:
                raise ConnectionClosed("EOF")
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        """One response frame without its size prefix; ConnectionClosed at EOF/reset."""
        (size,) = _SIZE.unpack(self._recv_exact(4))
        assert 4 <= size <= 1 << 30, f"implausible response size {size}"
        return self._recv_exact(size)

    def recv_response(self, api_key: int, version: int) -> tuple[int, Any]:
        return m.decode_response(api_key, version, self.recv_frame())

    def request(self, api_key: int, version: int, body: Any) -> Any:
        cid = self.send_request(api_key, version, body)
        got, response = self.recv_response(api_key, version)
        assert got == cid, f"correlation id {got}, expected {cid}"
        return response

    def closed_by_peer(self, timeout: float = SOCKET_TIMEOUT_S) -> bool:
        """Read until the broker closes; True if it did within ``timeout`` with no data sent."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        assert data == b"", f"expected a disconnect, got {len(data)} bytes: {data[:64]!r}"
        return True

    # -- convenience requests ------------------------------------------------

    def metadata(self, topics: list[str] | None = None, version: int = 4) -> Any:
        wanted = (
            None
            if topics is None
            else [m.MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        )
        body = m.MetadataRequest(topics=wanted, allow_auto_topic_creation=True)
        return self.request(m.ApiKey.METADATA, version, body)

    @staticmethod
    def produce_body(
        topic: str, batch: bytes, acks: int = -1, topic_id: uuid.UUID | None = None,
        transactional_id: str | None = None,
    ) -> Any:  # fmt: skip
        """A ProduceRequest for one partition (name, or topic id for v13+)."""
        Topic = m.ProduceRequest.TopicProduceData
        data = [Topic.PartitionProduceData(index=0, records=bytes(batch))]
        topic_data = Topic(name=topic, partition_data=data)
        if topic_id is not None:
            topic_data.topic_id = topic_id
        return m.ProduceRequest(
            transactional_id=transactional_id, acks=acks, timeout_ms=10_000,
            topic_data=[topic_data],
        )  # fmt: skip

    def produce(
        self, topic: str, batch: bytes, version: int = 9, acks: int = -1,
        transactional_id: str | None = None,
    ) -> Any:  # fmt: skip
        """Send one batch to partition 0; returns the partition's response."""
        body = self.produce_body(topic, batch, acks, transactional_id=transactional_id)
        response = self.request(m.ApiKey.PRODUCE, version, body)
        return response.responses[0].partition_responses[0]

    def create_topic(self, topic: str, configs: dict[str, str] | None = None) -> None:
        """CreateTopics v4 of one partition, replication factor 1; asserts it worked."""
        Req = m.CreateTopicsRequest
        Config = Req.CreatableTopic.CreatableTopicConfig
        listed = [Config(name=k, value=v) for k, v in (configs or {}).items()]
        wanted = Req.CreatableTopic(name=topic, num_partitions=1, replication_factor=1,
                                    assignments=[], configs=listed)  # fmt: skip
        body = Req(topics=[wanted], timeout_ms=10_000, validate_only=False)
        result = self.request(m.ApiKey.CREATE_TOPICS, 4, body).topics[0]
        assert result.error_code == 0, result

    def init_producer_id(self, transactional_id: str) -> tuple[int, int, int]:
        """InitProducerId v4 for a transactional id: (error code, producer id, epoch)."""
        body = m.InitProducerIdRequest(transactional_id=transactional_id,
                                       transaction_timeout_ms=60_000,
                                       producer_id=-1, producer_epoch=-1)  # fmt: skip
        r = self.request(m.ApiKey.INIT_PRODUCER_ID, 4, body)
        return int(r.error_code), int(r.producer_id), int(r.producer_epoch)

    def add_partition_to_txn(
        self, transactional_id: str, producer_id: int, epoch: int, topic: str
    ) -> int:
        """AddPartitionsToTxn v3 of partition 0 of ``topic``: its error code."""
        Req = m.AddPartitionsToTxnRequest
        body = Req(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[Req.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
        )  # fmt: skip
        response = self.request(m.ApiKey.ADD_PARTITIONS_TO_TXN, 3, body)
        [topic_result] = response.results_by_topic_v3_and_below
        return int(topic_result.results_by_partition[0].partition_error_code)

    def topic_id(self, topic: str) -> uuid.UUID:
        (meta,) = self.metadata([topic], version=12).topics
        assert meta.error_code == 0, f"Metadata error {meta.error_code} for {topic}"
        return meta.topic_id

    def end_offset(self, topic: str, partition: int = 0) -> int:
        body = m.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                m.ListOffsetsRequest.ListOffsetsTopic(
                    name=topic,
                    partitions=[
                        m.ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=partition, timestamp=-1
                        )
                    ],
                )
            ],
        )
        response = self.request(m.ApiKey.LIST_OFFSETS, 1, body)
        part = response.topics[0].partitions[0]
        assert part.error_code == 0, f"ListOffsets error {part.error_code}"
        return int(part.offset)

    def fetch_batches(self, topic: str, partition: int = 0, max_rounds: int = 1000) -> list[Any]:
        """Every record batch of a partition (headers only need reading), via Fetch v4."""
        end = self.end_offset(topic, partition)
        batches: list[Any] = []
        offset = 0
        for _ in range(max_rounds):
            if offset >= end:
                return batches
            body = m.FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=64 << 20,
                isolation_level=0,
                topics=[
                    m.FetchRequest.FetchTopic(
                        topic=topic,
                        partitions=[
                            m.FetchRequest.FetchTopic.FetchPartition(
                                partition=partition,
                                fetch_offset=offset,
                                partition_max_bytes=64 << 20,
                            )
                        ],
                    )
                ],
            )
            response = self.request(m.ApiKey.FETCH, 4, body)
            part = response.responses[0].partitions[0]
            assert part.error_code == 0, f"Fetch error {part.error_code}"
            records = bytes(part.records or b"")
            got = [b for b in iter_batches(records) if b.last_offset >= offset]
            assert got, f"Fetch at offset {offset} (end {end}) returned no whole batch"
            batches.extend(got)
            offset = got[-1].next_offset
        raise AssertionError(f"fetching {topic} did not finish in {max_rounds} rounds")


# --------------------------------------------------------------------------- the process


class BrokerProcess:
    """A ``trio-broker serve`` subprocess; keeps its port and data dir across restarts."""

    def __init__(
        self, data_dir: Path, processing_model: str, storage: str, *, properties: str = ""
    ) -> None:
        """``properties``: server.properties lines, written beside the data dir and
        passed with ``--config``."""
        self.data_dir = data_dir
        self.processing_model = processing_model
        self.storage = storage
        self.properties_path: Path | None = None
        if properties:
            self.properties_path = data_dir.parent / f"{data_dir.name}-server.properties"
            self.properties_path.parent.mkdir(parents=True, exist_ok=True)
            self.properties_path.write_text(properties)
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.starts = 0
        #: True between stop()/kill9() and start(): the broker is down on purpose.
        self.down_on_purpose = False
        self._drainer: threading.Thread | None = None
        self._log_lock = threading.Lock()
        #: The process sent SIGTERM by :meth:`terminate`.
        self._terminated: subprocess.Popen[bytes] | ForkedProcess | None = None
        #: Set by the stderr drainer at ``listening on`` (the port in ``_found``) or EOF.
        self._listening = threading.Event()
        self._found: list[int] = []

    def __repr__(self) -> str:
        return f"<BrokerProcess {self.bootstrap} {self.processing_model}/{self.storage}>"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- lifecycle -----------------------------------------------------------

    def command_line(self) -> list[str]:
        """The ``trio-broker serve`` argv; subclasses add flags."""
        config = [] if self.properties_path is None else ["--config", str(self.properties_path)]
        return [
            str(BROKER_EXE), "serve", "--listen", f"127.0.0.1:{self.port}",
            "--data-dir", str(self.data_dir), "--storage", self.storage,
            "--processing-model", self.processing_model, *config,
        ]  # fmt: skip

    def start(self, *, ready_check: bool = True) -> None:
        """Start on ``self.port`` (0 the first time) and wait for ``listening on``.

        With ``ready_check`` it then waits for one ApiVersions answer, so that the
        broker is past its start-up (signal handlers included) when this returns.
        """
        self.launch()
        self.wait_started(ready_check=ready_check)

    def launch(self) -> None:
        """The first half of :meth:`start`: the process runs, nothing waited for yet
        (:func:`start_all` launches several, then waits for each)."""
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        if self.port == 0:  # a port its restarts will find free (tests/ports.py)
            self.port = restartable_port()
        self.starts += 1
        self.down_on_purpose = False
        self._log(f"===== e2e: start #{self.starts} on port {self.port} =====\n")
        # Forked from a parent that imported the broker already (tests/broker_fork.py):
        # in its own session (a Ctrl-C at the terminal is not meant for it), and it does
        # not outlive a killed pytest.
        proc = start_broker(self.command_line())
        self.proc = proc
        self._listening = threading.Event()
        self._found: list[int] = []
        self._drainer = threading.Thread(
            target=self._drain,
            args=(proc, self._listening, self._found),
            name="broker-stderr",
            daemon=True,
        )
        self._drainer.start()

    def wait_started(self, *, ready_check: bool = True) -> None:
        """The second half of :meth:`start`, after :meth:`launch`."""
        proc, found = self.proc, self._found
        assert proc is not None, "broker was never launched"
        try:
            if not self._listening.wait(START_TIMEOUT_S) or not found:
                raise AssertionError(
                    f"broker did not log 'listening on' within {START_TIMEOUT_S}s "
                    f"(exit code {proc.poll()})\n{self.log_tail()}"
                )
            if self.starts == 1:  # a config's own listeners may name another port
                self.port = found[0]
            assert found[0] == self.port, f"restarted on port {found[0]}, wanted {self.port}"
            if ready_check:
                with self.connect() as conn:
                    answer = conn.request(m.ApiKey.API_VERSIONS, 0, m.ApiVersionsRequest())
                assert answer.error_code == 0, answer
        except BaseException:
            self._kill_hard()  # never leave a half-started broker behind
            raise

    def _drain(
        self,
        proc: subprocess.Popen[bytes] | ForkedProcess,
        listening: threading.Event,
        found: list[int],
    ) -> None:
        assert proc.stderr is not None
        with open(self.log_path, "ab") as out:
            for raw in iter(proc.stderr.readline, b""):
                with self._log_lock:
                    out.write(raw)
                    out.flush()
                if not listening.is_set():
                    match = LISTENING.search(raw.decode(errors="replace"))
                    if match:
                        found.append(int(match.group(2)))
                        listening.set()
        proc.stderr.close()
        listening.set()  # EOF: the process is gone; start() checks ``found``

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait; returns the exit code. A hang is killed and fails the test."""
        proc = self.proc
        assert proc is not None, "broker was never started"
        self.down_on_purpose = True
        if proc.poll() is None:
            if self._terminated is not proc:
                self.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_hard()
                pytest.fail(
                    f"broker pid {proc.pid} ignored SIGTERM for {timeout}s; killed\n"
                    f"{self.log_tail()}"
                )
            except BaseException:  # an interrupted wait (Ctrl-C, a test timeout)
                self._kill_hard()
                raise
        self._join_drainer()
        return proc.returncode

    def terminate(self) -> None:
        """SIGTERM without waiting (:meth:`stop` waits, and sends none again)."""
        proc = self.proc
        assert proc is not None, "broker was never started"
        self.down_on_purpose = True
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            self._terminated = proc

    def restart(self) -> None:
        """Graceful stop (exit code 0 required), then start on the same port and data dir."""
        code = self.stop()
        assert code == 0, f"broker exited with {code} on SIGTERM\n{self.log_tail()}"
        self.start()

    def kill9(self) -> None:
        """SIGKILL (by PID) and reap; call :meth:`start` to bring it back."""
        assert self.proc is not None and self.proc.poll() is None, "broker is not running"
        self._log("===== e2e: kill -9 =====\n")
        self._kill_hard()
        self.down_on_purpose = True

    def _kill_hard(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
        self._join_drainer()

    def _join_drainer(self) -> None:
        if self._drainer is not None:
            self._drainer.join(5.0)
            self._drainer = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- diagnostics -----------------------------------------------------------

    def _log(self, text: str) -> None:
        with self._log_lock, open(self.log_path, "ab") as out:
            out.write(text.encode())

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def current_log(self) -> str:
        """The log since the last start (each start is marked in it)."""
        return self.log_text().rsplit("===== e2e: start #", 1)[-1]

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of the running process's /metrics (0 when the family has no such
        sample); the broker must serve them (``--metrics-listen``, ``metrics.listener``)."""
        wanted = f"{name}{{{labels}}}" if labels else name
        return sum(value for sample, value in self._samples() if sample == wanted)

    def metric_sum(self, name: str) -> float:
        """The sum of a family's samples, whatever their labels."""
        return sum(value for sample, value in self._samples() if sample.split("{")[0] == name)

    def _samples(self) -> list[tuple[str, float]]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port := METRICS_LINE.findall(self.current_log())):
            assert time.monotonic() < deadline, f"no metrics listener\n{self.log_tail()}"
            time.sleep(0.05)  # polling its log, bounded by the deadline
        url = f"http://127.0.0.1:{port[-1]}/metrics"
        with urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_S) as page:
            text = page.read().decode()
        lines = (
            line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
        )
        return [(sample, float(value)) for sample, value in lines]

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- broker log tail ({self.log_path}) ---\n" + "\n".join(tail)

    # -- clients ---------------------------------------------------------------

    def connect(self, timeout: float = SOCKET_TIMEOUT_S) -> RawConnection:
        return RawConnection(self.port, timeout)

    def assert_serving(self) -> None:
        """A well-behaved client on a new connection gets Metadata answered."""
        assert self.running, (
            f"broker exited with {self.proc and self.proc.poll()}\n{self.log_tail()}"
        )
        with self.connect() as conn:
            response = conn.metadata(topics=None)
        assert response.brokers and response.brokers[0].port == self.port, response


def start_all(brokers: Iterable[BrokerProcess]) -> None:
    """Start several brokers side by side: each is launched, then each waited for (as
    :meth:`BrokerProcess.start`). Their start-ups (mostly the interpreter's imports)
    overlap, where one after another they add up. A failure stops every one of them."""
    launched: list[BrokerProcess] = []
    try:
        for broker in brokers:
            broker.launch()
            launched.append(broker)
        for broker in launched:
            broker.wait_started()
    except BaseException:
        for broker in launched:
            if broker.running:
                broker._kill_hard()
        raise


def stop_all(brokers: Iterable[BrokerProcess]) -> None:
    """Stop every running broker (continued if paused; SIGTERM, a hang killed), even when
    stopping one fails; then raise the first failure. A loop of ``stop()`` calls leaves the rest running when
    one raises. Every broker hears SIGTERM first, then each is waited for: they stop side
    by side."""
    errors: list[BaseException] = []
    running = [broker for broker in brokers if broker.running]
    for broker in running:
        try:
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGCONT)  # a paused one must hear SIGTERM
            broker.terminate()
        except BaseException as exc:
            errors.append(exc)
    for broker in running:
        try:
            broker.stop()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _params(request: pytest.FixtureRequest) -> tuple[str, str]:
    param = getattr(request, "param", DEFAULT_PARAMS)
    model, storage = param
    assert model in ("serial", "pipelined") and storage in ("file", "memory"), param
    return model, storage


_Broker = TypeVar("_Broker", bound=BrokerProcess)


@contextlib.contextmanager
def _running_broker(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[BrokerProcess]:
    model, storage = _params(request)
    with running_broker(data_dir, model, storage) as broker:
        yield broker


@contextlib.contextmanager
def running_broker(
    data_dir: Path,
    model: str = "pipelined",
    storage: str = "file",
    kind: type[_Broker] = BrokerProcess,  # type: ignore[assignment]
    *,
    properties: str = "",
) -> Iterator[_Broker]:
    """A started broker process, stopped afterwards; the test fails if it exits non-zero
    on SIGTERM or died by itself (unless the test brought it down on purpose).
    ``properties``: server.properties lines it is started with (``--config``)."""
    broker = kind(data_dir, model, storage, properties=properties)
    broker.start()
    try:
        yield broker
    finally:
        if broker.running:
            code = broker.stop()
            if code != 0:
                pytest.fail(f"broker exited with {code} on SIGTERM\n{broker.log_tail()}")
        elif not broker.down_on_purpose and broker.proc is not None:
            broker._join_drainer()
            pytest.fail(
                f"broker died by itself (exit code {broker.proc.returncode})\n{broker.log_tail()}"
            )


@pytest.fixture
def broker_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    with _running_broker(request, tmp_path / "data") as broker:
        yield broker


@pytest.fixture(scope="module")
def shared_broker_process(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    with _running_broker(request, tmp_path_factory.mktemp("broker") / "data") as broker:
        yield broker


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        try:
            for value in funcargs.values():
                if isinstance(value, BrokerProcess):
                    report.sections.append((f"broker log {value!r}", value.log_tail()))
        except Exception as exc:  # an extra of the report must not end the whole run
            report.sections.append(("broker logs", f"not collected: {exc!r}"))
    return report
