"""Client quotas (trio_broker/state/quota.py) against a plain model of Kafka's rules.

The throttle machine drives a real connection's mute from quota breaches it makes up;
this one drives the rules that decide a breach: ``QuotaManager.record`` for a few users
and client ids under quotas set at every level (Kafka's eight entity forms, defaults
included), at times the machine moves. The model states Kafka's rules directly:

1. the quota that applies is the most specific configured one, in Kafka's order
   (user+client, user+<default> client, user, <default> user+client, <default>
   user+<default> client, <default> user, client, <default> client);
2. usage is counted per sensor: a quota set for a user (or a user and client) is shared
   by that user's clients, one set by a default is counted per actual user / client id
   (Kafka's metric tags), so one busy client never throttles another under a default;
3. the rate is the sum of the samples kept (``quota.window.num`` samples of
   ``quota.window.size.seconds``, a new sample when the current one is that old, one
   dropped once that many windows old) over the time since the oldest kept sample
   began, never less than ``samples - 1`` whole samples (a first burst is averaged over
   the window, not the milliseconds it took);
4. the throttle is ``(rate - quota) / quota * window``, rounded up, 0 at or under the
   quota, at most the whole window.
"""

from __future__ import annotations

import math

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from trio_broker.state.quota import (
    CLIENT_ID,
    PRODUCER_BYTE_RATE,
    USER,
    Entity,
    QuotaManager,
    QuotaTable,
    WindowConfig,
    make_entity,
)

USERS = ("alice", "bob")
CLIENTS = ("app", "cli")
WINDOW = WindowConfig(samples=4, sample_ms=100)

#: Every entity form Kafka allows, most specific first (rule 1), as (user, client):
#: a name, None for the default, or "" for "not part of the entity".
FORMS = (
    ("u", "c"), ("u", None), ("u", ""), (None, "c"), (None, None), (None, ""), ("", "c"),
    ("", None),
)  # fmt: skip


def _entity(user: str | None, client: str | None) -> Entity:
    pairs: list[tuple[str, str | None]] = []
    if user != "":
        pairs.append((USER, user))
    if client != "":
        pairs.append((CLIENT_ID, client))
    return make_entity(pairs)


@attrs.define
class ModelRate:
    #: [start_ms, total] per sample, oldest first.
    samples: list[list[float]] = attrs.field(factory=list)

    def record(self, value: float, now_ms: int) -> float:
        """Rule 3: add ``value`` at ``now_ms``; the rate per second after it."""
        horizon = WINDOW.samples * WINDOW.sample_ms
        self.samples = [s for s in self.samples if now_ms - s[0] < horizon]
        if not self.samples or now_ms - self.samples[-1][0] >= WINDOW.sample_ms:
            self.samples.append([now_ms, 0.0])
        self.samples[-1][1] += value
        elapsed = now_ms - self.samples[0][0]
        window = max(elapsed, (WINDOW.samples - 1) * WINDOW.sample_ms)
        return sum(total for _, total in self.samples) * 1000.0 / window

    def window_ms(self, now_ms: int) -> float:
        return max(now_ms - self.samples[0][0], (WINDOW.samples - 1) * WINDOW.sample_ms)


class QuotaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0
        self.quotas: dict[tuple[str | None, str | None], float] = {}
        self.manager: QuotaManager | None = None
        #: (user, client id) as the sensor names them ("" where the quota has none).
        self.rates: dict[tuple[str | None, str | None], ModelRate] = {}

    @initialize(
        configured=st.dictionaries(
            st.sampled_from(range(len(FORMS))), st.sampled_from((500.0, 2000.0)), min_size=1
        ),
        names=st.lists(st.sampled_from(USERS + CLIENTS), min_size=8, max_size=8),
    )
    def configure(self, configured: dict[int, float], names: list[str]) -> None:
        table: dict[Entity, dict[str, float]] = {}
        for index, bound in configured.items():
            user, client = FORMS[index]
            user = names[index] if user == "u" else user
            client = names[index] if client == "c" else client
            if user in CLIENTS or client in USERS:
                continue  # a name of the other kind: no client would match it
            self.quotas[(user, client)] = bound
            table[_entity(user, client)] = {PRODUCER_BYTE_RATE: bound}
        note(f"quotas {self.quotas}")
        self.manager = QuotaManager(QuotaTable(table), WINDOW)

    def _applies(
        self, user: str, client: str
    ) -> tuple[tuple[str | None, str | None], float] | None:
        """Rule 1: the configured quota Kafka's order finds first for this client."""
        for form_user, form_client in FORMS:
            key = (
                user if form_user == "u" else form_user,
                client if form_client == "c" else form_client,
            )
            if key in self.quotas:
                return key, self.quotas[key]
        return None

    @rule(ms=st.integers(0, 3 * WINDOW.sample_ms))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms

    @rule(
        user=st.sampled_from(USERS),
        client=st.sampled_from(CLIENTS),
        nbytes=st.sampled_from((1, 50, 300, 2000)),
    )
    def produce(self, user: str, client: str, nbytes: int) -> None:
        assert self.manager is not None
        got = self.manager.record(PRODUCER_BYTE_RATE, user, client, nbytes, self.now_ms)
        found = self._applies(user, client)
        if found is None:
            assert got == 0, f"{user}/{client} throttled {got} ms without a quota"
            return
        entity, bound = found
        # Rule 2: a default's usage is the actual user's / client's own.
        sensor = (
            user if entity[0] is None else entity[0],
            client if entity[1] is None else entity[1],
        )
        rate = self.rates.setdefault(sensor, ModelRate())
        per_second = rate.record(nbytes, self.now_ms)
        expected = 0
        if per_second > bound:  # rule 4
            delay = (per_second - bound) / bound * rate.window_ms(self.now_ms)
            expected = min(math.ceil(delay), WINDOW.max_throttle_ms)
        note(f"{user}/{client} +{nbytes} at {self.now_ms}: {per_second:.0f}/s, quota {bound}")
        assert got == expected, f"{user}/{client}: throttle {got} ms, the model says {expected}"


TestQuotaMachine = QuotaMachine.TestCase
TestQuotaMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
