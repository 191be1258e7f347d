"""``trio-broker acls add|remove|list``: manage a running broker's ACLs over CreateAcls,
DeleteAcls and DescribeAcls (the connecting principal needs ALTER/DESCRIBE on the
cluster, or to be a super user; see docs/acls.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from trio_broker.admin.client import AdminError, BlockingClient, add_bootstrap_argument, check
from trio_broker.admin.commands import table
from trio_broker.protocol import messages as m
from trio_broker.security.acl import (
    CLUSTER_NAME,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

ACL_API_VERSION = 3
OPERATIONS = [op.name for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)]


def add_acls_command(sub: Any) -> None:
    acls = sub.add_parser("acls", help="add, remove and list ACLs")
    asub = acls.add_subparsers(dest="acls_command", required=True)
    for name, help_ in (
        ("add", "add ALLOW (or --deny) bindings: one per --operation"),
        ("remove", "remove the bindings matching the options (absent options match all)"),
        ("list", "list the bindings matching the options (absent options match all)"),
    ):
        p = asub.add_parser(name, help=help_)
        resource = p.add_mutually_exclusive_group(required=name == "add")
        resource.add_argument("--topic", metavar="NAME")
        resource.add_argument("--group", metavar="NAME")
        resource.add_argument("--transactional-id", metavar="NAME")
        resource.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument("--prefixed", action="store_true",
                       help="the name is a prefix (PREFIXED pattern; default LITERAL)")  # fmt: skip
        p.add_argument("--principal", metavar="TYPE:NAME", required=name == "add",
                       help="e.g. User:alice, or User:* for everyone")  # fmt: skip
        p.add_argument("--host", default="*" if name == "add" else None,
                       help="client IP the binding is for (add: default * = any host)")  # fmt: skip
        p.add_argument("--operation", choices=OPERATIONS, action="append",
                       required=name == "add", help="repeatable")  # fmt: skip
        p.add_argument("--deny", action="store_true", help="DENY instead of ALLOW")
        add_bootstrap_argument(p)
        p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")


def _resource(args: argparse.Namespace) -> tuple[ResourceType, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    return ResourceType.ANY, None


def _filters(args: argparse.Namespace) -> list[AclFilter]:
    rtype, name = _resource(args)
    if args.prefixed:
        pattern = PatternType.PREFIXED
    else:
        pattern = PatternType.ANY if name is None else PatternType.LITERAL
    permission = Permission.DENY if args.deny else Permission.ANY
    ops = [Operation[o] for o in args.operation] if args.operation else [Operation.ANY]
    return [
        AclFilter(rtype, name, pattern, args.principal, args.host, op, permission) for op in ops
    ]


def _filter_fields(f: AclFilter) -> dict[str, Any]:
    return {
        "resource_type_filter": f.resource_type, "resource_name_filter": f.resource_name,
        "pattern_type_filter": f.pattern_type, "principal_filter": f.principal,
        "host_filter": f.host, "operation": f.operation, "permission_type": f.permission,
    }  # fmt: skip


def _row(acl: Any, rtype: int, name: str, pattern: int) -> tuple[str, ...]:
    return (acl.principal, acl.host, Operation(acl.operation).name,
            Permission(acl.permission_type).name, ResourceType(rtype).name, name,
            PatternType(pattern).name)  # fmt: skip


HEADERS = ["PRINCIPAL", "HOST", "OPERATION", "PERMISSION", "RESOURCE", "NAME", "PATTERN"]


def acls_add(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    rtype, name = _resource(args)
    assert name is not None  # add requires a resource (argparse)
    Creation = m.CreateAclsRequest.AclCreation
    creations = [
        Creation(
            resource_type=rtype, resource_name=name,
            resource_pattern_type=PatternType.PREFIXED if args.prefixed else PatternType.LITERAL,
            principal=args.principal, host=args.host, operation=Operation[op],
            permission_type=Permission.DENY if args.deny else Permission.ALLOW,
        )
        for op in args.operation
    ]  # fmt: skip
    response = client.call(
        m.ApiKey.CREATE_ACLS, ACL_API_VERSION, m.CreateAclsRequest(creations=creations)
    )
    for op, result in zip(args.operation, response.results, strict=True):
        check(result.error_code, f"adding {op}", result.error_message)
    return acls_list(client, args, out)


def acls_remove(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    filters = _filters(args)
    Filter = m.DeleteAclsRequest.DeleteAclsFilter
    response = client.call(
        m.ApiKey.DELETE_ACLS, ACL_API_VERSION,
        m.DeleteAclsRequest(filters=[Filter(**_filter_fields(f)) for f in filters]),
    )  # fmt: skip
    rows = []
    for result in response.filter_results:
        check(result.error_code, "removing ACLs", result.error_message)
        for acl in result.matching_acls:
            rows.append(_row(acl, acl.resource_type, acl.resource_name, acl.pattern_type))
    table(HEADERS, rows, out)
    print(f"removed {len(rows)} binding(s)", file=out)
    return 0


def acls_list(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    rows = []
    seen = set()
    for f in _filters(args) if args.acls_command != "add" else _listing_filters(args):
        response = client.call(
            m.ApiKey.DESCRIBE_ACLS, ACL_API_VERSION, m.DescribeAclsRequest(**_filter_fields(f))
        )
        check(response.error_code, "listing ACLs", response.error_message)
        for resource in response.resources:
            for acl in resource.acls:
                row = _row(acl, resource.resource_type, resource.resource_name,
                           resource.pattern_type)  # fmt: skip
                if row not in seen:
                    seen.add(row)
                    rows.append(row)
    table(HEADERS, rows, out)
    return 0


def _listing_filters(args: argparse.Namespace) -> list[AclFilter]:
    """After ``add``: every binding of the resource pattern just written."""
    rtype, name = _resource(args)
    pattern = PatternType.PREFIXED if args.prefixed else PatternType.LITERAL
    return [AclFilter(rtype, name, pattern)]


def run_acls(args: argparse.Namespace, out: TextIO | None = None) -> int:
    # sys.stdout looked up per call, not at import: it may have been replaced since.
    out = out or sys.stdout
    fn = {"add": acls_add, "remove": acls_remove, "list": acls_list}[args.acls_command]
    try:
        with BlockingClient(args.bootstrap) as client:
            return fn(client, args, out)
    except AdminError as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 1
