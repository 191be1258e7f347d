"""A private ZooKeeper server for the cluster tests (Debian's zookeeper package)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Clients
from kazoo.client import KazooClient

from trio_broker.cluster.local_zookeeper import LocalZooKeeper, start_local_zookeeper

_chroots = itertools.count(1)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    server = start_local_zookeeper(Path(tmp_path_factory.mktemp("zookeeper")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zookeeper(zookeeper_server: LocalZooKeeper) -> str:
    """A connect string with a chroot of its own: each test starts from an empty tree."""
    chroot = f"/test{next(_chroots)}"
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=30)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return zookeeper_server.hosts + chroot


@pytest.fixture(params=["zookeeper", "memory"])
def clients(request: pytest.FixtureRequest) -> Clients:
    """Coordination clients on a real ZooKeeper (through kazoo) or the in-memory twin."""
    return Clients(str(request.param), request)
