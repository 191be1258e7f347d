"""A listener's PEM keystore and truststore loaded into an ``ssl.SSLContext``: the
server side (server/transport.py) and the inter-broker client side (inter_broker.py).

``ssl`` loads certificate chains from files only, so inline PEM (``ssl.keystore.
certificate.chain`` with ``ssl.keystore.key``) goes through a private temporary
directory that is deleted at once: TLS material, never re-read.
"""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["load_keystore", "load_truststore"]


def load_keystore(context: ssl.SSLContext, s: Mapping[str, Any]) -> None:
    """The listener's key and certificate chain, if it has any."""
    password = s["ssl.key.password"]
    if s["ssl.keystore.location"]:
        context.load_cert_chain(s["ssl.keystore.location"], password=password)
    elif s["ssl.keystore.certificate.chain"]:
        with tempfile.TemporaryDirectory() as tmp:
            chain, key = Path(tmp, "chain.pem"), Path(tmp, "key.pem")
            chain.write_text(s["ssl.keystore.certificate.chain"])
            key.write_text(s["ssl.keystore.key"])
            context.load_cert_chain(chain, key, password=password)


def load_truststore(context: ssl.SSLContext, s: Mapping[str, Any]) -> None:
    """The CA certificates the listener trusts, if it names any."""
    if s["ssl.truststore.location"]:
        context.load_verify_locations(cafile=s["ssl.truststore.location"])
    if s["ssl.truststore.certificates"]:
        context.load_verify_locations(cadata=s["ssl.truststore.certificates"])
