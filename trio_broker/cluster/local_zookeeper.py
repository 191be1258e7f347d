"""A private ZooKeeper server for tests and ``trio-broker cluster up``.

Runs the ZooKeeper of Debian's ``zookeeper`` package (installed by
scripts/install-system-deps.sh) as a standalone server on 127.0.0.1, with its own data
directory and port, and stops it by its PID. Not for production: one server, no quorum.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import attrs

__all__ = ["ZOOKEEPER_JAR", "LocalZooKeeper", "start_local_zookeeper"]

ZOOKEEPER_JAR = Path(os.environ.get("TRIO_BROKER_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class LocalZooKeeper:
    host: str
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes]

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_local_zookeeper(
    data_dir: Path, port: int = 0, tick_ms: int = 500, timeout_s: float = 30.0
) -> LocalZooKeeper:
    """Start a server and wait until it accepts connections; its log is data_dir/zookeeper.log."""
    if not ZOOKEEPER_JAR.is_file():
        raise FileNotFoundError(
            f"{ZOOKEEPER_JAR} is missing: install Debian's zookeeper package "
            "(scripts/install-system-deps.sh does)"
        )
    port = port or _free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "zoo.cfg"
    config.write_text(
        f"tickTime={tick_ms}\ndataDir={data_dir / 'data'}\nclientPort={port}\n"
        "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
        f"minSessionTimeout={2 * tick_ms}\nmaxSessionTimeout=60000\n"
    )
    log = (data_dir / "zookeeper.log").open("ab")
    process = subprocess.Popen(
        ["java", "-Xmx256m", "-cp", str(ZOOKEEPER_JAR),
         "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    server = LocalZooKeeper("127.0.0.1", port, data_dir, process)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ZooKeeper exited with {process.returncode}; see {log.name}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"ZooKeeper did not listen on 127.0.0.1:{port} within {timeout_s} s")
