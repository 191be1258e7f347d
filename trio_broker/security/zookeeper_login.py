"""The brokers' login to ZooKeeper: SASL DIGEST-MD5 as the user of a JAAS file's
``Client`` section (``zookeeper.jaas.file``), as Kafka's brokers log in with
``-Djava.security.auth.login.config``. Which znodes the ACLs then protect:
cluster/zk_security.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from trio_broker.config_errors import ConfigError
from trio_broker.security.inter_broker import jaas_credentials

__all__ = [
    "CLIENT_SECTION",
    "ZooKeeperLogin",
    "client_jaas",
    "read_client_login",
    "server_jaas",
]

#: The JAAS section a ZooKeeper client reads (Java's ``zookeeper.sasl.clientconfig`` default).
CLIENT_SECTION = "Client"
DIGEST_LOGIN_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"


@attrs.frozen
class ZooKeeperLogin:
    """The brokers' SASL DIGEST-MD5 user in ZooKeeper; the ACLs name it (``sasl:<user>``)."""

    username: str
    password: str = attrs.field(repr=False)


_SECTION = re.compile(r"(?ms)^\s*(\w+)\s*\{(.*?)\}\s*;")


def read_client_login(path: str | Path, section: str = CLIENT_SECTION) -> ZooKeeperLogin:
    """The user and password of the JAAS file's ``Client`` section (the file Kafka's
    brokers name with ``-Djava.security.auth.login.config``); ConfigError if missing."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"zookeeper.jaas.file: cannot read {path}: {exc.strerror}") from None
    for name, body in _SECTION.findall(text):
        if name != section:
            continue
        if "DigestLoginModule" not in body:
            raise ConfigError(
                f"zookeeper.jaas.file {path}: section {section} must use {DIGEST_LOGIN_MODULE} "
                "(SASL DIGEST-MD5, the only ZooKeeper login supported)"
            )
        user, password = jaas_credentials(body, f"zookeeper.jaas.file {path}, {section}")
        return ZooKeeperLogin(user, password)
    raise ConfigError(f"zookeeper.jaas.file {path}: no {section} {{ ... }}; section")


def _quoted(value: str) -> str:
    if '"' in value or "\\" in value or "\n" in value:
        raise ValueError("a JAAS value here has no quotes, backslashes or line breaks")
    return f'"{value}"'


def client_jaas(login: ZooKeeperLogin) -> str:
    """A JAAS file with the ``Client`` section of ``login`` (for brokers and tools)."""
    return (
        f"{CLIENT_SECTION} {{\n  {DIGEST_LOGIN_MODULE} required\n"
        f"  username={_quoted(login.username)}\n  password={_quoted(login.password)};\n}};\n"
    )


def server_jaas(logins: list[ZooKeeperLogin]) -> str:
    """ZooKeeper's own JAAS file: the ``Server`` section listing the users it accepts."""
    users = "".join(f"\n  user_{login.username}={_quoted(login.password)}" for login in logins)
    return f"Server {{\n  {DIGEST_LOGIN_MODULE} required{users};\n}};\n"
