"""How this broker logs in to the others (replica fetches, transaction markers), sans I/O.

A follower connects to the leader's inter-broker listener (``inter.broker.listener.name``,
else the first listener) and speaks that listener's security protocol, as Kafka does:

- TLS (SSL, SASL_SSL): the listener's own ``ssl.*`` settings serve as the client's too.
  The truststore checks the other broker's certificate and its host name (Kafka's
  default ``ssl.endpoint.identification.algorithm=https``), and the keystore's
  certificate is presented, for listeners that ask for one (``ssl.client.auth``).
- SASL (SASL_PLAINTEXT, SASL_SSL): mechanism ``sasl.mechanism.inter.broker.protocol``
  (when unset: the listener's first enabled mechanism). The user and password come
  from that mechanism's JAAS line, as in Kafka:
  ``listener.name.<listener>.<mechanism>.sasl.jaas.config=... username="broker"
  password="...";`` (or a global ``sasl.jaas.config``). The user must exist on every
  broker (``trio-broker users add``).

:class:`InterBrokerLogin` holds what the shell needs; :func:`sasl_exchange` yields the
tokens to send and takes the answers (PLAIN: one token; SCRAM: client-first, then
client-final, then the server's signature is checked).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Generator, Mapping
from typing import Any

import attrs

from trio_broker.config_errors import ConfigError
from trio_broker.security.listeners import Listener, split_list
from trio_broker.security.pem import load_keystore, load_truststore

__all__ = [
    "InterBrokerLogin",
    "LoginFailed",
    "client_context",
    "inter_broker_login",
    "sasl_exchange",
]

MECHANISM_KEY = "sasl.mechanism.inter.broker.protocol"
JAAS_KEY = "sasl.jaas.config"
_JAAS_OPTION = re.compile(r"""\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)\"""")


class LoginFailed(Exception):
    """The other broker refused the login, or answered something a server must not."""


@attrs.frozen
class InterBrokerLogin:
    #: The client side of TLS; None: plaintext.
    tls: ssl.SSLContext | None
    #: (mechanism, user, password); None: no SASL.
    sasl: tuple[str, str, str] | None = attrs.field(repr=False)


def jaas_credentials(jaas: str, where: str) -> tuple[str, str]:
    """``username`` and ``password`` of a JAAS line (the login module itself is ignored)."""
    found = {name: value.replace('\\"', '"') for name, value in _JAAS_OPTION.findall(jaas)}
    if "username" not in found or "password" not in found:
        raise ConfigError(f'{where}: the JAAS line needs username="..." and password="..."')
    return found["username"], found["password"]


def inter_broker_listener(listeners: list[Listener], name: str | None) -> Listener:
    """The listener other brokers' followers connect to: ``inter.broker.listener.name``,
    else the first."""
    if name is None:
        return listeners[0]
    return next(spec for spec in listeners if spec.name == name.upper())


def inter_broker_login(listener: Listener, security: Mapping[str, Any]) -> InterBrokerLogin:
    """The login for ``listener`` (the inter-broker one); ConfigError names what is missing."""
    tls = client_context(listener) if listener.uses_tls else None
    if not listener.uses_sasl:
        return InterBrokerLogin(tls, None)
    mechanism = str(security.get(MECHANISM_KEY) or listener.mechanisms[0]).upper()
    if mechanism not in listener.mechanisms:
        raise ConfigError(
            f"{MECHANISM_KEY}={mechanism}: not enabled on the inter-broker listener "
            f"{listener.name} (sasl.enabled.mechanisms: {', '.join(listener.mechanisms)})"
        )
    per_listener = f"listener.name.{listener.name.lower()}.{mechanism.lower()}.{JAAS_KEY}"
    jaas = security.get(per_listener) or security.get(JAAS_KEY)
    if not jaas:
        raise ConfigError(
            f"the inter-broker listener {listener.name} uses SASL: set {per_listener} "
            f'(... username="<user>" password="<password>";) for the brokers\' own login'
        )
    user, password = jaas_credentials(str(jaas), per_listener)
    return InterBrokerLogin(tls, (mechanism, user, password))


def client_context(listener: Listener) -> ssl.SSLContext:
    """The client side of the listener's TLS: its truststore, its certificate, host names
    checked."""
    s = listener.settings
    if s["ssl.truststore.location"] or s["ssl.truststore.certificates"]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # only the listener's CAs
        load_truststore(context, s)
    else:
        context = ssl.create_default_context()  # the system's CAs
    versions = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
    enabled = sorted(versions[p] for p in split_list(s["ssl.enabled.protocols"]))
    context.minimum_version, context.maximum_version = enabled[0], enabled[-1]
    load_keystore(context, s)
    return context


def sasl_exchange(mechanism: str, user: str, password: str) -> Generator[bytes, bytes, None]:
    """The client's tokens, one per SaslAuthenticate; ``send()`` each answer's bytes.
    Raises LoginFailed when the server's final message does not prove it knows the
    password (SCRAM), or is not a SCRAM message at all."""
    if mechanism == "PLAIN":
        yield b"\0" + user.encode() + b"\0" + password.encode()
        return
    # Imported here, not at the top: scramp loads asn1crypto and reads its own package
    # metadata (about 0.1 s of CPU per process), which a broker or CLI without SCRAM
    # never needs.
    from scramp import ScramClient

    client = ScramClient([mechanism], user, password)
    server_first = yield client.get_client_first().encode()
    try:
        client.set_server_first(server_first.decode())
    except Exception as exc:  # scramp raises its own errors for a malformed message
        raise LoginFailed(f"{mechanism}: server-first: {exc}") from None
    server_final = yield client.get_client_final().encode()
    try:
        client.set_server_final(server_final.decode())
    except Exception as exc:
        raise LoginFailed(f"{mechanism}: the server's signature did not check: {exc}") from None
