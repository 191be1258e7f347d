"""Two brokers' copies of a cluster's ACLs and SCRAM users on one in-memory ZooKeeper
(cluster/security_store.py): a change through one reaches the other by watches,
concurrent changes of one resource all survive, a malformed znode is logged and
skipped, ZooKeeper out of reach refuses writes and leaves reads alone, and a single-node
data dir's files are copied in once."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.waits import eventually
from trio_broker.cluster.coordination import (
    BadVersion,
    MemoryCoordination,
    MemoryZooKeeper,
    NodeExists,
)
from trio_broker.cluster.security_store import ClusterSecurity
from trio_broker.cluster.security_znodes import acl_path, decode_user, user_path
from trio_broker.security.acl import (
    AclBinding,
    AclFilter,
    AuthorizerSettings,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorize,
)
from trio_broker.security.acl_store import AclStore
from trio_broker.security.credentials import CredentialStore, credential_from_password
from trio_broker.security.shared_store import SharedStoreError

TOPIC = ResourceType.TOPIC


def allow(name: str, principal: str = "User:alice", op: Operation = Operation.WRITE) -> AclBinding:
    return AclBinding(TOPIC, name, PatternType.LITERAL, principal, "*", op, Permission.ALLOW)


class CountingCoordination(MemoryCoordination):
    """Counts the conditional writes another broker won."""

    lost_races = 0

    async def set(self, path: str, data: bytes, version: int) -> int:
        try:
            return await super().set(path, data, version)
        except BadVersion:
            CountingCoordination.lost_races += 1
            raise

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        try:
            await super().create(path, data, ephemeral=ephemeral)
        except NodeExists:
            CountingCoordination.lost_races += 1
            raise


@asynccontextmanager
async def broker(
    server: MemoryZooKeeper, data_dir: Path | None = None
) -> AsyncIterator[ClusterSecurity]:
    coord = CountingCoordination(server)
    security = ClusterSecurity(coord, AclStore(None), CredentialStore(None))
    await security.load(data_dir)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(security.follow)
        yield security
        nursery.cancel_scope.cancel()


def may_write(security: ClusterSecurity, topic: str, principal: str = "User:alice") -> bool:
    assert security.acl_store is not None
    return authorize(security.acl_store.current(), AuthorizerSettings(), principal, "10.0.0.1",
                     Operation.WRITE, TOPIC, topic)  # fmt: skip


async def test_a_change_through_one_broker_reaches_the_other() -> None:
    server = MemoryZooKeeper()
    async with broker(server) as one, broker(server) as two:
        assert await one.add_acls([allow("orders")]) == [None]
        assert may_write(one, "orders")  # its own copy at once
        await eventually(lambda: may_write(two, "orders"), "broker two allows alice")
        assert not may_write(two, "payments")
        # A user made through two logs in at one.
        cred = credential_from_password("SCRAM-SHA-256", "pw", 4096)
        await two.put_credential("alice", "SCRAM-SHA-256", cred)
        await eventually(
            lambda: one.credential_store.lookup("alice", "SCRAM-SHA-256") == cred, "user at one"
        )
        # Deleting through two takes effect at one; the answer lists what went.
        removed = await two.remove_acls([AclFilter(resource_type=TOPIC, resource_name="orders")])
        assert removed == [[allow("orders")]]
        await eventually(lambda: not may_write(one, "orders"), "the ACL gone at one")
        assert server.nodes.get(acl_path(TOPIC, "orders", PatternType.LITERAL)) is None
        assert await one.delete_credential("alice", "SCRAM-SHA-256")
        assert not await one.delete_credential("alice", "SCRAM-SHA-256")
        await eventually(lambda: two.credential_store.users() == {}, "the user gone at two")


async def test_concurrent_adds_to_one_resource_all_survive() -> None:
    server = MemoryZooKeeper()
    CountingCoordination.lost_races = 0
    principals = [f"User:u{i}" for i in range(12)]
    async with broker(server) as one, broker(server) as two:
        async with trio.open_nursery() as nursery:
            for i, principal in enumerate(principals):
                nursery.start_soon((one, two)[i % 2].add_acls, [allow("orders", principal)])
        assert CountingCoordination.lost_races > 0  # the writes did race
        for security in (one, two):
            await eventually(
                lambda s=security: all(may_write(s, "orders", p) for p in principals),
                "every principal's ACL on both brokers",
            )
        # And concurrent deletes of different bindings of the resource.
        async with trio.open_nursery() as nursery:
            for i, principal in enumerate(principals[:6]):
                only = AclFilter(resource_name="orders", principal=principal)
                nursery.start_soon((one, two)[i % 2].remove_acls, [only])
        await eventually(
            lambda: [may_write(two, "orders", p) for p in principals] == [False] * 6 + [True] * 6,
            "the other six ACLs kept",
        )


async def test_other_keys_of_a_user_znode_are_kept() -> None:
    server = MemoryZooKeeper()
    async with broker(server) as one:
        await one.coord.create(
            user_path("bob"), b'{"version":1,"config":{"consumer_byte_rate":"10"}}'
        )
        cred = credential_from_password("SCRAM-SHA-512", "pw", 4096)
        await one.put_credential("bob", "SCRAM-SHA-512", cred)
        raw = server.nodes[user_path("bob")].data
        assert json.loads(raw)["config"]["consumer_byte_rate"] == "10"
        assert decode_user(raw, "bob") == {"SCRAM-SHA-512": cred}
        assert await one.delete_credential("bob", "SCRAM-SHA-512")
        assert user_path("bob") in server.nodes  # the quota is still there


async def test_a_malformed_znode_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    server = MemoryZooKeeper()
    async with broker(server) as one, broker(server) as two:
        await one.add_acls([allow("orders"), allow("payments")])
        await eventually(lambda: may_write(two, "payments"), "payments at two")
        with caplog.at_level(logging.ERROR):
            await one.coord.set(acl_path(TOPIC, "payments", PatternType.LITERAL), b"{oops", -1)
            await one.coord.create(user_path("mallory"), b'{"version":1,"config":[]}')
            await one.add_acls([allow("audit")])
            await eventually(lambda: may_write(two, "audit"), "a later change still arrives")
        assert "ignoring /kafka-acl/Topic/payments" in caplog.text
        assert "ignoring /config/users/mallory" in caplog.text
        # The last good copy of the unreadable resource stays; the rest is intact.
        assert may_write(two, "payments") and may_write(two, "orders")
        # Writing to it is refused with a message, not a crash.
        [problem] = await two.add_acls([allow("payments", "User:bob")])
        assert problem is not None and "unreadable" in problem


async def test_zookeeper_out_of_reach_refuses_writes_and_keeps_reads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MemoryZooKeeper()
    async with broker(server) as one:
        await one.add_acls([allow("orders")])
        assert isinstance(one.coord, MemoryCoordination)
        one.coord.disconnect()
        [problem] = await one.add_acls([allow("payments")])
        assert problem is not None and "did not answer" in problem
        with pytest.raises(SharedStoreError, match="did not answer"):
            await one.put_credential("a", "SCRAM-SHA-256",
                                     credential_from_password("SCRAM-SHA-256", "pw", 4096))  # fmt: skip
        with pytest.raises(SharedStoreError):
            await one.remove_acls([AclFilter()])
        assert may_write(one, "orders") and not may_write(one, "payments")
        one.coord.reconnect()
        assert await one.add_acls([allow("payments")]) == [None]
        assert may_write(one, "payments")


async def test_session_expiry_reads_everything_again() -> None:
    server = MemoryZooKeeper()
    async with broker(server) as one, broker(server) as two:
        assert isinstance(two.coord, MemoryCoordination)
        two.coord.disconnect()
        await one.add_acls([allow("orders")])
        two.coord.expire_session()
        two.coord.reconnect()
        await eventually(lambda: may_write(two, "orders"), "read after the new session")
        await one.add_acls([allow("payments")])
        await eventually(lambda: may_write(two, "payments"), "watches set in the new session")


async def test_a_single_node_data_dir_is_copied_in_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = MemoryZooKeeper()
    old = tmp_path / "old"
    old.mkdir()
    AclStore(old).add([allow("orders"), allow("payments")])
    users = CredentialStore.in_data_dir(old)
    users.add("alice", "SCRAM-SHA-256", "alice-pw")
    users.add("bob", "SCRAM-SHA-256", "file-pw")
    async with broker(server) as one:
        # The cluster already has its own bob and its own payments ACLs: those win.
        await one.put_credential("bob", "SCRAM-SHA-256",
                                 credential_from_password("SCRAM-SHA-256", "zk-pw", 4096))  # fmt: skip
        await one.add_acls([allow("payments", "User:carol")])
        with caplog.at_level(logging.INFO):
            async with broker(server, old) as joined:
                await eventually(lambda: may_write(one, "orders"), "orders copied")
                assert joined.credential_store.lookup("alice", "SCRAM-SHA-256") is not None
        assert not may_write(one, "payments") and may_write(one, "payments", "User:carol")
        bob = decode_user(server.nodes[user_path("bob")].data, "bob")["SCRAM-SHA-256"]
        assert bob != users.lookup("bob", "SCRAM-SHA-256")  # ZooKeeper's bob kept
        assert "copied SCRAM user 'alice'" in caplog.text
        assert "not copying SCRAM user 'bob'" in caplog.text
        assert sorted(p.name for p in old.iterdir()) == [
            "acls.json.migrated", "scram-credentials.json.migrated"
        ]  # fmt: skip
        # Deleted in the cluster, it is not brought back by the next start.
        await one.remove_acls([AclFilter(resource_name="orders")])
        async with broker(server, old):
            pass
        assert not may_write(one, "orders")
