"""A cluster's ACLs and SCRAM users, kept in ZooKeeper: every broker's copy, and the writes.

In cluster mode the broker's ``AclStore`` and ``CredentialStore`` are memory-only
copies of the znodes of ``security_znodes.py``. :meth:`ClusterSecurity.follow` keeps
them with plain ZooKeeper watches: a children watch on each parent znode and a data
watch on each znode read; a fired watch re-reads only its own znode (Kafka's
sequential change-notification znodes would tell which resource changed, but a data
watch per znode tells that too). Authorization and SASL logins read the copies, never
ZooKeeper, so a broker cut off from ZooKeeper keeps deciding with what it last saw.

Writes (CreateAcls, DeleteAcls, AlterUserScramCredentials on any broker, and
``trio-broker users --zookeeper``) are read-modify-writes of one znode, conditional on
its version: a change another broker stored meanwhile is read again and kept. They
fail with :class:`SharedStoreError` when ZooKeeper is out of reach.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import attrs
import trio

from trio_broker.cluster.coordination import (
    BadVersion,
    Coordination,
    CoordinationError,
    NodeExists,
    NoNode,
    NotAuthorized,
    ZooKeeperCoordination,
)
from trio_broker.cluster.security_znodes import (
    ACL_PARENTS,
    USERS,
    AclResource,
    acl_path,
    credential_text,
    decode_acls,
    decode_user,
    decode_user_config,
    encode_acls,
    encode_user,
    encode_user_config,
    group_by_resource,
    resource_of_path,
    user_of_path,
    user_path,
)
from trio_broker.cluster.waiting import RETRY_S, Watch, wait_any
from trio_broker.cluster.zk_layout import CoordinationDataError
from trio_broker.security.acl import AclBinding, AclFilter, Operation, Permission
from trio_broker.security.acl_store import ACL_FILE, AclStore
from trio_broker.security.credentials import CREDENTIALS_FILE, CredentialStore, ScramCredential
from trio_broker.security.shared_store import SharedStoreError
from trio_broker.storage.durable import rename_durably

__all__ = ["ClusterSecurity", "update_znode"]

log = logging.getLogger(__name__)

#: A write gives up after this many conditional updates lost to other brokers.
WRITE_ATTEMPTS = 50
#: ...or after this long (ZooKeeper unreachable: kazoo waits for it meanwhile).
WRITE_TIMEOUT_S = 10.0
#: What a data dir's files are renamed to once copied into ZooKeeper.
MIGRATED_SUFFIX = ".migrated"

T = TypeVar("T")


async def update_znode(
    coord: Coordination, path: str, change: Callable[[bytes | None], bytes | None]
) -> tuple[bytes | None, int, bytes | None, int]:
    """Replace ``path``'s data by ``change(current)`` (None: absent / delete it),
    conditionally on the version read, trying again while other writers win.
    Returns (old data, old version, new data, new version); version -1: absent.
    ``change`` may raise to refuse (its exception propagates)."""
    for _ in range(WRITE_ATTEMPTS):
        node = await coord.get(path)
        old, old_version = (None, -1) if node is None else (node.data, node.version)
        new = change(old)
        try:
            if new == old:
                return old, old_version, new, old_version
            if new is None:
                await coord.delete(path, old_version)
                return old, old_version, None, -1
            if node is None:
                await coord.create(path, new)
                return None, -1, new, 0
            return old, old_version, new, await coord.set(path, new, old_version)
        except (BadVersion, NodeExists, NoNode):
            continue  # another broker changed it meanwhile: decide again on its value
    raise SharedStoreError(f"{path} kept changing ({WRITE_ATTEMPTS} attempts); try again")


@attrs.define
class _Follower(Generic[T]):
    """The children of some parent znodes and each child's decoded data, kept with
    one-shot watches: :meth:`refresh` reads what a fired (or never set) watch covers."""

    coord: Coordination
    parents: tuple[str, ...]
    decode: Callable[[str, bytes], T]
    #: path -> (znode version, decoded value), for the znodes that decoded.
    values: dict[str, tuple[int, T]] = attrs.field(factory=dict)
    _names: dict[str, list[str]] = attrs.field(factory=dict)
    _children: dict[str, Watch] = attrs.field(factory=dict)
    _data: dict[str, Watch] = attrs.field(factory=dict)

    def watches(self) -> list[Watch]:
        return [*self._children.values(), *self._data.values()]

    def forget_watches(self) -> None:
        """A new session holds none of the old one's watches: read everything again."""
        self._children.clear()
        self._data.clear()

    async def refresh(self) -> bool:
        """Read again what may have changed; True if :attr:`values` changed."""
        for parent in self.parents:
            event = self._children.get(parent)
            if event is None or event.is_set():
                self._names[parent], self._children[parent] = await self.coord.children_and_watch(
                    parent
                )
        paths = {f"{p}/{name}" for p in self.parents for name in self._names.get(p, ())}
        changed = False
        for gone in set(self._data) - paths:
            del self._data[gone]
        for gone in set(self.values) - paths:
            del self.values[gone]
            changed = True
        for path in sorted(paths):
            event = self._data.get(path)
            if event is not None and not event.is_set():
                continue
            node, self._data[path] = await self.coord.get_and_watch(path)
            if node is None:
                changed |= self.values.pop(path, None) is not None
                continue
            try:
                value = self.decode(path, node.data)
            except CoordinationDataError as exc:
                # A copy that does not parse changes nothing here; the last good one stays.
                log.error("ignoring %s: %s", path, exc)
                continue
            changed |= self.offer(path, node.version, value, known=None)
        return changed

    def offer(self, path: str, version: int, value: T | None, *, known: int | None) -> bool:
        """Take (version, value) for ``path`` (value None: deleted). With ``known``, only
        if the copy is still at that version (-1: absent): a broker's own write, never
        older than what a watch brought in meanwhile. True if :attr:`values` changed."""
        held = self.values.get(path)
        if known is not None and (held[0] if held is not None else -1) != known:
            return False
        if value is None:
            return self.values.pop(path, None) is not None
        if held == (version, value):
            return False
        self.values[path] = (version, value)
        return True


class ClusterSecurity:
    """This broker's copies of the cluster's ACLs (when an authorizer is configured:
    ``acls`` not None) and SCRAM users, and the writes of the ACL and credential APIs
    (the ``SharedSecurity`` protocol of ``security/shared_store.py``)."""

    def __init__(
        self, coord: Coordination, acls: AclStore | None, credentials: CredentialStore
    ) -> None:
        self.coord = coord
        self.acl_store = acls
        self.credential_store = credentials
        self.acls: _Follower[list[AclBinding]] = _Follower(
            coord, ACL_PARENTS if acls is not None else (), _decode_acls
        )
        self.users: _Follower[dict[str, ScramCredential]] = _Follower(coord, (USERS,), _decode_user)
        self._lost = coord.session_lost()

    # ------------------------------------------------------------------ the copies

    async def load(self, data_dir: Path | None) -> None:
        """Copy a data dir's single-node ACLs and users into ZooKeeper (:meth:`migrate`),
        then read everything, watches set. Tries again while ZooKeeper fails."""
        while True:
            self._lost = self.coord.session_lost()
            try:
                for parent in (*self.acls.parents, USERS):
                    try:
                        await self.coord.create(parent, b"")
                    except NodeExists:
                        pass
                if data_dir is not None:
                    await self.migrate(data_dir)
                await self._refresh(force=True)
                return
            except NotAuthorized:
                raise  # the login does not match the znodes' ACLs: no retry mends that
            except CoordinationError as exc:
                log.warning("reading ACLs and SCRAM users from ZooKeeper: %s", exc)
                await trio.sleep(RETRY_S)

    async def follow(self) -> None:
        """Keep the copies equal to ZooKeeper's, until cancelled (after :meth:`load`)."""
        while True:
            await wait_any(self._lost, *self.acls.watches(), *self.users.watches())
            if self._lost.is_set():
                self.acls.forget_watches()
                self.users.forget_watches()
            self._lost = self.coord.session_lost()
            try:
                await self._refresh()
            except CoordinationError as exc:
                log.warning("reading ACLs and SCRAM users from ZooKeeper: %s", exc)
                await trio.sleep(RETRY_S)  # the fired watches stay fired: read again

    async def _refresh(self, *, force: bool = False) -> None:
        acls_changed = await self.acls.refresh()
        users_changed = await self.users.refresh()
        self._publish(acls=acls_changed or force, users=users_changed or force)

    def _publish(self, *, acls: bool, users: bool) -> None:
        if acls and self.acl_store is not None:
            self.acl_store.mirror(
                b for _, (_, bindings) in sorted(self.acls.values.items()) for b in bindings
            )
        if users:
            self.credential_store.mirror(
                {user_of_path(p): creds for p, (_, creds) in self.users.values.items()}
            )

    # ------------------------------------------------------------------ writes

    async def _write(
        self, follower: _Follower[T], path: str, change: Callable[[bytes | None], bytes | None],
        decode: Callable[[str, bytes], T],
    ) -> None:  # fmt: skip
        """One conditional update, bounded in time; the copy takes it at once (a client
        that reads back through this broker sees its change)."""
        if isinstance(self.coord, ZooKeeperCoordination) and self.coord.disconnected_since:
            raise SharedStoreError("ZooKeeper is unreachable: nothing was changed")
        try:
            with trio.fail_after(WRITE_TIMEOUT_S):
                _, old_version, new, version = await update_znode(self.coord, path, change)
        except trio.TooSlowError:
            raise SharedStoreError(
                f"ZooKeeper did not answer within {WRITE_TIMEOUT_S:g} s "
                "(the change may still be applied when it does)"
            ) from None
        except CoordinationDataError as exc:
            raise SharedStoreError(f"{path} is unreadable ({exc}): fix or delete it") from None
        except CoordinationError as exc:
            raise SharedStoreError(f"ZooKeeper: {exc}") from None
        value = None if new is None else decode(path, new)
        if follower.offer(path, version, value, known=old_version):
            self._publish(acls=follower is self.acls, users=follower is self.users)

    async def add_acls(self, bindings: Sequence[AclBinding]) -> list[str | None]:
        failed: dict[AclResource, str] = {}
        for resource, new in group_by_resource(bindings).items():

            def union(raw: bytes | None, resource: AclResource = resource,
                      new: list[AclBinding] = new) -> bytes:  # fmt: skip
                current = [] if raw is None else decode_acls(raw, resource)
                return encode_acls(dict.fromkeys([*current, *new]))

            try:
                await self._write(self.acls, acl_path(*resource), union, _decode_acls)
            except SharedStoreError as exc:
                failed[resource] = f"cannot store ACLs: {exc}"
        return [failed.get((b.resource_type, b.resource_name, b.pattern_type)) for b in bindings]

    async def remove_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Every resource znode in ZooKeeper (not only in this broker's copy, which may
        lag) that the filters could match loses the bindings they match."""
        removed: list[list[AclBinding]] = [[] for _ in filters]
        for path in await self._acl_resource_paths():
            try:
                resource = resource_of_path(path)
            except CoordinationDataError as exc:
                log.error("ignoring %s: %s", path, exc)
                continue
            if not any(_may_match(f, resource) for f in filters):
                continue
            gone: list[AclBinding] = []

            def without(raw: bytes | None, resource: AclResource = resource,
                        gone: list[AclBinding] = gone) -> bytes | None:  # fmt: skip
                gone.clear()
                if raw is None:
                    return None
                current = decode_acls(raw, resource)
                gone.extend(b for b in current if any(f.matches(b) for f in filters))
                kept = [b for b in current if b not in gone]
                return raw if not gone else encode_acls(kept) if kept else None

            await self._write(self.acls, path, without, _decode_acls)
            for i, acl_filter in enumerate(filters):
                removed[i].extend(b for b in gone if acl_filter.matches(b))
        return removed

    async def _acl_resource_paths(self) -> list[str]:
        try:
            with trio.fail_after(WRITE_TIMEOUT_S):
                return [
                    f"{parent}/{name}"
                    for parent in ACL_PARENTS
                    for name in (await self.coord.children_and_watch(parent))[0]
                ]
        except trio.TooSlowError:
            raise SharedStoreError(
                f"ZooKeeper did not answer within {WRITE_TIMEOUT_S:g} s"
            ) from None
        except CoordinationError as exc:
            raise SharedStoreError(f"ZooKeeper: {exc}") from None

    async def put_credential(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        def put(raw: bytes | None) -> bytes:
            config = {} if raw is None else decode_user_config(raw, user)
            return encode_user_config({**config, mechanism: credential_text(credential)})

        await self._write(self.users, user_path(user), put, _decode_user)

    async def delete_credential(self, user: str, mechanism: str) -> bool:
        found = False

        def delete(raw: bytes | None) -> bytes | None:
            nonlocal found
            config = {} if raw is None else decode_user_config(raw, user)
            found = mechanism in config
            if not found:
                return raw
            rest = {k: v for k, v in config.items() if k != mechanism}
            return encode_user_config(rest) if rest else None

        await self._write(self.users, user_path(user), delete, _decode_user)
        return found

    # ------------------------------------------------------------------ migration

    async def migrate(self, data_dir: Path) -> None:
        """A broker joining a cluster with ACLs or users of its single-node days: each
        resource's bindings and each user ZooKeeper does not have yet are copied there
        (what ZooKeeper has wins: it is what the cluster has decided since), and the
        files are renamed ``*.migrated`` so that a later start does not copy them again
        (which would bring back what the cluster deleted meanwhile)."""
        acl_file, users_file = data_dir / ACL_FILE, data_dir / CREDENTIALS_FILE
        if acl_file.exists():
            try:
                file_bindings = AclStore(data_dir).bindings()
            except (OSError, ValueError, KeyError) as exc:
                log.error("%s not copied into ZooKeeper (unreadable: %s)", acl_file, exc)
            else:
                copied = skipped = 0
                for resource, bindings in group_by_resource(file_bindings).items():
                    if await self._create(acl_path(*resource), encode_acls(bindings)):
                        copied += 1
                        log.info("copied %d ACLs of %s %r (%s) from %s into ZooKeeper",
                                 len(bindings), resource[0].name, resource[1],
                                 resource[2].name, acl_file)  # fmt: skip
                    else:
                        skipped += 1
                        log.warning("not copying the ACLs of %s %r (%s) from %s: ZooKeeper "
                                    "has ACLs for it already", resource[0].name, resource[1],
                                    resource[2].name, acl_file)  # fmt: skip
                _set_aside(acl_file, f"{copied} resources copied, {skipped} kept ZooKeeper's")
        if users_file.exists():
            try:
                users = CredentialStore(users_file).users()
            except (OSError, ValueError, KeyError) as exc:
                log.error("%s not copied into ZooKeeper (unreadable: %s)", users_file, exc)
                return
            copied = skipped = 0
            for user, credentials in sorted(users.items()):
                if await self._create(user_path(user), encode_user(credentials)):
                    copied += 1
                    log.info("copied SCRAM user %r from %s into ZooKeeper", user, users_file)
                else:
                    skipped += 1
                    log.warning("not copying SCRAM user %r from %s: ZooKeeper has it already",
                                user, users_file)  # fmt: skip
            _set_aside(users_file, f"{copied} users copied, {skipped} kept ZooKeeper's")

    async def _create(self, path: str, data: bytes) -> bool:
        try:
            await self.coord.create(path, data)
        except NodeExists:
            return False
        return True


def _set_aside(path: Path, summary: str) -> None:
    moved = path.with_name(path.name + MIGRATED_SUFFIX)
    rename_durably([(path, moved)])
    log.warning("%s: %s; renamed to %s (ZooKeeper holds them now)", path, summary, moved.name)


def _decode_acls(path: str, raw: bytes) -> list[AclBinding]:
    return decode_acls(raw, resource_of_path(path))


def _decode_user(path: str, raw: bytes) -> dict[str, ScramCredential]:
    return decode_user(raw, user_of_path(path))


def _may_match(acl_filter: AclFilter, resource: AclResource) -> bool:
    """Whether the filter's resource part could match a binding of ``resource``."""
    probe = AclBinding(*resource, "User:*", "*", Operation.READ, Permission.ALLOW)
    wide = attrs.evolve(
        acl_filter, principal=None, host=None, operation=Operation.ANY, permission=Permission.ANY
    )
    return wide.matches(probe)
