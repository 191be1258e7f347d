"""SCRAM credentials in the data dir: salted keys only, never a password.

One JSON file, ``scram-credentials.json``, maps user -> mechanism -> salt,
iterations, stored key and server key (RFC 5802), which is what Kafka keeps in
its metadata log. PLAIN logins are checked against the same keys (security/sasl.py): the password
is salted and hashed with a stored SCRAM salt and compared with the stored key,
so a PLAIN user is any user that has a SCRAM credential.

The file is written crash-safely (temporary file, fsync, rename, fsync of the
directory: :mod:`trio_broker.storage.durable`) with mode 0600 and re-read when
its modification time changes, so ``trio-broker users add`` on a running
broker's data dir takes effect at the next login. In a cluster the users live in
ZooKeeper instead, and the store is a memory-only copy of them
(``trio_broker/cluster/security_store.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

import attrs

from trio_broker.storage.durable import make_dirs_durable, write_file_atomically

CREDENTIALS_FILE = "scram-credentials.json"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: Kafka's bounds for SCRAM iterations (ScramMechanism.minIterations / maxIterations).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
#: Kafka's mechanism numbers in Describe/AlterUserScramCredentials.
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}


class CredentialError(ValueError):
    """A credential that cannot be stored (bad mechanism, iterations, empty name)."""


@attrs.frozen
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {"salt": b64(self.salt).decode(), "stored_key": b64(self.stored_key).decode(),
                "server_key": b64(self.server_key).decode(), "iterations": self.iterations}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScramCredential:
        b64 = base64.b64decode
        return cls(b64(data["salt"]), b64(data["stored_key"]), b64(data["server_key"]),
                   int(data["iterations"]))  # fmt: skip


def credential_from_password(mechanism: str, password: str, iterations: int) -> ScramCredential:
    # Imported here, not at the top: scramp loads asn1crypto and reads its own package
    # metadata (about 0.1 s of CPU per process), which a broker without SCRAM never needs.
    from scramp import ScramMechanism

    check_mechanism(mechanism, iterations)
    salt, stored_key, server_key, i = ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations
    )
    return ScramCredential(salt, stored_key, server_key, i)


def credential_from_salted(
    mechanism: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """What AlterUserScramCredentials sends: the client already salted the password."""
    check_mechanism(mechanism, iterations)
    digest = HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return ScramCredential(salt, digest(client_key).digest(), server_key, iterations)


def check_mechanism(mechanism: str, iterations: int) -> None:
    if mechanism not in HASHES:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}")


class CredentialStore:
    """The users of one data dir; ``path`` None keeps them in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._stamp: tuple[int, int] | None = None
        self._reload()

    @classmethod
    def in_data_dir(cls, data_dir: Path | None) -> CredentialStore:
        return cls(None if data_dir is None else Path(data_dir) / CREDENTIALS_FILE)

    def _reload(self) -> None:
        if self.path is None:
            return
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._users, self._stamp = {}, None
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        raw = json.loads(self.path.read_text())
        self._users = {
            user: {mech: ScramCredential.from_json(c) for mech, c in mechs.items()}
            for user, mechs in raw.get("users", {}).items()
        }
        self._stamp = stamp

    def _save(self) -> None:
        if self.path is None:
            return
        make_dirs_durable(self.path.parent)
        data = {"version": 1, "users": {
            user: {mech: c.to_json() for mech, c in sorted(mechs.items())}
            for user, mechs in sorted(self._users.items())
        }}  # fmt: skip
        write_file_atomically(self.path, json.dumps(data, indent=1).encode(), mode=0o600)
        stat = os.stat(self.path)
        self._stamp = (stat.st_mtime_ns, stat.st_size)

    def mirror(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        """Hold exactly ``users``: a cluster's copy of the users in ZooKeeper
        (cluster/security_store.py), which writes them there, never to a file."""
        assert self.path is None, "a cluster's users live in ZooKeeper, not in a file"
        self._users = {user: dict(mechs) for user, mechs in users.items()}

    # ------------------------------------------------------------------ reads

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        self._reload()
        return {user: dict(mechs) for user, mechs in self._users.items()}

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        self._reload()
        return self._users.get(user, {}).get(mechanism)

    # ------------------------------------------------------------------ writes

    def put(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        if not user:
            raise CredentialError("the user name must not be empty")
        check_mechanism(mechanism, credential.iterations)
        self._reload()
        self._users.setdefault(user, {})[mechanism] = credential
        self._save()

    def add(
        self, user: str, mechanism: str, password: str, iterations: int = MIN_ITERATIONS
    ) -> None:
        if not password:
            raise CredentialError("the password must not be empty")
        self.put(user, mechanism, credential_from_password(mechanism, password, iterations))

    def delete(self, user: str, mechanism: str | None = None) -> bool:
        """Remove one mechanism of a user (or all of them); False if there was none."""
        self._reload()
        mechs = self._users.get(user)
        if not mechs or (mechanism is not None and mechanism not in mechs):
            return False
        if mechanism is None:
            del self._users[user]
        else:
            del mechs[mechanism]
            if not mechs:
                del self._users[user]
        self._save()
        return True
