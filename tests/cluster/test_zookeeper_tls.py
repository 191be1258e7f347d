"""TLS to ZooKeeper (``zookeeper.ssl.*``): a cluster whose ZooKeeper speaks TLS only.

ZooKeeper (Debian's, 3.8) runs with a ``secureClientPort`` and no plaintext port and asks
every client for a certificate (``ssl.clientAuth=need``). A broker configured with Kafka's
``zookeeper.ssl.*`` keys joins it and serves a real client; a client without TLS, or
without a certificate of the cluster's CA, is not let in; the operator's tool reaches it
with ``--zk-tls-config-file``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from tests.cluster.test_cluster_e2e import produce, read_all
from tests.cluster.test_cluster_faults import ConfiguredBroker, running
from tests.e2e.conftest import BROKER_EXE
from trio_broker.cluster.coordination import ZooKeeperCoordination
from trio_broker.cluster.local_zookeeper import LocalZooKeeper, ServerTls, start_local_zookeeper
from trio_broker.security.zookeeper_tls import ZooKeeperTls

pytestmark = pytest.mark.timeout(300)


def pem_keystore(path: Path, cert: trustme.LeafCert) -> Path:
    """ZooKeeper's PEM keystore: the PKCS#8 private key, then the certificate chain."""
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pkcs8 + b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    return path


class Certificates:
    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        ca = trustme.CA(key_type=trustme.KeyType.RSA)
        self.ca = directory / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        leaf = ca.issue_cert("127.0.0.1", key_type=trustme.KeyType.RSA)
        self.server = pem_keystore(directory / "zookeeper.pem", leaf)
        broker = ca.issue_cert("brokers", key_type=trustme.KeyType.RSA)
        self.broker = pem_keystore(directory / "broker.pem", broker)
        rogue = trustme.CA(key_type=trustme.KeyType.RSA)
        self.rogue = pem_keystore(
            directory / "rogue.pem", rogue.issue_cert("brokers", key_type=trustme.KeyType.RSA)
        )

    def client_properties(self, keystore: Path | None = None) -> str:
        return (
            "zookeeper.ssl.client.enable=true\n"
            "zookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty\n"
            f"zookeeper.ssl.keystore.location={keystore or self.broker}\n"
            "zookeeper.ssl.keystore.type=PEM\n"
            f"zookeeper.ssl.truststore.location={self.ca}\n"
            "zookeeper.ssl.truststore.type=PEM\n"
        )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("zk-tls") / "certs")


@pytest.fixture(scope="module")
def tls_zookeeper(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[LocalZooKeeper]:
    server = start_local_zookeeper(
        tmp_path_factory.mktemp("zk-tls") / "zk",
        tls=ServerTls(certificates.server, certificates.ca),
    )
    try:
        yield server
    finally:
        server.stop()


def connects(hosts: str, **options: object) -> bool:
    client = KazooClient(hosts=hosts, **options)  # type: ignore[arg-type]
    try:
        client.start(timeout=3)
    except KazooTimeoutError:
        return False
    finally:
        client.stop()
        client.close()
    return True


def test_a_broker_joins_a_tls_only_zookeeper_and_serves(
    tmp_path: Path, tls_zookeeper: LocalZooKeeper, certificates: Certificates
) -> None:
    config = tmp_path / "broker.properties"
    config.write_text(
        "default.replication.factor=1\nmin.insync.replicas=1\n" + certificates.client_properties()
    )
    broker = ConfiguredBroker(tmp_path / "broker1", 1, tls_zookeeper.hosts, config)
    with running({1: broker}):
        acked = produce(broker.bootstrap, "over-tls", range(20))
        assert len(acked) == 20
        assert sorted(read_all(broker.bootstrap, "over-tls", 20, 20)) == sorted(acked)
        # What the broker wrote is there, for a client of the cluster's CA.
        tls = ZooKeeperTls(keystore=str(certificates.broker), truststore=str(certificates.ca))
        client = KazooClient(hosts=tls_zookeeper.hosts, **tls.kazoo_options())
        client.start(timeout=30)
        try:
            assert client.get_children("/brokers/ids") == ["1"]
            assert "over-tls" in client.get_children("/brokers/topics")
        finally:
            client.stop()
            client.close()
    # Nobody else gets in: no TLS, or TLS without a certificate the server trusts.
    assert not connects(tls_zookeeper.hosts)
    rogue = ZooKeeperTls(keystore=str(certificates.rogue), truststore=str(certificates.ca))
    assert not connects(tls_zookeeper.hosts, **rogue.kazoo_options())


async def test_a_server_certificate_of_another_ca_is_refused(
    tmp_path: Path, tls_zookeeper: LocalZooKeeper, certificates: Certificates
) -> None:
    """The broker checks ZooKeeper too: a truststore without ZooKeeper's CA connects to
    nothing (the server's certificate is not trusted)."""
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    tls = ZooKeeperTls(keystore=str(certificates.broker), truststore=str(other_ca))
    coord = ZooKeeperCoordination(tls_zookeeper.hosts, tls=tls)
    with pytest.raises(KazooTimeoutError), trio.fail_after(20):
        await coord.start(timeout_s=3)
    await coord.stop()


def test_the_users_tool_reaches_zookeeper_over_tls(
    tmp_path: Path, tls_zookeeper: LocalZooKeeper, certificates: Certificates
) -> None:
    tls_config = tmp_path / "zk-tls.properties"
    tls_config.write_text(certificates.client_properties())
    password = tmp_path / "alice.pw"
    password.write_text("alice-secret")

    def users(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BROKER_EXE), "users", *args, "--zookeeper", tls_zookeeper.hosts],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    added = users("add", "--user", "alice", "--password-file", str(password),
                  "--zk-tls-config-file", str(tls_config))  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = users("list", "--zk-tls-config-file", str(tls_config))
    assert listed.returncode == 0, listed.stderr
    assert "alice" in listed.stdout
    # Without the file the tool cannot reach this ZooKeeper, and says so.
    refused = users("list")
    assert refused.returncode == 2
    assert "did not answer" in refused.stderr
