"""`trio-broker cluster up`: ZooKeeper and three brokers in one command, stopped by SIGTERM;
a broker that dies is restarted while the others serve; `cluster restart|stop|status N`."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from tests.e2e.conftest import BROKER_EXE
from tests.leak_check import descendants, kill_tree

pytestmark = pytest.mark.timeout(300)


def _create_topic(admin: AdminClient, name: str) -> None:
    """CreateTopics with the cluster's default replication factor (3), retried while the
    broker asked still lists fewer brokers: "cluster ready" means every broker registered
    in ZooKeeper; each broker's own list follows its watch a moment later."""
    deadline = time.monotonic() + 60
    while True:
        [future] = admin.create_topics([NewTopic(name, num_partitions=1)]).values()
        try:
            future.result(timeout=60)
            return
        except KafkaException as exc:
            lagging = exc.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
            if not lagging or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # polling, bounded by the deadline


def _partition_with_a_leader(admin: AdminClient, topic: str) -> Any:
    found: list[Any] = []

    def led() -> bool:
        try:
            meta = admin.list_topics(topic, timeout=10).topics[topic]
        except KafkaException:
            return False
        found[:] = [meta.partitions.get(0)] if meta.error is None else []
        return bool(found) and found[0] is not None and found[0].leader >= 1

    _wait_for(led, 60, f"{topic}-0 has a leader")
    return found[0]


def test_cluster_up_prints_its_bootstrap_serves_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(BROKER_EXE), "cluster", "up", "--brokers", "3", "--base-port", "0",
         "--data-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("cluster ready: bootstrap "), line
        servers = line.split()[-1]
        assert len(servers.split(",")) == 3
        admin = AdminClient({"bootstrap.servers": servers})
        assert len(admin.list_topics(timeout=10).brokers) == 3
        _create_topic(admin, "up")
        # The broker asked may not have read the topic yet (no partitions) or its state
        # (leader -1): wait for a leader.
        meta = _partition_with_a_leader(admin, "up")
        assert sorted(meta.replicas) == [1, 2, 3]
        # A second `cluster up` on the same DATA_DIR would start a ZooKeeper on the same
        # snapshots and brokers on the same logs: it exits 1 before starting anything.
        second = subprocess.run(
            [str(BROKER_EXE), "cluster", "up", "--brokers", "1", "--base-port", "0",
             "--data-dir", str(tmp_path)],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr.decode()
        assert b"is in use by another `trio-broker cluster up`" in second.stderr
        assert b"cluster ready" not in second.stdout
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        for i in range(20):
            producer.produce("up", value=str(i).encode())
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": servers, "group.id": "up"})
        consumer.assign([TopicPartition("up", 0, 0)])
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(int(msg.value()))
        consumer.close()
        assert seen == list(range(20))
        broker_pids = _children(proc.pid)
        assert len(broker_pids) == 4  # ZooKeeper and three brokers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for pid in broker_pids:
            assert not _alive(pid), f"process {pid} outlived cluster up"
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)  # its brokers run in sessions of their own
            proc.wait()


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trio_broker.cli", "cluster", "up", "--brokers", "2",
         "--replication-factor", "3", "--data-dir", str(tmp_path)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert b"replication-factor" in done.stderr


def test_broker_config_reaches_every_broker(tmp_path: Path) -> None:
    """--broker-config KEY=VALUE lands in each broker's config: a bad value stops them all."""
    malformed = subprocess.run(
        [sys.executable, "-m", "trio_broker.cli", "cluster", "up", "--broker-config",
         "acks.all.fsync", "--data-dir", str(tmp_path)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert malformed.returncode == 2, malformed.stderr
    assert b"KEY=VALUE" in malformed.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "trio_broker.cli", "cluster", "up", "--brokers", "2",
         "--base-port", "0", "--broker-config", "acks.all.fsync=maybe",
         "--data-dir", str(tmp_path)],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    for broker in (1, 2):
        assert "acks.all.fsync=maybe\n" in (tmp_path / f"broker-{broker}.properties").read_text()
    # The first broker to refuse it stops the cluster, maybe before the other one reads
    # its config: at least one log names the key.
    logs = [(tmp_path / f"broker-{b}.log").read_text() for b in (1, 2)]
    assert any("acks.all.fsync" in text for text in logs), logs


# The restarted broker waits for its killed predecessor's ZooKeeper session to expire.
FAST_SESSIONS = ["--broker-config", "zookeeper.session.timeout.ms=4000"]


class _ClusterUp:
    """A running `cluster up` (its stderr collected line by line) and its data dir."""

    def __init__(self, data_dir: Path, *extra: str, brokers: int = 3) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [str(BROKER_EXE), "cluster", "up", "--brokers", str(brokers), "--base-port", "0",
             "--data-dir", str(data_dir), *FAST_SESSIONS, *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().decode()
            assert line.startswith("cluster ready: bootstrap "), (line, self.stderr)
        except BaseException:  # the caller's try has not begun: no cluster left behind
            self.kill()
            raise
        self.servers = line.split()[-1]

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    def broker(self, broker_id: int) -> dict[str, Any]:
        state = json.loads((self.data_dir / "cluster-up.json").read_text())
        return state["brokers"][str(broker_id)]  # type: ignore[no-any-return]

    def log_tails(self, lines: int = 40) -> str:
        """Each broker's last log lines, for a failure's message."""
        state = json.loads((self.data_dir / "cluster-up.json").read_text())
        tails = []
        for broker_id, broker in sorted(state["brokers"].items()):
            try:
                tail = Path(broker["log"]).read_text(errors="replace").splitlines()[-lines:]
            except (OSError, KeyError) as exc:
                tail = [f"(no log: {exc})"]
            tails.append(f"\n--- broker {broker_id} ---\n" + "\n".join(tail))
        return "".join(tails)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.stderr)

    def operate(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(BROKER_EXE), "cluster", *args, "--data-dir", str(self.data_dir)],
            capture_output=True, timeout=120,
        )  # fmt: skip

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)

    def kill(self) -> None:
        """SIGKILL to it and every process below it: the brokers run in sessions of their
        own, which killing its process group misses."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()


def _wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    explain: Callable[[], str] = lambda: "",
) -> None:
    """``explain``: what to add to the failure (say, the brokers' log tails)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}{explain()}"
        time.sleep(0.2)  # polling a condition, bounded by the deadline


def test_a_killed_leader_is_replaced_then_restarted_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    cluster = _ClusterUp(tmp_path)
    stop_producing = threading.Event()
    try:
        admin = AdminClient({"bootstrap.servers": cluster.servers})
        _create_topic(admin, "failover")

        def partition() -> Any:
            meta = admin.list_topics("failover", timeout=10).topics["failover"]
            return meta.partitions[0] if meta.error is None else None

        _wait_for(lambda: (p := partition()) is not None and len(p.isrs) == 3, 60, "ISR of 3")
        acked: list[int] = []
        errors: list[str] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                acked.append(int(msg.value()))
            else:
                errors.append(str(err))

        def produce() -> None:
            producer = Producer({"bootstrap.servers": cluster.servers, "acks": "all",
                                 "enable.idempotence": True, "linger.ms": 5})  # fmt: skip
            sent = 0
            while not stop_producing.is_set() and sent < 200_000:
                for _ in range(20):
                    producer.produce("failover", value=str(sent).encode(), on_delivery=delivered)
                    sent += 1
                producer.poll(0.02)  # serve delivery reports; paces the load
            assert producer.flush(90) == 0

        producing = threading.Thread(target=produce)
        producing.start()
        _wait_for(lambda: len(acked) >= 300, 60, "acknowledged writes before the kill")
        leader = _partition_with_a_leader(admin, "failover").leader  # (partition() may say -1)
        before = cluster.broker(leader)
        os.kill(before["pid"], signal.SIGKILL)
        # One line names the broker, how it ended and its log; the others keep running.
        _wait_for(lambda: cluster.said(f"broker {leader} was killed by SIGKILL"), 60, "report")
        line = next(x for x in cluster.stderr if f"broker {leader} was killed" in x)
        assert before["log"] in line, line
        assert cluster.proc.poll() is None
        # Another in-sync broker leads, and takes writes.
        _wait_for(lambda: (p := partition()) is not None and p.leader not in (leader, -1),
                  120, "a new leader", cluster.log_tails)  # fmt: skip
        at_kill = len(acked)
        _wait_for(lambda: len(acked) >= at_kill + 300, 60, "writes acknowledged by the new leader")
        # The killed broker comes back (same id, port and data) and catches up into the ISR.
        _wait_for(lambda: cluster.broker(leader)["starts"] == 2, 60, "the restart")
        assert cluster.broker(leader)["address"] == before["address"]
        _wait_for(lambda: (p := partition()) is not None and leader in p.isrs, 90,
                  f"broker {leader} back in the ISR")  # fmt: skip
        # The supervisor says so on its next pass after the broker is ready, which can
        # come after the broker rejoined the ISR on a busy machine.
        _wait_for(lambda: cluster.said(f"broker {leader} is back on {before['address']}"), 60,
                  "the supervisor to report the broker back")  # fmt: skip
        stop_producing.set()
        producing.join(120)
        assert not producing.is_alive()
        # Every acknowledged record is there, once (the producer is idempotent).
        consumer = Consumer({"bootstrap.servers": cluster.servers, "group.id": "check",
                             "enable.auto.commit": False})  # fmt: skip
        consumer.assign([TopicPartition("failover", 0, 0)])
        _, end = consumer.get_watermark_offsets(TopicPartition("failover", 0), timeout=10)
        seen: list[int] = []
        deadline = time.monotonic() + 60
        position = 0
        while position < end and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(int(msg.value()))
                position = msg.offset() + 1
        consumer.close()
        assert position >= end, (position, end)
        assert not set(acked) - set(seen), sorted(set(acked) - set(seen))[:20]
        assert len(seen) == len(set(seen)), "duplicates despite enable.idempotence"
        assert cluster.stop() == 0
        assert not (tmp_path / "cluster-up.json").exists()
    finally:
        stop_producing.set()
        cluster.kill()


def test_a_killed_zookeeper_is_restarted_and_the_cluster_serves_on(tmp_path: Path) -> None:
    """`cluster up` supervises its ZooKeeper too: killed with -9, it is started again on
    the same port and data, the brokers reconnect, and the cluster creates topics and
    acknowledges acks=all writes as before."""
    cluster = _ClusterUp(tmp_path, brokers=2)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.servers})
        _create_topic(admin, "before")
        [zookeeper] = [
            pid for pid in _children(cluster.proc.pid)
            if b"ZooKeeperServerMain" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]  # fmt: skip
        os.kill(zookeeper, signal.SIGKILL)
        _wait_for(lambda: cluster.said("ZooKeeper is back"), 90, "ZooKeeper to be restarted")
        assert cluster.said("ZooKeeper was killed by SIGKILL; restarting it"), cluster.stderr
        _create_topic(admin, "after")  # the controller writes through ZooKeeper again
        producer = Producer({"bootstrap.servers": cluster.servers, "acks": "all"})
        for topic in ("before", "after"):
            producer.produce(topic, value=b"served on")
        assert producer.flush(60) == 0
        assert cluster.proc.poll() is None
        assert cluster.stop() == 0
    finally:
        cluster.kill()


def test_operator_stops_and_restarts_a_broker_and_one_that_keeps_dying_is_given_up(
    tmp_path: Path,
) -> None:
    cluster = _ClusterUp(tmp_path)
    try:
        state = tmp_path / "cluster-up.json"
        assert state.stat().st_mode & 0o777 == 0o600
        assert cluster.operate("status").stdout.count(b": running pid") == 3
        # stop 2: it stays down, the cluster goes on.
        pid = cluster.broker(2)["pid"]
        stopped = cluster.operate("stop", "2")
        assert stopped.returncode == 0, stopped.stderr
        assert cluster.broker(2)["state"] == "stopped"
        assert not _alive(pid)
        admin = AdminClient({"bootstrap.servers": cluster.servers})
        _wait_for(lambda: len(admin.list_topics(timeout=10).brokers) == 2, 60, "2 brokers")
        # restart 2: back on its port.
        address = cluster.broker(2)["address"]
        restarted = cluster.operate("restart", "2")
        assert restarted.returncode == 0, restarted.stderr
        assert cluster.broker(2)["address"] == address
        _wait_for(lambda: len(admin.list_topics(timeout=10).brokers) == 3, 60, "3 brokers")
        # A broker killed again and again is given up on; the others keep running.
        # The supervisor reports a death before it rewrites its state file, so the file
        # can still say "running" with the pid just killed: wait for a new pid.
        killed: set[int] = set()
        for death in range(1, 4):
            _wait_for(lambda: cluster.broker(3)["state"] == "running"
                      and cluster.broker(3)["pid"] not in killed, 60, "broker 3 running")  # fmt: skip
            victim = cluster.broker(3)["pid"]
            killed.add(victim)
            os.kill(victim, signal.SIGKILL)
            _wait_for(lambda d=death: sum("broker 3 was killed" in x for x in cluster.stderr) == d,
                      60, f"death {death} reported")  # fmt: skip
        assert cluster.said("not restarting it")
        # The supervisor says so first and writes its state file on its next pass.
        _wait_for(lambda: cluster.broker(3)["state"] == "gave up", 60, "state 'gave up'")
        assert cluster.proc.poll() is None
        assert cluster.broker(1)["state"] == cluster.broker(2)["state"] == "running"
        # The operator's restart brings it back.
        assert cluster.operate("restart", "3").returncode == 0
        assert cluster.broker(3)["state"] == "running"
        assert cluster.stop() == 0
        missing = cluster.operate("status")
        assert missing.returncode == 1 and b"no `cluster up`" in missing.stderr
    finally:
        cluster.kill()


def test_a_killed_cluster_up_takes_its_brokers_and_zookeeper_with_it(tmp_path: Path) -> None:
    """SIGKILL to `cluster up` alone gives it no chance to stop its children; each asked
    for SIGTERM at its parent's death (PR_SET_PDEATHSIG), so none outlives it. Before,
    the broker (in a session of its own) and ZooKeeper ran on, orphaned, after every such
    kill: the processes a test run left behind."""
    cluster = _ClusterUp(tmp_path, brokers=1)
    children: list[int] = []
    try:
        children = _children(cluster.proc.pid)
        assert len(children) == 2, children  # ZooKeeper and the broker
        assert set(children) == set(descendants(cluster.proc.pid))
        os.kill(cluster.proc.pid, signal.SIGKILL)
        cluster.proc.wait()
        _wait_for(lambda: not any(_alive(p) for p in children), 60, "its children to exit")
    finally:
        cluster.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # ours: never leave them running


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True)
    return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_cluster_up_locks_zookeeper_and_its_files(tmp_path: Path) -> None:
    """Secure by default: the brokers log in to ZooKeeper and set ACLs, so that another
    local process, connecting without the login, can neither read the SCRAM credentials
    nor change the cluster (it could, and did, all of it before); the cluster works for
    clients meanwhile, and what holds passwords or keys is its owner's alone."""
    data_dir = tmp_path / "cluster"
    cluster = _ClusterUp(data_dir, brokers=2)
    try:
        servers = cluster.servers
        admin = AdminClient({"bootstrap.servers": servers})
        upsert = UserScramCredentialUpsertion(
            "boss", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"boss-secret"
        )
        admin.alter_user_scram_credentials([upsert])["boss"].result(timeout=60)
        _create_topic(admin, "locked")
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        producer.produce("locked", value=b"still works")
        assert producer.flush(30) == 0

        config = (data_dir / "zookeeper" / "zoo.cfg").read_text()
        port = re.search(r"^clientPort=(\d+)$", config, re.M)
        assert port is not None
        hosts = f"127.0.0.1:{port[1]}"
        anonymous = KazooClient(hosts=hosts)
        anonymous.start(timeout=30)
        try:
            assert sorted(anonymous.get_children("/brokers/ids")) == ["1", "2"]
            attempts: dict[str, Callable[[], object]] = {
                "read a SCRAM credential": lambda: anonymous.get("/config/users/boss"),
                "add a user": lambda: anonymous.create("/config/users/mallory", b"{}"),
                "register a broker": lambda: anonymous.create("/brokers/ids/3", b"{}"),
                "delete a registration": lambda: anonymous.delete("/brokers/ids/1"),
                "delete the controller": lambda: anonymous.delete("/controller"),
                "add a top-level znode": lambda: anonymous.create("/kafka-acl-changes", b""),
            }
            allowed = []
            for what, attempt in attempts.items():
                try:
                    attempt()
                    allowed.append(what)
                except NoAuthError:
                    pass
            assert allowed == []
        finally:
            anonymous.stop()
            anonymous.close()
        # With the login cluster up made, the users tool reads them.
        jaas = data_dir / "zookeeper-client.jaas"
        listed = subprocess.run(
            [str(BROKER_EXE), "users", "list", "--zookeeper", hosts, "--zookeeper-jaas", str(jaas)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert "boss\tSCRAM-SHA-256" in listed.stdout

        private_dirs = [data_dir, data_dir / "zookeeper", data_dir / "zookeeper" / "data"]
        private_files = [jaas, data_dir / "broker-1.properties", data_dir / "zookeeper" / "jaas.conf",
                         data_dir / "zookeeper" / "zoo.cfg"]  # fmt: skip
        for path in private_dirs:
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        for path in private_files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert cluster.stop() == 0
    finally:
        cluster.kill()
