"""The ``trio_broker`` pytest plugin: a real Kafka-compatible broker for a test suite.

Registered under the ``pytest11`` entry point, so installing trio-broker makes these
fixtures available to every suite (docs/pytest-plugin.md):

- ``kafka_broker`` (session): a ``trio-broker serve`` subprocess on 127.0.0.1 and a free
  port; ``.bootstrap`` is "HOST:PORT". Storage in memory, or on disk with
  ``--kafka-broker-storage=disk`` (ini ``kafka_broker_storage``).
- ``kafka_topic_factory`` / ``kafka_topic``: fresh uniquely named topics on it, created
  (and deleted after the test) with the broker's own admin client.
- ``kafka_cluster`` (session): ``trio-broker cluster up`` (ZooKeeper and N brokers), with
  ``stop_broker``/``kill_broker``/``restart_broker`` for failover tests; skipped when
  ZooKeeper is not installed.

The broker is a subprocess, not a Trio run in a thread of the test process: the user's
tests keep their own event loops, signal handlers and GIL to themselves, and a broker
crash cannot take the test process with it. pytest imports this module in every run
of every suite where trio-broker is installed, so it imports only the standard library
and pytest here; the broker's own modules are imported by the fixtures that need them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

__all__ = ["KafkaBroker", "KafkaCluster"]

#: Bounded waits (seconds), generous: CI machines are busy (at load 16 a broker took over
#: 30 s to print "listening on"; docs/testing-waits.md gives a start at least 60 s).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
CLUSTER_START_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 60

#: The fixtures learn a broker's port from its INFO line "listening on": no quieter level.
LOG_LEVELS = ("INFO", "DEBUG")
LISTENING = re.compile(rb"listening on (\S+):(\d+)")
CLUSTER_READY = re.compile(rb"cluster ready: bootstrap (\S+)")
STATUS_LINE = re.compile(r"broker (\d+): (.+?) pid (\S+) on (\S+),")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trio_broker", "trio-broker (the kafka_broker fixture)")
    group.addoption(
        "--kafka-broker-storage",
        choices=["memory", "disk"],
        default=None,
        help="where kafka_broker keeps its logs: memory (default) or disk (a temp dir)",
    )
    group.addoption(
        "--kafka-broker-log-level",
        choices=LOG_LEVELS,
        default=None,
        help="logging level of the kafka_broker/kafka_cluster brokers (default INFO)",
    )
    parser.addini(
        "kafka_broker_storage", "kafka_broker storage: memory (default) or disk", default="memory"
    )
    parser.addini(
        "kafka_broker_log_level", "kafka_broker logging level: INFO or DEBUG", default="INFO"
    )
    parser.addini("kafka_cluster_brokers", "brokers in kafka_cluster (default 3)", default="3")
    parser.addini(
        "kafka_cluster_broker_config",
        "KEY=VALUE lines: broker config of kafka_cluster (cluster up --broker-config)",
        type="linelist",
        default=[],
    )


# ----------------------------------------------------------------------------- processes


def _broker_command() -> list[str]:
    """``trio-broker`` beside this interpreter (a venv's script), else ``python -m``."""
    exe = Path(sys.executable).with_name("trio-broker")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trio_broker.cli"]


class _LoggedProcess:
    """A child process whose stderr (its log) a thread copies to ``log_path``, watching
    for the line ``pattern`` that says it is ready."""

    def __init__(self, argv: list[str], log_path: Path, pattern: re.Pattern[bytes]) -> None:
        self.log_path = log_path
        self.match: re.Match[bytes] | None = None
        self._ready = threading.Event()
        from trio_broker.cluster.child_process import die_with_parent

        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # SIGTERM when the test process dies, even by SIGKILL (Linux, main thread).
            preexec_fn=die_with_parent(),  # only a prctl call: safe despite threads
        )
        assert self.process.stdout is not None
        self._thread = threading.Thread(
            target=self._follow, args=(self.process.stdout, pattern), daemon=True
        )
        self._thread.start()

    def _follow(self, stream: IO[bytes], pattern: re.Pattern[bytes]) -> None:
        with self.log_path.open("ab") as out:
            for line in stream:
                out.write(line)
                out.flush()
                if self.match is None and (found := pattern.search(line)):
                    self.match = found
                    self._ready.set()
        self._ready.set()  # exited: whoever waits must look

    def wait_ready(self, timeout: float, what: str) -> re.Match[bytes]:
        try:
            self._ready.wait(timeout)
        except BaseException:  # Ctrl-C, a test timeout: no process left behind
            self.stop()
            raise
        if self.match is None or self.process.poll() is not None:
            status = self.process.poll()
            self.stop()
            state = f"exited with status {status}" if status is not None else "timed out"
            raise RuntimeError(
                f"{what} did not start ({state}); its log ({self.log_path}) ends:\n"
                + self.log_tail()
            )
        return self.match

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM by its PID, SIGKILL if it has not exited within ``timeout``. The exit
        status, or None when it had to be killed."""
        killed = False
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                killed = True
            finally:  # a timeout, or an interrupted wait
                if self.process.poll() is None:
                    self.process.kill()
                    self.process.wait()
        self._thread.join(5)
        return None if killed else self.process.returncode


class KafkaBroker:
    """A running ``trio-broker serve``; ``bootstrap`` is what clients connect to."""

    def __init__(self, process: _LoggedProcess, host: str, port: int, data_dir: Path | None):
        self._process = process
        self.host, self.port, self.data_dir = host, port, data_dir
        self.bootstrap = f"{host}:{port}"

    @property
    def pid(self) -> int:
        return self._process.process.pid

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self._process.log_tail(lines)

    def alive(self) -> bool:
        return self._process.process.poll() is None

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """CreateTopics with the broker's own admin client; raises on an error."""
        _create_topic(self.bootstrap, name, partitions, config or {})

    def delete_topic(self, name: str) -> None:
        from trio_broker.admin.client import BlockingClient, check

        with BlockingClient(self.bootstrap) as client:
            result = client.delete_topic(name)
            check(result.error_code, f"delete {name}", result.error_message)

    def __repr__(self) -> str:
        return f"<KafkaBroker {self.bootstrap} pid {self.pid}>"


def _create_topic(
    bootstrap: str, name: str, partitions: int, config: dict[str, str], replicas: int = 1
) -> None:
    from trio_broker.admin.client import BlockingClient, check

    with BlockingClient(bootstrap) as client:
        result = client.create_topic(name, partitions, config, replication_factor=replicas)
        check(result.error_code, f"create {name}", result.error_message)


def start_broker(
    work_dir: Path, *, storage: str = "memory", log_level: str = "INFO", extra: Sequence[str] = ()
) -> KafkaBroker:
    """Start ``trio-broker serve`` on 127.0.0.1 and a free port (port 0: the broker binds
    and logs ``listening on HOST:PORT``, so parallel sessions never collide) and return
    once it accepts connections."""
    work_dir.mkdir(parents=True, exist_ok=True)
    argv = [*_broker_command(), "serve", "--listen", "127.0.0.1:0", "--log-level", log_level]
    data_dir: Path | None = None
    if storage == "disk":
        data_dir = work_dir / "data"
        argv += ["--storage", "file", "--data-dir", str(data_dir)]
    else:
        # No files at all; --data-dir still names where nothing will be written.
        argv += ["--storage", "memory", "--data-dir", str(work_dir / "data")]
    argv += list(extra)
    process = _LoggedProcess(argv, work_dir / "broker.log", LISTENING)
    found = process.wait_ready(START_TIMEOUT_S, "trio-broker serve")
    return KafkaBroker(process, found[1].decode(), int(found[2]), data_dir)


def stop_broker(broker: KafkaBroker) -> None:
    """Stop it cleanly; a broker that hangs or exits badly is reported as a warning with
    the end of its log (the suite's own results stand)."""
    status = broker._process.stop()
    if status == 0 or status == -signal.SIGTERM:
        return
    what = f"did not stop within {STOP_TIMEOUT_S:g} s and was killed"
    if status is not None:
        what = f"exited with status {status}"
    warnings.warn(
        pytest.PytestWarning(
            f"trio-broker {broker.bootstrap} {what}; its log ({broker.log_path}) ends:\n"
            + broker.log_tail()
        ),
        stacklevel=1,
    )


# ------------------------------------------------------------------------------ fixtures

_BROKER_KEY = pytest.StashKey["KafkaBroker"]()


def _setting(config: pytest.Config, option: str, ini: str) -> str:
    value = config.getoption(option)
    return str(value if value is not None else config.getini(ini))


def _log_level(config: pytest.Config) -> str:
    level = _setting(config, "kafka_broker_log_level", "kafka_broker_log_level").upper()
    if level not in LOG_LEVELS:
        raise pytest.UsageError(f"kafka_broker_log_level must be INFO or DEBUG, not {level!r}")
    return level


@pytest.fixture(scope="session")
def kafka_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBroker]:
    """A trio-broker for the session (one per xdist worker); ``.bootstrap`` is HOST:PORT."""
    config = request.config
    storage = _setting(config, "kafka_broker_storage", "kafka_broker_storage")
    if storage not in ("memory", "disk"):
        raise pytest.UsageError(f"kafka_broker_storage must be memory or disk, not {storage!r}")
    level = _log_level(config)
    broker = start_broker(tmp_path_factory.mktemp("kafka_broker"), storage=storage, log_level=level)
    config.stash[_BROKER_KEY] = broker
    try:
        yield broker
    finally:
        del config.stash[_BROKER_KEY]
        stop_broker(broker)


TopicFactory = Callable[..., str]


def _unique_topic(request: pytest.FixtureRequest) -> str:
    # Kafka topic names: [a-zA-Z0-9._-], at most 249 characters.
    stem = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name)[:80].strip("-.")
    return f"{stem or 'topic'}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def kafka_topic_factory(
    kafka_broker: KafkaBroker, request: pytest.FixtureRequest
) -> Iterator[TopicFactory]:
    """``kafka_topic_factory(partitions=1, config=None, name=None) -> name``: creates a
    topic (a fresh unique name unless given) on ``kafka_broker``; deleted after the test."""
    created: list[str] = []

    def make(
        partitions: int = 1, config: dict[str, str] | None = None, name: str | None = None
    ) -> str:
        topic = name or _unique_topic(request)
        kafka_broker.create_topic(topic, partitions, config)
        created.append(topic)
        return topic

    yield make
    if kafka_broker.alive():
        for topic in created:
            with contextlib.suppress(Exception):  # e.g. the test deleted it already
                kafka_broker.delete_topic(topic)


@pytest.fixture
def kafka_topic(kafka_topic_factory: TopicFactory) -> str:
    """A fresh topic with one partition on ``kafka_broker``."""
    return kafka_topic_factory()


# ------------------------------------------------------------------------------- cluster


class KafkaCluster:
    """A running ``trio-broker cluster up``: ZooKeeper and brokers 1..N.

    ``cluster up`` supervises the brokers: one that dies (``kill_broker``) is restarted
    by it after a backoff of about a second; one stopped with ``stop_broker`` stays down
    until ``restart_broker``. The cluster lives for the session, so a test that takes a
    broker down should bring it back (``with cluster.broker_stopped(n):``)."""

    def __init__(self, process: _LoggedProcess, bootstrap: str, data_dir: Path) -> None:
        self._process = process
        self.bootstrap = bootstrap
        self.data_dir = data_dir
        self.addresses = {i + 1: a for i, a in enumerate(bootstrap.split(","))}

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def broker_log_path(self, broker_id: int) -> Path:
        return self.data_dir / f"broker-{broker_id}.log"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self._process.log_tail(lines)

    def _cli(self, *args: str, timeout: float = CLUSTER_START_TIMEOUT_S) -> str:
        done = subprocess.run(
            [*_broker_command(), "cluster", *args, "--data-dir", str(self.data_dir)],
            capture_output=True, text=True, timeout=timeout + 30,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"trio-broker cluster {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def status(self) -> dict[int, dict[str, Any]]:
        """broker id -> {"state", "pid", "address"}, as ``trio-broker cluster status`` says."""
        out: dict[int, dict[str, Any]] = {}
        for line in self._cli("status").splitlines():
            if found := STATUS_LINE.match(line):
                pid = int(found[3]) if found[3].isdigit() else None
                out[int(found[1])] = {"state": found[2], "pid": pid, "address": found[4]}
        return out

    def stop_broker(self, broker_id: int) -> None:
        """A clean stop (SIGTERM); it stays down until :meth:`restart_broker`."""
        self._cli("stop", str(broker_id), "--timeout", str(START_TIMEOUT_S))

    def restart_broker(self, broker_id: int) -> None:
        """Start it again (or restart a running one); returns once it serves."""
        self._cli("restart", str(broker_id), "--timeout", str(START_TIMEOUT_S))

    def kill_broker(self, broker_id: int) -> None:
        """SIGKILL, a crash: ``cluster up`` restarts it after about a second (see
        :meth:`wait_running`)."""
        pid = self.status()[broker_id]["pid"]
        if pid is None:
            raise RuntimeError(f"broker {broker_id} is not running")
        os.kill(pid, signal.SIGKILL)

    def wait_running(self, broker_id: int, timeout: float = START_TIMEOUT_S) -> None:
        """Until ``cluster status`` shows broker ``broker_id`` running again."""
        deadline = time.monotonic() + timeout
        while (state := self.status().get(broker_id, {}).get("state")) != "running":
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker {broker_id} is {state}, not running, after {timeout} s")
            time.sleep(0.2)  # polling another process's state file

    @contextlib.contextmanager
    def broker_stopped(self, broker_id: int) -> Iterator[None]:
        self.stop_broker(broker_id)
        try:
            yield
        finally:
            self.restart_broker(broker_id)

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = -1,
        config: dict[str, str] | None = None,
    ) -> None:
        """CreateTopics (replication_factor -1: the cluster's default.replication.factor)."""
        last: Exception | None = None
        for address in self.addresses.values():
            try:
                return _create_topic(address, name, partitions, config or {}, replication_factor)
            except Exception as exc:  # that broker is down or not the controller's peer yet
                last = exc
        raise RuntimeError(f"no broker created topic {name}: {last}")


@pytest.fixture(scope="session")
def kafka_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    """ZooKeeper and ``kafka_cluster_brokers`` (ini, default 3) brokers for the session."""
    from trio_broker.cluster.local_zookeeper import ZOOKEEPER_JAR

    if not ZOOKEEPER_JAR.is_file():
        pytest.skip(
            f"kafka_cluster needs ZooKeeper: {ZOOKEEPER_JAR} is missing (Debian's zookeeper "
            "package; or set TRIO_BROKER_ZOOKEEPER_JAR)"
        )
    from shutil import which

    if which("java") is None:
        pytest.skip("kafka_cluster needs ZooKeeper, which needs java on PATH")
    config = request.config
    brokers = int(config.getini("kafka_cluster_brokers"))
    level = _log_level(config)
    work = tmp_path_factory.mktemp("kafka_cluster")
    data_dir = work / "data"
    keys = [f"--broker-config={line}" for line in config.getini("kafka_cluster_broker_config")]
    argv = [*_broker_command(), "cluster", "up",
            "--brokers", str(brokers), "--base-port", "0", "--data-dir", str(data_dir),
            "--log-level", level, *keys]  # fmt: skip
    process = _LoggedProcess(argv, work / "cluster-up.log", CLUSTER_READY)
    found = process.wait_ready(CLUSTER_START_TIMEOUT_S, "trio-broker cluster up")
    cluster = KafkaCluster(process, found[1].decode(), data_dir)
    try:
        yield cluster
    finally:
        # cluster up stops its brokers (SIGTERM, SIGKILL after its grace) and ZooKeeper.
        status = process.stop(timeout=60.0)
        if status not in (0, -signal.SIGTERM):
            warnings.warn(
                pytest.PytestWarning(
                    f"trio-broker cluster up exited with {status}; its log "
                    f"({cluster.log_path}) ends:\n{cluster.log_tail()}"
                ),
                stacklevel=1,
            )


# ------------------------------------------------------------------------------- reports


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """A failed test that used ``kafka_broker`` gets the end of the broker's log."""
    outcome = yield  # the old-style wrapper: every pytest and pluggy version has it
    report = outcome.get_result()
    if report.failed and "kafka_broker" in getattr(item, "fixturenames", ()):
        broker = item.config.stash.get(_BROKER_KEY, None)
        if broker is not None:
            report.sections.append((f"trio-broker log {broker.log_path}", broker.log_tail()))
