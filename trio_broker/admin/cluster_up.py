"""``trio-broker cluster up``: a private ZooKeeper and N brokers on 127.0.0.1, in one command.

For trying replication and for tests: it starts ZooKeeper (Debian's package) on a free
port with its data under ``DATA_DIR/zookeeper``, then ``trio-broker serve --broker-id I
--zookeeper ...`` for I = 1..N with data under ``DATA_DIR/broker-I``, waits until every
broker is registered, prints one line::

    cluster ready: bootstrap 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094

and runs until Ctrl-C or SIGTERM, when it stops the brokers (SIGTERM, then SIGKILL after
a grace period) and ZooKeeper, each by its own PID. Exit status: 0 after a clean stop,
1 if something failed to start, 2 for bad arguments. Killed itself (SIGKILL), it cannot
stop them, so each child asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``, cluster/child_process.py): no broker or ZooKeeper outlives it.
The brokers run in sessions of their own (a Ctrl-C at the terminal is for this process,
which stops them in order), so killing this process's group does not reach them; the
death signal does.

Meanwhile it supervises: a broker that exits on its own is reported (one stderr line)
and restarted with the same id, port and data dir after a backoff, unless it keeps
dying; the others run on. A broker that died without closing its ZooKeeper session
(killed, crashed) is started again only once ZooKeeper has let go of its registration,
so the controller sees it gone (and moves its leadership) before it comes back.
``cluster restart|stop|status N`` reach it through files in the data dir (see
"operating a running cluster" below).

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
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trio_broker.admin.client import AdminError, BlockingClient
from trio_broker.admin.cluster_zookeeper import add_secure_zookeeper_command
from trio_broker.cluster.child_process import die_with_parent
from trio_broker.cluster.local_zookeeper import LocalZooKeeper, start_local_zookeeper
from trio_broker.config_errors import ConfigError
from trio_broker.security.zookeeper_login import ZooKeeperLogin, client_jaas, read_client_login
from trio_broker.storage.data_dir_lock import DataDirInUse, lock_data_dir
from trio_broker.storage.durable import TMP_SUFFIX, write_file_atomically

__all__ = ["add_cluster_command", "run_cluster"]

LISTENING = re.compile(rb"listening on ([0-9.]+):(\d+)")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0
SUPERVISE_EVERY_S = 0.5
#: A broker that exits on its own is restarted after these delays (its first, second
#: ... exit within the window; the last one from then on) ...
RESTART_BACKOFF_S = (1.0, 2.0)
#: ... and given up on when it exits this many times within RESTART_WINDOW_S.
RESTART_LIMIT = 3
RESTART_WINDOW_S = 60.0
#: The longest a restart waits for ZooKeeper to drop the dead broker's registration
#: (its session timeout, 18 s by default, plus ZooKeeper's own tick).
REGISTRATION_WAIT_S = 60.0
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
    for command, text in (
        ("restart", "restart broker N of the running `cluster up` (or start it again)"),
        ("stop", "stop broker N of the running `cluster up` until `cluster restart N`"),
        ("status", "show the brokers of the running `cluster up`"),
    ):
        operate = csub.add_parser(command, help=text)
        operate.set_defaults(log_level="WARNING")  # the CLI sets up logging for every command
        if command != "status":
            operate.add_argument("broker", type=int, metavar="N", help="the broker id")
            operate.add_argument("--timeout", type=float, default=START_TIMEOUT_S,
                                 help="seconds to wait for it (default %(default)g)")  # fmt: skip
        operate.add_argument("--data-dir", type=Path, default=Path("cluster-data"),
                             help="the data dir of that `cluster up` (default ./cluster-data)")  # fmt: skip
    add_secure_zookeeper_command(csub)


class _Broker:
    """One broker of ``cluster up``: its current process, its log, and what the supervisor
    does when the process exits (restart it, or leave it down)."""

    def __init__(self, broker_id: int, log_path: Path, port: int) -> None:
        self.broker_id, self.log_path, self.port = broker_id, log_path, port
        self.process: subprocess.Popen[bytes] | None = None
        self.address: str | None = None
        self.ready = threading.Event()
        #: starting, running, restarting (waiting out its backoff), stopping, stopped,
        #: gave up (died too often); shown by ``cluster status``.
        self.state = "starting"
        self.starts = 0
        #: When it exited unexpectedly, within RESTART_WINDOW_S.
        self.deaths: deque[float] = deque()
        self.restart_at: float | None = None
        #: What to do once a process asked to stop (SIGTERM) has exited.
        self.then: str | None = None
        self.term_sent_at: float | None = None

    def start(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        self.ready = threading.Event()
        self.starts += 1
        self.state = "starting" if self.starts == 1 else "restarting"
        self.restart_at = None
        threading.Thread(
            target=self.follow_stderr, args=(self.process, self.ready), daemon=True
        ).start()

    def follow_stderr(self, process: subprocess.Popen[bytes], ready: threading.Event) -> None:
        """Copy the broker's log to its file, noting its address on the way."""
        assert process.stderr is not None
        with self.log_path.open("ab") as out:
            for line in process.stderr:
                out.write(line)
                out.flush()
                found = LISTENING.search(line)
                if found and not ready.is_set():
                    self.address = f"{found[1].decode()}:{found[2].decode()}"
                    self.port = int(found[2])  # a restart listens there again
                    ready.set()
        ready.set()  # exited: whoever waits must look

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, then: str) -> None:
        """SIGTERM (a clean stop); :meth:`supervise` does ``then`` once it has exited."""
        assert self.process is not None
        self.then, self.term_sent_at, self.state = then, time.monotonic(), "stopping"
        os.kill(self.process.pid, signal.SIGTERM)

    def supervise(
        self,
        now: float,
        argv: Callable[[int], list[str]],
        registered: Callable[[int], bool] = lambda broker_id: False,
    ) -> bool:
        """One look at the broker; True when its state changed. ``registered(id)``:
        whether ZooKeeper still holds the broker's registration."""
        process = self.process
        if process is not None and process.poll() is not None:
            self.process, then, self.then = None, self.then, None
            if then == "stop":
                self.state = "stopped"
                _say(f"broker {self.broker_id} stopped")
            elif then == "restart":
                self.start(argv(self.port))
            else:
                self._died(now, process.returncode)
            return True
        if self.restart_at is not None and now >= self.restart_at:
            # Until the dead process's session expires, its registration stands: a new
            # process would wait for it to go and register the moment it does, maybe
            # before the controller read the broker list, which then never showed the
            # broker gone (its leadership stays, in the same leader epoch). Starting it
            # only now gives the controller the new process's start-up to react.
            if now < self.restart_at + REGISTRATION_WAIT_S and registered(self.broker_id):
                return False
            self.start(argv(self.port))
            return True
        since = self.term_sent_at if self.then is not None else None
        if process is not None and since is not None and now - since > STOP_GRACE_S:
            process.kill()  # a clean stop that does not end
            self.term_sent_at = None
        if self.state in ("starting", "restarting") and self.ready.is_set() and self.alive():
            if self.state == "restarting":
                _say(f"broker {self.broker_id} is back on {self.address} "
                     f"(pid {self.process.pid if self.process else '?'})")  # fmt: skip
            self.state = "running"
            return True
        return False

    def _died(self, now: float, status: int) -> None:
        """It exited on its own: restart it after a backoff, unless it keeps dying."""
        self.deaths.append(now)
        while self.deaths and self.deaths[0] < now - RESTART_WINDOW_S:
            self.deaths.popleft()
        exited = f"broker {self.broker_id} {_exit_status(status)}"
        if len(self.deaths) >= RESTART_LIMIT:
            self.state = "gave up"
            _say(f"{exited}, {len(self.deaths)} times within {RESTART_WINDOW_S:.0f} s: "
                 f"not restarting it (the others keep running; `trio-broker cluster "
                 f"restart {self.broker_id}` tries again); see {self.log_path}")  # fmt: skip
            return
        delay = RESTART_BACKOFF_S[min(len(self.deaths), len(RESTART_BACKOFF_S)) - 1]
        self.restart_at, self.state = now + delay, "restarting"
        _say(f"{exited}; restarting it in {delay:g} s; see {self.log_path}")

    def asked(self, command: str, argv: Callable[[int], list[str]]) -> None:
        """``cluster restart N`` / ``cluster stop N``: the operator's word (no backoff,
        and it does not count toward giving up)."""
        if self.then is not None and self.alive():
            self.then = command  # stopping already: a second SIGTERM would cut that short
            return
        if command == "restart":
            self.deaths.clear()
            if self.alive():
                self.terminate("restart")
            else:
                self.start(argv(self.port))
        elif self.alive():
            self.terminate("stop")
        else:
            self.restart_at, self.state = None, "stopped"


def _broker_argv(
    zookeeper_hosts: str, data_dir: Path, broker_id: int, port: int, log_level: str,
    config: Path,
) -> list[str]:  # fmt: skip
    """The command line of broker ``broker_id`` (the same for every restart but its
    port: 0 at first with --base-port 0, then the one it got)."""
    exe = Path(sys.executable).with_name("trio-broker")
    return [
        str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else
        ["-m", "trio_broker.cli"]), "serve", "--broker-id", str(broker_id),
        "--zookeeper", zookeeper_hosts, "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data_dir / f"broker-{broker_id}"), "--log-level", log_level,
        "--config", str(config),
    ]  # fmt: skip


def run_cluster(args: argparse.Namespace) -> int:
    if args.cluster_command in ("restart", "stop", "status"):
        return _operate(args)
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
    try:
        # One `cluster up` per DATA_DIR: a second would start a ZooKeeper on the same
        # snapshots. Held until this process exits.
        held = lock_data_dir(data_dir, "`trio-broker cluster up`")
    except DataDirInUse as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 1
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
        configs = {
            i: _config_file(data_dir, i, rf, min_isr, tuple(extra_keys))
            for i in range(1, args.brokers + 1)
        }
        hosts = zookeeper.hosts

        def argv_of(broker: _Broker) -> Callable[[int], list[str]]:
            return lambda port: _broker_argv(
                hosts, data_dir, broker.broker_id, port, args.log_level, configs[broker.broker_id]
            )

        for i in range(1, args.brokers + 1):
            port = 0 if args.base_port == 0 else args.base_port + i - 1
            broker = _Broker(i, data_dir / f"broker-{i}.log", port)
            broker.start(argv_of(broker)(port))
            brokers.append(broker)
        _write_state(data_dir, brokers)
        deadline = time.monotonic() + START_TIMEOUT_S
        for broker in brokers:
            broker.ready.wait(max(deadline - time.monotonic(), 0))
            if broker.address is None or not broker.alive():
                print(f"trio-broker: broker {broker.broker_id} did not start; see "
                      f"{broker.log_path}", file=sys.stderr)  # fmt: skip
                return 1
        if not _wait_registered(zookeeper, args.brokers, deadline, stop):
            print("trio-broker: the brokers did not all register in ZooKeeper", file=sys.stderr)
            return 1
        short = _wait_every_broker_lists_all(brokers, deadline, stop)
        if short:
            print(f"trio-broker: broker(s) {', '.join(map(str, short))} did not list every "
                  "broker in their Metadata in time", file=sys.stderr)  # fmt: skip
            return 1
        for broker in brokers:
            broker.state = "running"
        _write_state(data_dir, brokers)  # before the line: whoever reads it can act
        bootstrap = ",".join(str(b.address) for b in brokers)
        print(f"cluster ready: bootstrap {bootstrap}", flush=True)
        argvs = {b.broker_id: argv_of(b) for b in brokers}

        def registered(broker_id: int) -> bool:
            return _still_registered(hosts, broker_id)

        zookeeper_deaths: deque[float] = deque()
        while not stop.wait(SUPERVISE_EVERY_S):
            now = time.monotonic()
            if not _supervise_zookeeper(zookeeper, zookeeper_deaths, now):
                return 1
            changed = False
            for broker_id, command in _take_requests(data_dir):
                if 1 <= broker_id <= len(brokers):
                    brokers[broker_id - 1].asked(command, argvs[broker_id])
                    changed = True
            for broker in brokers:
                changed = broker.supervise(now, argvs[broker.broker_id], registered) or changed
            if changed:
                _write_state(data_dir, brokers)
        return 0
    finally:
        try:
            _stop_all(brokers)
        finally:
            if zookeeper is not None:
                zookeeper.stop()
            _remove_state(data_dir)
            held.close()  # the last: everything it guarded has stopped


def _supervise_zookeeper(zookeeper: LocalZooKeeper, deaths: deque[float], now: float) -> bool:
    """Start ZooKeeper again (same port, data and logins) when it exited on its own:
    the brokers' sessions survive in its data if it is back within their timeout, and
    they reconnect by themselves. False when it keeps dying (RESTART_LIMIT exits within
    RESTART_WINDOW_S) or does not come back: the cluster cannot run without it."""
    status = zookeeper.process.poll()
    if status is None:
        return True
    deaths.append(now)
    while deaths and deaths[0] < now - RESTART_WINDOW_S:
        deaths.popleft()
    exited = f"ZooKeeper {_exit_status(status)}"
    if len(deaths) >= RESTART_LIMIT:
        _say(f"{exited}, {len(deaths)} times within {RESTART_WINDOW_S:.0f} s: stopping the "
             f"cluster; see {zookeeper.data_dir}")  # fmt: skip
        return False
    _say(f"{exited}; restarting it on {zookeeper.hosts}")
    try:
        zookeeper.restart()
    except (OSError, RuntimeError, TimeoutError) as exc:
        _say(f"ZooKeeper did not start again ({exc}): stopping the cluster")
        return False
    _say(f"ZooKeeper is back on {zookeeper.hosts} (pid {zookeeper.process.pid})")
    return True


def _private_data_dir(data_dir: Path) -> None:
    """DATA_DIR and all that this process and its brokers make in it: the owner's alone
    (JAAS files and broker configs hold passwords, ZooKeeper's snapshots SCRAM keys)."""
    os.umask(0o077)  # the brokers inherit it
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)


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


def _still_registered(hosts: str, broker_id: int) -> bool:
    """Whether ``/brokers/ids/<broker_id>`` exists; False if ZooKeeper cannot be asked
    within a few seconds (then a restart goes ahead, as it would without this check)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=hosts)
    try:
        client.start(timeout=3)
        return client.exists(f"/brokers/ids/{broker_id}") is not None
    except (KazooException, KazooTimeoutError):
        return False
    finally:
        client.stop()
        client.close()


def _wait_every_broker_lists_all(
    brokers: list[_Broker], deadline: float, stop: threading.Event
) -> list[int]:
    """Ready means a client may start anywhere: every broker's Metadata names all the
    brokers and a controller (registration in ZooKeeper comes before each broker's view
    has read it). Returns the ids of the brokers that did not get there in time. A
    listener that does not answer a plain Metadata request (SASL or TLS set through
    --broker-config) cannot be asked, and is not waited for."""
    ids = {b.broker_id for b in brokers}
    pending = {b.broker_id: str(b.address) for b in brokers}
    while pending and time.monotonic() < deadline and not stop.is_set():
        for broker_id, address in list(pending.items()):
            try:
                with BlockingClient(address, timeout=2.0) as client:
                    metadata = client.metadata([])
            except AdminError as exc:
                if "closed the connection" in str(exc):
                    del pending[broker_id]  # not a plaintext listener: nothing to ask
                continue
            listed = {b.node_id for b in metadata.brokers}
            if ids <= listed and metadata.controller_id in ids:
                del pending[broker_id]
        if pending:
            time.sleep(0.1)
    return sorted(pending)


def _stop_all(brokers: list[_Broker]) -> None:
    running = [b.process for b in brokers if b.process is not None]
    for process in running:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in running:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _say(line: str) -> None:
    print(f"trio-broker: {line}", file=sys.stderr, flush=True)


def _exit_status(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


# ---------------------------------------------------------------- operating a running cluster
#
# A second process finds the running ``cluster up`` through files in the data dir, both
# readable by their owner only: ``cluster-up.json``, the state (cluster up's pid; each
# broker's pid, address, state and starts), rewritten (whole, by rename) on every change;
# and ``cluster-up.requests/``, where ``cluster restart|stop N`` drops one file per
# request. The supervisor polls that directory, acts and deletes the file; the
# requester then watches the state. No signal: a stale state file's pid may belong to
# another process by now, and a socket path under a deep data dir can exceed the
# 108 bytes of sun_path.


def _state_path(data_dir: Path) -> Path:
    return data_dir / "cluster-up.json"


def _requests_dir(data_dir: Path) -> Path:
    return data_dir / "cluster-up.requests"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (0600) whole: by rename, so a reader never sees half."""
    write_file_atomically(path, text.encode(), mode=0o600)


def _write_state(data_dir: Path, brokers: list[_Broker]) -> None:
    state = {
        "pid": os.getpid(),
        "brokers": {
            str(b.broker_id): {
                "pid": b.process.pid if b.alive() and b.process is not None else None,
                "address": b.address,
                "state": b.state,
                "starts": b.starts,
                "log": str(b.log_path),
            }
            for b in brokers
        },
    }
    _write_private(_state_path(data_dir), json.dumps(state, indent=1))
    requests = _requests_dir(data_dir)
    requests.mkdir(mode=0o700, exist_ok=True)
    requests.chmod(0o700)  # a leftover of a previous run keeps its mode otherwise


def _remove_state(data_dir: Path) -> None:
    _state_path(data_dir).unlink(missing_ok=True)
    requests = _requests_dir(data_dir)
    if requests.is_dir():
        for left in requests.iterdir():
            left.unlink(missing_ok=True)
        requests.rmdir()


def _take_requests(data_dir: Path) -> list[tuple[int, str]]:
    """The requests dropped since the last look, oldest first; each is taken (deleted)."""
    requests = _requests_dir(data_dir)
    taken = []
    try:
        # Not a request still being written (its temp file).
        names = sorted(n for n in os.listdir(requests) if not n.endswith(TMP_SUFFIX))
    except FileNotFoundError:
        return []
    for name in names:
        path = requests / name
        try:
            command, broker_id = path.read_text().split()
            if command in ("restart", "stop"):
                taken.append((int(broker_id), command))
        except (OSError, ValueError):
            pass  # not ours: dropped with the rest
        path.unlink(missing_ok=True)
    return taken


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    """The running ``cluster up``'s state, or None (none runs for this data dir)."""
    try:
        state: dict[str, Any] = json.loads(_state_path(data_dir).read_text())
        cmdline = Path(f"/proc/{state['pid']}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError):
        return None
    return state if b"cluster\0up" in cmdline else None


def _operate(args: argparse.Namespace) -> int:
    """``cluster restart|stop|status``: act on the ``cluster up`` running for a data dir."""
    data_dir: Path = args.data_dir.resolve()
    state = _read_state(data_dir)
    if state is None:
        print(f"trio-broker: no `cluster up` is running for {data_dir}", file=sys.stderr)
        return 1
    if args.cluster_command == "status":
        for broker_id, b in state["brokers"].items():
            print(f"broker {broker_id}: {b['state']} pid {b['pid']} on {b['address']}, "
                  f"started {b['starts']} time(s); log {b['log']}")  # fmt: skip
        return 0
    before = state["brokers"].get(str(args.broker))
    if before is None:
        print(f"trio-broker: the cluster has no broker {args.broker}", file=sys.stderr)
        return 2
    name = f"{time.time_ns()}-{os.getpid()}"
    _write_private(_requests_dir(data_dir) / name, f"{args.cluster_command} {args.broker}\n")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        after = (_read_state(data_dir) or {}).get("brokers", {}).get(str(args.broker))
        if after is None:
            break  # cluster up stopped
        if args.cluster_command == "stop" and after["state"] == "stopped":
            print(f"broker {args.broker} stopped")
            return 0
        if (
            args.cluster_command == "restart"
            and after["starts"] > before["starts"]
            and after["state"] == "running"
        ):
            print(f"broker {args.broker} restarted: pid {after['pid']} on {after['address']}")
            return 0
        time.sleep(SUPERVISE_EVERY_S)  # polling a file another process rewrites
    print(f"trio-broker: broker {args.broker} did not {args.cluster_command} within "
          f"{args.timeout:g} s; see `trio-broker cluster status`", file=sys.stderr)  # fmt: skip
    return 1
