"""Kafka's request quota (request_percentage) around every handler; see services/quotas.py."""

from __future__ import annotations

import time
from typing import Any

import attrs

from trio_broker.handlers.base import Deferred, HandlerSpec, RequestContext
from trio_broker.protocol.schema import Message
from trio_broker.services.quotas import EXEMPT_APIS
from trio_broker.state.quota import REQUEST_PERCENTAGE

# ---------------------------------------------------------------------- request_percentage


def _add_throttle(response: Any, delay_ms: int) -> None:
    if isinstance(response, Message) and hasattr(response, "throttle_time_ms"):
        response.throttle_time_ms = max(response.throttle_time_ms or 0, delay_ms)


def with_request_quota(spec: HandlerSpec) -> HandlerSpec:
    """Count the handler's time against ``request_percentage`` (Kafka's request quota).

    The time is the handler call itself (a deferred response's wait is not work),
    in Kafka's unit: percent of one thread, so 100 = one handler busy all the time.
    """
    if spec.api_key in EXEMPT_APIS:
        return spec
    inner = spec.fn

    async def timed(ctx: RequestContext, request: Any) -> Any:
        if ctx.services.quotas.table.empty:
            return await inner(ctx, request)
        started = time.perf_counter_ns()
        result = await inner(ctx, request)
        used = (time.perf_counter_ns() - started) * 100 / 1e9
        delay = ctx.services.quotas.throttle(ctx, REQUEST_PERCENTAGE, used)
        if delay <= 0:
            return result
        if isinstance(result, Deferred):
            # Its wait keeps its kind and bound (a long poll's max_wait_ms, acks=all's
            # timeout_ms); the throttle goes on the answer when it comes.
            return result.then(lambda response: _add_throttle(response, delay))
        _add_throttle(result, delay)
        return result

    return attrs.evolve(spec, fn=timed)
