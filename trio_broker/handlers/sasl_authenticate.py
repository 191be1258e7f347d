"""SaslAuthenticate (36): one SASL token of the exchange (KIP-152 framing).

The token goes to the connection's sans-I/O :class:`SaslSession`. PLAIN salts the
password (thousands of PBKDF2 rounds), so the session hands out a
:class:`PasswordCheck` that runs in a worker thread inside a Deferred rather than
in the handler task that other connections share; its result goes back to the
session on the event loop, where the login completes in one step. A failed login
is answered after ``connection.failed.authentication.delay.ms`` (100 ms by default;
Kafka's KIP-306 delays the failure answer and closes once it is sent) from a
Deferred, and the connection closes once the answer is sent.

The connection reads nothing more until this request is answered (its
AUTHENTICATING mute), so the next request is read, and authorized, as whoever
the login made the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from trio_broker.handlers.base import Deferred, RequestContext, Response, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.sasl import AuthStep, PasswordCheck, SaslSession

log = logging.getLogger("trio_broker.sasl")

Resp = m.SaslAuthenticateResponse


def _response(step: AuthStep) -> m.SaslAuthenticateResponse:
    return Resp(error_code=step.error_code, error_message=step.error_message,
                auth_bytes=step.auth_bytes, session_lifetime_ms=step.session_lifetime_ms)  # fmt: skip


@handles(m.ApiKey.SASL_AUTHENTICATE)
async def handle_sasl_authenticate(
    ctx: RequestContext, request: m.SaslAuthenticateRequest
) -> Response:
    session = ctx.sasl
    if session is None:
        return Resp(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                    error_message="SaslAuthenticate on a listener without SASL", auth_bytes=b"")  # fmt: skip
    token = bytes(request.auth_bytes or b"")

    connection_id = ctx.client.connection_id

    async def finish(step: AuthStep) -> m.SaslAuthenticateResponse:
        if step.principal is not None:
            log.info("connection %d authenticated as %s with %s",
                     connection_id, step.principal, session.mechanism)  # fmt: skip
        elif session.failed:
            log.info("connection %d from %s: SASL authentication failed (%s)",
                     connection_id, ctx.client.host, session.reason)  # fmt: skip
            delay_ms = ctx.services.config.connection_failed_authentication_delay_ms
            await ctx.services.sleep(delay_ms / 1000)
        return _response(step)

    outcome = session.authenticate(token, ctx.services.monotonic_ms())
    if isinstance(outcome, PasswordCheck):
        return Deferred(lambda: _check_password(ctx, session, outcome, finish))
    if session.failed:
        return Deferred(lambda: finish(outcome))
    return await finish(outcome)


async def _check_password(
    ctx: RequestContext,
    session: SaslSession,
    check: PasswordCheck,
    finish: Callable[[AuthStep], Awaitable[m.SaslAuthenticateResponse]],
) -> m.SaslAuthenticateResponse:
    # The thread runs only the check, which touches no session; the login completes
    # here, on the event loop, in one call.
    ok = await ctx.services.run_off_loop(check.run)
    return await finish(session.password_checked(check, ok, ctx.services.monotonic_ms()))
