"""Private ZooKeeper servers for tests and ``trio-broker cluster up``.

Runs the ZooKeeper of Debian's ``zookeeper`` package (installed by
scripts/install-system-deps.sh) on 127.0.0.1, each server with its own data directory
and ports, and stops them by PID: a standalone server (:func:`start_local_zookeeper`),
or an ensemble of several (:func:`start_local_ensemble`: a quorum, as production runs
it, to test brokers riding out the loss of one server).

Given ``sasl_users``, a server accepts SASL DIGEST-MD5 logins of those users (a JAAS
``Server`` section, ZooKeeper's SASL authentication provider), which the ACLs of
``zookeeper.set.acl`` name. A server's directory is its owner's alone (0700): its
snapshots hold every znode, SCRAM keys included, and its JAAS file the passwords.

A server is never left behind: one that does not come up in time, or whose wait is
interrupted (Ctrl-C, a test's timeout), is stopped before the error propagates, and each
gets SIGTERM when the process that started it dies (cluster/child_process.py), so a
killed ``cluster up`` or test run takes its ZooKeeper with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import attrs

from trio_broker.cluster.child_process import die_with_parent
from trio_broker.security.zookeeper_login import ZooKeeperLogin, server_jaas

__all__ = [
    "ZOOKEEPER_JAR",
    "LocalZooKeeper",
    "ServerTls",
    "quorum_mode",
    "start_local_ensemble",
    "start_local_zookeeper",
]

STANDALONE = "org.apache.zookeeper.server.ZooKeeperServerMain"
SASL_PROVIDER = "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n"
QUORUM_PEER = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

ZOOKEEPER_JAR = Path(os.environ.get("TRIO_BROKER_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
#: ZooKeeper's Netty server (the one that speaks TLS) needs it; Debian's zookeeper.jar
#: lists the other Netty jars in its manifest but not this one.
NETTY_CODEC_JAR = ZOOKEEPER_JAR.parent / "netty-codec.jar"
NETTY_SERVER = "org.apache.zookeeper.server.NettyServerCnxnFactory"
#: A private server holds a few hundred znodes for a handful of brokers: a small heap,
#: Java's client compiler alone and the serial collector. Most of such a server's CPU
#: is its JVM warming up (C2 compiling, G1's threads); with these flags a server that
#: starts and answers 900 requests over 10 s used 0.73-0.79 s of CPU instead of
#: 1.07-1.20 s (three pairs side by side); the 20 servers of test_zookeeper_faults.py and
#: test_cluster_up.py 11.7-11.8 s instead of 15.8-16.5 s (two pairs). Every
#: process-level cluster test starts one.
ZOOKEEPER_JVM = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@attrs.frozen
class ServerTls:
    """A server that speaks TLS only, on its client port (``secureClientPort``)."""

    #: PEM file: the server's private key (PKCS#8: ZooKeeper reads no other layout)
    #: followed by its certificate chain.
    keystore: Path
    #: PEM file of the CA certificates a client's certificate must chain to.
    truststore: Path
    #: ZooKeeper's ssl.clientAuth: "need" (a client certificate is required), "want", "none".
    client_auth: str = "need"

    def config_lines(self, port: int) -> str:
        return (
            f"secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n"
            f"serverCnxnFactory={NETTY_SERVER}\n"
            f"ssl.keyStore.location={self.keystore}\nssl.keyStore.type=PEM\n"
            f"ssl.trustStore.location={self.truststore}\nssl.trustStore.type=PEM\n"
            f"ssl.clientAuth={self.client_auth}\n"
        )


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
    #: How to start it again (:meth:`restart`): its config and main class.
    config: Path | None = None
    main_class: str = STANDALONE
    #: Its JAAS file (the SASL users it accepts); None: no SASL.
    jaas: Path | None = None
    #: Whether it speaks TLS (only) on its port.
    tls: bool = False

    def restart(self, timeout_s: float = 60.0) -> None:
        """Start it again after a stop or kill, same config, ports and data."""
        if self.process.poll() is None:
            raise RuntimeError("ZooKeeper is still running")
        assert self.config is not None
        self.process = _launch(self.config, self.main_class, self.data_dir, self.jaas, self.tls)
        _wait_until_serving(self, timeout_s, quorum=self.main_class == QUORUM_PEER)

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """SIGTERM; SIGKILL after 10 s, or at once if the wait is interrupted."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read, from the first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _sasl_config(
    data_dir: Path, sasl_users: list[ZooKeeperLogin] | None
) -> tuple[str, Path | None]:
    """The zoo.cfg lines and the JAAS file for ``sasl_users`` (none: no SASL)."""
    if not sasl_users:
        return "", None
    jaas = data_dir / "jaas.conf"
    _private_file(jaas, server_jaas(sasl_users))
    return SASL_PROVIDER, jaas


def start_local_zookeeper(
    data_dir: Path,
    port: int = 0,
    tick_ms: int = 500,
    timeout_s: float = 30.0,
    *,
    sasl_users: list[ZooKeeperLogin] | None = None,
    tls: ServerTls | None = None,
) -> LocalZooKeeper:
    """Start a server and wait until it accepts connections; its log is data_dir/zookeeper.log.

    With ``tls`` it accepts TLS connections only: no plaintext port is open."""
    port = port or _free_port()
    _private_dir(data_dir)
    _private_dir(data_dir / "data")
    sasl, jaas = _sasl_config(data_dir, sasl_users)
    listener = (
        tls.config_lines(port)
        if tls is not None
        else f"clientPort={port}\nclientPortAddress=127.0.0.1\n"
    )
    config = data_dir / "zoo.cfg"
    _private_file(
        config,
        f"tickTime={tick_ms}\ndataDir={data_dir / 'data'}\n{listener}admin.enableServer=false\n"
        f"minSessionTimeout={2 * tick_ms}\nmaxSessionTimeout=60000\n{sasl}",
    )
    secure = tls is not None
    process = _launch(config, STANDALONE, data_dir, jaas, secure)
    server = LocalZooKeeper("127.0.0.1", port, data_dir, process, config, STANDALONE, jaas, secure)
    _wait_until_serving(server, timeout_s, quorum=False)
    return server


def start_local_ensemble(
    base_dir: Path,
    servers: int = 3,
    tick_ms: int = 500,
    timeout_s: float = 60.0,
    *,
    sasl_users: list[ZooKeeperLogin] | None = None,
) -> list[LocalZooKeeper]:
    """``servers`` ZooKeeper servers forming one ensemble (each in ``base_dir/zk<id>``);
    returns once every one serves as leader or follower. Connect to all of them with
    ``",".join(s.hosts for s in ensemble)``."""
    client_ports = [_free_port() for _ in range(servers)]
    peer_ports = [(_free_port(), _free_port()) for _ in range(servers)]
    members = "".join(
        f"server.{i + 1}=127.0.0.1:{quorum}:{election}\n"
        for i, (quorum, election) in enumerate(peer_ports)
    )
    ensemble = []
    try:
        for i, port in enumerate(client_ports):
            data_dir = base_dir / f"zk{i + 1}"
            _private_dir(data_dir)
            _private_dir(data_dir / "data")
            (data_dir / "data" / "myid").write_text(f"{i + 1}\n")
            sasl, jaas = _sasl_config(data_dir, sasl_users)
            config = data_dir / "zoo.cfg"
            _private_file(
                config,
                f"tickTime={tick_ms}\ninitLimit=20\nsyncLimit=10\n"
                f"dataDir={data_dir / 'data'}\nclientPort={port}\n"
                "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                "4lw.commands.whitelist=srvr\n"
                f"minSessionTimeout={2 * tick_ms}\nmaxSessionTimeout=60000\n{members}{sasl}",
            )
            process = _launch(config, QUORUM_PEER, data_dir, jaas)
            ensemble.append(
                LocalZooKeeper("127.0.0.1", port, data_dir, process, config, QUORUM_PEER, jaas)
            )
        for server in ensemble:
            _wait_until_serving(server, timeout_s, quorum=True)
    except BaseException:
        for server in ensemble:
            server.stop()
        raise
    return ensemble


def quorum_mode(server: LocalZooKeeper) -> str | None:
    """ "leader", "follower" or "standalone" as the server answers ``srvr``; None while it
    does not serve (no quorum yet, or not listening)."""
    try:
        with socket.create_connection((server.host, server.port), timeout=1) as conn:
            conn.sendall(b"srvr")
            reply = b""
            while chunk := conn.recv(4096):
                reply += chunk
    except OSError:
        return None
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def _launch(
    config: Path, main_class: str, data_dir: Path, jaas: Path | None, tls: bool = False
) -> subprocess.Popen[bytes]:
    if not ZOOKEEPER_JAR.is_file():
        raise FileNotFoundError(
            f"{ZOOKEEPER_JAR} is missing: install Debian's zookeeper package "
            "(scripts/install-system-deps.sh does)"
        )
    jvm = [] if jaas is None else [f"-Djava.security.auth.login.config={jaas}"]
    classpath = [str(ZOOKEEPER_JAR)]
    if tls:
        if not NETTY_CODEC_JAR.is_file():
            raise FileNotFoundError(f"{NETTY_CODEC_JAR} is missing: install Debian's netty package")
        classpath.append(str(NETTY_CODEC_JAR))
    log_fd = os.open(data_dir / "zookeeper.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(log_fd, "ab") as log:
        return subprocess.Popen(
            ["java", *ZOOKEEPER_JVM, *jvm, "-cp", ":".join(classpath), main_class, str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )  # fmt: skip


def _wait_until_serving(server: LocalZooKeeper, timeout_s: float, *, quorum: bool) -> None:
    """Until it serves; on any failure (an interrupt too) it is stopped first."""
    try:
        _wait(server, timeout_s, quorum=quorum)
    except BaseException:
        server.stop()
        raise


def _wait(server: LocalZooKeeper, timeout_s: float, *, quorum: bool) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"ZooKeeper exited with {server.process.returncode}; "
                f"see {server.data_dir / 'zookeeper.log'}"
            )
        if quorum:
            if quorum_mode(server) in ("leader", "follower"):
                return
        else:
            try:
                with socket.create_connection((server.host, server.port), timeout=0.5):
                    return
            except OSError:
                pass
        time.sleep(0.1)  # polling, bounded by the deadline
    raise TimeoutError(f"ZooKeeper did not serve on {server.hosts} within {timeout_s} s")
