"""What the shell's parts need of the broker that owns them, as protocols.

The Broker builds connections, the handler pool and the metrics responder and
hands itself in; typing them against these protocols instead of the Broker keeps
``server/broker.py`` the top of the shell (it imports them, never the reverse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import trio

    from trio_broker.config import BrokerConfig
    from trio_broker.groups.share import ShareGroups
    from trio_broker.handlers.base import HandlerSpec, Services
    from trio_broker.protocol.messages import RequestHeader
    from trio_broker.security.credentials import CredentialStore
    from trio_broker.server.histogram import RequestStages
    from trio_broker.server.memory_budget import MemoryBudget
    from trio_broker.services.stats import BrokerStats


class RequestQueue(Protocol):
    """The handler pool as a connection sees it."""

    @property
    def stages(self) -> RequestStages:
        """Where the connection records a request's stage times once its answer is out."""
        ...

    async def submit(
        self, conn: Any, slot: int, header: RequestHeader, body: Any, principal: str
    ) -> None: ...

    def try_submit(
        self, conn: Any, slot: int, header: RequestHeader, body: Any, principal: str
    ) -> bool: ...


class PoolHost(Services, Protocol):
    """What the handler pool needs: the services for the handlers, and where to wait."""

    @property
    def router(self) -> dict[int, HandlerSpec]: ...
    @property
    def root_nursery(self) -> trio.Nursery: ...


class ConnectionHost(Protocol):
    """What a connection needs: limits, the memory budget, the queue, the capture tap."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def stats(self) -> BrokerStats: ...
    @property
    def memory(self) -> MemoryBudget: ...
    @property
    def router(self) -> dict[int, HandlerSpec]: ...
    @property
    def handler_pool(self) -> RequestQueue: ...
    @property
    def capture(self) -> Any: ...
    @property
    def root_nursery(self) -> trio.Nursery: ...
    @property
    def tls_contexts(self) -> dict[str, Any]: ...
    @property
    def credentials(self) -> CredentialStore: ...
    @property
    def sasl_decoy_secret(self) -> bytes: ...
    @property
    def shares(self) -> ShareGroups: ...
