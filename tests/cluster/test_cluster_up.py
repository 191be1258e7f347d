"""`trio-broker cluster up`: ZooKeeper and three brokers in one command, stopped by SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
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

pytestmark = pytest.mark.timeout(180)


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
        [future] = admin.create_topics([NewTopic("up", num_partitions=1)]).values()
        future.result(timeout=30)  # replication factor 3: the cluster's default
        meta = admin.list_topics("up", timeout=10).topics["up"].partitions[0]
        assert sorted(meta.replicas) == [1, 2, 3]
        producer = Producer({"bootstrap.servers": servers, "acks": "all"})
        for i in range(20):
            producer.produce("up", value=str(i).encode())
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": servers, "group.id": "up"})
        consumer.assign([TopicPartition("up", 0, 0)])
        seen = []
        deadline = time.monotonic() + 30
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
            os.killpg(proc.pid, signal.SIGKILL)
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
    proc = subprocess.Popen(
        [str(BROKER_EXE), "cluster", "up", "--brokers", "2", "--base-port", "0",
         "--data-dir", str(data_dir)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("cluster ready: bootstrap "), line
        servers = line.split()[-1]
        admin = AdminClient({"bootstrap.servers": servers})
        upsert = UserScramCredentialUpsertion(
            "boss", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"boss-secret"
        )
        admin.alter_user_scram_credentials([upsert])["boss"].result(timeout=30)
        [future] = admin.create_topics([NewTopic("locked", num_partitions=1)]).values()
        future.result(timeout=30)
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
