"""Metadata and DescribeCluster read one view (``services.leaders.view``) alone and in a
cluster (issue 29): a node alone answers as a cluster of one, a clustered broker from
the cluster's view. The services are real (topics in memory, the local view); the
cluster's view is plain data, as the replica manager keeps it.

The by-id case is a regression test: a broker answered Metadata by topic id for a
cluster topic it held no replica of without checking DESCRIBE on that topic (the check
looked the id up among its local topics only), so a principal could learn the name and
partitions of a topic it may not describe.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from trio_broker.config import BrokerConfig
from trio_broker.handlers.base import ClientInfo, Deferred, RequestContext
from trio_broker.handlers.describe_cluster import handle_describe_cluster
from trio_broker.handlers.metadata import handle_metadata
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.security.acl import Operation, ResourceType
from trio_broker.services.cluster_view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.local_replication import LocalReplication, LocalView
from trio_broker.services.topic_admin import LocalAdmin
from trio_broker.services.topics import TopicError, TopicManager
from trio_broker.storage.log import LogConfig

ENDPOINTS = [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]


class DenyTopic:
    """An authorizer that allows everything but DESCRIBE (and CREATE) of one topic."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def allowed(
        self, principal: Any, host: str, op: Operation, kind: ResourceType, name: str
    ) -> bool:
        return not (kind == ResourceType.TOPIC and name == self.secret)


@attrs.define
class Services:
    leaders: Any
    config: BrokerConfig = attrs.Factory(lambda: BrokerConfig(node_id=1))
    cluster_id: str = "view"
    topics: TopicManager = attrs.Factory(lambda: TopicManager(None, LogConfig(), lambda: 0))
    authorizer: Any = None
    admin: Any = None
    #: A node alone's internal topics clients read: none here.
    own_internal_topics: dict[str, Any] = attrs.Factory(dict)

    def listener_name_for(self, connection_id: int | None) -> str:
        return "PLAINTEXT"


def context(services: Services, api_key: int, version: int) -> RequestContext:
    header = RequestHeader(api_key, version, 1, "view")
    return RequestContext(header=header, services=services, client=ClientInfo(1, "127.0.0.1", 1))


def alone() -> Services:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    services = Services(leaders=None, topics=topics)
    view = LocalView(1, "r1", topics, lambda: ENDPOINTS)
    services.leaders, services.admin = LocalReplication(view), LocalAdmin(view)
    return services


def in_a_cluster(secret_id: uuid.UUID) -> Services:
    view = ClusterView(1, controller_id=2)
    for broker in (1, 2):
        view.brokers[broker] = BrokerInfo(broker, "127.0.0.1", 9090 + broker)
    led = PartitionInfo(replicas=(2,), leader=2, leader_epoch=3, isr=(2,))
    view.topics["secret"] = TopicInfo("secret", secret_id, {0: led})  # none of it here
    return Services(leaders=type("Replication", (), {"view": view})())


def metadata_by_id(topic_id: uuid.UUID) -> m.MetadataRequest:
    wanted = m.MetadataRequest.MetadataRequestTopic(topic_id=topic_id, name=None)
    return m.MetadataRequest(topics=[wanted], allow_auto_topic_creation=False)


async def ask(services: Services, request: Any, api_key: int, version: int) -> Any:
    return await handle_metadata(context(services, api_key, version), request)


async def test_alone_every_topic_is_led_here_at_epoch_0_and_auto_created() -> None:
    services = alone()
    services.topics.create("mine", 2)
    wanted = [m.MetadataRequest.MetadataRequestTopic(name=n) for n in ("mine", "new")]
    request = m.MetadataRequest(topics=wanted, allow_auto_topic_creation=True)
    answer = await ask(services, request, m.ApiKey.METADATA, 12)
    assert [(b.node_id, b.host, b.port, b.rack) for b in answer.brokers] == [
        (1, "127.0.0.1", 9092, "r1")
    ]
    assert answer.controller_id == 1
    assert [(t.name, t.error_code) for t in answer.topics] == [("mine", 0), ("new", 0)]
    mine = answer.topics[0]
    assert [
        (p.partition_index, p.leader_id, p.leader_epoch, p.isr_nodes) for p in mine.partitions
    ] == [
        (0, 1, 0, [1]),
        (1, 1, 0, [1]),
    ]
    assert len(services.topics.get("new").logs) == services.config.num_partitions  # type: ignore[union-attr]

    by_id = await ask(services, metadata_by_id(mine.topic_id), m.ApiKey.METADATA, 12)
    assert [(t.name, t.error_code) for t in by_id.topics] == [("mine", 0)]
    unknown = await ask(services, metadata_by_id(uuid.uuid4()), m.ApiKey.METADATA, 12)
    assert [t.error_code for t in unknown.topics] == [ErrorCode.UNKNOWN_TOPIC_ID]


@attrs.define
class RefusingAdmin:
    """A cluster's admin (through ZooKeeper: the answer is deferred) that refuses every
    creation with one error code."""

    code: ErrorCode
    asked: list[str] = attrs.Factory(list)

    @property
    def applies_at_once(self) -> bool:
        return False

    async def create_topic(self, name: str, *args: Any) -> uuid.UUID:
        self.asked.append(name)
        raise TopicError(self.code, "refused")


async def test_in_a_cluster_a_refused_auto_creation_is_the_topic_error() -> None:
    """As Kafka's auto-creation (KafkaApis.createTopic): the refusal's error is the
    topic's (fewer live brokers than default.replication.factor), and a topic created
    meanwhile is described as the view has it (unknown until the view catches up).
    The handler has one path alone and in a cluster: the admin decides (it answered
    UNKNOWN_TOPIC_OR_PARTITION for both before)."""
    for code, answered in (
        (ErrorCode.INVALID_REPLICATION_FACTOR, ErrorCode.INVALID_REPLICATION_FACTOR),
        (ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ):
        services = in_a_cluster(uuid.uuid4())
        services.admin = RefusingAdmin(code)
        wanted = [m.MetadataRequest.MetadataRequestTopic(name="new")]
        request = m.MetadataRequest(topics=wanted, allow_auto_topic_creation=True)
        deferred = await ask(services, request, m.ApiKey.METADATA, 12)
        assert isinstance(deferred, Deferred)
        answer = await deferred.finish()
        assert services.admin.asked == ["new"]
        assert [(t.name, t.error_code) for t in answer.topics] == [("new", answered)]


async def test_alone_describe_cluster_names_this_node_as_broker_and_controller() -> None:
    request = m.DescribeClusterRequest(include_cluster_authorized_operations=False)
    ctx = context(alone(), m.ApiKey.DESCRIBE_CLUSTER, 0)
    answer = await handle_describe_cluster(ctx, request)
    assert answer.controller_id == 1
    assert [(b.broker_id, b.host, b.port, b.rack) for b in answer.brokers] == [
        (1, "127.0.0.1", 9092, "r1")
    ]


async def test_a_cluster_topic_held_elsewhere_is_described_from_the_view() -> None:
    secret_id = uuid.uuid4()
    answer = await ask(in_a_cluster(secret_id), metadata_by_id(secret_id), m.ApiKey.METADATA, 12)
    [topic] = answer.topics
    assert (topic.name, topic.error_code) == ("secret", 0)
    assert [(p.leader_id, p.leader_epoch) for p in topic.partitions] == [(2, 3)]
    assert [b.node_id for b in answer.brokers] == [1, 2] and answer.controller_id == 2


async def test_by_id_a_topic_the_principal_may_not_describe_is_refused_in_a_cluster() -> None:
    secret_id = uuid.uuid4()
    services = in_a_cluster(secret_id)
    services.authorizer = DenyTopic("secret")
    answer = await ask(services, metadata_by_id(secret_id), m.ApiKey.METADATA, 12)
    [topic] = answer.topics
    assert topic.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert not topic.name and topic.partitions == []
    listed = await ask(services, m.MetadataRequest(topics=None), m.ApiKey.METADATA, 12)
    assert listed.topics == []


def test_a_node_alone_builds_a_topics_entry_once_per_topic_and_growth() -> None:
    """The groups' heartbeats list every topic through the view: an entry is built when a
    topic appears or grows, not on every listing; a topic deleted and created again under
    its name is listed with its new id."""
    topics = TopicManager(None, LogConfig(), lambda: 0)
    view = LocalView(1, None, topics, lambda: ENDPOINTS)
    topics.create("t", 2)
    first = view.topics["t"]
    assert view.topics["t"] is first
    assert dict(view.topics.items())["t"] is first  # what topic_table lists
    topics.add_partitions("t", 3)
    grown = view.topics["t"]
    assert sorted(grown.partitions) == [0, 1, 2] and grown.topic_id == first.topic_id
    topics.delete("t")
    assert "t" not in view.topics and list(view.topics) == []
    topics.create("t", 1)
    again = view.topics["t"]
    assert again.topic_id != first.topic_id and sorted(again.partitions) == [0]
