"""trio_broker.security.acl: Kafka's StandardAuthorizer rules, example by example and
as Hypothesis properties (DENY precedence, patterns, implied operations, super
users, allow-everyone, wildcard principal and host), plus the ACL store."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.security.acl import (
    AclBinding,
    AclFilter,
    AuthorizerSettings,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorize,
    authorize_any,
    parse_super_users,
    validate_binding,
)
from trio_broker.security.acl_store import AclStore

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"
NONE = AuthorizerSettings()


def acl(
    op: Operation, perm: Permission = ALLOW, name: str = "orders", pattern: PatternType = LIT,
    principal: str = ALICE, host: str = "*", rtype: ResourceType = T,
) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def check(acls: list[AclBinding], op: Operation, name: str = "orders", *,
          principal: str = ALICE, host: str = HOST, rtype: ResourceType = T,
          settings: AuthorizerSettings = NONE) -> bool:  # fmt: skip
    return authorize(acls, settings, principal, host, op, rtype, name)


CONCRETE_OPS = [op for op in Operation if op not in (Operation.UNKNOWN, Operation.ANY)]
names = st.text(alphabet="abc.-", min_size=1, max_size=6)
ops = st.sampled_from(CONCRETE_OPS)
bindings = st.builds(
    AclBinding,
    resource_type=st.sampled_from([T, G, C]),
    resource_name=st.one_of(names, st.just("*")),
    pattern_type=st.sampled_from([LIT, PRE]),
    principal=st.sampled_from([ALICE, BOB, "User:*"]),
    host=st.sampled_from(["*", HOST, "10.0.0.2"]),
    operation=ops,
    permission=st.sampled_from([ALLOW, DENY]),
)


# ---------------------------------------------------------------- examples


def test_nothing_is_allowed_without_acls() -> None:
    assert not check([], Operation.READ)


def test_literal_allow_and_other_names() -> None:
    acls = [acl(Operation.READ)]
    assert check(acls, Operation.READ)
    assert not check(acls, Operation.READ, "orders2")
    assert not check(acls, Operation.WRITE)


def test_prefixed_matches_names_starting_with_it() -> None:
    acls = [acl(Operation.WRITE, name="ord", pattern=PRE)]
    assert check(acls, Operation.WRITE, "orders")
    assert check(acls, Operation.WRITE, "ord")
    assert not check(acls, Operation.WRITE, "xorders")


def test_literal_wildcard_name_matches_every_resource_of_its_type() -> None:
    acls = [acl(Operation.READ, name="*")]
    assert check(acls, Operation.READ, "anything")
    assert not check(acls, Operation.READ, "anything", rtype=G)


def test_deny_wins_over_allow() -> None:
    acls = [acl(Operation.ALL), acl(Operation.WRITE, DENY, name="ord", pattern=PRE)]
    assert check(acls, Operation.READ)
    assert not check(acls, Operation.WRITE)


def test_implied_operations() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert check([acl(op)], Operation.DESCRIBE)
    assert check([acl(Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS)
    assert not check([acl(Operation.DESCRIBE)], Operation.READ)
    assert not check([acl(Operation.CREATE)], Operation.DESCRIBE)
    # A DENY does not imply: denying READ leaves DESCRIBE to the ALLOWs.
    assert check([acl(Operation.WRITE), acl(Operation.READ, DENY)], Operation.DESCRIBE)


def test_all_covers_every_operation_and_deny_all_refuses_everything() -> None:
    for op in CONCRETE_OPS:
        assert check([acl(Operation.ALL)], op)
        assert not check([acl(Operation.ALL), acl(Operation.ALL, DENY)], op)


def test_wildcard_principal_and_host() -> None:
    acls = [acl(Operation.READ, principal="User:*", host="*")]
    assert check(acls, Operation.READ, principal=BOB, host="192.168.1.9")
    host_bound = [acl(Operation.READ, host=HOST)]
    assert check(host_bound, Operation.READ)
    assert not check(host_bound, Operation.READ, host="10.0.0.2")
    assert not check([acl(Operation.READ)], Operation.READ, principal=BOB)


def test_super_users_bypass_even_deny() -> None:
    settings = AuthorizerSettings(super_users=parse_super_users("User:admin; User:ops"))
    assert settings.super_users == {"User:admin", "User:ops"}
    deny_all = [acl(Operation.ALL, DENY, name="*", principal="User:*")]
    assert check(deny_all, Operation.WRITE, principal="User:admin", settings=settings)
    assert not check(deny_all, Operation.WRITE, principal=BOB, settings=settings)


def test_allow_everyone_if_no_acl_found_only_for_resources_without_acls() -> None:
    settings = AuthorizerSettings(allow_if_no_acl=True)
    acls = [acl(Operation.READ, principal=BOB)]
    assert check([], Operation.WRITE, settings=settings)
    assert check(acls, Operation.READ, "payments", settings=settings)
    # "orders" has an ACL (for bob): alice falls under the ACLs, not the flag.
    assert not check(acls, Operation.READ, settings=settings)


def test_authorize_any_topic() -> None:
    assert authorize_any([acl(Operation.WRITE, name="x")], NONE, ALICE, HOST, Operation.WRITE, T)
    assert not authorize_any([], NONE, ALICE, HOST, Operation.WRITE, T)
    denied = [acl(Operation.WRITE, name="x"), acl(Operation.WRITE, DENY, name="*")]
    assert not authorize_any(denied, NONE, ALICE, HOST, Operation.WRITE, T)
    prefix_denied = [acl(Operation.WRITE, name="xy"), acl(Operation.WRITE, DENY, "x", PRE)]
    assert not authorize_any(prefix_denied, NONE, ALICE, HOST, Operation.WRITE, T)
    other = [acl(Operation.WRITE, name="a"), acl(Operation.WRITE, DENY, name="b")]
    assert authorize_any(other, NONE, ALICE, HOST, Operation.WRITE, T)


def test_validate_binding() -> None:
    assert validate_binding(acl(Operation.READ)) is None
    assert validate_binding(acl(Operation.ANY)) is not None
    assert validate_binding(acl(Operation.READ, principal="alice")) is not None
    assert validate_binding(acl(Operation.READ, pattern=PatternType.MATCH)) is not None
    assert validate_binding(acl(Operation.READ, rtype=ResourceType.ANY)) is not None
    assert validate_binding(acl(Operation.READ, host="")) is not None
    assert validate_binding(acl(Operation.READ, rtype=ResourceType.TRANSACTIONAL_ID)) is None


def test_filters() -> None:
    lit, star = acl(Operation.READ), acl(Operation.READ, name="*")
    pre = acl(Operation.READ, name="ord", pattern=PRE)
    everything = AclFilter()
    assert all(everything.matches(b) for b in (lit, pre, star))
    match = AclFilter(resource_name="orders", pattern_type=PatternType.MATCH)
    assert all(match.matches(b) for b in (lit, pre, star))
    assert not match.matches(acl(Operation.READ, name="other"))
    literal = AclFilter(resource_name="orders", pattern_type=LIT)
    assert literal.matches(lit) and not literal.matches(pre) and not literal.matches(star)
    assert not AclFilter(permission=DENY).matches(lit)
    assert AclFilter(principal=ALICE, operation=Operation.READ).matches(lit)


# ---------------------------------------------------------------- properties


@given(st.lists(bindings, max_size=8), ops, names, st.sampled_from([ALICE, BOB]))
def test_an_applicable_deny_always_refuses(
    acls: list[AclBinding], op: Operation, name: str, principal: str
) -> None:
    deny = acl(op, DENY, name=name, principal=principal)
    assert not check([*acls, deny], op, name, principal=principal)


@given(st.lists(bindings, max_size=8), ops, names)
def test_adding_an_allow_never_refuses_what_was_allowed(
    acls: list[AclBinding], op: Operation, name: str
) -> None:
    extra = acl(op, ALLOW, name=name)
    if check(acls, op, name):
        assert check([*acls, extra], op, name)


@given(st.lists(bindings, max_size=8), ops, names)
def test_decision_ignores_order(acls: list[AclBinding], op: Operation, name: str) -> None:
    assert check(acls, op, name) == check(list(reversed(acls)), op, name)


@given(st.lists(bindings, max_size=8), ops, names)
def test_super_user_is_always_allowed(acls: list[AclBinding], op: Operation, name: str) -> None:
    settings = AuthorizerSettings(super_users=frozenset({ALICE}))
    assert check(acls, op, name, settings=settings)


@given(st.lists(bindings, max_size=8), ops, names)
def test_allowed_means_an_applicable_allow_and_no_applicable_deny(
    acls: list[AclBinding], op: Operation, name: str
) -> None:
    # The reference: the rule spelled out directly.
    implied = {Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE,
                                    Operation.ALTER},
               Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS}}  # fmt: skip

    def applies(b: AclBinding) -> bool:
        name_ok = (b.pattern_type == LIT and b.resource_name in (name, "*")) or (
            b.pattern_type == PRE and name.startswith(b.resource_name)
        )
        return (b.resource_type == T and name_ok and b.principal in (ALICE, "User:*")
                and b.host in (HOST, "*"))  # fmt: skip

    deny = any(
        applies(b) and b.permission == DENY and b.operation in (op, Operation.ALL) for b in acls
    )
    allow = any(
        applies(b) and b.permission == ALLOW
        and (b.operation in (op, Operation.ALL) or b.operation in implied.get(op, set()))
        for b in acls
    )  # fmt: skip
    assert check(acls, op, name) == (allow and not deny)


@given(st.lists(bindings, max_size=8), ops, names)
def test_allow_everyone_only_changes_resources_without_acls(
    acls: list[AclBinding], op: Operation, name: str
) -> None:
    open_ = AuthorizerSettings(allow_if_no_acl=True)
    has_acl = any(b.applies_to_resource(T, name) for b in acls)
    if has_acl:
        assert check(acls, op, name, settings=open_) == check(acls, op, name)
    else:
        assert check(acls, op, name, settings=open_)


# ---------------------------------------------------------------- store


def test_store_persists_and_deletes(tmp_path: Path) -> None:
    store = AclStore(tmp_path)
    a, b = acl(Operation.READ), acl(Operation.WRITE, DENY, "ord", PRE, host=HOST)
    store.add([a, b, a])
    assert store.bindings() == [a, b]
    assert AclStore(tmp_path).bindings() == [a, b]
    removed = store.remove([AclFilter(permission=DENY), AclFilter(permission=DENY)])
    assert removed == [[b], [b]]
    assert AclStore(tmp_path).bindings() == [a]
    assert not (tmp_path / "acls.json.tmp").exists()


def test_memory_store_writes_nothing(tmp_path: Path) -> None:
    store = AclStore(None)
    store.add([acl(Operation.READ)])
    assert len(store) == 1
    assert list(tmp_path.iterdir()) == []


def test_config_keys(tmp_path: Path) -> None:
    from trio_broker.config import BrokerConfig, ConfigError, load_config
    from trio_broker.security.authorize import Authorizer

    path = tmp_path / "broker.toml"
    path.write_text(
        'authorizer.class.name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"\n'
        'super.users = "User:admin; User:ops"\n'
        "allow.everyone.if.no.acl.found = true\n"
    )
    config = load_config(path)
    authorizer = Authorizer.from_config(config, None)
    assert authorizer is not None
    assert authorizer.settings == AuthorizerSettings(frozenset({"User:admin", "User:ops"}), True)
    assert Authorizer.from_config(BrokerConfig(), None) is None  # off by default
    try:
        BrokerConfig(authorizer_class_name="com.example.Other").validate()
    except ConfigError as exc:
        assert "authorizer.class.name" in str(exc)
    else:
        raise AssertionError("an unknown authorizer must be refused")


@given(st.lists(bindings, max_size=10), st.lists(bindings, max_size=4))
def test_store_round_trip_and_filtered_delete(
    tmp_dir_bindings: list[AclBinding], to_delete: list[AclBinding]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        store = AclStore(Path(tmp))
        store.add(tmp_dir_bindings)
        unique = list(dict.fromkeys(tmp_dir_bindings))
        assert AclStore(Path(tmp)).bindings() == unique
        # Exact filters (every field given) delete exactly their binding.
        exact = [
            AclFilter(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
                      b.operation, b.permission)
            for b in to_delete
        ]  # fmt: skip
        store.remove(exact)
        expected = [b for b in unique if b not in to_delete]
        assert store.bindings() == expected
        assert AclStore(Path(tmp)).bindings() == expected
