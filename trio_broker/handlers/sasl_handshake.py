"""SaslHandshake (17): pick the SASL mechanism of a connection on a SASL listener.

On a listener without SASL there is nothing to authenticate: Kafka answers
ILLEGAL_SASL_STATE there, and so do we. An unknown mechanism gets
UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection closes.
"""

from __future__ import annotations

from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.SaslHandshakeResponse


@handles(m.ApiKey.SASL_HANDSHAKE)
async def handle_sasl_handshake(
    ctx: RequestContext, request: m.SaslHandshakeRequest
) -> m.SaslHandshakeResponse:
    session = ctx.sasl
    if session is None:
        return Resp(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
    error = session.handshake(request.mechanism or "")
    return Resp(error_code=error, mechanisms=list(session.mechanisms))
