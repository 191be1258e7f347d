"""CreateAcls: store new bindings (ALTER on the cluster); one result per creation.

Alone, into the authorizer's store; in a cluster, into ZooKeeper (a Deferred: the
answer waits for the write), where every broker's copy follows.
"""

from __future__ import annotations

from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.describe_acls import access_error, enum_or_unknown
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    validate_binding,
)
from trio_broker.security.shared_store import SharedSecurity

Resp = m.CreateAclsResponse
Result = Resp.AclCreationResult


def binding_from_wire(wire: m.CreateAclsRequest.AclCreation) -> AclBinding:
    return AclBinding(
        resource_type=enum_or_unknown(ResourceType, wire.resource_type),
        resource_name=wire.resource_name or "",
        pattern_type=enum_or_unknown(PatternType, wire.resource_pattern_type),
        principal=wire.principal or "",
        host=wire.host or "",
        operation=enum_or_unknown(Operation, wire.operation),
        permission=enum_or_unknown(Permission, wire.permission_type),
    )


@handles(m.ApiKey.CREATE_ACLS)
async def handle_create_acls(
    ctx: RequestContext, request: m.CreateAclsRequest
) -> m.CreateAclsResponse | Deferred:
    refused = access_error(ctx, Operation.ALTER)
    if refused is not None:
        code, message = refused
        return Resp(
            throttle_time_ms=0,
            results=[Result(error_code=code, error_message=message) for _ in request.creations],
        )
    authorizer = ctx.services.authorizer
    assert authorizer is not None  # access_error said it is on
    results: list[Result] = []
    valid: list[AclBinding] = []
    for creation in request.creations:
        binding = binding_from_wire(creation)
        problem = validate_binding(binding)
        if problem is None:
            valid.append(binding)
            results.append(Result(error_code=ErrorCode.NONE, error_message=None))
        else:
            results.append(Result(error_code=ErrorCode.INVALID_REQUEST, error_message=problem))
    shared = ctx.services.shared_security
    if valid and shared is not None:
        return Deferred(lambda: _store_shared(shared, valid, results))
    if valid:
        try:
            authorizer.store.add(valid)
        except OSError as exc:
            # Not durable, so not created: every otherwise valid creation fails.
            for result in results:
                if result.error_code == ErrorCode.NONE:
                    result.error_code = ErrorCode.UNKNOWN_SERVER_ERROR
                    result.error_message = f"cannot store ACLs: {exc}"
    return Resp(throttle_time_ms=0, results=results)


async def _store_shared(
    shared: SharedSecurity, valid: list[AclBinding], results: list[Result]
) -> m.CreateAclsResponse:
    """In a cluster: into ZooKeeper, where every broker's copy follows."""
    problems = iter(await shared.add_acls(valid))
    for result in results:
        if result.error_code == ErrorCode.NONE and (problem := next(problems)) is not None:
            result.error_code = ErrorCode.UNKNOWN_SERVER_ERROR
            result.error_message = problem
    return Resp(throttle_time_ms=0, results=results)
