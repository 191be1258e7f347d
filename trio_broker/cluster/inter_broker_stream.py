"""Connections to other brokers over a secured inter-broker listener: TLS, then SASL.

:func:`login_opener` wraps a plain stream opener (TCP, or the simulation's network) into
one that returns streams already logged in as security/inter_broker.py describes, so the
replica fetchers and the transaction marker channel use them like any other
(``BrokerClient(..., open_stream=...)``). A refused login or a failed TLS handshake is a
BrokerConnectionError: the caller backs off and tries again, as for an unreachable broker.
"""

from __future__ import annotations

from typing import Any

import trio

from trio_broker.cluster.broker_client import BrokerClient, BrokerConnectionError, OpenStream
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.inter_broker import InterBrokerLogin, LoginFailed, sasl_exchange

__all__ = ["login_opener"]

#: KIP-152 framing, as librdkafka sends: SaslHandshake v1, then SaslAuthenticate.
HANDSHAKE_VERSION, AUTHENTICATE_VERSION = 1, 2
LOGIN_TIMEOUT_S = 10.0


def login_opener(login: InterBrokerLogin, plain: OpenStream, client_id: str) -> OpenStream:
    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        stream = await plain(host, port)
        try:
            if login.tls is not None:
                tls = trio.SSLStream(stream, login.tls, server_hostname=host)
                with trio.fail_after(LOGIN_TIMEOUT_S):
                    await tls.do_handshake()
                stream = tls
            if login.sasl is not None:
                await _authenticate(stream, host, port, client_id, *login.sasl)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, LoginFailed) as exc:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise BrokerConnectionError(f"{host}:{port}: login: {exc!r}") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise
        return stream

    return open_stream


async def _authenticate(
    stream: trio.abc.Stream, host: str, port: int, client_id: str,
    mechanism: str, user: str, password: str,
) -> None:  # fmt: skip
    async def given(_host: str, _port: int) -> trio.abc.Stream:
        return stream

    # A client on the stream just opened: its framing and correlation ids. It is dropped
    # (not closed) afterwards; the server sends nothing unasked, so no bytes stay behind.
    exchange = BrokerClient(host, port, client_id, given)

    async def ask(api_key: int, version: int, request: Any) -> Any:
        answer = await exchange.call(api_key, version, request, LOGIN_TIMEOUT_S)
        if answer.error_code != ErrorCode.NONE:
            offered = getattr(answer, "mechanisms", None)
            detail = getattr(answer, "error_message", None) or (
                f"the broker offers {', '.join(offered)}" if offered else ""
            )
            raise LoginFailed(f"{mechanism}: {ErrorCode(answer.error_code).name} {detail}".strip())
        return answer

    await ask(
        m.ApiKey.SASL_HANDSHAKE, HANDSHAKE_VERSION, m.SaslHandshakeRequest(mechanism=mechanism)
    )
    tokens = sasl_exchange(mechanism, user, password)
    token = next(tokens)
    while True:
        answer = await ask(
            m.ApiKey.SASL_AUTHENTICATE, AUTHENTICATE_VERSION,
            m.SaslAuthenticateRequest(auth_bytes=token),
        )  # fmt: skip
        try:
            token = tokens.send(bytes(answer.auth_bytes or b""))
        except StopIteration:
            return
