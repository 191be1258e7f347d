"""DeleteAcls: remove the bindings each filter matches (ALTER on the cluster)."""

from __future__ import annotations

from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.describe_acls import access_error, filter_from_wire
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, filter_error
from trio_broker.security.shared_store import SharedStoreError

Resp = m.DeleteAclsResponse
FilterResult = Resp.DeleteAclsFilterResult
Matching = FilterResult.DeleteAclsMatchingAcl


@handles(m.ApiKey.DELETE_ACLS)
async def handle_delete_acls(
    ctx: RequestContext, request: m.DeleteAclsRequest
) -> m.DeleteAclsResponse | Deferred:
    refused = access_error(ctx, Operation.ALTER)
    if refused is not None:
        code, message = refused
        return Resp(
            throttle_time_ms=0,
            filter_results=[
                FilterResult(error_code=code, error_message=message) for _ in request.filters
            ],
        )
    authorizer = ctx.services.authorizer
    assert authorizer is not None  # access_error said it is on
    filters = [filter_from_wire(wire) for wire in request.filters]
    problems = [filter_error(f) for f in filters]
    usable = [f for f, problem in zip(filters, problems, strict=True) if problem is None]
    shared = ctx.services.shared_security
    if shared is not None:

        async def delete_shared() -> m.DeleteAclsResponse:
            # In a cluster: from ZooKeeper, where every broker's copy follows.
            try:
                removed = await shared.remove_acls(usable)
            except SharedStoreError as exc:
                return _failed(len(filters), f"cannot store ACLs: {exc}")
            return _answer(problems, removed)

        return Deferred(delete_shared)
    try:
        removed = authorizer.store.remove(usable)
    except OSError as exc:
        return _failed(len(filters), f"cannot store ACLs: {exc}")
    return _answer(problems, removed)


def _failed(count: int, message: str) -> m.DeleteAclsResponse:
    return Resp(
        throttle_time_ms=0,
        filter_results=[
            FilterResult(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=message)
            for _ in range(count)
        ],
    )


def _answer(problems: list[str | None], deleted: list[list[AclBinding]]) -> m.DeleteAclsResponse:
    """One result per filter: its problem, or what it deleted."""
    removed = iter(deleted)
    results: list[FilterResult] = []
    for problem in problems:
        if problem is not None:
            results.append(
                FilterResult(error_code=ErrorCode.INVALID_REQUEST, error_message=problem)
            )
            continue
        matching = [
            Matching(
                error_code=ErrorCode.NONE, error_message=None,
                resource_type=b.resource_type, resource_name=b.resource_name,
                pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                operation=b.operation, permission_type=b.permission,
            )
            for b in next(removed)
        ]  # fmt: skip
        results.append(FilterResult(error_code=ErrorCode.NONE, error_message=None,
                                    matching_acls=matching))  # fmt: skip
    return Resp(throttle_time_ms=0, filter_results=results)
