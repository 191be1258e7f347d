"""What every API handler sees: the request context, the registry, deferred responses.

A handler is ``async def handle(ctx, request) -> response`` registered for one
API key and a version range with :func:`handles`. It returns the response
message, ``None`` for "no response" (Produce with acks=0), or a
:class:`Deferred` when the answer must wait (an fsync, a long-poll fetch). The
handler task then moves on to the connection's next request: that is the
pipelined model. The connection still sends responses in request order.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs

from trio_broker.protocol.messages import RequestHeader
from trio_broker.protocol.schema import REQUESTS, Message

if TYPE_CHECKING:
    from trio_broker.server.broker import Broker


ANONYMOUS = "User:ANONYMOUS"


@attrs.frozen
class ClientInfo:
    connection_id: int
    host: str
    port: int


@attrs.frozen
class RequestContext:
    header: RequestHeader
    broker: Broker
    client: ClientInfo
    #: Who sent the request, as Kafka writes principals ("User:alice"); set by SASL
    #: or the TLS certificate, "User:ANONYMOUS" on an unauthenticated listener.
    principal: str = ANONYMOUS

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000


class Deferred:
    """A response that completes later; ``finish`` runs in the broker's delayed-ops nursery."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], Awaitable[Message | None]]) -> None:
        self.finish = finish


class CloseConnection:
    """Answer by closing the connection (Kafka's reply to a failed acks=0 produce)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


Response = Message | Deferred | CloseConnection | None
HandlerFn = Callable[[RequestContext, Any], Awaitable[Response]]


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
) -> Callable[[HandlerFn], HandlerFn]:  # fmt: skip
    """Register a handler; the version range defaults to everything the codec has."""
    schema = REQUESTS[api_key]
    lo = schema.min_version if min_version is None else min_version
    hi = schema.max_version if max_version is None else max_version
    if not schema.min_version <= lo <= hi <= schema.max_version:
        raise ValueError(f"{schema.name}: {lo}-{hi} outside the codec's range")

    def register(fn: HandlerFn) -> HandlerFn:
        HANDLERS[api_key] = HandlerSpec(
            api_key, lo, hi, fn, lo if advertised_min is None else advertised_min
        )
        return fn

    return register
