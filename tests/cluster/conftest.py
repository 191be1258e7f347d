"""A private ZooKeeper server for the cluster tests (Debian's zookeeper package).

It accepts the SASL login of the harness's ZooKeeper user (harness.ZOOKEEPER_LOGIN), as
a secured cluster's ZooKeeper does: coordination clients from harness.Clients log in and
set ACLs; broker processes do when their config names the JAAS file of the
``zookeeper_jaas`` fixture (with ``zookeeper.set.acl=true``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from harness import ZOOKEEPER_LOGIN, Clients
from kazoo.client import KazooClient

from tests.e2e.conftest import BrokerProcess
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


def _brokers_in(value: object) -> list[BrokerProcess]:
    """The broker processes a fixture's value holds: itself, a mapping's values (a
    cluster), a ``brokers`` mapping attribute, or a (mode, cluster) tuple."""
    if isinstance(value, BrokerProcess):
        return [value]
    if isinstance(value, tuple):
        return [b for item in value for b in _brokers_in(item)]
    held = getattr(value, "brokers", value)
    if isinstance(held, Mapping):
        return [b for b in held.values() if isinstance(b, BrokerProcess)]
    return []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed cluster test shows each of its brokers' log tails (the e2e hook looks at
    single broker fixtures only): a race between brokers shows in their logs, and the
    run's temporary directories may be gone by the time anyone looks."""
    report = yield
    if report.failed:
        try:
            for value in getattr(item, "funcargs", {}).values():
                for broker in _brokers_in(value):
                    report.sections.append((f"broker log {broker!r}", broker.log_tail()))
        except Exception as exc:  # an extra of the report must not end the whole run
            report.sections.append(("broker logs", f"not collected: {exc!r}"))
    return report
