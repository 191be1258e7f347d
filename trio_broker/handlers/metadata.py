"""Metadata: this node as the only broker, every partition led by it, topic ids included."""

from __future__ import annotations

import uuid

from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
    may_create_topic,
)
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import TopicError, validate_topic_name

Resp = m.MetadataResponse
#: All partitions are led by this node at epoch 0 (no elections on one node).
LEADER_EPOCH = 0


def topic_metadata(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> Resp.MetadataResponseTopic:
    services = ctx.services
    node = services.config.node_id
    if name is None:
        assert topic_id is not None, "a topic is asked for by name or by id"
        topic = services.topics.by_id.get(topic_id)
    else:
        topic = services.topics.get(name)
    if topic is None:
        if topic_id is not None and name is None:  # by id, as Kafka: the id echoed, no name
            return Resp.MetadataResponseTopic(
                error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None, topic_id=topic_id, partitions=[]
            )
        return Resp.MetadataResponseTopic(
            error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name
            else ErrorCode.INVALID_TOPIC_EXCEPTION,
            name=name, topic_id=uuid.UUID(int=0), partitions=[],
        )  # fmt: skip
    partitions = [
        Resp.MetadataResponseTopic.MetadataResponsePartition(
            error_code=ErrorCode.NONE,
            partition_index=i,
            leader_id=node,
            leader_epoch=LEADER_EPOCH,
            replica_nodes=[node],
            isr_nodes=[node],
            offline_replicas=[],
        )
        for i in range(len(topic.logs))
    ]
    return Resp.MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=topic.name, topic_id=topic.topic_id,
        is_internal=False, partitions=partitions, topic_authorized_operations=-2147483648,
    )  # fmt: skip


@handles(m.ApiKey.METADATA)
async def handle_metadata(ctx: RequestContext, request: m.MetadataRequest) -> m.MetadataResponse:
    services = ctx.services
    topics: list[Resp.MetadataResponseTopic] = []
    cluster_operations = -2147483648  # "not provided"
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        topics = [
            topic_metadata(ctx, name, None)
            for name in sorted(services.topics.topics)
            if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)  # hide the rest
        ]
    else:
        for wanted in request.topics:
            name = wanted.name
            # A non-zero id wins over the name, as in Kafka (the Java Admin's describeTopics
            # by id sends the id with an empty name, librdkafka with a null one).
            if wanted.topic_id is not None and wanted.topic_id.int != 0:
                name = None
            if name is None:
                known = services.topics.by_id.get(wanted.topic_id)
                if known is not None and not authorized(
                    ctx, Operation.DESCRIBE, ResourceType.TOPIC, known.name
                ):
                    topics.append(
                        Resp.MetadataResponseTopic(
                            error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            topic_id=wanted.topic_id,
                        )
                    )
                    continue
                topics.append(topic_metadata(ctx, None, wanted.topic_id))
                continue
            auto = request.allow_auto_topic_creation if ctx.api_version >= 4 else True
            exists = services.topics.get(name) is not None
            if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name) or (
                not exists and auto and services.config.auto_create_topics
                and not may_create_topic(ctx, name)
            ):  # fmt: skip
                topics.append(
                    Resp.MetadataResponseTopic(
                        error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name
                    )
                )
                continue
            if services.topics.get(name) is None and auto and services.config.auto_create_topics:
                try:
                    services.topics.create(name, services.config.num_partitions)
                except TopicError as exc:
                    topics.append(Resp.MetadataResponseTopic(error_code=exc.error_code, name=name))
                    continue
            elif services.topics.get(name) is None:
                try:
                    validate_topic_name(name)
                except TopicError as exc:
                    topics.append(Resp.MetadataResponseTopic(error_code=exc.error_code, name=name))
                    continue
            topics.append(topic_metadata(ctx, name, None))
    if services.authorizer is not None and ctx.api_version >= 8:
        # Without an authorizer these stay "not provided", as before.
        if request.include_topic_authorized_operations:
            for t in topics:
                if t.error_code == ErrorCode.NONE and t.name is not None:
                    t.topic_authorized_operations = authorized_operations(
                        ctx, ResourceType.TOPIC, t.name
                    )
        if ctx.api_version <= 10 and request.include_cluster_authorized_operations:
            cluster_operations = authorized_operations(ctx, ResourceType.CLUSTER)
    host, port = services.advertised_for(ctx.client.connection_id)
    return Resp(
        throttle_time_ms=0,
        brokers=[
            Resp.MetadataResponseBroker(
                node_id=services.config.node_id, host=host, port=port, rack=None
            )
        ],
        cluster_id=services.cluster_id,
        controller_id=services.config.node_id,
        topics=topics,
        cluster_authorized_operations=cluster_operations,
    )
