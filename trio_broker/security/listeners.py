"""Listeners as Kafka configures them: ``listeners``, the protocol map, per-listener settings.

``listeners = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094"`` opens one
socket per entry. An entry's name is its security protocol unless
``listener.security.protocol.map`` says otherwise (``CLIENT:SASL_SSL``).
``advertised.listeners`` gives, by name, the address Metadata returns to a client
connected to that listener. TLS and SASL keys (``ssl.*``, ``sasl.enabled.mechanisms``,
``connections.max.reauth.ms``) apply to every listener and may be overridden for one
with ``listener.name.<name lower case>.<key>``, as in Kafka.

The first listener's address is the config's ``host``/``port``, so ``--listen``
(and a config without ``listeners``) keep their meaning. Pure: no trio here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from trio_broker.config_errors import ConfigError, parse_host_port

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_AUTH = ("none", "requested", "required")

#: Keys that may be set globally or per listener, with their defaults.
#: Certificates are PEM only (``ssl.keystore.type = "PEM"``): either file locations
#: or the PEM text inline, as Kafka's PEM keystore keys allow.
LISTENER_KEYS: dict[str, Any] = {
    "ssl.keystore.type": "PEM",
    "ssl.keystore.location": None,  # PEM file: private key + certificate chain
    "ssl.keystore.certificate.chain": None,  # inline PEM certificate chain
    "ssl.keystore.key": None,  # inline PEM private key
    "ssl.key.password": None,  # for an encrypted private key
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": None,  # PEM file of CA certificates (client certificates)
    "ssl.truststore.certificates": None,  # inline PEM CA certificates
    "ssl.client.auth": "none",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.principal.mapping.rules": "DEFAULT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "connections.max.reauth.ms": 0,
}


@attrs.frozen
class Listener:
    name: str
    protocol: str
    host: str
    port: int
    #: Where Metadata sends clients of this listener; None = the bound address.
    advertised: tuple[str, int] | None
    settings: Mapping[str, Any] = attrs.field(hash=False)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def mechanisms(self) -> list[str]:
        return split_list(self.settings["sasl.enabled.mechanisms"])

    @property
    def reauth_ms(self) -> int:
        return int(self.settings["connections.max.reauth.ms"])


def split_list(value: Any) -> list[str]:
    """A comma-separated string (or a TOML list) -> its non-empty, stripped items."""
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value or "").split(",") if part.strip()]


def _entries(spec: Any, key: str) -> list[tuple[str, str, int]]:
    """NAME://HOST:PORT entries; a bare HOST:PORT has the name "" (the first listener's)."""
    out = []
    for entry in split_list(spec):
        name, sep, _ = entry.partition("://")
        host, port = parse_host_port(entry, key)
        out.append((name.upper() if sep else "", host, port))
    return out


def _protocol_map(spec: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for entry in split_list(spec):
        name, sep, protocol = entry.partition(":")
        if not sep or protocol.upper() not in PROTOCOLS:
            raise ConfigError(
                f"listener.security.protocol.map: expected NAME:PROTOCOL with PROTOCOL one of "
                f"{', '.join(PROTOCOLS)}, got {entry!r}"
            )
        mapping[name.strip().upper()] = protocol.upper()
    return mapping


def _settings_for(name: str, security: Mapping[str, Any]) -> dict[str, Any]:
    settings = dict(LISTENER_KEYS)
    prefix = f"listener.name.{name.lower()}."
    for key, value in security.items():
        if not key.startswith("listener.name."):
            settings[key] = value
    for key, value in security.items():
        if key.startswith(prefix):
            settings[key[len(prefix) :]] = value
    return settings


#: The brokers' own login to each other (security/inter_broker.py): the mechanism, and
#: the JAAS line with the user and password (also per listener and mechanism:
#: ``listener.name.<listener>.<mechanism>.sasl.jaas.config``).
INTER_BROKER_KEYS = ("sasl.mechanism.inter.broker.protocol", "sasl.jaas.config")


def check_security_key(key: str) -> None:
    """Raise ConfigError unless ``key`` is a TLS/SASL key, global or per listener."""
    if key.startswith("listener.name."):
        rest = key[len("listener.name.") :]
        name, sep, inner = rest.partition(".")
        mechanism, _, mechanism_key = inner.partition(".")
        per_mechanism = mechanism.upper() in SASL_MECHANISMS and mechanism_key == "sasl.jaas.config"
        if not name or not sep or (inner not in LISTENER_KEYS and not per_mechanism):
            raise ConfigError(f"unknown config key {key!r}")
    elif key not in LISTENER_KEYS and key not in INTER_BROKER_KEYS:
        raise ConfigError(f"unknown config key {key!r}")


class ListenerConfig(Protocol):
    """The part of the broker config that listeners come from (BrokerConfig has it)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def advertised_host(self) -> str | None: ...
    @property
    def advertised_port(self) -> int | None: ...
    @property
    def listeners(self) -> str | None: ...
    @property
    def advertised_listeners(self) -> str | None: ...
    @property
    def listener_security_protocol_map(self) -> str: ...
    @property
    def security(self) -> dict[str, Any]: ...


def resolve_listeners(config: ListenerConfig) -> list[Listener]:
    """Every listener with its protocol, advertised address and settings; validated."""
    entries = _entries(config.listeners, "listeners") if config.listeners else []
    if not entries:
        entries = [("PLAINTEXT", config.host, config.port)]
    entries = [(name or "PLAINTEXT", host, port) for name, host, port in entries]
    name0 = entries[0][0]
    entries[0] = (name0, config.host, config.port)
    protocols = _protocol_map(config.listener_security_protocol_map)
    advertised = {
        name or name0: (host, port)
        for name, host, port in (
            _entries(config.advertised_listeners, "advertised.listeners")
            if config.advertised_listeners
            else []
        )
    }
    if config.advertised_host or config.advertised_port:
        # --advertised-listener HOST:PORT: the first listener, as before listeners existed.
        old = advertised.get(name0)
        advertised[name0] = (
            config.advertised_host or (old[0] if old else config.host),
            config.advertised_port or (old[1] if old else config.port),
        )
    for key in config.security:
        check_security_key(key)
    listeners: list[Listener] = []
    seen: set[str] = set()
    for name, host, port in entries:
        if name in seen:
            raise ConfigError(f"listeners: listener name {name} appears twice")
        seen.add(name)
        protocol = protocols.get(name, name)
        if protocol not in PROTOCOLS:
            raise ConfigError(
                f"listeners: {name} is not a security protocol; map it in "
                f"listener.security.protocol.map (e.g. {name}:SASL_SSL)"
            )
        listener = Listener(name, protocol, host, port, advertised.get(name),
                            _settings_for(name, config.security))  # fmt: skip
        _validate(listener)
        listeners.append(listener)
    for name in advertised:
        if name not in seen:
            raise ConfigError(f"advertised.listeners: {name} is not in listeners")
    return listeners


def _validate(listener: Listener) -> None:
    s = listener.settings
    where = f"listener {listener.name}"
    if s["ssl.client.auth"] not in CLIENT_AUTH:
        raise ConfigError(f"ssl.client.auth ({where}): expected one of {CLIENT_AUTH}")
    for key in ("ssl.keystore.type", "ssl.truststore.type"):
        if str(s[key]).upper() != "PEM":
            raise ConfigError(f"{key} ({where}): only PEM is supported")
    for protocol in split_list(s["ssl.enabled.protocols"]):
        if protocol not in ("TLSv1.2", "TLSv1.3"):
            raise ConfigError(f"ssl.enabled.protocols ({where}): {protocol} is not supported")
    try:
        int(s["connections.max.reauth.ms"])
    except (TypeError, ValueError):
        raise ConfigError(f"connections.max.reauth.ms ({where}): expected an integer") from None
    if listener.uses_sasl:
        mechanisms = listener.mechanisms
        unknown = [mech for mech in mechanisms if mech not in SASL_MECHANISMS]
        if not mechanisms or unknown:
            raise ConfigError(
                f"sasl.enabled.mechanisms ({where}): supported are {', '.join(SASL_MECHANISMS)}"
            )
    if listener.uses_tls:
        has_file = s["ssl.keystore.location"] is not None
        has_inline = s["ssl.keystore.certificate.chain"] is not None
        if has_file == has_inline or (has_inline and s["ssl.keystore.key"] is None):
            raise ConfigError(
                f"{where} uses TLS: set ssl.keystore.location (a PEM file with the key and "
                "certificate chain), or ssl.keystore.certificate.chain and ssl.keystore.key"
            )
        if s["ssl.client.auth"] != "none" and not (
            s["ssl.truststore.location"] or s["ssl.truststore.certificates"]
        ):
            raise ConfigError(
                f"ssl.client.auth ({where}): needs ssl.truststore.location or "
                "ssl.truststore.certificates to check client certificates"
            )
