"""TLS between the brokers (and the operator's tools) and ZooKeeper.

Kafka 3's client-side keys, read from server.properties (or from the file Kafka's tools
take as ``--zk-tls-config-file``):

- ``zookeeper.ssl.client.enable``: connect over TLS (the ensemble's ``secureClientPort``);
- ``zookeeper.ssl.keystore.location`` (+ ``.password``): this client's certificate, for a
  ZooKeeper that asks for one (``ssl.clientAuth=need``, its default);
- ``zookeeper.ssl.truststore.location``: the CA certificates that sign ZooKeeper's
  certificate; none: the system's;
- ``zookeeper.ssl.endpoint.identification.algorithm``: ``HTTPS`` (the default) checks that
  ZooKeeper's certificate names the host connected to; empty turns the check off.

Certificates are PEM only, as on the listeners (docs/security.md): a keystore is one file
holding the private key and the certificate chain (ZooKeeper's own PEM keystore layout),
a truststore a file of CA certificates. ``zookeeper.clientCnxnSocket`` (Java's Netty
socket, which Java's client needs for TLS) is accepted and means nothing here.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from trio_broker.config_errors import ConfigError

__all__ = ["TLS_KEYS", "ZooKeeperTls", "read_tls_config_file", "tls_from_properties"]

ENABLE = "zookeeper.ssl.client.enable"
KEYSTORE = "zookeeper.ssl.keystore.location"
KEYSTORE_PASSWORD = "zookeeper.ssl.keystore.password"
KEYSTORE_TYPE = "zookeeper.ssl.keystore.type"
TRUSTSTORE = "zookeeper.ssl.truststore.location"
TRUSTSTORE_PASSWORD = "zookeeper.ssl.truststore.password"
TRUSTSTORE_TYPE = "zookeeper.ssl.truststore.type"
ENDPOINT_IDENTIFICATION = "zookeeper.ssl.endpoint.identification.algorithm"
CLIENT_SOCKET = "zookeeper.clientCnxnSocket"

#: Every key this module reads.
TLS_KEYS = (
    ENABLE, KEYSTORE, KEYSTORE_PASSWORD, KEYSTORE_TYPE, TRUSTSTORE, TRUSTSTORE_PASSWORD,
    TRUSTSTORE_TYPE, ENDPOINT_IDENTIFICATION, CLIENT_SOCKET,
)  # fmt: skip

_TRUE = {"true"}
_FALSE = {"false", ""}


@attrs.frozen
class ZooKeeperTls:
    """How to reach ZooKeeper over TLS (checked when made: a bad file fails at start)."""

    #: PEM file: private key and certificate chain; None: no client certificate.
    keystore: str | None = None
    keystore_password: str | None = attrs.field(default=None, repr=False)
    #: PEM file of CA certificates; None: the system's trusted CAs.
    truststore: str | None = None
    #: Whether ZooKeeper's certificate must name the host connected to.
    check_hostname: bool = True

    def __attrs_post_init__(self) -> None:
        self.context()  # unreadable or mismatched files: a ConfigError now

    def context(self) -> ssl.SSLContext:
        """The client context these settings make (what kazoo builds from the same files)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.check_hostname
        try:
            if self.truststore is not None:
                context.load_verify_locations(cafile=self.truststore)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{TRUSTSTORE}: cannot load {self.truststore}: {exc}") from None
        try:
            if self.keystore is not None:
                context.load_cert_chain(self.keystore, self.keystore, self.keystore_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{KEYSTORE}: cannot load {self.keystore} (a PEM file holding the private "
                f"key and its certificate chain): {exc}"
            ) from None
        return context

    def kazoo_options(self) -> dict[str, Any]:
        """The KazooClient arguments that connect this way."""
        return {
            "use_ssl": True,
            "ca": self.truststore,
            "certfile": self.keystore,
            "keyfile": self.keystore,
            "keyfile_password": self.keystore_password,
            "verify_certs": True,
            "check_hostname": self.check_hostname,
        }


def _store_type(properties: Mapping[str, str], key: str, location: str | None) -> None:
    kind = (properties.get(key) or "").strip()
    if kind and kind.upper() != "PEM":
        raise ConfigError(f"{key}: {kind} is not supported; certificates are PEM files (PEM)")
    if not kind and location and Path(location).suffix.lower() in {".jks", ".p12", ".pfx"}:
        raise ConfigError(f"{key}: {location} looks like a Java keystore; give a PEM file")


def tls_from_properties(properties: Mapping[str, str]) -> ZooKeeperTls | None:
    """The TLS settings of these ``zookeeper.*`` keys; None when TLS is off."""
    enable = (properties.get(ENABLE) or "").strip().lower()
    if enable not in _TRUE | _FALSE:
        raise ConfigError(f"{ENABLE}: expected true or false, got {properties.get(ENABLE)!r}")
    if enable not in _TRUE:
        return None
    keystore = properties.get(KEYSTORE) or None
    truststore = properties.get(TRUSTSTORE) or None
    _store_type(properties, KEYSTORE_TYPE, keystore)
    _store_type(properties, TRUSTSTORE_TYPE, truststore)
    algorithm = (properties.get(ENDPOINT_IDENTIFICATION, "HTTPS") or "").strip()
    if algorithm.upper() not in {"HTTPS", ""}:
        raise ConfigError(f"{ENDPOINT_IDENTIFICATION}: HTTPS or empty, got {algorithm!r}")
    return ZooKeeperTls(
        keystore=keystore,
        keystore_password=properties.get(KEYSTORE_PASSWORD) or None,
        truststore=truststore,
        check_hostname=bool(algorithm),
    )


def read_tls_config_file(path: str | Path) -> ZooKeeperTls | None:
    """A tool's ``--zk-tls-config-file``: a properties file of the keys above."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--zk-tls-config-file: cannot read {path}: {exc.strerror}") from None
    properties: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        properties[key.strip()] = value.strip()
    return tls_from_properties(properties)
