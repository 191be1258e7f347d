"""The handlers' side of authorization: one call per check, a no-op when off.

Every handler asks :func:`authorized` (or :func:`authorized_any`) and answers
Kafka's *_AUTHORIZATION_FAILED error when refused. The request's principal is
the one decided when the connection read it (docs/security.md). With no
authorizer (``authorizer.class.name`` unset) every check passes.
"""

from __future__ import annotations

from trio_broker.handlers.base import RequestContext
from trio_broker.security.acl import CLUSTER_NAME, Operation, ResourceType

__all__ = ["Operation", "ResourceType", "authorized", "authorized_any"]


def authorized(
    ctx: RequestContext, op: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> bool:
    """Whether the request's principal may do ``op`` on the resource (always, when off)."""
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return True
    return authorizer.allowed(ctx.principal, ctx.client.host, op, resource_type, name)


def authorized_any(ctx: RequestContext, op: Operation, resource_type: ResourceType) -> bool:
    """Whether ``op`` is allowed on some resource of the type (InitProducerId: any topic)."""
    authorizer = ctx.services.authorizer
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
