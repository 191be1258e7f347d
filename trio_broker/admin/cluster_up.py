"""``trio-broker cluster up``: a private ZooKeeper and N brokers on 127.0.0.1, in one command.

For trying replication and for tests: it starts ZooKeeper (Debian's package) on a free
port with its data under ``DATA_DIR/zookeeper``, then ``trio-broker serve --broker-id I
--zookeeper ...`` for I = 1..N with data under ``DATA_DIR/broker-I``, waits until every
broker is registered, prints one line::

    cluster ready: bootstrap 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094

and runs until Ctrl-C or SIGTERM, when it stops the brokers (SIGTERM, then SIGKILL after
a grace period) and ZooKeeper, each by its own PID. Exit status: 0 after a clean stop,
1 if something failed to start, 2 for bad arguments.

Secure by default: ZooKeeper accepts the SASL login of one user, ``broker``, with a
random password kept in ``DATA_DIR/zookeeper-client.jaas`` (made on the first run,
reused after), and the brokers log in as it with ``zookeeper.set.acl=true``, so no other
local process can change the cluster's znodes or read its SCRAM credentials. Everything
under DATA_DIR is its owner's alone (directories 0700, files 0600). Admin tools that
write to ZooKeeper take the same file: ``trio-broker users --zookeeper HOST:PORT
--zookeeper-jaas DATA_DIR/zookeeper-client.jaas ...``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trio_broker.admin.cluster_zookeeper import add_secure_zookeeper_command
from trio_broker.cluster.local_zookeeper import LocalZooKeeper, start_local_zookeeper
from trio_broker.config_errors import ConfigError
from trio_broker.security.zookeeper_login import ZooKeeperLogin, client_jaas, read_client_login

__all__ = ["add_cluster_command", "run_cluster"]

LISTENING = re.compile(rb"listening on ([0-9.]+):(\d+)")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0
#: The brokers' ZooKeeper login (the user their znodes' ACLs name), under DATA_DIR.
CLIENT_JAAS = "zookeeper-client.jaas"
ZOOKEEPER_USER = "broker"


def add_cluster_command(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="run a local cluster: ZooKeeper and N brokers")
    csub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = csub.add_parser("up", help="start ZooKeeper and the brokers; stop them on Ctrl-C")
    up.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    up.add_argument("--data-dir", type=Path, default=Path("cluster-data"),
                    help="ZooKeeper's and every broker's data (default ./cluster-data)")  # fmt: skip
    up.add_argument("--base-port", type=int, default=9092,
                    help="broker I listens on BASE+I-1 (default 9092); 0 picks free ports")  # fmt: skip
    up.add_argument("--replication-factor", type=int, default=None,
                    help="default.replication.factor (default: min(3, brokers))")  # fmt: skip
    up.add_argument("--min-insync-replicas", type=int, default=None,
                    help="min.insync.replicas (default: 2 with 3+ brokers, else 1)")  # fmt: skip
    up.add_argument("--log-level", default="INFO", help="the brokers' logging level")
    up.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config key for every broker (repeatable), e.g. "
                    "acks.all.fsync=false")  # fmt: skip
    add_secure_zookeeper_command(csub)


class _Broker:
    def __init__(self, broker_id: int, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.broker_id, self.process, self.log_path = broker_id, process, log_path
        self.address: str | None = None
        self.ready = threading.Event()

    def follow_stderr(self) -> None:
        """Copy the broker's log to its file, noting its address on the way."""
        assert self.process.stderr is not None
        with self.log_path.open("ab") as out:
            for line in self.process.stderr:
                out.write(line)
                out.flush()
                found = LISTENING.search(line)
                if found and self.address is None:
                    self.address = f"{found[1].decode()}:{found[2].decode()}"
                    self.ready.set()
        self.ready.set()  # exited: whoever waits must look


def run_cluster(args: argparse.Namespace) -> int:
    if args.cluster_command != "up":
        return 2
    if not 1 <= args.brokers <= 64:
        print("trio-broker: --brokers must be between 1 and 64", file=sys.stderr)
        return 2
    rf = args.replication_factor or min(3, args.brokers)
    min_isr = args.min_insync_replicas or (2 if args.brokers >= 3 else 1)
    if not 1 <= min_isr <= rf <= args.brokers:
        print("trio-broker: need 1 <= min-insync-replicas <= replication-factor <= brokers",
              file=sys.stderr)  # fmt: skip
        return 2
    extra_keys = [line.strip() for line in args.broker_config]
    if any("=" not in line or "\n" in line for line in extra_keys):
        print("trio-broker: --broker-config takes KEY=VALUE", file=sys.stderr)
        return 2
    data_dir: Path = args.data_dir.resolve()
    _private_data_dir(data_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    zookeeper: LocalZooKeeper | None = None
    brokers: list[_Broker] = []
    try:
        try:
            zookeeper = _start_zookeeper(data_dir)
        except (OSError, RuntimeError, TimeoutError, ConfigError) as exc:
            print(f"trio-broker: ZooKeeper did not start: {exc}", file=sys.stderr)
            return 1
        exe = Path(sys.executable).with_name("trio-broker")
        for i in range(1, args.brokers + 1):
            port = 0 if args.base_port == 0 else args.base_port + i - 1
            argv = [
                str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else
                ["-m", "trio_broker.cli"]), "serve", "--broker-id", str(i),
                "--zookeeper", zookeeper.hosts, "--listen", f"127.0.0.1:{port}",
                "--data-dir", str(data_dir / f"broker-{i}"), "--log-level", args.log_level,
                "--config", str(_config_file(data_dir, i, rf, min_isr, tuple(extra_keys))),
            ]  # fmt: skip
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            broker = _Broker(i, process, data_dir / f"broker-{i}.log")
            threading.Thread(target=broker.follow_stderr, daemon=True).start()
            brokers.append(broker)
        deadline = time.monotonic() + START_TIMEOUT_S
        for broker in brokers:
            broker.ready.wait(max(deadline - time.monotonic(), 0))
            if broker.address is None:
                print(f"trio-broker: broker {broker.broker_id} did not start; see "
                      f"{broker.log_path}", file=sys.stderr)  # fmt: skip
                return 1
        if not _wait_registered(zookeeper, args.brokers, deadline, stop):
            print("trio-broker: the brokers did not all register in ZooKeeper", file=sys.stderr)
            return 1
        bootstrap = ",".join(str(b.address) for b in brokers)
        print(f"cluster ready: bootstrap {bootstrap}", flush=True)
        while not stop.wait(0.5):
            for broker in brokers:
                if broker.process.poll() is not None:
                    print(f"trio-broker: broker {broker.broker_id} exited with "
                          f"{broker.process.returncode}; see {broker.log_path}",
                          file=sys.stderr)  # fmt: skip
                    return 1
        return 0
    finally:
        _stop_all(brokers)
        if zookeeper is not None:
            zookeeper.stop()


def _private_data_dir(data_dir: Path) -> None:
    """DATA_DIR and all that this process and its brokers make in it: the owner's alone
    (JAAS files and broker configs hold passwords, ZooKeeper's snapshots SCRAM keys)."""
    os.umask(0o077)  # the brokers inherit it
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file from an earlier run keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _start_zookeeper(data_dir: Path) -> LocalZooKeeper:
    """ZooKeeper accepting the brokers' login only: the one of DATA_DIR's client JAAS
    file, made with a random password on the first run."""
    jaas = data_dir / CLIENT_JAAS
    if jaas.exists():
        login = read_client_login(jaas)
        jaas.chmod(0o600)
    else:
        login = ZooKeeperLogin(ZOOKEEPER_USER, secrets.token_urlsafe(32))
        _write_private(jaas, client_jaas(login))
    return start_local_zookeeper(data_dir / "zookeeper", sasl_users=[login])


def _config_file(
    data_dir: Path, broker_id: int, rf: int, min_isr: int, extra_keys: tuple[str, ...] = ()
) -> Path:
    path = data_dir / f"broker-{broker_id}.properties"
    _write_private(
        path,
        f"default.replication.factor={rf}\nmin.insync.replicas={min_isr}\n"
        "replica.lag.time.max.ms=10000\n"
        # Consumer groups' offsets topic: no more replicas than brokers, or it is never made.
        f"offsets.topic.replication.factor={rf}\n"
        f"zookeeper.set.acl=true\nzookeeper.jaas.file={data_dir / CLIENT_JAAS}\n"
        + "".join(f"{line}\n" for line in extra_keys),
    )
    return path


def _wait_registered(
    zookeeper: LocalZooKeeper, count: int, deadline: float, stop: threading.Event
) -> bool:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=max(deadline - time.monotonic(), 1))
    try:
        while time.monotonic() < deadline and not stop.is_set():
            if client.exists("/brokers/ids") and len(client.get_children("/brokers/ids")) >= count:
                return True
            time.sleep(0.2)
        return False
    finally:
        client.stop()
        client.close()


def _stop_all(brokers: list[_Broker]) -> None:
    for broker in brokers:
        if broker.process.poll() is None:
            os.kill(broker.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for broker in brokers:
        try:
            broker.process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            broker.process.kill()
            broker.process.wait()
