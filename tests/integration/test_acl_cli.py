"""``trio-broker acls add|remove|list`` against an in-process broker with ACLs on.

The CLI's blocking client runs in a worker thread and connects as
User:ANONYMOUS, which the broker lists in ``super.users`` (how an operator
bootstraps ACLs on a listener without authentication)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from trio_broker.admin.acls import run_acls
from trio_broker.cli import build_parser
from trio_broker.config import BrokerConfig
from trio_broker.security.acl import Operation, Permission, ResourceType
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data",
        authorizer_class_name="org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        super_users="User:ANONYMOUS",
    )  # fmt: skip


async def acls(bootstrap: str, *argv: str) -> tuple[int, list[list[str]]]:
    args = build_parser().parse_args(["acls", *argv, "--bootstrap", bootstrap])
    out = io.StringIO()
    code = await trio.to_thread.run_sync(lambda: run_acls(args, out))
    return code, [line.split() for line in out.getvalue().splitlines() if line.strip()]


async def test_add_list_remove(broker: Broker, bootstrap: str) -> None:
    code, table = await acls(
        bootstrap, "add", "--topic", "orders", "--principal", "User:alice",
        "--operation", "READ", "--operation", "WRITE",
    )  # fmt: skip
    assert code == 0
    assert table[0] == [
        "PRINCIPAL",
        "HOST",
        "OPERATION",
        "PERMISSION",
        "RESOURCE",
        "NAME",
        "PATTERN",
    ]
    assert sorted(r[2] for r in table[1:]) == ["READ", "WRITE"]
    code, _ = await acls(
        bootstrap, "add", "--group", "billing-", "--prefixed", "--deny",
        "--principal", "User:*", "--host", "10.1.2.3", "--operation", "ALL",
    )  # fmt: skip
    assert code == 0
    assert broker.authorizer is not None
    stored = {(b.resource_type, b.resource_name, b.operation, b.permission, b.host)
              for b in broker.authorizer.bindings()}  # fmt: skip
    assert (ResourceType.GROUP, "billing-", Operation.ALL, Permission.DENY, "10.1.2.3") in stored
    assert len(stored) == 3

    code, table = await acls(bootstrap, "list", "--principal", "User:alice")
    assert code == 0 and len(table) == 3
    code, table = await acls(bootstrap, "list")
    assert code == 0 and len(table) == 4
    assert ["User:*", "10.1.2.3", "ALL", "DENY", "GROUP", "billing-", "PREFIXED"] in table

    code, table = await acls(bootstrap, "remove", "--topic", "orders", "--operation", "WRITE")
    assert code == 0 and table[-1] == ["removed", "1", "binding(s)"]
    code, table = await acls(bootstrap, "list", "--topic", "orders")
    assert [r[2] for r in table[1:]] == ["READ"]


async def test_errors_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")  # no authorizer
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        args = build_parser().parse_args(["acls", "list", "--bootstrap", bootstrap])
        code = await trio.to_thread.run_sync(lambda: run_acls(args, io.StringIO()))
        assert code == 1
        assert "SECURITY_DISABLED" in capsys.readouterr().err
        nursery.cancel_scope.cancel()


async def test_invalid_principal_is_refused(broker: Broker, bootstrap: str) -> None:
    code, _ = await acls(
        bootstrap, "add", "--topic", "t", "--principal", "alice", "--operation", "READ"
    )
    assert code == 1
    assert broker.authorizer is not None and broker.authorizer.bindings() == []
