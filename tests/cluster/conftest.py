"""A private ZooKeeper server for the cluster tests (Debian's zookeeper package).

It accepts the SASL login of the harness's ZooKeeper user (harness.ZOOKEEPER_LOGIN), as
a secured cluster's ZooKeeper does: coordination clients from harness.Clients log in and
set ACLs; broker processes do when their config names the JAAS file of the
``zookeeper_jaas`` fixture (with ``zookeeper.set.acl=true``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ZOOKEEPER_LOGIN, Clients
from kazoo.client import KazooClient

from trio_broker.cluster.local_zookeeper import LocalZooKeeper, start_local_zookeeper
from trio_broker.security.zookeeper_login import client_jaas

_chroots = itertools.count(1)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    server = start_local_zookeeper(
        Path(tmp_path_factory.mktemp("zookeeper")), sasl_users=[ZOOKEEPER_LOGIN]
    )
    try:
        yield server
    finally:
        server.stop()


def _fresh_chroot(server: LocalZooKeeper) -> str:
    chroot = f"/test{next(_chroots)}"
    client = KazooClient(hosts=server.hosts)
    client.start(timeout=30)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return server.hosts + chroot


@pytest.fixture
def zookeeper(zookeeper_server: LocalZooKeeper) -> str:
    """A connect string with a chroot of its own: each test starts from an empty tree."""
    return _fresh_chroot(zookeeper_server)


@pytest.fixture(scope="module")
def module_zookeeper(zookeeper_server: LocalZooKeeper) -> str:
    """A chroot for a module's shared cluster: the tests that use that cluster leave its
    brokers alone (no kill, pause, partition or broker config change), except the last
    one to use it, which may; each uses topics and groups of its own."""
    return _fresh_chroot(zookeeper_server)


@pytest.fixture(scope="session")
def zookeeper_jaas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JAAS file with the harness's ZooKeeper login (zookeeper.jaas.file, --zookeeper-jaas)."""
    path = tmp_path_factory.mktemp("zookeeper-login") / "client.jaas"
    path.write_text(client_jaas(ZOOKEEPER_LOGIN))
    path.chmod(0o600)
    return path


@pytest.fixture(params=["zookeeper", "memory"])
def clients(request: pytest.FixtureRequest) -> Clients:
    """Coordination clients on a real ZooKeeper (through kazoo) or the in-memory twin."""
    return Clients(str(request.param), request)
