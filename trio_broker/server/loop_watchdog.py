"""The event loop's lag: how late a periodic sleep wakes, and who held the loop.

Every request, timer and heartbeat of the broker runs on one Trio loop, so a task
that computes for a second without a checkpoint delays all of them by a second
(issue 28: a backtracking regex froze a broker 27 s). This task sleeps
:data:`INTERVAL_S` at a time and measures how late it wakes; /metrics exports the
lag as ``trio_broker_event_loop_lag_seconds``. A wake :data:`STALL_S` or more late
is a stall: it is counted (``trio_broker_event_loop_stalls_total``) and logged as a
WARN on ``trio_broker.loop`` naming the requests the handler pool was running
during it — the likely culprit.

A coarse sampler rather than a ``trio.abc.Instrument``: an instrument's
``before_task_step``/``after_task_step`` run on every step of every task (both
measured, docs/reliability.md), while this costs 20 wake-ups a second whatever the
load. It sees stalls as long as its interval and longer, which is what matters.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from trio_broker.protocol.messages import API_KEY_NAMES
from trio_broker.server.histogram import LatencyHistogram

if TYPE_CHECKING:
    from trio_broker.server.handler_pool import HandlerPool

log = logging.getLogger("trio_broker.loop")

#: How often the loop is sampled.
INTERVAL_S = 0.05
#: A wake this late or later is a stall: counted and logged.
STALL_S = 0.2
#: Upper bounds (seconds) of the lag histogram: 1 ms to 30 s.
LAG_BOUNDS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class LoopWatchdog:
    def __init__(
        self, pool: HandlerPool, interval_s: float = INTERVAL_S, stall_s: float = STALL_S
    ) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.stall_s = stall_s
        #: Lag of each wake, unlabelled (key 0).
        self.lag = LatencyHistogram(LAG_BOUNDS)
        self.stalls = 0
        #: The longest lag seen, seconds.
        self.max_lag = 0.0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            # perf_counter, not trio's clock: the handler pool stamps requests with it,
            # and a test's mock clock must not read as lag.
            due = time.perf_counter() + self.interval_s
            await trio.sleep(self.interval_s)
            woke = time.perf_counter()
            lag = max(0.0, woke - due)
            self.lag.observe(0, lag)
            if lag > self.max_lag:
                self.max_lag = lag
            if lag >= self.stall_s:
                self.stalls += 1
                self._warn(due, woke, lag)

    def _warn(self, due: float, woke: float, lag: float) -> None:
        culprits = [
            f"{API_KEY_NAMES.get(r.api_key, f'api_{r.api_key}').lower()} (key {r.api_key} "
            f"v{r.api_version}, correlation id {r.correlation_id}, client {r.client}, "
            f"{r.client_id!r}, handler ran {_ms(r.ran_for(woke))} ms)"
            for r in self.pool.requests_during(due, woke)
        ]
        log.warning(
            "event loop stalled %d ms; %s",
            round(lag * 1000),
            "requests being handled: " + "; ".join(culprits)
            if culprits
            else "no request handler was running (connection I/O, a deferred response or "
            "a background task)",
        )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
