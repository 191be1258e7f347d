"""DescribeAcls: the bindings a filter matches, grouped by resource pattern.

Needs DESCRIBE on the cluster. With no authorizer configured the answer is
SECURITY_DISABLED, as Kafka's. Also home of the wire -> filter conversion that
DeleteAcls shares.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from trio_broker.handlers.authorization import authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import (
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    filter_error,
)

Resp = m.DescribeAclsResponse
E = TypeVar("E", bound=enum.IntEnum)


def enum_or_unknown(kind: type[E], code: int) -> E:
    """A wire code as the enum; codes we do not know are UNKNOWN (0), as in Kafka."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


def filter_from_wire(
    wire: m.DescribeAclsRequest | m.DeleteAclsRequest.DeleteAclsFilter,
) -> AclFilter:
    """DescribeAcls request / DeleteAcls filter fields -> AclFilter."""
    return AclFilter(
        resource_type=enum_or_unknown(ResourceType, wire.resource_type_filter),
        resource_name=wire.resource_name_filter,
        # v0 has no pattern type: Kafka reads it as LITERAL.
        pattern_type=enum_or_unknown(PatternType, wire.pattern_type_filter),
        principal=wire.principal_filter,
        host=wire.host_filter,
        operation=enum_or_unknown(Operation, wire.operation),
        permission=enum_or_unknown(Permission, wire.permission_type),
    )


def access_error(ctx: RequestContext, op: Operation) -> tuple[ErrorCode, str] | None:
    """The error every ACL API answers before looking at its input, or None."""
    if ctx.services.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, "no authorizer is configured (authorizer.class.name)"
    if not authorized(ctx, op, ResourceType.CLUSTER):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{op.name} on the cluster is not allowed"
    return None


@handles(m.ApiKey.DESCRIBE_ACLS)
async def handle_describe_acls(
    ctx: RequestContext, request: m.DescribeAclsRequest
) -> m.DescribeAclsResponse:
    refused = access_error(ctx, Operation.DESCRIBE)
    if refused is not None:
        return Resp(throttle_time_ms=0, error_code=refused[0], error_message=refused[1])
    authorizer = ctx.services.authorizer
    assert authorizer is not None  # access_error said it is on
    acl_filter = filter_from_wire(request)
    problem = filter_error(acl_filter)
    if problem is not None:
        return Resp(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, error_message=problem)
    grouped: dict[tuple[int, str, int], list[Resp.DescribeAclsResource.AclDescription]] = {}
    for binding in authorizer.bindings():
        if not acl_filter.matches(binding):
            continue
        key = (binding.resource_type, binding.resource_name, binding.pattern_type)
        grouped.setdefault(key, []).append(
            Resp.DescribeAclsResource.AclDescription(
                principal=binding.principal, host=binding.host,
                operation=binding.operation, permission_type=binding.permission,
            )
        )  # fmt: skip
    resources = [
        Resp.DescribeAclsResource(
            resource_type=rtype, resource_name=name, pattern_type=pattern, acls=acls
        )
        for (rtype, name, pattern), acls in grouped.items()
    ]
    return Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                resources=resources)  # fmt: skip
