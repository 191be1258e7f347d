"""The coordination service as the broker sees it: a small async API over ZooKeeper.

Only what the cluster needs: znodes with data and versions, ephemeral znodes that live
as long as the session, conditional updates, and one-shot watches. Two implementations:
:class:`ZooKeeperCoordination` (kazoo, its blocking calls in worker threads, its watch
callbacks handed to the event loop with a ``TrioToken``) and :class:`MemoryCoordination`
(one process, ZooKeeper's semantics, for tests and the deterministic simulation).

Access control is the ZooKeeper client's alone: with a login and ``set_acl``
(``zookeeper.set.acl``), :class:`ZooKeeperCoordination` creates each znode with the ACL
zk_security.py gives its path, and locks the root of the tree (the chroot, or ``/``)
when it starts, so that no one else can add or remove top-level znodes. The in-memory
twin has one trusted user and no ACLs.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import trio

from trio_broker.cluster.waiting import Signal, Watch
from trio_broker.cluster.zk_security import SECURE_ROOTS, sensitive_path
from trio_broker.security.zookeeper_login import ZooKeeperLogin
from trio_broker.security.zookeeper_tls import ZooKeeperTls

__all__ = [
    "BadVersion",
    "Coordination",
    "CoordinationError",
    "MemoryCoordination",
    "MemoryZooKeeper",
    "NoNode",
    "NodeExists",
    "NotAuthorized",
    "SessionLost",
    "Znode",
    "ZooKeeperCoordination",
]


#: kazoo's reconnection backoff stops growing here (seconds).
RECONNECT_MAX_DELAY_S = 1.0
#: At most this many ZooKeeper calls wait in worker threads at once.
ZOOKEEPER_THREADS = 32


class CoordinationError(Exception):
    """The coordination service refused or could not do an operation."""


class NodeExists(CoordinationError):
    pass


class NoNode(CoordinationError):
    pass


class NotAuthorized(CoordinationError):
    """ZooKeeper refused the login, or the znode's ACL refuses this client (NoAuth)."""


class BadVersion(CoordinationError):
    """A conditional update lost: someone else changed the znode first."""


class SessionLost(CoordinationError):
    """The session expired: every ephemeral znode it made is gone."""


@attrs.frozen
class Znode:
    data: bytes
    version: int
    #: ZooKeeper's transaction ids of the znode's creation (czxid) and of its last
    #: change (mzxid); 0 where unknown. They order writes across znodes: a partition
    #: state last written before its leader's registration was made is a previous
    #: life's (cluster/controller.py). Not part of equality (data and version are).
    created: int = attrs.field(default=0, eq=False)
    modified: int = attrs.field(default=0, eq=False)


class Coordination(Protocol):
    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        """Create ``path`` (and missing parents); NodeExists if it is there. Each znode
        gets the ACL of its path, when the implementation sets ACLs."""

    async def create_sequential(self, prefix: str, data: bytes) -> str:
        """Create a persistent znode named ``prefix`` plus ZooKeeper's 10-digit sequence
        number (and missing parents); the path made. Kafka's notification znodes."""

    async def get(self, path: str) -> Znode | None: ...

    async def owned_by_this_session(self, path: str) -> bool:
        """Is ``path`` an ephemeral znode of the current session? A create whose reply
        was lost (the connection dropped after the server made the znode) is tried
        again and finds NodeExists: this tells one's own from another's."""

    async def get_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[Znode | None, Watch]:
        """The znode now, and an event set on its next change (created, changed, deleted).

        ``into``: the event to set, instead of a new one; a task that watches many
        znodes passes one event to all of them and waits for that one."""

    async def children_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[list[str], Watch]:
        """Children now (none if ``path`` is missing), and an event set when they change
        (``into``, if given: as for :meth:`get_and_watch`)."""

    async def set(self, path: str, data: bytes, version: int) -> int:
        """Replace the data if the version is still ``version``; the new version."""

    async def delete(self, path: str, version: int = -1) -> None: ...

    async def set_fenced(self, path: str, data: bytes, version: int, fence: tuple[str, int]) -> int:
        """``set``, in one transaction with a check that znode ``fence[0]`` is still at
        version ``fence[1]`` (BadVersion if either moved): a deposed controller's writes
        fail once its successor bumped ``/controller_epoch``."""

    def session_lost(self) -> Watch:
        """Set when the current session expires (ephemerals gone); a new one follows."""

    async def stop(self) -> None:
        """Close the session for good."""


class ZooKeeperCoordination:
    """:class:`Coordination` over a real ZooKeeper ensemble, through kazoo."""

    def __init__(
        self,
        hosts: str,
        session_timeout_s: float = 6.0,
        *,
        login: ZooKeeperLogin | None = None,
        set_acl: bool = False,
        tls: ZooKeeperTls | None = None,
    ) -> None:
        """``login``: SASL DIGEST-MD5 as this user; ``set_acl``: create znodes with ACLs
        that only that user can change (needs ``login``); ``tls``: connect over TLS."""
        from kazoo.client import KazooClient  # a dependency of cluster mode only
        from kazoo.retry import KazooRetry

        if set_acl and login is None:
            raise ValueError("ACLs name the login's user: set_acl needs a login")
        self._login = login
        self._set_acl = set_acl

        # Reconnect at least every second while ZooKeeper is away (as Java's client
        # does): kazoo's default backoff grows to an hour, and a broker that comes back
        # after its session timeout finds its session expired.
        reconnect = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=RECONNECT_MAX_DELAY_S)
        sasl = None
        if login is not None:
            sasl = {"mechanism": "DIGEST-MD5", "username": login.username,
                    "password": login.password}  # fmt: skip
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout_s, connection_retry=reconnect, sasl_options=sasl,
            **(tls.kazoo_options() if tls is not None else {}),
        )  # fmt: skip
        # kazoo's calls wait while ZooKeeper is away (until it returns or the session
        # is known to be lost): their threads come from this limiter, never from the
        # one the storage's fsyncs use, and a cancelled caller abandons its thread.
        self._threads = trio.CapacityLimiter(ZOOKEEPER_THREADS)
        self._token: trio.lowlevel.TrioToken | None = None
        self._lost = Signal()
        self._stopped = False
        #: trio.current_time() when the connection to ZooKeeper dropped; None while
        #: connected. The session may still live (it expires on the server's clock).
        self.disconnected_since: float | None = None
        self._connection_changed = trio.Event()

    async def start(self, timeout_s: float = 15.0) -> None:
        from kazoo.protocol.states import KazooState, KeeperState

        self._token = trio.lowlevel.current_trio_token()
        #: The server refused the login: kazoo's start() then raises AuthFailedError,
        #: or, when its waiting thread looks only after the refusal closed the session
        #: (a loaded machine: ci20), a plain "Connection time-out".
        login_refused: list[bool] = []

        def on_state(state: Any) -> None:  # kazoo's thread: hand over, never block
            if state == KazooState.LOST:
                if self._client.client_state == KeeperState.AUTH_FAILED:
                    login_refused.append(True)
                self._from_kazoo(self._on_lost)
            self._from_kazoo(lambda: self._on_connection(state == KazooState.CONNECTED))

        self._client.add_listener(on_state)
        try:
            await self._in_thread(lambda: self._client.start(timeout=timeout_s))
        except Exception as exc:
            from kazoo import exceptions as kz

            if isinstance(exc, kz.AuthFailedError) or login_refused:
                raise NotAuthorized(self._login_refused()) from None
            raise
        if self._set_acl:
            await self._lock_root()

    def _login_refused(self) -> str:
        user = "?" if self._login is None else self._login.username
        return f"ZooKeeper refused the SASL login of user {user} (a wrong password or user)"

    def acl(self, path: str) -> list[Any] | None:
        """The ACL a znode at ``path`` gets (kazoo's), None for ZooKeeper's default (open).

        The login's user may do anything; the world may read, except sensitive paths."""
        if not self._set_acl:
            return None
        return self.secure_acl(path)

    def secure_acl(self, path: str) -> list[Any]:
        from kazoo.security import ACL, READ_ACL_UNSAFE, Id, Permissions

        assert self._login is not None
        owner = [ACL(Permissions.ALL, Id("sasl", self._login.username))]
        return owner if sensitive_path(path) else owner + list(READ_ACL_UNSAFE)

    async def _lock_root(self) -> None:
        """Give the tree's root (the chroot, or ``/``) the brokers' ACL: an open root lets
        anyone delete and recreate top-level znodes such as ``/controller``."""
        try:
            acl, _ = await self._call(self._client.get_acls, "/")
        except NoNode:  # a chroot not made yet: its parents stay open, outside the tree
            await self._call(lambda _path: self._make_chroot(), "/")
            return
        if set(acl) != set(self.secure_acl("/")):
            await self._call(self._client.set_acls, "/", self.secure_acl("/"))

    def _make_chroot(self) -> None:
        from kazoo.exceptions import NodeExistsError

        chroot = self._client.chroot
        self._client.chroot = ""  # (kazoo's calls prefix it; no other call runs yet)
        try:
            self._client.ensure_path(chroot.rsplit("/", 1)[0] or "/")
            try:
                self._client.create(chroot, b"", acl=self.secure_acl("/"))
            except NodeExistsError:
                self._client.set_acls(chroot, self.secure_acl("/"))
        finally:
            self._client.chroot = chroot

    async def set_acls_recursively(self, *, secure: bool) -> list[str]:
        """Set the ACL of every znode of the cluster's tree (the root and SECURE_ROOTS,
        recursively) to the brokers' (``secure``) or ZooKeeper's open one; the paths
        changed. What ``trio-broker cluster secure-zookeeper`` runs on an existing tree."""
        from kazoo.security import OPEN_ACL_UNSAFE

        def acl_of(path: str) -> list[Any]:
            return self.secure_acl(path) if secure else list(OPEN_ACL_UNSAFE)

        changed = []
        # Parents first: a znode is locked before its children, and a child made
        # meanwhile under an unlocked parent is found by the walk below it.
        pending = ["/", *SECURE_ROOTS]
        while pending:
            path = pending.pop(0)
            try:
                await self._call(self._client.set_acls, path, acl_of(path))
            except NoNode:
                continue
            changed.append(path)
            if path != "/":
                try:
                    children = await self._call(self._client.get_children, path)
                except NoNode:
                    continue
                pending.extend(f"{path}/{child}" for child in sorted(children))
        return changed

    async def _in_thread(self, fn: Any) -> Any:
        return await trio.to_thread.run_sync(fn, limiter=self._threads, abandon_on_cancel=True)

    def _on_connection(self, connected: bool) -> None:
        if connected:
            self.disconnected_since = None
        elif self.disconnected_since is None:
            self.disconnected_since = trio.current_time()
        self._connection_changed.set()
        self._connection_changed = trio.Event()

    def connected(self) -> bool:
        """kazoo's own view, read now. A change it reported reaches ``disconnected_since``
        only when the event loop runs the hand-over, which a stalled loop delays."""
        return bool(self._client.connected)

    def connection_changed(self) -> trio.Event:
        """Set at the next change of the connection state (see ``disconnected_since``)."""
        return self._connection_changed

    def _on_lost(self) -> None:
        self._lost.set()
        self._lost = Signal()  # the next session's

    async def stop(self) -> None:
        """Close the session (its ephemeral znodes go at once); runs even when cancelled.

        Calling it again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await self._in_thread(self._client.stop)
            await self._in_thread(self._client.close)

    def session_lost(self) -> Watch:
        return self._lost

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kazoo import exceptions as kz

        try:
            return await self._in_thread(lambda: fn(*args, **kwargs))
        except kz.NodeExistsError:
            raise NodeExists(args[0]) from None
        except kz.NoNodeError:
            raise NoNode(args[0]) from None
        except kz.BadVersionError:
            raise BadVersion(args[0]) from None
        except kz.AuthFailedError:
            raise NotAuthorized(self._login_refused()) from None
        except kz.NoAuthError:
            who = "no login" if self._login is None else f"user {self._login.username}"
            raise NotAuthorized(f"{args[0]}: NoAuth (its ACL does not admit {who})") from None
        except (kz.SessionExpiredError, kz.ConnectionLoss) as exc:
            raise SessionLost(f"{args[0]}: {type(exc).__name__}") from None
        except kz.KazooException as exc:
            raise CoordinationError(f"{args[0]}: {type(exc).__name__}: {exc}") from None

    def _watcher(self, into: Watch | None) -> tuple[Watch, Any]:
        event = Signal() if into is None else into
        return event, lambda _watched_event: self._from_kazoo(event.set)

    def _from_kazoo(self, fn: Any) -> None:
        """Run ``fn`` on the event loop, from one of kazoo's threads, without blocking it."""
        assert self._token is not None, "start() first"
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass  # a watch fired after the program's event loop ended

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await self._create(path, data, ephemeral=ephemeral)

    async def create_sequential(self, prefix: str, data: bytes) -> str:
        return await self._create(prefix, data, sequence=True)

    async def _create(
        self, path: str, data: bytes, *, ephemeral: bool = False, sequence: bool = False
    ) -> str:
        flags = {"ephemeral": ephemeral, "sequence": sequence}
        if not self._set_acl:
            return str(await self._call(self._client.create, path, data, makepath=True, **flags))
        # kazoo's makepath would give the parents this znode's ACL: each gets its own.
        try:
            return str(await self._call(self._client.create, path, data, acl=self.acl(path),
                                        **flags))  # fmt: skip
        except NoNode:
            parent = path.rsplit("/", 1)[0] or "/"
            if parent == "/":
                raise
            try:
                await self.create(parent, b"")
            except NodeExists:
                pass
            return str(await self._call(self._client.create, path, data, acl=self.acl(path),
                                        **flags))  # fmt: skip

    async def get(self, path: str) -> Znode | None:
        try:
            data, stat = await self._call(self._client.get, path)
        except NoNode:
            return None
        return Znode(data, stat.version, stat.czxid, stat.mzxid)

    async def owned_by_this_session(self, path: str) -> bool:
        stat = await self._call(self._client.exists, path)
        session = self._client.client_id  # (session id, password) once connected
        return stat is not None and session is not None and stat.ephemeralOwner == session[0]

    async def get_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[Znode | None, Watch]:
        event, watch = self._watcher(into)
        # exists() sets a watch whether or not the znode is there (get() would not).
        stat = await self._call(self._client.exists, path, watch=watch)
        if stat is None:
            return None, event
        try:
            data, stat = await self._call(self._client.get, path)
        except NoNode:
            return None, event  # deleted in between: the watch has fired already
        return Znode(data, stat.version, stat.czxid, stat.mzxid), event

    async def children_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[list[str], Watch]:
        event, watch = self._watcher(into)
        while True:
            try:
                children = await self._call(self._client.get_children, path, watch=watch)
                return sorted(children), event
            except NoNode:
                # Missing: watch for its creation. If it was created since, exists() finds
                # it and sets a data watch, which its children's changes do not fire (a
                # controller missed a new topic so): read its children again.
                if await self._call(self._client.exists, path, watch=watch) is None:
                    return [], event

    async def set(self, path: str, data: bytes, version: int) -> int:
        stat = await self._call(self._client.set, path, data, version=version)
        return int(stat.version)

    async def delete(self, path: str, version: int = -1) -> None:
        await self._call(self._client.delete, path, version=version)

    async def set_fenced(self, path: str, data: bytes, version: int, fence: tuple[str, int]) -> int:
        def commit() -> Any:
            transaction = self._client.transaction()
            transaction.check(fence[0], fence[1])
            transaction.set_data(path, data, version=version)
            return transaction.commit()

        results = await self._call(lambda _path: commit(), path)
        for result in results:
            if isinstance(result, Exception):
                from kazoo import exceptions as kz

                if isinstance(result, kz.NoNodeError):
                    raise NoNode(path)
                raise BadVersion(f"{path} (fenced by {fence[0]})")
        return int(results[1].version)


@attrs.define
class _Node:
    data: bytes
    version: int = 0
    owner: int | None = None  # the session of an ephemeral znode
    created: int = 0  # the server's zxid at creation, and at the last change
    modified: int = 0

    def znode(self) -> Znode:
        return Znode(self.data, self.version, self.created, self.modified)


@attrs.define(eq=False)
class MemoryZooKeeper:
    """One in-memory ZooKeeper shared by several :class:`MemoryCoordination` clients."""

    nodes: dict[str, _Node] = attrs.field(factory=lambda: {"/": _Node(b"")})
    watches: dict[str, list[Watch]] = attrs.field(factory=dict)
    child_watches: dict[str, list[Watch]] = attrs.field(factory=dict)
    _next_session: int = 1
    #: Per parent path, the next sequence number of :meth:`MemoryCoordination.create_sequential`.
    sequences: dict[str, int] = attrs.field(factory=dict)
    #: The last transaction id: every create and set takes the next one, as in ZooKeeper.
    zxid: int = 0

    def next_zxid(self) -> int:
        self.zxid += 1
        return self.zxid

    def open_session(self) -> int:
        self._next_session += 1
        return self._next_session - 1

    def expire(self, session: int) -> None:
        """The session is gone: delete its ephemerals (firing watches), as ZooKeeper does."""
        for path in [p for p, n in self.nodes.items() if n.owner == session]:
            self._remove(path)

    def _fire(self, table: dict[str, list[Watch]], path: str) -> None:
        for event in table.pop(path, []):
            event.set()

    def _remove(self, path: str) -> None:
        del self.nodes[path]
        self._fire(self.watches, path)
        self._fire(self.child_watches, _parent(path))


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class MemoryCoordination:
    """:class:`Coordination` against a :class:`MemoryZooKeeper`, with its own session.

    Models the client's side of ZooKeeper failures as kazoo shows them: :meth:`disconnect`
    (kazoo's SUSPENDED) fires every watch this client set and makes operations wait;
    :meth:`reconnect` lets them through, or, if the server expired the session meanwhile
    (:meth:`expire_session`), fails them with :class:`SessionLost`, sets
    :meth:`session_lost` and opens a new session (kazoo's LOST, then CONNECTED).
    """

    def __init__(self, server: MemoryZooKeeper) -> None:
        self._server = server
        self.session = server.open_session()
        self._lost = Signal()
        self._connected = trio.Event()
        self._connected.set()
        self._session_expired = False  # by the server, not yet known to this client
        #: Watches this client set and that have not fired yet.
        self._watches: list[Watch] = []

    async def stop(self) -> None:
        """Close the session: its ephemeral znodes go at once, as with a real server."""
        self._server.expire(self.session)

    def disconnect(self) -> None:
        """The connection to ZooKeeper broke; the session lives on the server meanwhile."""
        if self._connected.is_set():
            self._connected = trio.Event()
            self._fire_own_watches()

    def reconnect(self) -> None:
        """Connected again: in the same session, or told that it expired."""
        if self._session_expired:
            self._learn_session_lost()
        self._connected.set()

    def expire_session(self) -> None:
        """The server expires the session (its ephemerals go); a connected client learns
        at once, a disconnected one when it reconnects."""
        self._server.expire(self.session)
        self._session_expired = True
        if self._connected.is_set():
            self._learn_session_lost()

    def _learn_session_lost(self) -> None:
        self._session_expired = False
        self._fire_own_watches()
        self.session = self._server.open_session()
        self._lost.set()
        self._lost = Signal()

    def _fire_own_watches(self) -> None:
        for event in self._watches:
            event.set()
        self._watches.clear()

    def _watch(self, table: dict[str, list[Watch]], path: str, into: Watch | None) -> Watch:
        event = Signal() if into is None else into
        table.setdefault(path, []).append(event)
        self._watches = [e for e in self._watches if not e.is_set()]
        if event not in self._watches:
            self._watches.append(event)
        return event

    async def _connection(self) -> None:
        """Wait while disconnected, as kazoo queues requests; SessionLost if the session
        the caller started in expired meanwhile."""
        session = self.session
        await trio.lowlevel.checkpoint()
        if not self._connected.is_set():  # (a set Event's wait() would checkpoint again)
            await self._connected.wait()
        if self.session != session:
            raise SessionLost("session expired while disconnected")

    def session_lost(self) -> Watch:
        return self._lost

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await self._connection()
        nodes = self._server.nodes
        if path in nodes:
            raise NodeExists(path)
        missing = []
        parent = _parent(path)
        while parent not in nodes:
            missing.append(parent)
            parent = _parent(parent)
        for p in reversed(missing):
            zxid = self._server.next_zxid()
            nodes[p] = _Node(b"", created=zxid, modified=zxid)
            self._server._fire(self._server.child_watches, _parent(p))
        zxid = self._server.next_zxid()
        nodes[path] = _Node(
            data, owner=self.session if ephemeral else None, created=zxid, modified=zxid
        )
        self._server._fire(self._server.watches, path)
        self._server._fire(self._server.child_watches, _parent(path))

    async def create_sequential(self, prefix: str, data: bytes) -> str:
        # ZooKeeper numbers by the parent's count of child creations; one counter per
        # parent does the same here (numbers are never reused).
        parent = _parent(prefix)
        number = self._server.sequences.get(parent, 0)
        self._server.sequences[parent] = number + 1
        path = f"{prefix}{number:010d}"
        await self.create(path, data)
        return path

    async def get(self, path: str) -> Znode | None:
        await self._connection()
        node = self._server.nodes.get(path)
        return None if node is None else node.znode()

    async def owned_by_this_session(self, path: str) -> bool:
        await self._connection()
        node = self._server.nodes.get(path)
        return node is not None and node.owner == self.session

    async def get_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[Znode | None, Watch]:
        await self._connection()
        event = self._watch(self._server.watches, path, into)
        node = self._server.nodes.get(path)
        return (None if node is None else node.znode()), event

    async def children_and_watch(
        self, path: str, *, into: Watch | None = None
    ) -> tuple[list[str], Watch]:
        await self._connection()
        event = self._watch(self._server.child_watches, path, into)
        prefix = path.rstrip("/") + "/"
        names = [
            p[len(prefix) :]
            for p in self._server.nodes
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        ]
        return sorted(names), event

    def _node_at(self, path: str, version: int) -> _Node:
        """The znode, if it exists and (unless ``version`` is -1) is at that version."""
        node = self._server.nodes.get(path)
        if node is None:
            raise NoNode(path)
        if version != -1 and version != node.version:
            raise BadVersion(path)
        return node

    async def set(self, path: str, data: bytes, version: int) -> int:
        await self._connection()
        return self._set_now(path, data, version)

    def _set_now(self, path: str, data: bytes, version: int) -> int:
        node = self._node_at(path, version)
        node.data, node.version = data, node.version + 1
        node.modified = self._server.next_zxid()
        self._server._fire(self._server.watches, path)
        return node.version

    async def set_fenced(self, path: str, data: bytes, version: int, fence: tuple[str, int]) -> int:
        await self._connection()
        fence_node = self._server.nodes.get(fence[0])
        if fence_node is None or fence_node.version != fence[1]:
            raise BadVersion(f"{path} (fenced by {fence[0]})")
        return self._set_now(path, data, version)  # one transaction: no await in between

    async def delete(self, path: str, version: int = -1) -> None:
        await self._connection()
        self._node_at(path, version)
        self._server._remove(path)
