"""What every API handler sees: the request context, the registry, deferred responses.

A handler is ``async def handle(ctx, request) -> response`` registered for one
API key and a version range with :func:`handles`. It returns the response
message, ``None`` for "no response" (Produce with acks=0), or a
:class:`Deferred` when the answer must wait (an fsync, a long-poll fetch). The
handler task then moves on to the connection's next request: that is the
pipelined model. The connection still sends responses in request order.

Handlers are sans-I/O: they import no trio and never see the Broker. What they
need comes through ``ctx.services`` (the :class:`Services` protocol: topics,
producer states, quotas, authorizer, durability, appends, clock), and waiting is
an effect the shell performs: a :class:`Deferred` whose coroutine awaits only
service calls, under a deadline the shell enforces (``timeout_s``).

This module is a leaf of the handler layer: it imports nothing from the layers
above it (docs/architecture.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from trio_broker.protocol.messages import RequestHeader
from trio_broker.protocol.schema import REQUESTS, Message
from trio_broker.services.local_replication import DataReplication
from trio_broker.services.topic_admin import TopicAdmin

if TYPE_CHECKING:
    from trio_broker.config import BrokerConfig
    from trio_broker.groups.coordinator import GroupCoordinator
    from trio_broker.groups.share import ShareGroups
    from trio_broker.groups.share_coordinator import PartitionedShareCoordinator
    from trio_broker.security.authorize import Authorizer
    from trio_broker.security.credentials import CredentialStore
    from trio_broker.security.sasl import SaslSession
    from trio_broker.security.shared_store import SharedSecurity
    from trio_broker.services.own_partition import OwnPartition
    from trio_broker.services.producers import ProducerStateRegistry
    from trio_broker.services.quotas import QuotaService
    from trio_broker.services.stats import BrokerStats
    from trio_broker.services.topics import TopicManager
    from trio_broker.state.fetch_sessions import FetchSessionCache
    from trio_broker.storage.log_protocol import Log
    from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator


ANONYMOUS = "User:ANONYMOUS"


@attrs.frozen
class ClientInfo:
    connection_id: int
    host: str
    port: int


class DurableWait(Protocol):
    """One write's wait for its fsync, from :meth:`Durability.watch_durable`."""

    def check(self) -> bool:
        """True once durable, False while waiting; raises the sync's error if it failed."""
        ...

    def cancel(self) -> None: ...


class Durability(Protocol):
    """Group commit (the flusher): when appended bytes are on disk."""

    def mark_dirty(self, log: Log, messages: int = 1) -> None: ...
    async def wait_durable(self, log: Log, offset: int) -> None: ...
    def watch_durable(self, log: Log, offset: int, wake: Callable[[], None]) -> DurableWait:
        """:meth:`wait_durable` without a task: ``wake()`` when it may be done."""
        ...

    def recover_soon(self, log: Log) -> None: ...


#: A partition a follower asked for: (topic name or id, partition, fetch offset, current
#: leader epoch or -1).
FollowerFetchPartition = tuple[str | uuid.UUID, int, int, int]


class FetchWait(Protocol):
    """A long poll's watch on its partitions, from :meth:`Appends.watch` (right after
    its first read, so that no later change is missed) until its ``with`` block ends."""

    def __enter__(self) -> FetchWait: ...
    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None: ...
    async def changed(self) -> AbstractSet[tuple[str, int]]:
        """Wait for a change to a watched partition; the partitions that changed."""
        ...

    def take(self) -> AbstractSet[tuple[str, int]]:
        """The watched partitions that changed since the last look (empty: none)."""
        ...

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """``wake`` on each change, until the returned function ends the watch."""
        ...


class Appends(Protocol):
    """Wake-ups for long-poll fetches, by partition (server/fetch_waits.py)."""

    def notify(self, topic: str, partition: int) -> None:
        """The partition changed (an append, its HW or LSO moved, its leadership ended)."""
        ...

    def notify_all(self) -> None: ...
    def watch(self, partitions: Iterable[tuple[str, int]]) -> FetchWait: ...


class Services(Protocol):
    """Everything a handler may use; the Broker owns each as a plain field."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def topics(self) -> TopicManager: ...
    @property
    def producers(self) -> ProducerStateRegistry: ...
    @property
    def quotas(self) -> QuotaService: ...
    @property
    def authorizer(self) -> Authorizer | None: ...
    @property
    def credentials(self) -> CredentialStore: ...
    @property
    def shared_security(self) -> SharedSecurity | None:
        """Where ACL and SCRAM changes go in a cluster (ZooKeeper); None: alone, the
        authorizer's and credentials' own stores."""
        ...

    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def shares(self) -> ShareGroups:
        """Share groups (KIP-932): membership, share partitions, share sessions."""
        ...

    @property
    def share_coordinator(self) -> PartitionedShareCoordinator:
        """The share coordinator of the ``__share_group_state`` partitions this broker
        leads (alone its one partition), and the way to the others'."""
        ...

    @property
    def own_internal_topics(self) -> Mapping[str, OwnPartition]:
        """Alone, the internal topics' one partition each, kept by this broker for its
        coordinators (services/own_partition.py), which clients read as topics; in a
        cluster none (they are the topic manager's)."""
        ...

    @property
    def durability(self) -> Durability: ...
    @property
    def appends(self) -> Appends: ...
    @property
    def stats(self) -> BrokerStats: ...
    @property
    def fetch_sessions(self) -> FetchSessionCache[Any, Any]: ...
    @property
    def leaders(self) -> DataReplication:
        """The data path's replication: never None (``DataReplication``)."""
        ...

    @property
    def admin(self) -> TopicAdmin:
        """Where topic and config changes go: never None (``services/topic_admin.py``)."""
        ...

    @property
    def transactions(self) -> PartitionedTransactionCoordinator:
        """The transaction coordinator, never None: a node alone's leads the one
        partition of its ``__transaction_state`` (trio_broker/transactions)."""
        ...

    @property
    def shutting_down(self) -> bool: ...
    def now_ms(self) -> int:
        """Wall-clock milliseconds: the one clock of the broker (injected, for tests)."""
        ...

    def monotonic_ms(self) -> float:
        """The event loop's clock in ms (session lifetimes, deadlines)."""
        ...

    def advertised_for(self, connection_id: int | None) -> tuple[str, int]:
        """The address Metadata gives a client: that of the listener it connected to."""
        ...

    def listener_name_for(self, connection_id: int | None) -> str:
        """The name of the listener a client connected to (cluster Metadata answers with
        every broker's endpoint on that listener)."""
        ...

    async def run_off_loop(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` in a worker thread (CPU-heavy or blocking work)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


@attrs.frozen
class RequestContext:
    header: RequestHeader
    services: Services
    client: ClientInfo
    #: Who sent the request, as Kafka writes principals ("User:alice"): decided by
    #: the connection when it read the request (SASL or the TLS certificate),
    #: "User:ANONYMOUS" on an unauthenticated listener.
    principal: str = ANONYMOUS
    #: On a SASL listener, the connection's login (the SASL handlers drive it).
    sasl: SaslSession | None = None

    @property
    def api_version(self) -> int:
        return self.header.api_version

    def now_ms(self) -> int:
        return self.services.now_ms()


#: How long (ms) a handler walking many items computes before it gives the event loop
#: back (:class:`LoopBudget`).
LOOP_SLICE_MS = 10.0


class LoopBudget:
    """Gives the event loop back every :data:`LOOP_SLICE_MS` of a handler's work.

    Every client shares the broker's one event loop: a handler that walks ten thousand
    topics, partitions or ids in one go holds every other request, timer and heartbeat
    until it is done (issue 28). Such a handler calls ``await budget.tick()`` once per
    item, never between a check and the change it guards. The time is the loop's clock
    (``services.monotonic_ms``): a simulation's mock clock does not move while a handler
    computes, so there it never yields and the run stays deterministic.
    """

    __slots__ = ("_services", "_since")

    def __init__(self, services: Services) -> None:
        self._services = services
        self._since = services.monotonic_ms()

    async def tick(self) -> bool:
        """True when it gave the loop back: anything may have changed meanwhile."""
        if self._services.monotonic_ms() - self._since < LOOP_SLICE_MS:
            return False
        await self._services.sleep(0)
        self._since = self._services.monotonic_ms()
        return True


class Deferred:
    """A response that completes later: the shell awaits ``finish()`` off the handler task.

    ``finish`` awaits only service calls (durability, appends, run_off_loop, sleep).
    With ``timeout_s`` the shell stops waiting after that many seconds and answers
    ``on_timeout()`` instead (acks=all's timeout_ms, a long poll's max_wait_ms).
    """

    __slots__ = ("finish", "on_timeout", "timeout_s")

    def __init__(
        self,
        finish: Callable[[], Awaitable[Message | None]],
        *,
        timeout_s: float | None = None,
        on_timeout: Callable[[], Message | None] | None = None,
    ) -> None:
        self.finish = finish
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout

    def _map_timeout(
        self, change: Callable[[Message | None], None]
    ) -> Callable[[], Message | None] | None:
        on_timeout = self.on_timeout
        if on_timeout is None:
            return None

        def timed_out() -> Message | None:
            response = on_timeout()
            change(response)
            return response

        return timed_out

    def then(self, change: Callable[[Message | None], None]) -> Deferred:
        """The same answer, with ``change`` applied to it when it comes (a throttle time
        added), of the same kind and bound: a wrapper that must not know whether the
        shell awaits this answer or polls it (:class:`Polled`)."""
        finish = self.finish

        async def finished() -> Message | None:
            response = await finish()
            change(response)
            return response

        return Deferred(finished, timeout_s=self.timeout_s, on_timeout=self._map_timeout(change))


class NotReady:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_READY"


#: What :attr:`Polled.poll` returns while its answer must wait.
NOT_READY = NotReady()


class Polled(Deferred):
    """A Deferred the shell completes without a task of its own: it calls ``poll()``
    when the handler returns and again each time the callback it gave ``watch`` is
    called, until ``poll()`` returns the answer instead of :data:`NOT_READY`; past
    ``timeout_s`` it answers ``on_timeout()``.

    ``watch(wake)`` registers ``wake`` with whatever the answer waits on (a long poll's
    partitions) and returns the function that unregisters it, which the shell calls
    once the request is answered, timed out or failed. ``wake`` may be called from any
    task at any time, as often as the waited-on parties like: the shell only notes
    it and calls ``poll`` later, from its own task, never inside the caller's change.
    """

    __slots__ = ("poll", "watch")

    def __init__(
        self,
        poll: Callable[[], Message | NotReady | None],
        watch: Callable[[Callable[[], None]], Callable[[], None]],
        *,
        timeout_s: float | None = None,
        on_timeout: Callable[[], Message | None] | None = None,
    ) -> None:
        super().__init__(_polled_by_the_shell, timeout_s=timeout_s, on_timeout=on_timeout)
        self.poll = poll
        self.watch = watch

    def then(self, change: Callable[[Message | None], None]) -> Polled:
        poll = self.poll

        def polled() -> Message | NotReady | None:
            response = poll()
            if not isinstance(response, NotReady):
                change(response)
            return response

        return Polled(
            polled, self.watch, timeout_s=self.timeout_s, on_timeout=self._map_timeout(change)
        )


async def _polled_by_the_shell() -> Message | None:
    raise TypeError("a Polled answer is run by the shell (handler_pool._run_deferred)")


AnyMessage = TypeVar("AnyMessage", bound=Message)


async def when_applied(
    services: Services,
    finish: Callable[[], Awaitable[AnyMessage]],
    *,
    timeout_s: float | None = None,
    on_timeout: Callable[[], AnyMessage] | None = None,
) -> AnyMessage | Deferred:
    """An admin answer once ``services.admin`` has applied the change ``finish`` makes:
    at once on the handler task where the admin applies it when called (a node alone:
    the connection's next request sees it done), else a Deferred (ZooKeeper)."""
    if services.admin.applies_at_once:
        return await finish()
    return Deferred(finish, timeout_s=timeout_s, on_timeout=on_timeout)


class CloseConnection:
    """Answer by closing the connection (Kafka's reply to a failed acks=0 produce)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


Response = Message | Deferred | CloseConnection | None
#: The request is the API's message class (``m.ProduceRequest``); the registry keeps
#: handlers of every API side by side, so here it is ``Any``.
HandlerFn = Callable[[RequestContext, Any], Awaitable[Response]]
#: A handler keeps its own signature through ``handles`` (its request and response types).
AnyHandler = TypeVar("AnyHandler", bound=HandlerFn)


@attrs.frozen
class HandlerSpec:
    api_key: int
    min_version: int
    max_version: int
    fn: HandlerFn
    #: The minimum we *advertise*; Produce advertises 0 though it rejects v0-2
    #: (old librdkafka only enables features when exact versions are in range).
    advertised_min: int


#: api_key -> HandlerSpec, filled by the ``handles`` decorator at import time.
HANDLERS: dict[int, HandlerSpec] = {}


def handles(
    api_key: int, min_version: int | None = None, max_version: int | None = None,
    *, advertised_min: int | None = None,
) -> Callable[[AnyHandler], AnyHandler]:  # fmt: skip
    """Register a handler; the version range defaults to everything the codec has."""
    schema = REQUESTS[api_key]
    lo = schema.min_version if min_version is None else min_version
    hi = schema.max_version if max_version is None else max_version
    if not schema.min_version <= lo <= hi <= schema.max_version:
        raise ValueError(f"{schema.name}: {lo}-{hi} outside the codec's range")

    def register(fn: AnyHandler) -> AnyHandler:
        HANDLERS[api_key] = HandlerSpec(
            api_key, lo, hi, fn, lo if advertised_min is None else advertised_min
        )
        return fn

    return register
