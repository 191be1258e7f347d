"""ACLs and SCRAM users a cluster shares: what the ACL and credential handlers write through.

A broker alone changes its own stores (``acl_store.py``, ``credentials.py``) directly.
In a cluster the changes go to ZooKeeper instead (``trio_broker/cluster/security_store.py``
implements :class:`SharedSecurity`), and every broker's stores are copies that follow
it; the handlers only see this protocol (services.shared_security).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trio_broker.security.acl import AclBinding, AclFilter
from trio_broker.security.credentials import ScramCredential

__all__ = ["SharedSecurity", "SharedStoreError"]


class SharedStoreError(Exception):
    """A change could not be stored (ZooKeeper unreachable or refusing); the message
    says why. Nothing of it is in this broker's copy; it may still reach ZooKeeper if
    the message says the write timed out."""


class SharedSecurity(Protocol):
    async def add_acls(self, bindings: Sequence[AclBinding]) -> list[str | None]:
        """Store the bindings (validated); per binding, None or why it was not stored."""
        ...

    async def remove_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Delete what each filter matches; the deleted bindings, per filter.
        :class:`SharedStoreError` if any resource could not be changed."""
        ...

    async def put_credential(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        """Add or replace one SCRAM credential of a user (:class:`SharedStoreError`)."""
        ...

    async def delete_credential(self, user: str, mechanism: str) -> bool:
        """Remove one of a user's credentials; False if there was none."""
        ...
