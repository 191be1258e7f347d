"""SaslAuthenticate (36): one SASL token of the exchange (KIP-152 framing).

The token goes to the connection's sans-I/O :class:`SaslSession`. PLAIN salts the
password (thousands of PBKDF2 rounds), so it runs in a worker thread inside a
Deferred rather than in the handler task that other connections share. A failed
login is answered after ``FAILED_LOGIN_DELAY_S`` (Kafka delays too, KIP-306) from
a Deferred, and the connection closes once the answer is sent.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from trio_broker.handlers.base import (
    CloseConnection,
    Deferred,
    RequestContext,
    Response,
    handles,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.sasl import AuthStep, SaslSession

log = logging.getLogger("trio_broker.sasl")

Resp: Any = m.SaslAuthenticateResponse
FAILED_LOGIN_DELAY_S = 0.1


def _response(step: AuthStep) -> Any:
    return Resp(error_code=step.error_code, error_message=step.error_message,
                auth_bytes=step.auth_bytes, session_lifetime_ms=step.session_lifetime_ms)  # fmt: skip


@handles(m.ApiKey.SASL_AUTHENTICATE)
async def handle_sasl_authenticate(ctx: RequestContext, request: Any) -> Response:
    conn = ctx.broker.connections.get(ctx.client.connection_id)
    session = None if conn is None else conn.sasl
    if conn is None or session is None:
        return Resp(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                    error_message="SaslAuthenticate on a listener without SASL", auth_bytes=b"")  # fmt: skip
    token = bytes(request.auth_bytes or b"")
    now_ms = trio.current_time() * 1000

    async def finish(step: AuthStep) -> Any:
        if step.principal is not None:
            conn.principal = step.principal
            conn.frames.max_frame_size = ctx.broker.config.socket_request_max_bytes
            log.info("connection %d authenticated as %s with %s",
                     conn.id, step.principal, session.mechanism)  # fmt: skip
        elif session.failed:
            log.info("connection %d from %s: SASL authentication failed (%s)",
                     conn.id, ctx.client.host, session.reason)  # fmt: skip
            await trio.sleep(FAILED_LOGIN_DELAY_S)
        return _response(step)

    if session.busy:
        # A pipelined token while a PLAIN check runs in its thread: no client does
        # this, and the session must not change under the thread. Just close.
        return CloseConnection("SaslAuthenticate while the previous one is being checked")
    if session.mechanism == "PLAIN" and not session.failed:
        # Slow (PBKDF2): off the handler task, in a thread.
        session.busy = True
        return Deferred(lambda: _plain(session, token, now_ms, finish))
    step = session.authenticate(token, now_ms)
    if session.failed:
        return Deferred(lambda: finish(step))
    return await finish(step)


async def _plain(session: SaslSession, token: bytes, now_ms: float, finish: Any) -> Any:
    try:
        step = await trio.to_thread.run_sync(session.authenticate, token, now_ms)
    finally:
        session.busy = False
    return await finish(step)
