"""Apache Kafka 4.4 as the reference peer: resolve it from Maven Central, run a single KRaft node.

The jars of ``org.apache.kafka:kafka_2.13`` and its runtime dependencies are copied by Maven
(``dependency:copy-dependencies`` on a generated pom) into a cache outside the repo,
``~/.cache/trio-broker/kafka-<version>/libs`` (``$TRIO_BROKER_KAFKA_CACHE`` overrides the
parent); the first run downloads them, later runs reuse them. :class:`KafkaProcess` then
formats a fresh storage dir (``kafka.tools.StorageTool format``, what ``bin/kafka-storage.sh``
runs) and starts ``kafka.Kafka`` as broker and controller on 127.0.0.1 with the heap and GC
options of Kafka's own start script. It has the interface of ``produce.BrokerProcess``
(``bootstrap``, ``port``, ``cpu_seconds()``, ``rss_mib()``, ``stop()``), so every workload of
``bench/workloads.py`` runs against either broker.

    .venv/bin/python bench/kafka_peer.py                  # resolve, start, answer Metadata, stop
    .venv/bin/python bench/kafka_peer.py --flush-every-message
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KAFKA_VERSION = "4.4.0"
#: Kafka's distribution logs through SLF4J 1.x to Log4j 2; without a binding it logs nothing.
LOG4J_VERSION = "2.25.5"
#: bin/kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's performance options.
JVM_OPTIONS = [
    "-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]  # fmt: skip
#: Whitespace-separated JVM options that replace :data:`JVM_OPTIONS` and also start the
#: storage format tool: for the tests, which run Kafka to compare behaviour, not speed (a
#: JIT and collector for short runs, root conftest.py). Benchmarks leave it unset.
JVM_OPTIONS_ENV = "TRIO_BROKER_KAFKA_PEER_JVM"
RESOLVE_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>trio-broker.bench</groupId>
  <artifactId>kafka-peer</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

#: INFO to stdout (drained into kafka.log in the node's dir), as Kafka's server.log at INFO.
LOG4J2_PROPERTIES = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    base = os.environ.get("TRIO_BROKER_KAFKA_CACHE")
    parent = Path(base) if base else Path.home() / ".cache" / "trio-broker"
    return parent / f"kafka-{version}"


def resolve(version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka's jars, copied there by Maven on first use."""
    home = cache_dir(version)
    libs = home / "libs"
    done = home / "resolved"  # written last: a half-copied libs dir is redone
    if done.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven is missing: scripts/install-system-deps.sh installs it")
    home.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(libs, ignore_errors=True)
    (home / "pom.xml").write_text(POM.format(kafka=version, log4j=LOG4J_VERSION))
    print(f"resolving Kafka {version} into {libs} (first run: Maven downloads it)", flush=True)
    run = subprocess.run(
        [mvn, "-B", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={libs}", "-DincludeScope=runtime"],
        capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if run.returncode != 0 or not (libs / f"kafka_2.13-{version}.jar").exists():
        raise RuntimeError(f"mvn failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}")
    done.write_text(version + "\n")
    return libs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars).

    Not one starting with "-": the tool's argument parser would take it for an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


#: What the bench sets for a single node when no ``--config`` file is given: the replication
#: factors a one-node cluster needs, no rebalance delay, no auto-creation.
SINGLE_NODE_DEFAULTS = {
    "offsets.topic.replication.factor": "1",
    # One partition: the benchmark's consumer must not make Kafka create 50 of them
    # (and their logs) while it is being measured.
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
}
#: The "Kafka (fsync)" variant's key: an fsync before every acknowledgement, as trio-broker.
FSYNC_EVERY_MESSAGE = {"log.flush.interval.messages": "1"}
OVERRIDES_HEADER = "# ---- per-node keys added by bench/kafka_peer.py (later keys win) ----\n"


def kafka_node_keys(port: int, controller_port: int, data_dir: Path) -> dict[str, str]:
    """The keys that must differ per Kafka node, whatever a shared server.properties says.

    A single KRaft node is broker and controller at once (``process.roles``) with node id
    1 as the only voter; it needs a controller listener of its own on a second free port;
    its data and metadata logs go to the node's fresh directory.
    """
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / "logs"),
        "metadata.log.dir": str(data_dir / "metadata"),
    }


def trio_node_keys(data_dir: Path) -> dict[str, str]:
    """The keys that must differ for a trio-broker node: a free port, its own data dir."""
    return {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(data_dir)}


def write_properties(path: Path, source: Path | None, keys: dict[str, str]) -> Path:
    """``source``'s text verbatim (or :data:`SINGLE_NODE_DEFAULTS`), then ``keys`` after it.

    Appended, not merged: a properties file's later key replaces an earlier one, in
    Kafka's reader and in trio-broker's alike, so the shared file stays literal above the
    marked block.
    """
    if source is None:
        text = "".join(f"{k}={v}\n" for k, v in SINGLE_NODE_DEFAULTS.items())
    else:
        text = source.read_text()
        text += "" if text.endswith("\n") or not text else "\n"
    text += OVERRIDES_HEADER + "".join(f"{k}={v}\n" for k, v in keys.items())
    path.write_text(text)
    return path


def broker_jvm_options() -> list[str]:
    """The Kafka broker JVM's options: :data:`JVM_OPTIONS` unless the environment says."""
    custom = os.environ.get(JVM_OPTIONS_ENV, "").split()
    return custom or list(JVM_OPTIONS)


def tool_jvm_options() -> list[str]:
    """A Kafka tool JVM's options (the storage format): the JVM's defaults unless the
    environment says."""
    return os.environ.get(JVM_OPTIONS_ENV, "").split()


class KafkaProcess:
    """A single-node KRaft Kafka (broker and controller) on free 127.0.0.1 ports.

    ``config``: a server.properties shared with trio-broker (``run_all.py --config``);
    without one, :data:`SINGLE_NODE_DEFAULTS`. Then :func:`kafka_node_keys`, then
    ``overrides``, e.g. ``{"log.flush.interval.messages": "1"}`` for an fsync before every
    acknowledgement.
    """

    def __init__(
        self,
        overrides: dict[str, str] | None = None,
        label: str = "kafka",
        config: Path | None = None,
    ) -> None:
        libs = resolve()
        self.label = label
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"bench-{label}-", dir=ROOT / "bench"))
        self.port = _free_port()
        controller_port = _free_port()
        keys = {**kafka_node_keys(self.port, controller_port, self.data_dir), **(overrides or {})}
        config_file = write_properties(self.data_dir / "server.properties", config, keys)
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(LOG4J2_PROPERTIES)
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java is missing: scripts/install-system-deps.sh installs it")
        base = [java, f"-Dlog4j2.configurationFile={log4j}", "-cp", str(libs / "*")]
        fmt = subprocess.run(
            [*base[:1], *tool_jvm_options(), *base[1:], "kafka.tools.StorageTool", "format", "--config", str(config_file),
             "--cluster-id", _cluster_id()],
            capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if fmt.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise RuntimeError(f"kafka-storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
        self.log_path = self.data_dir / "kafka.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [*base[:1], *broker_jvm_options(), *base[1:], "kafka.Kafka", str(config_file)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # the error carries the tail of Kafka's log
            raise

    def _wait_ready(self) -> None:
        """Until Metadata lists this node (a librdkafka client, as the workloads use)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        # The port first: librdkafka would log every refused connection of the JVM's start-up.
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(f"Kafka did not answer Metadata: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """utime + stime of the JVM (every thread: network, request handlers, log flusher, GC)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, keep_dir: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if not keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flush-every-message", action="store_true",
                        help="log.flush.interval.messages=1 (fsync before the ack)")  # fmt: skip
    args = parser.parse_args()
    overrides = FSYNC_EVERY_MESSAGE if args.flush_every_message else {}
    t0 = time.monotonic()
    kafka = KafkaProcess(overrides)
    started = time.monotonic() - t0
    try:
        print(f"Kafka {KAFKA_VERSION} answers Metadata on {kafka.bootstrap} after {started:.1f}s "
              f"(pid {kafka.proc.pid}, RSS {kafka.rss_mib():.0f} MiB, "
              f"CPU {kafka.cpu_seconds():.1f} s)")  # fmt: skip
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()
