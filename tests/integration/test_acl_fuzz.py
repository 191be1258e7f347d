"""Arbitrary ACL and AlterConfigs requests (any enum codes, null names, odd hosts and
config operations) through the real handlers of a real broker with ACLs on: every
answer encodes at its version, has one result per input, and the ACL set on disk
always reloads to what the broker holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trio_broker.config import BrokerConfig
from trio_broker.handlers.alter_configs import handle_alter_configs
from trio_broker.handlers.base import ClientInfo, RequestContext
from trio_broker.handlers.create_acls import handle_create_acls
from trio_broker.handlers.delete_acls import handle_delete_acls
from trio_broker.handlers.describe_acls import handle_describe_acls
from trio_broker.handlers.incremental_alter_configs import handle_incremental_alter_configs
from trio_broker.protocol import messages as m
from trio_broker.security.acl_store import AclStore
from trio_broker.server.broker import Broker

codes = st.integers(-1, 16)
# Mostly valid codes, so that creations succeed and deletes find something to delete.
rtypes = st.one_of(st.sampled_from([2, 3, 4, 5]), codes)
patterns = st.one_of(st.sampled_from([3, 4]), codes)
ops = st.one_of(st.integers(2, 12), codes)
perms = st.one_of(st.sampled_from([2, 3]), codes)
names = st.one_of(st.none(), st.sampled_from(["", "*", "t", "t-1", "kafka-cluster", "g"]))
principals = st.one_of(st.none(), st.sampled_from(["User:a", "User:*", "a", ":", "User:"]))
hosts = st.one_of(st.none(), st.sampled_from(["*", "", "10.0.0.1"]))
# Creations: mostly storable bindings, some with a bad principal, host or name.
good_names = st.sampled_from(["t", "t-", "*", "g", "kafka-cluster", "t", ""])
good_principals = st.sampled_from(["User:a", "User:*", "User:b", "User:a", "a"])
good_hosts = st.sampled_from(["*", "10.0.0.1", "*", ""])
Creation = m.CreateAclsRequest.AclCreation
Filter = m.DeleteAclsRequest.DeleteAclsFilter
creations = st.builds(
    Creation, resource_type=rtypes, resource_name=good_names, resource_pattern_type=patterns,
    principal=good_principals, host=good_hosts, operation=ops, permission_type=perms,
)  # fmt: skip
filters = st.builds(
    Filter, resource_type_filter=codes, resource_name_filter=names, pattern_type_filter=codes,
    principal_filter=principals, host_filter=hosts, operation=codes, permission_type=codes,
)  # fmt: skip
config_names = st.sampled_from(
    ["retention.ms", "segment.bytes", "cleanup.policy", "max.message.bytes", "nope", ""]
)
config_values = st.one_of(st.none(), st.sampled_from(["1", "-1", "0", "x", "delete", "compact"]))
AlterRes = m.AlterConfigsRequest.AlterConfigsResource
IncRes = m.IncrementalAlterConfigsRequest.AlterConfigsResource
alter_resources = st.builds(
    AlterRes, resource_type=st.sampled_from([2, 4, 8, 0]), resource_name=st.sampled_from(["t", "x"]),
    configs=st.lists(st.builds(AlterRes.AlterableConfig, name=config_names, value=config_values),
                     max_size=3),
)  # fmt: skip
inc_resources = st.builds(
    IncRes, resource_type=st.sampled_from([2, 4]), resource_name=st.sampled_from(["t", "x"]),
    configs=st.lists(st.builds(IncRes.AlterableConfig, name=config_names,
                               config_operation=st.integers(-1, 4), value=config_values),
                     max_size=3),
)  # fmt: skip

calls = st.one_of(
    st.tuples(st.just(m.ApiKey.CREATE_ACLS), st.integers(1, 3),
              st.builds(m.CreateAclsRequest, creations=st.lists(creations, max_size=3))),
    st.tuples(st.just(m.ApiKey.DELETE_ACLS), st.integers(1, 3),
              st.builds(m.DeleteAclsRequest, filters=st.lists(filters, max_size=3))),
    st.tuples(st.just(m.ApiKey.DESCRIBE_ACLS), st.integers(1, 3),
              st.builds(m.DescribeAclsRequest, resource_type_filter=codes,
                        resource_name_filter=names, pattern_type_filter=codes,
                        principal_filter=principals, host_filter=hosts, operation=codes,
                        permission_type=codes)),
    st.tuples(st.just(m.ApiKey.ALTER_CONFIGS), st.integers(0, 2),
              st.builds(m.AlterConfigsRequest, resources=st.lists(alter_resources, max_size=2),
                        validate_only=st.booleans())),
    st.tuples(st.just(m.ApiKey.INCREMENTAL_ALTER_CONFIGS), st.integers(0, 1),
              st.builds(m.IncrementalAlterConfigsRequest,
                        resources=st.lists(inc_resources, max_size=2),
                        validate_only=st.booleans())),
)  # fmt: skip
HANDLER = {
    m.ApiKey.CREATE_ACLS: handle_create_acls, m.ApiKey.DELETE_ACLS: handle_delete_acls,
    m.ApiKey.DESCRIBE_ACLS: handle_describe_acls, m.ApiKey.ALTER_CONFIGS: handle_alter_configs,
    m.ApiKey.INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
}  # fmt: skip


def results_of(api_key: int, response: Any) -> int | None:
    if api_key == m.ApiKey.CREATE_ACLS:
        return len(response.results)
    if api_key == m.ApiKey.DELETE_ACLS:
        return len(response.filter_results)
    if api_key == m.ApiKey.DESCRIBE_ACLS:
        return None
    return len(response.responses)


def inputs_of(api_key: int, request: Any) -> int | None:
    if api_key == m.ApiKey.CREATE_ACLS:
        return len(request.creations)
    if api_key == m.ApiKey.DELETE_ACLS:
        return len(request.filters)
    if api_key == m.ApiKey.DESCRIBE_ACLS:
        return None
    return len(request.resources)


@pytest.mark.timeout(300)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(calls, min_size=1, max_size=8))
def test_arbitrary_requests(tmp_path: Path, sequence: list[tuple[int, int, Any]]) -> None:
    import tempfile

    async def main(data_dir: Path) -> None:
        config = BrokerConfig(port=0, data_dir=data_dir, authorizer_class_name="acl",
                              super_users="User:ANONYMOUS")  # fmt: skip
        broker = Broker(config)
        broker.topics.create("t", 1)
        try:
            for api_key, version, request in sequence:
                header = m.RequestHeader(api_key, version, 1, "fuzz")
                ctx = RequestContext(header, broker, ClientInfo(1, "127.0.0.1", 1))
                response = await HANDLER[api_key](ctx, request)
                m.encode_response(api_key, version, 1, response)  # every field encodable
                assert results_of(api_key, response) == inputs_of(api_key, request)
            assert broker.authorizer is not None
            assert AclStore(data_dir).bindings() == broker.authorizer.bindings()
            event("ACLs stored" if broker.authorizer.bindings() else "no ACL stored")
        finally:
            broker.topics.close()

    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        trio.run(main, Path(tmp) / "data")
