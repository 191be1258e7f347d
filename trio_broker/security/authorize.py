"""The broker's authorizer: the ACL store plus its settings (docs/acls.md).

The broker holds an :class:`Authorizer` only when ``authorizer.class.name`` is
set. Decisions are the pure ones of ``acl.py``; the handlers ask through
``trio_broker/handlers/authorization.py``, which passes every check when there
is no authorizer, so a broker without ACL configuration behaves as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from trio_broker.security.acl import (
    AclBinding,
    AuthorizerSettings,
    Operation,
    ResourceType,
    authorize,
    authorize_any,
    parse_super_users,
)
from trio_broker.security.acl_store import AclStore

__all__ = ["Authorizer", "AuthorizerConfig"]


class AuthorizerConfig(Protocol):
    """The broker settings an authorizer comes from (BrokerConfig has them)."""

    @property
    def authorizer_class_name(self) -> str: ...
    @property
    def super_users(self) -> str: ...
    @property
    def allow_everyone_if_no_acl_found(self) -> bool: ...


class Authorizer:
    """ACL store plus settings; decisions are the pure ones of ``acl.py``."""

    def __init__(self, super_users: str, allow_if_no_acl: bool, data_dir: Path | None) -> None:
        self.settings = AuthorizerSettings(
            super_users=parse_super_users(super_users), allow_if_no_acl=allow_if_no_acl
        )
        self.store = AclStore(data_dir)

    @classmethod
    def from_config(cls, config: AuthorizerConfig, data_dir: Path | None) -> Authorizer | None:
        """The authorizer ``authorizer.class.name`` asks for, or None when it is unset."""
        if not config.authorizer_class_name:
            return None
        return cls(config.super_users, config.allow_everyone_if_no_acl_found, data_dir)

    def bindings(self) -> list[AclBinding]:
        return self.store.bindings()

    def allowed(
        self, principal: str, host: str, op: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        return authorize(
            self.store.current(), self.settings, principal, host, op, resource_type, name
        )

    def allowed_any(
        self, principal: str, host: str, op: Operation, resource_type: ResourceType
    ) -> bool:
        return authorize_any(
            self.store.current(), self.settings, principal, host, op, resource_type
        )
