"""Configuration errors and the HOST:PORT parser: a leaf that every config parser shares.

``trio_broker.config`` validates a whole broker configuration with the parsers of
the layers below it (listeners in ``security/listeners.py``, quotas in
``state/quota.py``); they raise :class:`ConfigError` from here, so none of them
needs the config module itself (which would close an import cycle).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def parse_host_port(value: str, key: str = "listeners") -> tuple[str, int]:
    """'127.0.0.1:9092' or 'PLAINTEXT://127.0.0.1:9092' -> ('127.0.0.1', 9092)."""
    text = value.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
