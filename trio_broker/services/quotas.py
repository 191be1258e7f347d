"""The broker's client quotas: the table, runtime changes kept in the data dir, throttling.

Handlers call :meth:`QuotaService.throttle` with what a request cost (produce:
record bytes in; fetch: record bytes out). The answer goes into the response's
``throttle_time_ms`` and, as in Kafka since KIP-219, the connection is muted
(``THROTTLED``) for that long: the response is not delayed, the client's next
requests are. The arithmetic is sans-I/O in :mod:`trio_broker.state.quota`.

Runtime changes (AlterClientQuotas) are written to ``client-quotas.json`` in the
data dir (crash-safe write, :mod:`trio_broker.storage.durable`) and read back at
start, over the config file's ``[quotas]`` table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trio_broker.protocol.messages import ApiKey
from trio_broker.services.stats import BrokerStats
from trio_broker.state.quota import (
    Entity,
    QuotaConfigError,
    QuotaManager,
    QuotaTable,
    WindowConfig,
    format_entity,
    parse_entity,
    user_of,
)
from trio_broker.storage.durable import write_file_atomically

if TYPE_CHECKING:
    from trio_broker.config import BrokerConfig


class _Header(Protocol):
    @property
    def client_id(self) -> str | None: ...


class _Client(Protocol):
    @property
    def connection_id(self) -> int: ...


class Requester(Protocol):
    """What a quota needs of a request (RequestContext has it): who, which client, when."""

    @property
    def principal(self) -> str: ...
    @property
    def header(self) -> _Header: ...
    @property
    def client(self) -> _Client: ...
    def now_ms(self) -> int: ...


log = logging.getLogger("trio_broker.quotas")

STORE_NAME = "client-quotas.json"
#: Not counted against request_percentage, as in Kafka: a client must always be able to
#: learn the versions and authenticate.
EXEMPT_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.API_VERSIONS, ApiKey.SASL_AUTHENTICATE})
#: Rates of clients idle for a whole window are dropped every this many records.
FORGET_EVERY = 10_000


class QuotaService:
    def __init__(self, config: BrokerConfig, stats: BrokerStats | None = None) -> None:
        cfg = config
        self.stats = BrokerStats() if stats is None else stats
        #: Called with (connection id, delay ms) when a client went over a quota: the
        #: shell mutes that connection for the delay (KIP-219). Set by the Broker.
        self.on_throttle: Callable[[int, int], None] = lambda connection_id, delay_ms: None
        self.store: Path | None = cfg.data_dir / STORE_NAME if cfg.storage == "file" else None
        static = {
            parse_entity(name): {k: float(v) for k, v in values.items()}
            for name, values in cfg.quotas.items()
        }
        self.table = QuotaTable(static, self._load())
        window = WindowConfig(cfg.quota_window_num, cfg.quota_window_size_seconds * 1000)
        self.manager = QuotaManager(self.table, window)
        self._records = 0

    @staticmethod
    def attached_to(broker: Any) -> QuotaService:
        """The broker's quota service (its ``quotas`` field)."""
        service: QuotaService = broker.quotas
        return service

    # ------------------------------------------------------------------ persistence

    def _load(self) -> dict[Entity, dict[str, float | None]]:
        if self.store is None or not self.store.exists():
            return {}
        try:
            raw = json.loads(self.store.read_text())
            return {parse_entity(item["entity"]): dict(item["quotas"]) for item in raw["entities"]}
        except (OSError, ValueError, KeyError, TypeError, QuotaConfigError) as exc:
            # A broken store must not stop the broker; say so loudly.
            log.error("ignoring unreadable %s: %s", self.store, exc)
            return {}

    def _save(self) -> None:
        if self.store is None:
            return
        entities = [
            {"entity": format_entity(entity), "quotas": values}
            for entity, values in sorted(self.table.dynamic.items(), key=lambda i: str(i[0]))
        ]
        write_file_atomically(self.store, json.dumps({"entities": entities}, indent=1).encode())

    def alter(self, changes: list[tuple[Entity, str, float | None]]) -> None:
        """Apply every change (all validated first by the caller) and persist them."""
        for entity, key, value in changes:
            self.table.alter(entity, key, value)
        self._save()

    # ------------------------------------------------------------------ throttling

    def throttle(self, ctx: Requester, key: str, amount: float) -> int:
        """Count ``amount`` against the client's ``key`` quota; mute it if over. Returns ms."""
        if self.table.empty:
            return 0
        now = ctx.now_ms()
        client_id = ctx.header.client_id or ""
        delay = self.manager.record(key, user_of(ctx.principal), client_id, amount, now)
        self._records += 1
        if self._records % FORGET_EVERY == 0:
            self.manager.forget_idle(now)
        if delay > 0:
            stats = self.stats  # /metrics: throttled responses and ms, per quota
            stats.throttled_responses[key] = stats.throttled_responses.get(key, 0) + 1
            stats.throttle_ms[key] = stats.throttle_ms.get(key, 0) + delay
            self.on_throttle(ctx.client.connection_id, delay)
        return delay

    def unrecord(self, ctx: Requester, key: str, amount: float) -> None:
        client_id = ctx.header.client_id or ""
        self.manager.unrecord(key, user_of(ctx.principal), client_id, amount, ctx.now_ms())

    def max_bytes(self, ctx: Requester, key: str) -> int | None:
        """The most one response may carry under the client's ``key`` quota, or None."""
        client_id = ctx.header.client_id or ""
        limit = self.manager.max_in_window(key, user_of(ctx.principal), client_id)
        return None if limit is None else max(1, int(limit))
