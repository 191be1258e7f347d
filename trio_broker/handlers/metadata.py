"""Metadata: the brokers, and each topic's partitions with their leaders, topic ids included.

Alone, this node is the only broker and leads every partition. In a cluster the
answer comes from the cluster view (ZooKeeper's state as this broker last read it):
every live broker, each partition's leader, leader epoch, replicas, ISR and offline
replicas, LEADER_NOT_AVAILABLE for a partition without a leader.

``__consumer_offsets`` and ``__transaction_state`` are listed with ``is_internal``
true, as Kafka does (pattern-subscribing clients skip internal topics). A broker
alone keeps its group offsets and transaction state in private files, not topics, and
lists neither (services/topics.py RESERVED_TOPICS).
"""

from __future__ import annotations

import uuid

from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
    may_create_topic,
)
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import RESERVED_TOPICS, TopicError, validate_topic_name

Resp = m.MetadataResponse
#: All partitions are led by this node at epoch 0 (no elections on one node).
LEADER_EPOCH = 0


def topic_metadata(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> Resp.MetadataResponseTopic:
    services = ctx.services
    if services.replication is not None:
        known = cluster_topic_metadata(ctx, name, topic_id)
        if known is not None:
            return known
        if name is not None:
            # Not in the cluster (yet): never answer from a local leftover.
            return Resp.MetadataResponseTopic(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                topic_id=uuid.UUID(int=0), partitions=[],
            )  # fmt: skip
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
        is_internal=topic.name in RESERVED_TOPICS, partitions=partitions,
        topic_authorized_operations=-2147483648,
    )  # fmt: skip


def cluster_topic_metadata(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> Resp.MetadataResponseTopic | None:
    """A topic as the cluster view has it, or None if the view does not know it."""
    replication = ctx.services.replication
    assert replication is not None
    view = replication.view
    if name is None:
        name = next((t.name for t in view.topics.values() if t.topic_id == topic_id), None)
    info = None if name is None else view.topics.get(name)
    if info is None:
        return None
    partitions = []
    # Cut off from ZooKeeper (replica_manager.fence): this broker's view is stale and
    # another broker leads what it names itself leader of; say "no leader" so clients
    # ask again (elsewhere) instead of coming back here.
    stale_self = view.broker_id if getattr(replication, "fenced", False) else None
    for index, state in sorted(info.partitions.items()):
        leader = -1 if state.leader == stale_self else state.leader
        partition = Resp.MetadataResponseTopic.MetadataResponsePartition(
            error_code=ErrorCode.LEADER_NOT_AVAILABLE if leader < 0 else ErrorCode.NONE,
            partition_index=index, leader_id=leader, leader_epoch=state.leader_epoch,
            replica_nodes=list(state.replicas), isr_nodes=list(state.isr),
            offline_replicas=[r for r in state.replicas if r not in view.brokers],
        )  # fmt: skip
        partitions.append(partition)
    return Resp.MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=info.name, topic_id=info.topic_id,
        is_internal=info.name in RESERVED_TOPICS, partitions=partitions,
        topic_authorized_operations=-2147483648,
    )  # fmt: skip


@handles(m.ApiKey.METADATA)
async def handle_metadata(
    ctx: RequestContext, request: m.MetadataRequest
) -> m.MetadataResponse | Deferred:
    services = ctx.services
    replication = services.replication
    if replication is not None:
        missing = _to_create_in_cluster(ctx, request)
        if missing:  # created in the cluster first (a wait for ZooKeeper and the controller)

            async def create_then_answer() -> m.MetadataResponse:
                for name in missing:
                    try:
                        await replication.create_topic(
                            name, services.config.num_partitions,
                            services.config.default_replication_factor, {}, None,
                        )  # fmt: skip
                    except TopicError:
                        pass  # created meanwhile, or refused: the answer below says which
                return describe(ctx, request)

            return Deferred(
                create_then_answer, timeout_s=30.0, on_timeout=lambda: describe(ctx, request)
            )
    return describe(ctx, request)


def _to_create_in_cluster(ctx: RequestContext, request: m.MetadataRequest) -> list[str]:
    services = ctx.services
    assert services.replication is not None
    auto = request.allow_auto_topic_creation if ctx.api_version >= 4 else True
    if not (auto and services.config.auto_create_topics) or not request.topics:
        return []
    known = services.replication.view.topics
    names = []
    for wanted in request.topics:
        name = wanted.name
        if not name or (wanted.topic_id is not None and wanted.topic_id.int != 0):
            continue
        if name in known or not may_create_topic(ctx, name):
            continue
        try:
            validate_topic_name(name)
        except TopicError:
            continue
        names.append(name)
    return names


def known_topic_names(ctx: RequestContext) -> list[str]:
    replication = ctx.services.replication
    if replication is not None:
        return sorted(replication.view.topics)
    return sorted(ctx.services.topics.topics)


def topic_exists(ctx: RequestContext, name: str) -> bool:
    replication = ctx.services.replication
    if replication is not None:
        return name in replication.view.topics
    return ctx.services.topics.get(name) is not None


def describe(ctx: RequestContext, request: m.MetadataRequest) -> m.MetadataResponse:
    """The answer from what is known now (auto-creating topics alone, not in a cluster)."""
    services = ctx.services
    topics: list[Resp.MetadataResponseTopic] = []
    cluster_operations = -2147483648  # "not provided"
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        topics = [
            topic_metadata(ctx, name, None)
            for name in known_topic_names(ctx)
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
            if services.replication is not None:
                auto = False  # done by handle_metadata before answering
            exists = topic_exists(ctx, name)
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
            if not exists and auto and services.config.auto_create_topics:
                try:
                    services.topics.create(name, services.config.num_partitions)
                except TopicError as exc:
                    topics.append(Resp.MetadataResponseTopic(error_code=exc.error_code, name=name))
                    continue
            elif not exists:
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
    brokers = [
        Resp.MetadataResponseBroker(
            node_id=services.config.node_id, host=host, port=port, rack=None
        )
    ]
    controller = services.config.node_id
    if services.replication is not None:
        view = services.replication.view
        listener = services.listener_name_for(ctx.client.connection_id)
        # A broker cut off from ZooKeeper whose peers no longer list it leaves itself
        # out as they do: clients stop asking it (librdkafka asks its busiest
        # connection for Metadata) and ask them. While ZooKeeper is down for all of
        # them, each leaving itself out would give every answer a different broker
        # list, and librdkafka (2.16) decommissions what an answer leaves out, over
        # and over, until its consumer hangs: then every broker lists itself.
        dropped = getattr(services.replication, "dropped_by_peers", False)
        fenced_self = view.broker_id if dropped else None
        brokers = [
            Resp.MetadataResponseBroker(node_id=b.broker_id, host=h, port=p, rack=b.rack)
            for b, h, p in view.brokers_on(listener)
            if b.broker_id != fenced_self
        ]
        controller = view.controller_id
    return Resp(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=services.cluster_id,
        controller_id=controller,
        topics=topics,
        cluster_authorized_operations=cluster_operations,
    )
