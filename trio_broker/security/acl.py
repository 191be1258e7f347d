"""ACL bindings and the authorization decision, as Kafka's StandardAuthorizer makes it.

Sans-I/O: plain data and pure functions, no trio, no files (the store is
``acl_store.py``, the request-side glue ``authorize.py``). The enums carry
Kafka's wire codes, so a binding goes to and from CreateAcls/DescribeAcls
without translation.

Rules (Kafka's):

- a super user is allowed everything;
- a binding applies to a resource when its resource type is the same and its
  pattern matches the name: LITERAL equal, LITERAL ``*`` (every name), or
  PREFIXED with a prefix of the name; to a principal when equal or ``User:*``;
  to a host when equal or ``*``;
- DENY wins: one applicable DENY for the operation (or ALL) refuses;
- an applicable ALLOW for the operation, for ALL, or for an operation that
  implies it (READ/WRITE/DELETE/ALTER imply DESCRIBE, ALTER_CONFIGS implies
  DESCRIBE_CONFIGS) allows;
- otherwise refused, unless no binding at all exists for the resource and
  ``allow.everyone.if.no.acl.found`` is set.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: The name of the one CLUSTER resource, as Kafka spells it.
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

#: Resource types a binding may name (Kafka also stores USER/DELEGATION_TOKEN ACLs).
STORABLE_TYPES = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID,
     ResourceType.DELEGATION_TOKEN, ResourceType.USER}
)  # fmt: skip

#: An ALLOW for the key also allows these operations.
_IMPLIED: dict[Operation, frozenset[Operation]] = {
    Operation.READ: frozenset({Operation.DESCRIBE}),
    Operation.WRITE: frozenset({Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.DESCRIBE}),
    Operation.ALTER_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS}),
}


@attrs.frozen
class AclBinding:
    """One ACL: who may (or may not) do what to which resources, from where."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def applies_to_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return False

    def applies_to_client(self, principal: str, host: str) -> bool:
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)

    def covers(self, operation: Operation) -> bool:
        """Whether this binding speaks about ``operation`` (implication only for ALLOW)."""
        if self.operation in (Operation.ALL, operation):
            return True
        return self.permission == Permission.ALLOW and operation in _IMPLIED.get(
            self.operation, frozenset()
        )


def validate_binding(binding: AclBinding) -> str | None:
    """Why CreateAcls must refuse ``binding`` (Kafka's checks), or None if it is storable."""
    if binding.resource_type not in STORABLE_TYPES:
        return f"resource type {binding.resource_type.name} is not a concrete type"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"pattern type {binding.pattern_type.name} is not LITERAL or PREFIXED"
    if binding.operation in (Operation.UNKNOWN, Operation.ANY):
        return f"operation {binding.operation.name} is not a concrete operation"
    if binding.permission not in (Permission.ALLOW, Permission.DENY):
        return f"permission {binding.permission.name} is not ALLOW or DENY"
    if not binding.resource_name:
        return "the resource name is empty"
    kind, sep, name = binding.principal.partition(":")
    if not sep or not kind or not name:
        return f"principal {binding.principal!r} is not of the form Type:name"
    if not binding.host:
        return "the host is empty ('*' means every host)"
    return None


@attrs.frozen
class AclFilter:
    """DescribeAcls/DeleteAcls filter; None and ANY match everything.

    ``pattern_type`` MATCH selects the bindings that would apply to
    ``resource_name`` (literal, wildcard and prefixed), as Kafka does.
    """

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and binding.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(binding):
            return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation != Operation.ANY and binding.operation != self.operation:
            return False
        return self.permission == Permission.ANY or binding.permission == self.permission

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            return binding.applies_to_resource(binding.resource_type, self.resource_name)
        if self.pattern_type not in (PatternType.ANY, binding.pattern_type):
            return False
        return self.resource_name is None or binding.resource_name == self.resource_name


def filter_error(acl_filter: AclFilter) -> str | None:
    """Why a filter is unusable (UNKNOWN codes), or None."""
    for value in (acl_filter.resource_type, acl_filter.pattern_type, acl_filter.operation,
                  acl_filter.permission):  # fmt: skip
        if value == 0:
            return f"{type(value).__name__} UNKNOWN cannot be used in a filter"
    return None


@attrs.frozen
class AuthorizerSettings:
    #: Principals that are allowed everything (``super.users``).
    super_users: frozenset[str] = frozenset()
    #: ``allow.everyone.if.no.acl.found``: a resource without any binding is open.
    allow_if_no_acl: bool = False


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users`` is a semicolon-separated list of principals, as in Kafka."""
    return frozenset(p.strip() for p in value.split(";") if p.strip())


def authorize(
    acls: Iterable[AclBinding],
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
    resource_name: str,
) -> bool:
    """Kafka's decision for one action on one resource (see the module docstring)."""
    if principal in settings.super_users:
        return True
    any_for_resource = False
    allowed = False
    for acl in acls:
        if not acl.applies_to_resource(resource_type, resource_name):
            continue
        any_for_resource = True
        if not acl.applies_to_client(principal, host) or not acl.covers(operation):
            continue
        if acl.permission == Permission.DENY:
            return False
        allowed = True
    return allowed or (not any_for_resource and settings.allow_if_no_acl)


def authorize_any(
    acls: Iterable[AclBinding],
    settings: AuthorizerSettings,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
) -> bool:
    """Whether ``operation`` is allowed on *some* resource of the type.

    Kafka's ``authorizeByResourceType`` (used by InitProducerId for an
    idempotent producer: WRITE on any topic): an applicable ALLOW binding that
    no applicable DENY binding covers whole.
    """
    if principal in settings.super_users:
        return True
    acls = list(acls)
    relevant = [
        acl
        for acl in acls
        if acl.resource_type == resource_type
        and acl.applies_to_client(principal, host)
        and acl.covers(operation)
    ]
    if not relevant:
        return settings.allow_if_no_acl and not any(
            acl.resource_type == resource_type for acl in acls
        )
    denies = [acl for acl in relevant if acl.permission == Permission.DENY]
    for allow in relevant:
        if allow.permission != Permission.ALLOW:
            continue
        if not any(_deny_covers(deny, allow) for deny in denies):
            return True
    return False


def _deny_covers(deny: AclBinding, allow: AclBinding) -> bool:
    """Whether every name ``allow`` applies to is also denied by ``deny``."""
    if deny.pattern_type == PatternType.LITERAL and deny.resource_name == WILDCARD:
        return True
    if deny.pattern_type == PatternType.PREFIXED:
        return allow.resource_name.startswith(deny.resource_name)
    return allow.pattern_type == PatternType.LITERAL and allow.resource_name == deny.resource_name
