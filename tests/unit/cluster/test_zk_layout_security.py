"""ACL and SCRAM-user znodes: Kafka's paths and JSON, round trips, refusals of bad data."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.cluster.security_znodes import (
    ACL_PARENTS,
    acl_path,
    decode_acls,
    decode_user,
    decode_user_config,
    encode_acls,
    encode_user,
    resource_of_path,
    user_of_path,
    user_path,
)
from trio_broker.cluster.zk_layout import CoordinationDataError
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.security.credentials import ScramCredential, credential_from_password

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED


def binding(name: str = "orders", op: Operation = Operation.READ, **kw: object) -> AclBinding:
    fields: dict[str, object] = dict(
        resource_type=TOPIC, resource_name=name, pattern_type=LITERAL, principal="User:alice",
        host="*", operation=op, permission=Permission.ALLOW,
    )  # fmt: skip
    fields.update(kw)
    return AclBinding(**fields)  # type: ignore[arg-type]


def test_paths_and_contents_are_kafkas() -> None:
    assert acl_path(TOPIC, "orders", LITERAL) == "/kafka-acl/Topic/orders"
    assert acl_path(GROUP, "bill", PREFIXED) == "/kafka-acl-extended/prefixed/Group/bill"
    assert acl_path(ResourceType.TRANSACTIONAL_ID, "t", LITERAL) == "/kafka-acl/TransactionalId/t"
    assert acl_path(TOPIC, "*", LITERAL) == "/kafka-acl/Topic/*"
    assert "/kafka-acl/Cluster" in ACL_PARENTS and len(ACL_PARENTS) == 12
    raw = encode_acls([binding(op=Operation.IDEMPOTENT_WRITE, permission=Permission.DENY)])
    assert json.loads(raw) == {"version": 1, "acls": [{
        "principal": "User:alice", "permissionType": "Deny", "operation": "IdempotentWrite",
        "host": "*"}]}  # fmt: skip
    assert user_path("alice") == "/config/users/alice"
    cred = ScramCredential(b"salt", b"stored", b"server", 4096)
    doc = json.loads(encode_user({"SCRAM-SHA-256": cred}))
    b64 = base64.b64encode
    assert doc == {"version": 1, "config": {"SCRAM-SHA-256": (
        f"salt={b64(b'salt').decode()},stored_key={b64(b'stored').decode()},"
        f"server_key={b64(b'server').decode()},iterations=4096")}}  # fmt: skip


@given(
    st.sampled_from([t for t in ResourceType if t > ResourceType.ANY]),
    st.text(min_size=1),
    st.sampled_from([LITERAL, PREFIXED]),
    st.lists(st.sampled_from([op for op in Operation if op > Operation.ANY]), min_size=1),
)
def test_acls_round_trip(
    rtype: ResourceType, name: str, pattern: PatternType, ops: list[Operation]
) -> None:
    bindings = [
        binding(name, op, resource_type=rtype, pattern_type=pattern, host=f"10.0.0.{i}")
        for i, op in enumerate(ops)
    ]
    path = acl_path(rtype, name, pattern)
    znode_name = path.rsplit("/", 1)[1]
    assert "/" not in znode_name and znode_name not in (".", "..")
    assert resource_of_path(path) == (rtype, name, pattern)
    assert decode_acls(encode_acls(bindings), (rtype, name, pattern)) == bindings


@given(st.text(min_size=1))
def test_user_names_round_trip(user: str) -> None:
    path = user_path(user)
    assert "/" not in path.rsplit("/", 1)[1]
    assert user_of_path(path) == user


def test_credentials_round_trip_and_other_keys_are_left_alone() -> None:
    creds = {m: credential_from_password(m, "pw", 4096) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
    assert decode_user(encode_user(creds), "alice") == creds
    # Kafka keeps a user's quotas in the same znode: not ours, but kept on reading.
    raw = json.dumps({"version": 1, "config": {
        "producer_byte_rate": "1024", "SCRAM-SHA-256": json.loads(encode_user(creds))["config"][
            "SCRAM-SHA-256"]}}).encode()  # fmt: skip
    assert decode_user(raw, "alice") == {"SCRAM-SHA-256": creds["SCRAM-SHA-256"]}
    assert decode_user_config(raw, "alice")["producer_byte_rate"] == "1024"


RESOURCE = (TOPIC, "orders", LITERAL)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"acls": []}',
        b'{"version": 2, "acls": []}',
        b'{"version": 1, "acls": {}}',
        b'{"version": 1, "acls": [1]}',
        b'{"version": 1, "acls": [{"principal": "alice", "permissionType": "Allow",'
        b' "operation": "Read", "host": "*"}]}',
        b'{"version": 1, "acls": [{"principal": "User:a", "permissionType": "Maybe",'
        b' "operation": "Read", "host": "*"}]}',
        b'{"version": 1, "acls": [{"principal": "User:a", "permissionType": "Allow",'
        b' "operation": "Any", "host": "*"}]}',
        b'{"version": 1, "acls": [{"principal": "User:a", "permissionType": "Allow",'
        b' "operation": "Read"}]}',
    ],
)
def test_malformed_acl_znodes_are_a_clear_error(raw: bytes) -> None:
    with pytest.raises(CoordinationDataError, match="ACLs of Topic 'orders'"):
        decode_acls(raw, RESOURCE)


@pytest.mark.parametrize(
    "config",
    [
        None,
        [],
        {"SCRAM-SHA-256": 7},
        {"SCRAM-SHA-256": "salt=AAAA,stored_key=AAAA,iterations=4096"},
        {"SCRAM-SHA-256": "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=many"},
        {"SCRAM-SHA-256": "salt=!!!,stored_key=AAAA,server_key=AAAA,iterations=4096"},
        {"SCRAM-SHA-256": "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=0"},
        {"SCRAM-SHA-256": "salt=AAAA stored_key=AAAA"},
    ],
)
def test_malformed_user_znodes_are_a_clear_error(config: object) -> None:
    with pytest.raises(CoordinationDataError, match="user 'alice'"):
        decode_user(json.dumps({"version": 1, "config": config}).encode(), "alice")


@pytest.mark.parametrize(
    "path",
    ["/kafka-acl/Topic", "/kafka-acl/Nothing/x", "/elsewhere/Topic/x", "/kafka-acl/Topic/%ff"],
)
def test_paths_that_are_no_resource_are_refused(path: str) -> None:
    with pytest.raises(CoordinationDataError):
        resource_of_path(path)
    with pytest.raises(CoordinationDataError):
        user_of_path(path)
