"""Metadata: the brokers, and each topic's partitions with their leaders, topic ids included.

Alone, this node is the only broker and leads every partition. In a cluster the
answer comes from the cluster view (ZooKeeper's state as this broker last read it):
every live broker, each partition's leader, leader epoch, replicas, ISR and offline
replicas, LEADER_NOT_AVAILABLE for a partition without a leader.

``__consumer_offsets`` and ``__transaction_state`` (and ``__share_group_state``) are
listed with ``is_internal`` true, as Kafka does (pattern-subscribing clients skip
internal topics unless told not to). A cluster's are the topic manager's; a node
alone keeps each in its own file, one partition led by this broker from its start
(services/own_partition.py), listed once it holds a record: Kafka makes an internal
topic on its first use, not before.
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
from trio_broker.handlers.base import Deferred, RequestContext, handles, when_applied
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.local_replication import LOCAL_LEADER_EPOCH
from trio_broker.services.own_partition import OwnPartition
from trio_broker.services.topics import RESERVED_TOPICS, TopicError, validate_topic_name

Resp = m.MetadataResponse


def listed_own_topic(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None = None
) -> OwnPartition | None:
    """A node alone's internal topic of that name (or id), once Metadata lists it
    (``OwnPartition.listed``); None otherwise, and always in a cluster."""
    for own in ctx.services.own_internal_topics.values():
        if (own.topic == name or (name is None and own.topic_id == topic_id)) and own.listed():
            return own
    return None


def _own_topic_metadata(own: OwnPartition) -> Resp.MetadataResponseTopic:
    """A node alone's internal topic: one partition, led here in the local epoch."""
    me = [own.broker_id]
    partition = Resp.MetadataResponseTopic.MetadataResponsePartition(
        error_code=ErrorCode.NONE, partition_index=0, leader_id=own.broker_id,
        leader_epoch=LOCAL_LEADER_EPOCH, replica_nodes=me, isr_nodes=list(me),
        offline_replicas=[],
    )  # fmt: skip
    return Resp.MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=own.topic, topic_id=own.topic_id, is_internal=True,
        partitions=[partition], topic_authorized_operations=-2147483648,
    )  # fmt: skip


def topic_metadata(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> Resp.MetadataResponseTopic:
    """A topic as ``services.leaders.view`` has it: a cluster's as ZooKeeper last said,
    a node alone's its own (never a local leftover of a topic the cluster dropped)."""
    replication = ctx.services.leaders
    view = replication.view
    if name is None:
        assert topic_id is not None, "a topic is asked for by name or by id"
        info = view.topic_by_id(topic_id)
        own = None if info is not None else listed_own_topic(ctx, None, topic_id)
        if own is not None:
            return _own_topic_metadata(own)
        if info is None:  # by id, as Kafka: the id echoed, no name
            return Resp.MetadataResponseTopic(
                error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None, topic_id=topic_id, partitions=[]
            )
    else:
        info = view.topics.get(name)
        own = None if info is not None else listed_own_topic(ctx, name)
        if own is not None:
            return _own_topic_metadata(own)
        if info is None:
            return Resp.MetadataResponseTopic(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name
                else ErrorCode.INVALID_TOPIC_EXCEPTION,
                name=name, topic_id=uuid.UUID(int=0), partitions=[],
            )  # fmt: skip
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
    missing = _to_create(ctx, request)
    if not missing:
        return describe(ctx, request, {})

    async def create_then_answer() -> m.MetadataResponse:
        # As Kafka's auto-creation: a refusal is answered as the topic's error, one
        # created meanwhile (by another request or broker) is described as it is.
        refused: dict[str, ErrorCode] = {}
        for name in missing:
            try:
                await services.admin.create_topic(
                    name, services.config.num_partitions,
                    services.config.default_replication_factor, {}, None,
                )  # fmt: skip
            except TopicError as exc:
                if exc.error_code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    refused[name] = exc.error_code
        return describe(ctx, request, refused)

    # A node alone creates here and now (the connection's next request sees the topic);
    # a cluster waits for ZooKeeper and the controller, off the handler task.
    return await when_applied(
        services, create_then_answer, timeout_s=30.0, on_timeout=lambda: describe(ctx, request, {})
    )


def _to_create(ctx: RequestContext, request: m.MetadataRequest) -> list[str]:
    """The topics asked for by name that auto-creation makes before the answer."""
    services = ctx.services
    auto = request.allow_auto_topic_creation if ctx.api_version >= 4 else True
    if not (auto and services.config.auto_create_topics) or not request.topics:
        return []
    known = services.leaders.view.topics
    names = []
    for wanted in request.topics:
        name = wanted.name
        if not name or (wanted.topic_id is not None and wanted.topic_id.int != 0):
            continue
        if name in known or name in names or not may_create_topic(ctx, name):
            continue
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name):
            continue
        try:
            validate_topic_name(name)
        except TopicError:
            continue
        names.append(name)
    return names


def describe(
    ctx: RequestContext, request: m.MetadataRequest, refused: dict[str, ErrorCode]
) -> m.MetadataResponse:
    """The answer from what ``services.leaders.view`` knows now; ``refused``: the
    topics auto-creation was refused, with why."""
    services = ctx.services
    view = services.leaders.view
    topics: list[Resp.MetadataResponseTopic] = []
    cluster_operations = -2147483648  # "not provided"
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        internal = [
            name for name, partition in ctx.services.own_internal_topics.items()
            if name not in view.topics and partition.listed()
        ]  # fmt: skip
        topics = [
            topic_metadata(ctx, name, None)
            for name in sorted([*view.topics, *internal])
            if authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)  # hide the rest
        ]
    else:
        auto = request.allow_auto_topic_creation if ctx.api_version >= 4 else True
        auto = auto and services.config.auto_create_topics
        for wanted in request.topics:
            name = wanted.name
            # A non-zero id wins over the name, as in Kafka (the Java Admin's describeTopics
            # by id sends the id with an empty name, librdkafka with a null one).
            if wanted.topic_id is not None and wanted.topic_id.int != 0:
                name = None
            if name is None:
                known = view.topic_by_id(wanted.topic_id)
                by_id = None if known is not None else listed_own_topic(ctx, None, wanted.topic_id)
                known_name = known.name if known is not None else by_id.topic if by_id else None
                if known_name is not None and not authorized(
                    ctx, Operation.DESCRIBE, ResourceType.TOPIC, known_name
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
            exists = name in view.topics or listed_own_topic(ctx, name) is not None
            if not authorized(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name) or (
                not exists and auto and not may_create_topic(ctx, name)
            ):
                topics.append(
                    Resp.MetadataResponseTopic(
                        error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name
                    )
                )
                continue
            if name in refused:
                topics.append(Resp.MetadataResponseTopic(error_code=refused[name], name=name))
                continue
            if not exists:
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
    listener = services.listener_name_for(ctx.client.connection_id)
    # A broker cut off from ZooKeeper whose peers no longer list it leaves itself out as
    # they do: clients stop asking it (librdkafka asks its busiest connection for
    # Metadata) and ask them. While ZooKeeper is down for all of them, each leaving
    # itself out would give every answer a different broker list, and librdkafka (2.16)
    # decommissions what an answer leaves out, over and over, until its consumer hangs:
    # then every broker lists itself.
    dropped = getattr(services.leaders, "dropped_by_peers", False)
    fenced_self = view.broker_id if dropped else None
    brokers = [
        Resp.MetadataResponseBroker(node_id=b.broker_id, host=h, port=p, rack=b.rack)
        for b, h, p in view.brokers_on(listener)
        if b.broker_id != fenced_self
    ]
    return Resp(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=services.cluster_id,
        controller_id=view.controller_id,
        topics=topics,
        cluster_authorized_operations=cluster_operations,
    )
