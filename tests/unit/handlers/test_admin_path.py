"""The admin handlers hand their changes to ``services.admin`` (issue 29, one path).

A node alone's admin (``LocalAdmin``) is a cluster of one that is its own controller:
the change is made when the handler answers (no Deferred), with a cluster's error codes.
A clustered broker out of the cluster (before it joined, after it left:
``NotInCluster``) controls nothing and changes nothing, not even its local copies. The
services are real (topics in memory, the local view); the requests are the wire's.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from trio_broker.config import BrokerConfig
from trio_broker.handlers.alter_configs import TOPIC_RESOURCE, handle_alter_configs
from trio_broker.handlers.base import ClientInfo, Deferred, RequestContext
from trio_broker.handlers.create_partitions import handle_create_partitions
from trio_broker.handlers.create_topics import handle_create_topics
from trio_broker.handlers.delete_topics import handle_delete_topics
from trio_broker.handlers.elect_leaders import handle_elect_leaders
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.services.local_replication import LocalView
from trio_broker.services.topic_admin import LocalAdmin, NotInCluster, TopicAdmin
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

ENDPOINTS = [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
Req = m.CreateTopicsRequest


@attrs.define
class Services:
    admin: TopicAdmin
    topics: TopicManager
    config: BrokerConfig = attrs.Factory(lambda: BrokerConfig(node_id=1))
    authorizer: Any = None
    #: A node alone's internal topics clients read: none here.
    own_internal_topics: dict[str, Any] = attrs.Factory(dict)

    def monotonic_ms(self) -> float:
        return trio.current_time() * 1000

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def alone() -> Services:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    return Services(LocalAdmin(LocalView(1, None, topics, lambda: ENDPOINTS)), topics)


def out_of_the_cluster() -> Services:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    return Services(NotInCluster(1), topics)


def context(services: Services, api_key: int, version: int) -> RequestContext:
    header = RequestHeader(api_key, version, 1, "admin")
    return RequestContext(header=header, services=services, client=ClientInfo(1, "127.0.0.1", 1))


def topic(name: str, partitions: int = 1, rf: int = 1, *, assigned: Any = None) -> Any:
    assignments = [
        Req.CreatableTopic.CreatableReplicaAssignment(partition_index=i, broker_ids=replicas)
        for i, replicas in enumerate(assigned or [])
    ]
    if assignments:
        partitions = rf = -1
    return Req.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf,
                              configs=[], assignments=assignments)  # fmt: skip


async def create(services: Services, *topics: Any, validate_only: bool = False) -> list[int]:
    request = Req(topics=list(topics), timeout_ms=1000, validate_only=validate_only)
    answer = await handle_create_topics(context(services, m.ApiKey.CREATE_TOPICS, 5), request)
    assert not isinstance(answer, Deferred)  # both answer on the handler task
    return [t.error_code for t in answer.topics]


async def elect(services: Services, partitions: list[int]) -> Any:
    Topic = m.ElectLeadersRequest.TopicPartitions
    request = m.ElectLeadersRequest(
        election_type=0, topic_partitions=[Topic(topic="t", partitions=partitions)],
        timeout_ms=1000,
    )  # fmt: skip
    return await handle_elect_leaders(context(services, m.ApiKey.ELECT_LEADERS, 1), request)


async def alter_retention(services: Services, name: str) -> int:
    Resource = m.AlterConfigsRequest.AlterConfigsResource
    request = m.AlterConfigsRequest(
        resources=[Resource(
            resource_type=TOPIC_RESOURCE, resource_name=name,
            configs=[Resource.AlterableConfig(name="retention.ms", value="5000")],
        )],
        validate_only=False,
    )  # fmt: skip
    answer = await handle_alter_configs(context(services, m.ApiKey.ALTER_CONFIGS, 1), request)
    assert not isinstance(answer, Deferred)
    return int(answer.responses[0].error_code)


async def test_alone_the_admin_is_a_cluster_of_one_that_changes_at_once() -> None:
    services = alone()
    assert await create(services, topic("v"), validate_only=True) == [ErrorCode.NONE]
    assert services.topics.get("v") is None  # checked only
    assert await create(
        services, topic("t", 2), topic("two", rf=2), topic("mine", assigned=[[1]]),
        topic("elsewhere", assigned=[[2]]), topic("t_x"), topic("t.x"),
    ) == [
        ErrorCode.NONE, ErrorCode.INVALID_REPLICATION_FACTOR, ErrorCode.NONE,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT, ErrorCode.NONE, ErrorCode.INVALID_TOPIC_EXCEPTION,
    ]  # fmt: skip
    assert sorted(services.topics.topics) == ["mine", "t", "t_x"]

    Grow = m.CreatePartitionsRequest.CreatePartitionsTopic
    Assignment = m.CreatePartitionsRequest.CreatePartitionsTopic.CreatePartitionsAssignment
    grow = m.CreatePartitionsRequest(
        topics=[Grow(name="t", count=3, assignments=[Assignment(broker_ids=[1])] * 1),
                Grow(name="mine", count=2, assignments=[Assignment(broker_ids=[1, 1])])],
        timeout_ms=1000, validate_only=False,
    )  # fmt: skip
    grown = await handle_create_partitions(context(services, m.ApiKey.CREATE_PARTITIONS, 1), grow)
    assert [r.error_code for r in grown.results] == [
        ErrorCode.NONE, ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    ]  # fmt: skip
    assert len(services.topics.get("t").logs) == 3  # type: ignore[union-attr]

    assert await alter_retention(services, "t") == ErrorCode.NONE
    assert services.topics.get("t").info.configs == {"retention.ms": "5000"}  # type: ignore[union-attr]
    assert await alter_retention(services, "nope") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    elected = await elect(services, [0, 7])
    assert [(p.partition_id, p.error_code) for p in elected.replica_election_results[0]
            .partition_result] == [(0, ErrorCode.ELECTION_NOT_NEEDED),
                                   (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]  # fmt: skip

    request = m.DeleteTopicsRequest(topic_names=["t", "nope"], timeout_ms=1000)
    deleted = await handle_delete_topics(context(services, m.ApiKey.DELETE_TOPICS, 4), request)
    assert [r.error_code for r in deleted.responses] == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]  # fmt: skip
    assert services.topics.get("t") is None


async def test_out_of_the_cluster_nothing_changes_not_even_a_local_copy() -> None:
    services = out_of_the_cluster()
    services.topics.create("t", 1)  # a copy of a cluster topic, held here
    # No live broker to place a replica on, no controller, no topic in the view.
    assert await create(services, topic("new")) == [ErrorCode.INVALID_REPLICATION_FACTOR]
    elected = await elect(services, [0])
    assert elected.error_code == ErrorCode.NOT_CONTROLLER
    assert await alter_retention(services, "t") == ErrorCode.NOT_CONTROLLER
    request = m.DeleteTopicsRequest(topic_names=["t"], timeout_ms=1000)
    deleted = await handle_delete_topics(context(services, m.ApiKey.DELETE_TOPICS, 4), request)
    assert [r.error_code for r in deleted.responses] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    copy = services.topics.get("t")
    assert copy is not None and copy.info.configs == {}
