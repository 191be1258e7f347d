"""``trio-broker cluster secure-zookeeper``: locking the znodes of a cluster that ran open.

Two brokers start without a ZooKeeper login (every znode ``world:anyone:cdrwa``), make a
topic and a SCRAM user, and are moved over as docs/security.md says: a rolling restart
with the login (``zookeeper.jaas.file``), one with ``zookeeper.set.acl=true``, then the
tool. Before it, a client without the login could rewrite anything the cluster made;
after it, nothing, while the brokers go on serving and changing their znodes.
``--unsecure`` opens them again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from tests.cluster.test_cluster_e2e import eventually, every_broker_lists, produce, read_all
from tests.cluster.test_cluster_faults import ConfiguredBroker, running
from tests.e2e.conftest import BROKER_EXE
from trio_broker.cluster.coordination import ZooKeeperCoordination
from trio_broker.cluster.local_zookeeper import start_local_zookeeper
from trio_broker.security.zookeeper_login import ZooKeeperLogin, client_jaas

pytestmark = pytest.mark.timeout(300)

CONFIG = "default.replication.factor=2\nmin.insync.replicas=1\nzookeeper.session.timeout.ms=4000\n"


def secure_zookeeper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BROKER_EXE), "cluster", "secure-zookeeper", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def user(name: str) -> UserScramCredentialUpsertion:
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    return UserScramCredentialUpsertion(name, info, f"{name}-secret".encode())


def refused(client: KazooClient, attempts: dict[str, Callable[[], object]]) -> list[str]:
    """The attempts ZooKeeper refused (NoAuth), by name; the others are carried out."""
    names = []
    for what, attempt in attempts.items():
        try:
            attempt()
        except NoAuthError:
            names.append(what)
    return names


@pytest.fixture
def anonymous(zookeeper: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper)
    client.start(timeout=30)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def test_secure_zookeeper_locks_an_open_cluster_which_goes_on_working(
    tmp_path: Path, zookeeper: str, zookeeper_jaas: Path, anonymous: KazooClient
) -> None:
    config = tmp_path / "broker.properties"
    config.write_text(CONFIG)
    brokers = {b: ConfiguredBroker(tmp_path / f"broker{b}", b, zookeeper, config) for b in (1, 2)}
    with running(brokers):
        servers = ",".join(b.bootstrap for b in brokers.values())
        admin = AdminClient({"bootstrap.servers": servers})
        # Both brokers list both (the controller assigns two replicas from its own list).
        every_broker_lists(brokers)
        admin.create_topics([NewTopic("before", 1)])["before"].result(timeout=60)
        admin.alter_user_scram_credentials([user("boss")])["boss"].result(timeout=60)
        assert len(produce(servers, "before", range(10))) == 10

        # Open: a client without the login may read and change all of it.
        assert anonymous.get("/config/users/boss")[0]
        anonymous.create("/config/users/probe", b"{}")
        anonymous.delete("/config/users/probe")

        def restart_all_with(keys: str) -> None:  # one at a time, the other one serving
            config.write_text(CONFIG + keys)
            for broker in brokers.values():
                broker.stop()
                broker.start()
                eventually(lambda: len(admin.list_topics(timeout=5).brokers) == 2, "rejoined")

        restart_all_with(f"zookeeper.jaas.file={zookeeper_jaas}\n")
        restart_all_with(f"zookeeper.jaas.file={zookeeper_jaas}\nzookeeper.set.acl=true\n")

        done = secure_zookeeper("--zookeeper", zookeeper, "--zookeeper-jaas", str(zookeeper_jaas))
        assert done.returncode == 0, done.stderr
        assert "set the ACL of" in done.stdout

        attempts: dict[str, Callable[[], object]] = {
            "read a SCRAM credential": lambda: anonymous.get("/config/users/boss"),
            "add a user": lambda: anonymous.create("/config/users/mallory", b"{}"),
            "register a broker": lambda: anonymous.create("/brokers/ids/9", b"{}"),
            "delete a registration": lambda: anonymous.delete("/brokers/ids/1"),
            "change a topic": lambda: anonymous.set("/brokers/topics/before", b"{}"),
            "delete the cluster id": lambda: anonymous.delete("/cluster/id"),
            "delete the controller": lambda: anonymous.delete("/controller"),
            "add a top-level znode": lambda: anonymous.create("/mallory", b""),
        }
        assert refused(anonymous, attempts) == list(attempts)
        assert anonymous.get_children("/brokers/ids") == ["1", "2"]  # readable, as in Kafka

        # The brokers still change their znodes: a new topic, a user, records.
        every_broker_lists(brokers)  # since the restarts, each lists both again
        admin.create_topics([NewTopic("after", 1)])["after"].result(timeout=60)
        admin.alter_user_scram_credentials([user("clerk")])["clerk"].result(timeout=60)
        assert len(produce(servers, "after", range(10))) == 10
        assert sorted(read_all(servers, "before", 1, 10), key=int) == [str(i) for i in range(10)]
        listed = subprocess.run(
            [str(BROKER_EXE), "users", "list", "--zookeeper", zookeeper,
             "--zookeeper-jaas", str(zookeeper_jaas)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["boss", "clerk"]

        # --unsecure opens them again (as Kafka's tool with zookeeper.acl=unsecure).
        done = secure_zookeeper(
            "--zookeeper", zookeeper, "--zookeeper-jaas", str(zookeeper_jaas), "--unsecure"
        )
        assert done.returncode == 0, done.stderr
        assert anonymous.get("/config/users/boss")[0]


def test_secure_zookeeper_needs_the_right_login(
    tmp_path: Path, zookeeper: str, anonymous: KazooClient
) -> None:
    anonymous.create("/config/users/boss", b"{}", makepath=True)
    missing = secure_zookeeper("--zookeeper", zookeeper)
    assert missing.returncode == 2
    assert "--zookeeper-jaas" in missing.stderr
    wrong = tmp_path / "wrong.jaas"
    wrong.write_text(client_jaas(ZooKeeperLogin("broker", "not-the-password")))
    refused_login = secure_zookeeper("--zookeeper", zookeeper, "--zookeeper-jaas", str(wrong))
    assert refused_login.returncode == 1
    assert "refused" in refused_login.stderr
    assert anonymous.get("/config/users/boss")[0] == b"{}"  # untouched
    anonymous.set("/config/users/boss", b"{}")  # and still open


async def test_the_login_is_made_again_after_zookeeper_restarts(tmp_path: Path) -> None:
    """kazoo logs in on every connection: after a restart of ZooKeeper the same session
    writes its locked znodes again (an unauthenticated reconnection would get NoAuth)."""
    login = ZooKeeperLogin("broker", "restart-secret")
    server = start_local_zookeeper(tmp_path / "zk", sasl_users=[login])
    try:
        coord = ZooKeeperCoordination(server.hosts, session_timeout_s=20, login=login,
                                      set_acl=True)  # fmt: skip
        await coord.start()
        try:
            await coord.create("/config/users/boss", b"1")
            server.stop()
            await trio.to_thread.run_sync(server.restart)
            with trio.fail_after(60):
                version = await coord.set("/config/users/boss", b"2", 0)
                await coord.create("/brokers/ids/1", b"{}", ephemeral=True)
            assert version == 1
            node = await coord.get("/config/users/boss")
            assert node is not None and node.data == b"2"
        finally:
            await coord.stop()
        anonymous = KazooClient(hosts=server.hosts)
        anonymous.start(timeout=30)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get("/config/users/boss")
        finally:
            anonymous.stop()
            anonymous.close()
    finally:
        server.stop()


def test_a_broker_whose_login_zookeeper_refuses_stops_saying_so(
    tmp_path: Path, zookeeper: str
) -> None:
    jaas = tmp_path / "wrong.jaas"
    jaas.write_text(client_jaas(ZooKeeperLogin("broker", "not-the-password")))
    config = tmp_path / "broker.properties"
    config.write_text(f"zookeeper.set.acl=true\nzookeeper.jaas.file={jaas}\n")
    done = subprocess.run(
        [str(BROKER_EXE), "serve", "--broker-id", "1", "--zookeeper", zookeeper,
         "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"),
         "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    # One line says why (kazoo may log its session closing after it), no traceback.
    refusal = (
        "trio-broker: ZooKeeper refused the SASL login of user broker (a wrong password or user)"
    )
    assert done.stderr.splitlines().count(refusal) == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
