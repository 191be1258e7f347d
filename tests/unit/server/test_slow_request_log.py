"""The slow-request log's per-second line budget (HandlerPool._slow)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from trio_broker.config import load_config
from trio_broker.protocol.messages import RequestHeader
from trio_broker.server.handler_pool import SLOW_LOG_LINES_PER_S, HandlerPool
from trio_broker.services.stats import BrokerStats


def _slow(pool: HandlerPool, correlation_id: int, completed: float) -> None:
    header = RequestHeader(0, 9, correlation_id, "producer")
    conn: Any = SimpleNamespace(client_address="127.0.0.1:5000")
    ctx: Any = SimpleNamespace(header=header, principal="User:ANONYMOUS")
    pool._slow(conn, ctx, completed - 2.0, completed - 1.9, completed - 1.8, completed, None)


def test_past_the_budget_slow_requests_are_counted_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An overloaded broker finds every request slow: it logs SLOW_LOG_LINES_PER_S lines
    a second, counts every slow request, and says how many it did not log."""
    caplog.set_level(logging.INFO)
    broker: Any = SimpleNamespace(config=load_config(request_log_slow_ms=1), stats=BrokerStats())
    pool = HandlerPool(broker, 1)
    extra = 30
    for n in range(SLOW_LOG_LINES_PER_S + extra):  # all within one second
        _slow(pool, n, 100.0 + n / 1000)
    lines = [r for r in caplog.records if r.name == "trio_broker.requests"]
    assert [r.fields["correlation_id"] for r in lines] == list(range(SLOW_LOG_LINES_PER_S))  # type: ignore[attr-defined]
    assert broker.stats.slow_requests == SLOW_LOG_LINES_PER_S + extra
    assert pool.slow_unlogged == extra
    assert not [r for r in caplog.records if r.name == "trio_broker.handlers"]

    _slow(pool, 999, 101.5)  # a new second: logged again, after a line on what was not
    summary = [r.getMessage() for r in caplog.records if r.name == "trio_broker.handlers"]
    assert len(summary) == 1 and summary[0].startswith(f"{extra} slow requests not logged")
    lines = [r for r in caplog.records if r.name == "trio_broker.requests"]
    assert lines[-1].fields["correlation_id"] == 999  # type: ignore[attr-defined]
    assert (
        pool.slow_unlogged == extra
        and broker.stats.slow_requests == SLOW_LOG_LINES_PER_S + extra + 1
    )
