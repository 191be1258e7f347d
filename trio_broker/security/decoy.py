"""Decoy credentials: an unknown user is answered like a known one (RFC 5802, section 9).

A SCRAM server that answers "no such user" at the first message, or answers it
faster, tells an attacker which user names exist. So an unknown user gets a
server-first message built from a decoy credential: its salt and keys derived
from a server secret and the user name, the same on every attempt (as a real
user's are), with the iteration count ``trio-broker users add`` uses. The login
then fails at client-final, like a wrong password. PLAIN salts the password of
an unknown user with a decoy too, so that its answer takes as long.

The secret lives in the data dir (``sasl-decoy.secret``): a secret that changed
at every restart would change the decoy salts while real ones stay, which would
tell them apart again.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from trio_broker.security.credentials import HASHES, MIN_ITERATIONS, ScramCredential
from trio_broker.storage.durable import make_dirs_durable, write_file_atomically

#: Bytes of a decoy salt: what scramp draws for ``trio-broker users add``.
DECOY_SALT_BYTES = 32
SECRET_FILE = "sasl-decoy.secret"
SECRET_BYTES = 32


def decoy_credential(secret: bytes, user: str, mechanism: str) -> ScramCredential:
    """A credential for a user that does not exist, the same on every attempt.

    Derived from the server secret and the name (RFC 5802, section 9) so that a
    client cannot tell it from a real one by its salt, its iteration count or by
    trying twice. Its keys match no password anyone knows.
    """
    digest = HASHES[mechanism]

    def derive(label: str) -> bytes:
        return hmac.new(secret, f"{label}\0{mechanism}\0{user}".encode(), digest).digest()

    salt = (derive("salt") + derive("salt-more"))[:DECOY_SALT_BYTES]
    return ScramCredential(salt, derive("stored-key"), derive("server-key"), MIN_ITERATIONS)


def decoy_secret(data_dir: Path | None) -> bytes:
    """The data dir's decoy secret, made on first use; a fresh one without a data dir."""
    if data_dir is None:
        return os.urandom(SECRET_BYTES)
    path = Path(data_dir) / SECRET_FILE
    try:
        secret = path.read_bytes()
    except FileNotFoundError:
        secret = b""
    if len(secret) != SECRET_BYTES:  # missing, or torn by a crash before it was synced
        secret = os.urandom(SECRET_BYTES)
        make_dirs_durable(path.parent)
        write_file_atomically(path, secret, mode=0o600)
    return secret
