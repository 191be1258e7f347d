"""Where a cluster's ACLs and SCRAM users live in ZooKeeper, and what each znode holds.

Kafka's ZooKeeper-era layout:

- ``/kafka-acl/<ResourceType>/<name>``: the LITERAL bindings of one resource;
- ``/kafka-acl-extended/prefixed/<ResourceType>/<name>``: the PREFIXED ones;
  each ``{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",
  "operation":"Read","host":"*"}, ...]}``;
- ``/config/users/<user>``: ``{"version":1,"config":{"SCRAM-SHA-256":
  "salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=4096"}}``.

Resource names are znode names as they are, except that ``%`` and ``/`` (and the
characters ZooKeeper refuses) are percent-escaped: a group may be named ``a/b``, which
Kafka's layout could not store. User names are URL-encoded, as Kafka's ``Sanitizer``
does. A znode that does not parse is a :class:`CoordinationDataError`, never a crash.
Pure: no trio, no kazoo.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from urllib.parse import quote, unquote

from trio_broker.cluster.zk_layout import CoordinationDataError, _dump, _load
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.security.credentials import SCRAM_MECHANISMS, ScramCredential

__all__ = [
    "ACL_PARENTS",
    "USERS",
    "AclResource",
    "acl_parent",
    "acl_path",
    "credential_text",
    "decode_acls",
    "decode_user",
    "decode_user_config",
    "encode_acls",
    "encode_user",
    "encode_user_config",
    "group_by_resource",
    "resource_of_path",
    "user_of_path",
    "user_path",
]

LITERAL_ACLS = "/kafka-acl"
PREFIXED_ACLS = "/kafka-acl-extended/prefixed"
USERS = "/config/users"

#: (resource type, pattern type) of a resource znode.
AclResource = tuple[ResourceType, str, PatternType]


def _camel(name: str) -> str:
    """TRANSACTIONAL_ID -> TransactionalId: how Kafka's enums print in the layout."""
    return "".join(word.capitalize() for word in name.split("_"))


_CONCRETE_TYPES = [t for t in ResourceType if t not in (ResourceType.UNKNOWN, ResourceType.ANY)]
_TYPE_NAMES: dict[ResourceType, str] = {t: _camel(t.name) for t in _CONCRETE_TYPES}
_TYPES_BY_NAME = {name: t for t, name in _TYPE_NAMES.items()}
_OPS = {_camel(op.name): op for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)}
_PERMISSIONS = {"Allow": Permission.ALLOW, "Deny": Permission.DENY}
_PATTERN_ROOTS = {PatternType.LITERAL: LITERAL_ACLS, PatternType.PREFIXED: PREFIXED_ACLS}


def acl_parent(resource_type: ResourceType, pattern: PatternType) -> str:
    """The znode whose children are the resources of one type and pattern."""
    return f"{_PATTERN_ROOTS[pattern]}/{_TYPE_NAMES[resource_type]}"


#: Every parent znode of resource znodes (each concrete type, LITERAL and PREFIXED).
ACL_PARENTS: tuple[str, ...] = tuple(
    acl_parent(t, p) for p in _PATTERN_ROOTS for t in _CONCRETE_TYPES
)


def _is_plain(ch: str) -> bool:
    """A character a znode name may hold as it is (ZooKeeper's PathUtils rules)."""
    code = ord(ch)
    return not (
        ch in "%/"
        or code < 0x20
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xF8FF
        or code >= 0xFFF0
    )


def escape_name(name: str) -> str:
    escaped = "".join(ch if _is_plain(ch) else quote(ch, safe="") for ch in name)
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def _unescape(child: str, path: str) -> str:
    try:
        return unquote(child, errors="strict")
    except UnicodeDecodeError:
        raise CoordinationDataError(f"{path}: bad percent-escape in the name") from None


def acl_path(resource_type: ResourceType, name: str, pattern: PatternType) -> str:
    return f"{acl_parent(resource_type, pattern)}/{escape_name(name)}"


def resource_of_path(path: str) -> AclResource:
    """The resource a znode under one of :data:`ACL_PARENTS` holds the bindings of."""
    parent, _, child = path.rpartition("/")
    for pattern, root in _PATTERN_ROOTS.items():
        head, _, type_name = parent.rpartition("/")
        if head == root and type_name in _TYPES_BY_NAME and child:
            return _TYPES_BY_NAME[type_name], _unescape(child, path), pattern
    raise CoordinationDataError(f"{path}: not an ACL resource znode")


def encode_acls(bindings: Iterable[AclBinding]) -> bytes:
    """One resource's bindings (they must all name it), in the order given."""
    return _dump({"version": 1, "acls": [{
        "principal": b.principal, "permissionType": _camel(b.permission.name),
        "operation": _camel(b.operation.name), "host": b.host,
    } for b in bindings]})  # fmt: skip


def decode_acls(raw: bytes, resource: AclResource) -> list[AclBinding]:
    resource_type, name, pattern = resource
    what = f"ACLs of {_TYPE_NAMES.get(resource_type, resource_type.name)} {name!r}"
    doc = _load(raw, what)
    if doc.get("version") != 1:
        raise CoordinationDataError(f"{what}: unknown version {doc.get('version')!r}")
    entries = doc.get("acls")
    if not isinstance(entries, list):
        raise CoordinationDataError(f"{what}: 'acls' must be a list")
    bindings: list[AclBinding] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise CoordinationDataError(f"{what}: an entry is not an object: {entry!r}")
        principal, host = entry.get("principal"), entry.get("host")
        operation = _OPS.get(str(entry.get("operation")))
        permission = _PERMISSIONS.get(str(entry.get("permissionType")))
        if not isinstance(principal, str) or ":" not in principal or not isinstance(host, str):
            raise CoordinationDataError(f"{what}: bad principal or host in {entry!r}")
        if operation is None or permission is None:
            raise CoordinationDataError(f"{what}: bad operation or permissionType in {entry!r}")
        bindings.append(
            AclBinding(resource_type, name, pattern, principal, host, operation, permission)
        )
    return bindings


def group_by_resource(bindings: Iterable[AclBinding]) -> dict[AclResource, list[AclBinding]]:
    grouped: dict[AclResource, list[AclBinding]] = {}
    for b in bindings:
        grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    return grouped


# ---------------------------------------------------------------------- SCRAM users


def user_path(user: str) -> str:
    return f"{USERS}/{quote(user, safe='')}"


def user_of_path(path: str) -> str:
    parent, _, child = path.rpartition("/")
    if parent != USERS or not child:
        raise CoordinationDataError(f"{path}: not a user znode")
    return _unescape(child, path)


def credential_text(c: ScramCredential) -> str:
    """One SCRAM credential as Kafka's ScramCredentialUtils writes it."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return (
        f"salt={b64(c.salt)},stored_key={b64(c.stored_key)},"
        f"server_key={b64(c.server_key)},iterations={c.iterations}"
    )


def encode_user_config(config: dict[str, str]) -> bytes:
    return _dump({"version": 1, "config": config})


def encode_user(credentials: dict[str, ScramCredential]) -> bytes:
    return encode_user_config({m: credential_text(c) for m, c in sorted(credentials.items())})


def decode_user_config(raw: bytes, user: str) -> dict[str, str]:
    """Every key of a user's config znode (Kafka keeps the user's client quotas in the
    same znode: a change of its credentials keeps them)."""
    what = f"user {user!r}"
    doc = _load(raw, what)
    config = doc.get("config")
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise CoordinationDataError(f"{what}: 'config' must be an object of strings")
    return {str(k): v for k, v in config.items()}


def decode_user(raw: bytes, user: str) -> dict[str, ScramCredential]:
    """The SCRAM credentials in a user's config znode (other keys are not ours)."""
    config = decode_user_config(raw, user)
    return {
        mech: _credential(value, f"user {user!r} {mech}")
        for mech, value in config.items()
        if mech in SCRAM_MECHANISMS
    }


def _credential(value: str, what: str) -> ScramCredential:
    fields = dict(_fields(value, what))
    try:
        credential = ScramCredential(
            base64.b64decode(fields["salt"], validate=True),
            base64.b64decode(fields["stored_key"], validate=True),
            base64.b64decode(fields["server_key"], validate=True),
            int(fields["iterations"]),
        )
    except KeyError as missing:
        raise CoordinationDataError(f"{what}: no {missing}") from None
    except (binascii.Error, ValueError) as exc:
        raise CoordinationDataError(f"{what}: {exc}") from None
    if credential.iterations < 1 or not credential.salt:
        raise CoordinationDataError(f"{what}: no salt or iterations < 1")
    return credential


def _fields(value: str, what: str) -> Iterator[tuple[str, str]]:
    for part in value.split(","):
        key, sep, field = part.partition("=")
        if not sep:
            raise CoordinationDataError(f"{what}: {part!r} is not key=value")
        yield key.strip(), field.strip()
