"""Client quotas, sans-I/O: rates over a sampled window and Kafka's throttle time.

Kafka (KIP-13, KIP-55, KIP-219) measures each client's byte rate over
``quota.window.num`` samples of ``quota.window.size.seconds`` (11 x 1 s) and,
when a request takes the rate over the quota, answers at once with
``throttle_time_ms`` = the time the client must stay silent for the average
over the window to come back down to the quota; the broker then reads nothing
from that connection for that long. This module is the arithmetic and the
table of configured quotas; the Trio shell (``trio_broker.server.quotas``) feeds
it request sizes and mutes connections. No trio here.

Entities use the names of Kafka's dynamic quota configs: ``user`` and
``client-id``, each either a name or the default (``None`` here, ``<default>``
in config files). A client's quota is the first match in Kafka's precedence
order (:data:`PRECEDENCE`), looked up separately for each quota key.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping

import attrs

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
#: The quota keys enforced here.
QUOTA_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE})
USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)
#: How config files spell "the default entity of this type" (Kafka's ``<default>``).
DEFAULT_NAME = "<default>"

#: An entity: sorted ``(entity type, name or None for the default)`` pairs.
Entity = tuple[tuple[str, str | None], ...]


class QuotaConfigError(ValueError):
    """An entity or quota key that Kafka's rules do not allow; the message says which."""


@attrs.frozen
class WindowConfig:
    """Kafka's ``quota.window.num`` and ``quota.window.size.seconds`` (in ms here)."""

    samples: int = 11
    sample_ms: int = 1000

    @property
    def max_throttle_ms(self) -> int:
        """No throttle is longer than the whole measured window."""
        return self.samples * self.sample_ms


class SampledRate:
    """Kafka's ``Rate`` over a ``SampledStat``: a sum per sample, averaged over the window.

    The window is the time since the oldest kept sample began, but never less than
    ``samples - 1`` whole samples: a client's first burst is averaged over ten
    seconds rather than over the few milliseconds it took (Kafka does the same).
    """

    def __init__(self, window: WindowConfig) -> None:
        self.window = window
        #: [start_ms, total] per sample, oldest first; the last one is current.
        self._samples: deque[list[float]] = deque()

    def record(self, value: float, now_ms: int) -> None:
        self._purge(now_ms)
        if not self._samples or now_ms - self._samples[-1][0] >= self.window.sample_ms:
            self._samples.append([now_ms, 0.0])
        self._samples[-1][1] += value

    def _purge(self, now_ms: int) -> None:
        horizon = self.window.samples * self.window.sample_ms
        while self._samples and now_ms - self._samples[0][0] >= horizon:
            self._samples.popleft()

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(total for _, total in self._samples)

    def window_ms(self, now_ms: int) -> float:
        self._purge(now_ms)
        elapsed = float(now_ms - self._samples[0][0]) if self._samples else 0.0
        minimum = max(self.window.samples - 1, 1) * self.window.sample_ms
        return max(elapsed, float(minimum))

    def rate(self, now_ms: int) -> float:
        """Per second, over :meth:`window_ms`."""
        return self.total(now_ms) * 1000.0 / self.window_ms(now_ms)


def throttle_time_ms(rate: float, bound: float, window_ms: float, max_ms: int) -> int:
    """Kafka's throttle: how long the client must send nothing for ``rate`` to fall to ``bound``.

    ``(rate - bound) / bound * window``: 0 at or under the quota, growing with the
    overshoot, never more than ``max_ms``.

    pre: bound > 0 and window_ms > 0 and max_ms >= 0 and rate >= 0
    post: 0 <= __return__ <= max_ms
    """
    if rate <= bound:
        return 0
    delay = (rate - bound) / bound * window_ms
    # NaN or infinite (an infinite rate, found by CrossHair) saturate at the cap.
    if math.isnan(delay) or delay >= max_ms:
        return max_ms
    return math.ceil(delay)


# ---------------------------------------------------------------------- entities


def parse_entity(text: str) -> Entity:
    """``"user=alice,client-id=bench"`` -> entity; ``"default"`` is ``client-id=<default>``."""
    text = text.strip()
    if text == "default":
        return ((CLIENT_ID, None),)
    pairs: dict[str, str | None] = {}
    for part in text.split(","):
        kind, sep, name = part.strip().partition("=")
        kind = kind.strip()
        if not sep or kind not in ENTITY_TYPES:
            raise QuotaConfigError(
                f"quota entity {text!r}: expected user=NAME and/or client-id=NAME "
                f"(NAME may be {DEFAULT_NAME}), or 'default'"
            )
        if kind in pairs:
            raise QuotaConfigError(f"quota entity {text!r}: {kind} given twice")
        name = name.strip()
        pairs[kind] = None if name == DEFAULT_NAME else name
    return make_entity(pairs.items())


def make_entity(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    given = list(pairs)
    for kind, _ in given:
        if kind not in ENTITY_TYPES:
            raise QuotaConfigError(f"unknown quota entity type {kind!r}")
    if not given or len({k for k, _ in given}) != len(given):
        raise QuotaConfigError("a quota entity needs user and/or client-id, each once")
    return tuple(sorted(given, key=lambda p: ENTITY_TYPES.index(p[0])))


def format_entity(entity: Entity) -> str:
    return ",".join(f"{kind}={DEFAULT_NAME if name is None else name}" for kind, name in entity)


def check_quota(key: str, value: float) -> None:
    if key not in QUOTA_KEYS:
        raise QuotaConfigError(f"unknown quota key {key!r}; expected one of {sorted(QUOTA_KEYS)}")
    if not value > 0 or math.isinf(value):
        raise QuotaConfigError(f"{key} must be a positive number, got {value!r}")


def user_of(principal: str) -> str:
    """``"User:alice"`` -> ``"alice"`` (Kafka's user quotas name the principal's name)."""
    return principal.split(":", 1)[1] if ":" in principal else principal


def precedence(user: str, client_id: str) -> tuple[Entity, ...]:
    """Kafka's order of quota entities for a client, most specific first."""
    return (
        ((USER, user), (CLIENT_ID, client_id)),
        ((USER, user), (CLIENT_ID, None)),
        ((USER, user),),
        ((USER, None), (CLIENT_ID, client_id)),
        ((USER, None), (CLIENT_ID, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    )


def sensor_key(matched: Entity, user: str, client_id: str) -> Entity:
    """Whose usage counts against a matched quota: a user quota is shared by all that
    user's clients, a default quota is per client (Kafka's metric tags)."""
    actual = {USER: user, CLIENT_ID: client_id}
    return tuple((kind, actual[kind]) for kind, _ in matched)


# ---------------------------------------------------------------------- the table


class QuotaTable:
    """Configured quotas: static ones from the config file plus runtime changes.

    Runtime changes (AlterClientQuotas) are a layer over the static table; a
    removal is kept as ``None`` so it hides a static value too.
    """

    def __init__(
        self,
        static: Mapping[Entity, Mapping[str, float]] | None = None,
        dynamic: Mapping[Entity, Mapping[str, float | None]] | None = None,
    ) -> None:
        self.static = {e: dict(v) for e, v in (static or {}).items()}
        self.dynamic = {e: dict(v) for e, v in (dynamic or {}).items()}
        self._effective: dict[Entity, dict[str, float]] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        merged: dict[Entity, dict[str, float | None]] = {e: dict(v) for e, v in self.static.items()}
        for entity, values in self.dynamic.items():
            merged.setdefault(entity, {}).update(values)
        self._effective = {
            entity: {k: v for k, v in values.items() if v is not None}
            for entity, values in merged.items()
        }
        self._effective = {e: v for e, v in self._effective.items() if v}

    def alter(self, entity: Entity, key: str, value: float | None) -> None:
        """Set (``value``) or remove (``None``) one quota at runtime."""
        if value is not None:
            check_quota(key, value)
        elif key not in QUOTA_KEYS:
            raise QuotaConfigError(f"unknown quota key {key!r}")
        self.dynamic.setdefault(entity, {})[key] = value
        self._rebuild()

    @property
    def empty(self) -> bool:
        """No quota in force: the hot path can skip measuring altogether."""
        return not self._effective

    def effective(self) -> dict[Entity, dict[str, float]]:
        return {e: dict(v) for e, v in self._effective.items()}

    def lookup(self, key: str, user: str, client_id: str) -> tuple[Entity, float] | None:
        """The quota ``key`` for this client and the entity that set it, or None."""
        if not self._effective:  # the common case: no quotas configured at all
            return None
        for entity in precedence(user, client_id):
            value = self._effective.get(entity, {}).get(key)
            if value is not None:
                return entity, value
        return None


class QuotaManager:
    """Measures usage per client and answers with the throttle time (KIP-219)."""

    def __init__(self, table: QuotaTable, window: WindowConfig | None = None) -> None:
        self.table = table
        self.window = window or WindowConfig()
        self._rates: dict[tuple[str, Entity], SampledRate] = {}

    def record(self, key: str, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Count ``value`` (bytes) against the client's ``key`` quota; return the throttle ms."""
        found = self.table.lookup(key, user, client_id)
        if found is None:
            return 0
        entity, bound = found
        sensor = (key, sensor_key(entity, user, client_id))
        rate = self._rates.get(sensor)
        if rate is None:
            rate = self._rates[sensor] = SampledRate(self.window)
        rate.record(value, now_ms)
        return throttle_time_ms(
            rate.rate(now_ms), bound, rate.window_ms(now_ms), self.window.max_throttle_ms
        )

    def unrecord(self, key: str, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take back a recorded ``value`` (Kafka does for a throttled fetch it answers empty)."""
        found = self.table.lookup(key, user, client_id)
        if found is not None:
            rate = self._rates.get((key, sensor_key(found[0], user, client_id)))
            if rate is not None:
                rate.record(-value, now_ms)

    def max_in_window(self, key: str, user: str, client_id: str) -> float | None:
        """The most one response may carry, or None without a quota: the bound over the
        shortest window (Kafka's getMaxValueInQuotaWindow), so that a large fetch can never
        exceed the quota on its own and be answered empty for ever."""
        found = self.table.lookup(key, user, client_id)
        if found is None:
            return None
        return found[1] * max(self.window.samples - 1, 1) * self.window.sample_ms / 1000

    def forget_idle(self, now_ms: int) -> None:
        """Drop the rates of clients that sent nothing for a whole window (bounded memory)."""
        for sensor, rate in list(self._rates.items()):
            if rate.total(now_ms) == 0:
                del self._rates[sensor]
