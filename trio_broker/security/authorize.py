"""The handlers' side of authorization: one call per check, a no-op when off.

The broker holds an :class:`Authorizer` only when ``authorizer.class.name`` is
set; every handler asks :func:`authorized` (or :func:`authorized_any`) and
answers Kafka's *_AUTHORIZATION_FAILED error when refused. With no authorizer
every check passes, so a broker without ACL configuration behaves as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trio_broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AuthorizerSettings,
    Operation,
    ResourceType,
    authorize,
    authorize_any,
    parse_super_users,
)
from trio_broker.security.acl_store import AclStore

if TYPE_CHECKING:
    from trio_broker.config import BrokerConfig
    from trio_broker.handlers.base import RequestContext

#: ``authorizer.class.name`` values that turn ACLs on: Kafka's KRaft and ZooKeeper
#: authorizers (both mean the same rules here) and our short alias.
AUTHORIZER_NAMES = frozenset(
    {"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
     "kafka.security.authorizer.AclAuthorizer", "acl"}
)  # fmt: skip

__all__ = ["Authorizer", "Operation", "ResourceType", "authorized", "authorized_any"]


class Authorizer:
    """ACL store plus settings; decisions are the pure ones of ``acl.py``."""

    def __init__(self, config: BrokerConfig, data_dir: Path | None) -> None:
        self.settings = AuthorizerSettings(
            super_users=parse_super_users(config.super_users),
            allow_if_no_acl=config.allow_everyone_if_no_acl_found,
        )
        self.store = AclStore(data_dir)

    @classmethod
    def from_config(cls, config: BrokerConfig, data_dir: Path | None) -> Authorizer | None:
        return cls(config, data_dir) if config.authorizer_class_name else None

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


def authorized(
    ctx: RequestContext, op: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> bool:
    """Whether the request's principal may do ``op`` on the resource (always, when off)."""
    authorizer: Authorizer | None = ctx.broker.authorizer
    if authorizer is None:
        return True
    return authorizer.allowed(ctx.principal, ctx.client.host, op, resource_type, name)


def authorized_any(ctx: RequestContext, op: Operation, resource_type: ResourceType) -> bool:
    """Whether ``op`` is allowed on some resource of the type (InitProducerId: any topic)."""
    authorizer: Authorizer | None = ctx.broker.authorizer
    if authorizer is None:
        return True
    return authorizer.allowed_any(ctx.principal, ctx.client.host, op, resource_type)


def may_create_topic(ctx: RequestContext, name: str) -> bool:
    """CreateTopics and auto-creation: CREATE on the cluster or on the topic (Kafka's rule)."""
    return authorized(ctx, Operation.CREATE, ResourceType.CLUSTER) or authorized(
        ctx, Operation.CREATE, ResourceType.TOPIC, name
    )


#: The operations Kafka reports per resource type in "authorized operations" bit sets.
_REPORTED_OPERATIONS = {
    ResourceType.TOPIC: (
        Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
        Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE,
    ),
}  # fmt: skip


def authorized_operations(
    ctx: RequestContext, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> int:
    """Kafka's authorized-operations bit set (bit n = AclOperation code n) for a resource."""
    return sum(
        1 << op
        for op in _REPORTED_OPERATIONS[resource_type]
        if authorized(ctx, op, resource_type, name)
    )
