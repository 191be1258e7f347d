"""ListConfigResources (API 74, KIP-1142) over a real socket against the in-process broker.

Raw requests through our codec check Kafka's rules (v0: client-metrics only; v1: the
types asked for, all five when none; an unknown type fails the request; DESCRIBE_CONFIGS
on the cluster); then Kafka 4.4's own kafka-configs (ConfigCommand), which lists
client-metrics resources through this API before describing them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.kafka_tools import tool
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

API = m.ApiKey.LIST_CONFIG_RESOURCES
Req = m.ListConfigResourcesRequest
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32


@pytest.fixture
async def raw(broker: Broker) -> AsyncIterator[RawClient]:
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        yield RawClient(stream)


def listed(response: Any) -> list[tuple[int, str]]:
    return [(r.resource_type, r.resource_name) for r in response.config_resources]


async def test_advertised_in_api_versions(raw: RawClient) -> None:
    response = await raw.call(m.ApiKey.API_VERSIONS, 3, m.ApiVersionsRequest(
        client_software_name="raw", client_software_version="1"))  # fmt: skip
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[API] == (0, 1)


async def test_lists_by_type(raw: RawClient, broker: Broker) -> None:
    for name in ("cfg-b", "cfg-a"):
        broker.topics.create(name, 1)
    node = str(broker.config.node_id)
    everything = await raw.call(API, 1, Req(resource_types=[]))
    assert everything.error_code == ErrorCode.NONE
    assert listed(everything) == [(BROKER_LOGGER, node), (BROKER, node),
                                  (TOPIC, "cfg-a"), (TOPIC, "cfg-b")]  # fmt: skip
    topics = await raw.call(API, 1, Req(resource_types=[TOPIC]))
    assert listed(topics) == [(TOPIC, "cfg-a"), (TOPIC, "cfg-b")]
    brokers = await raw.call(API, 1, Req(resource_types=[BROKER, GROUP, CLIENT_METRICS]))
    assert listed(brokers) == [(BROKER, node)]  # no group configs, no metrics subscriptions
    # v0 (ListClientMetricsResources): client-metrics resources only, none here.
    v0 = await raw.call(API, 0, Req())
    assert (v0.error_code, listed(v0)) == (ErrorCode.NONE, [])


async def test_an_unknown_type_fails_the_request(raw: RawClient, broker: Broker) -> None:
    broker.topics.create("cfg-x", 1)
    response = await raw.call(API, 1, Req(resource_types=[TOPIC, 3]))  # 3: not a config type
    assert (response.error_code, listed(response)) == (ErrorCode.UNSUPPORTED_VERSION, [])


class TestAuthorization:
    @pytest.fixture
    def broker_config(self, tmp_path: Path) -> BrokerConfig:
        return BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")

    async def test_needs_describe_configs_on_the_cluster(
        self, raw: RawClient, broker: Broker
    ) -> None:
        assert broker.authorizer is not None
        broker.topics.create("secret", 1)
        # DESCRIBE_CONFIGS on every topic is not enough: the cluster is what counts.
        broker.authorizer.store.add([AclBinding(
            RT.TOPIC, "*", PatternType.LITERAL, "User:ANONYMOUS", "*",
            Operation.DESCRIBE_CONFIGS, Permission.ALLOW)])  # fmt: skip
        refused = await raw.call(API, 1, Req(resource_types=[]))
        assert (refused.error_code, listed(refused)) == (
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])  # fmt: skip
        broker.authorizer.store.add([AclBinding(
            RT.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:ANONYMOUS", "*",
            Operation.DESCRIBE_CONFIGS, Permission.ALLOW)])  # fmt: skip
        allowed = await raw.call(API, 1, Req(resource_types=[TOPIC]))
        assert (allowed.error_code, listed(allowed)) == (ErrorCode.NONE, [(TOPIC, "secret")])


# ------------------------------------------------------------------ Kafka's kafka-configs


tools_classpath = tool.tools_classpath


@pytest.mark.timeout(300)
async def test_kafka_configs_lists_client_metrics(
    broker: Broker, bootstrap: str, tools_classpath: str
) -> None:
    """kafka-configs --describe --entity-type client-metrics (no name) lists the
    resources with this API; a broker without it fails the command."""
    done = await trio.to_thread.run_sync(lambda: tool.run_tool(
        tools_classpath, "ConfigCommand", "--bootstrap-server", bootstrap, "--describe",
        "--entity-type", "client-metrics"))  # fmt: skip
    assert done.stdout.strip() == ""  # no client-metrics resources to describe
    assert broker.handler_pool.latency.count(API) == 1
