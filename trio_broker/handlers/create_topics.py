"""CreateTopics: validate each topic as Kafka does on one node, then create it (or not).

Each topic is judged on its own: one bad topic does not fail the others. The
checks run in Kafka's order (duplicate in the request, name, existence,
partitions and replication, configs), so clients see the same first error.
``validate_only`` runs every check and creates nothing. Alone, there is no
controller to wait for, so the request's timeout is not needed.

In a cluster a topic is created by writing its replica assignment to ZooKeeper
(``services.replication.create_topic``); the answer waits, within the request's
timeout, until the controller has given every partition a leader.
"""

from __future__ import annotations

import uuid

from trio_broker.handlers.authorization import may_create_topic
from trio_broker.handlers.base import Deferred, LoopBudget, RequestContext, handles
from trio_broker.handlers.describe_configs import topic_config_values
from trio_broker.handlers.repeated import REPEATED_MESSAGE, each_once
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import TopicError, validate_topic_name
from trio_broker.storage.errors import LogError, StorageError

Resp = m.CreateTopicsResponse
RequestedTopic = m.CreateTopicsRequest.CreatableTopic
Result = Resp.CreatableTopicResult
ResultConfig = Result.CreatableTopicConfigs

#: Only this node can hold a replica.
MAX_REPLICATION_FACTOR = 1


def _cluster_plan(
    ctx: RequestContext, topic: RequestedTopic
) -> tuple[int, int, dict[int, list[int]] | None]:
    """In a cluster: (partitions, replication factor, explicit assignment or None)."""
    config = ctx.services.config
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "a manual assignment needs num_partitions and replication_factor of -1",
            )
        assignment = {a.partition_index: list(a.broker_ids) for a in topic.assignments}
        if sorted(assignment) != list(range(len(assignment))):
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "assigned partitions must be numbered 0..n-1 without gaps or repeats",
            )
        counts = {len(replicas) for replicas in assignment.values()}
        if len(counts) > 1:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "all partitions in a manual assignment must have the same number of replicas",
            )
        return len(assignment), len(assignment[0]), assignment
    rf = topic.replication_factor
    if rf == -1:
        rf = config.default_replication_factor
    if rf <= 0:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR, f"replication factor {rf} is not positive"
        )
    partitions = config.num_partitions if topic.num_partitions == -1 else topic.num_partitions
    if partitions <= 0:
        raise TopicError(ErrorCode.INVALID_PARTITIONS, f"{topic.num_partitions} partitions")
    return partitions, rf, None


def _create_in_cluster(
    ctx: RequestContext, request: m.CreateTopicsRequest, validate_only: bool
) -> Deferred:
    services = ctx.services
    replication = services.replication
    assert replication is not None
    results: list[Result] = []
    plans = []
    for topic, repeated in each_once(request.topics, lambda t: t.name):
        name = topic.name
        result = Result(name=name, error_code=ErrorCode.NONE, error_message=None, configs=[])
        if repeated:  # answered once, with INVALID_REQUEST, as Kafka does
            result.error_code, result.error_message = ErrorCode.INVALID_REQUEST, REPEATED_MESSAGE
            results.append(result)
            continue
        try:
            if not may_create_topic(ctx, name):
                raise TopicError(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"CREATE on {name!r} refused"
                )
            validate_topic_name(name)
            if name in replication.view.topics:
                raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            partitions, rf, assignment = _cluster_plan(ctx, topic)
            configs = _configs(topic)
            services.topics.check_configs(configs)
        except TopicError as exc:
            result.error_code, result.error_message = exc.error_code, str(exc)
            results.append(result)
            continue
        result.num_partitions, result.replication_factor = partitions, rf
        results.append(result)
        plans.append((result, partitions, rf, configs, assignment))
    live = len(replication.view.brokers)
    for result, _, rf, _, assignment in plans:
        if assignment is None and rf > live:
            result.error_code = ErrorCode.INVALID_REPLICATION_FACTOR
            result.error_message = f"replication factor {rf} is larger than the {live} live brokers"

    async def create() -> m.CreateTopicsResponse:
        for result, partitions, rf, configs, assignment in plans:
            if result.error_code or validate_only:
                continue
            try:
                await replication.create_topic(result.name, partitions, rf, configs, assignment)
                info = replication.view.topics.get(result.name)
                if info is not None:
                    result.topic_id = info.topic_id
            except TopicError as exc:
                result.error_code, result.error_message = exc.error_code, str(exc)
        return Resp(throttle_time_ms=0, topics=results)

    def timed_out() -> m.CreateTopicsResponse:
        for result, *_ in plans:
            if not result.error_code and result.name not in replication.view.topics:
                result.error_code = ErrorCode.REQUEST_TIMED_OUT
                result.error_message = "the cluster did not create the topic in time"
        return Resp(throttle_time_ms=0, topics=results)

    return Deferred(create, timeout_s=max(request.timeout_ms, 1000) / 1000, on_timeout=timed_out)


def _partition_count(ctx: RequestContext, topic: RequestedTopic) -> int:
    """The partition count asked for, after the replication and assignment checks."""
    node = ctx.services.config.node_id
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "a manual assignment needs num_partitions and replication_factor of -1",
            )
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "assigned partitions must be numbered 0..n-1 without gaps or repeats",
            )
        for assignment in topic.assignments:
            if list(assignment.broker_ids) != [node]:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {assignment.partition_index}: replicas must be [{node}], "
                    f"the only broker, not {list(assignment.broker_ids)}",
                )
        return len(indexes)
    rf = topic.replication_factor
    if rf == 0 or rf < -1:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR, f"replication factor {rf} is not positive"
        )
    if rf > MAX_REPLICATION_FACTOR:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {rf} is larger than the 1 available broker",
        )
    if topic.num_partitions == -1:
        return ctx.services.config.num_partitions
    if topic.num_partitions <= 0:
        raise TopicError(ErrorCode.INVALID_PARTITIONS, f"{topic.num_partitions} partitions")
    return int(topic.num_partitions)


def _configs(topic: RequestedTopic) -> dict[str, str]:
    """The topic's configs as a dict; a null value is refused here."""
    configs: dict[str, str] = {}
    for entry in topic.configs:
        if entry.value is None:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"config {entry.name!r} has a null value")
        configs[entry.name] = entry.value
    return configs  # the values are checked by TopicManager (storage/topic_configs.py)


def _collision_keys(ctx: RequestContext) -> dict[str, str]:
    """Existing topics by their collision key: a lookup per new name, not a scan of
    every topic (a CreateTopics of 10,000 names was quadratic: seconds on the loop)."""
    return {_collision_key(name): name for name in ctx.services.topics.topics}


def _collision_key(name: str) -> str:
    # Metric names turn '.' into '_', so Kafka refuses names that differ only there.
    return name.replace(".", "_")


def _check_collision(name: str, keys: dict[str, str]) -> None:
    existing = keys.get(_collision_key(name))
    if existing is not None and existing != name:
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r} collides with {existing!r}"
        )


def _create_one(
    ctx: RequestContext, topic: RequestedTopic, validate_only: bool, keys: dict[str, str]
) -> Result:
    services = ctx.services
    name = topic.name
    if not may_create_topic(ctx, name):
        raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"CREATE on {name!r} refused")
    validate_topic_name(name)
    if services.topics.get(name) is not None:
        raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    _check_collision(name, keys)
    partitions = _partition_count(ctx, topic)
    configs = _configs(topic)
    services.topics.check_new(name, partitions, configs)
    topic_id = uuid.UUID(int=0)
    if not validate_only:
        topic_id = services.topics.create(name, partitions, configs).topic_id
        keys[_collision_key(name)] = name
    result = Result(
        name=name, topic_id=topic_id, error_code=ErrorCode.NONE, error_message=None,
        num_partitions=partitions, replication_factor=1,
    )  # fmt: skip
    result.configs = [
        ResultConfig(
            name=v.name, value=v.value, read_only=False, config_source=v.source, is_sensitive=False
        )
        for v in topic_config_values(services.config, configs, services.topics.broker_configs)
    ]
    return result


@handles(m.ApiKey.CREATE_TOPICS)
async def handle_create_topics(
    ctx: RequestContext, request: m.CreateTopicsRequest
) -> m.CreateTopicsResponse | Deferred:
    validate_only = ctx.api_version >= 1 and request.validate_only
    if ctx.services.replication is not None:
        return _create_in_cluster(ctx, request, validate_only)
    results: list[Result] = []
    keys = _collision_keys(ctx)
    budget = LoopBudget(ctx.services)
    for topic, repeated in each_once(request.topics, lambda t: t.name):
        if await budget.tick():  # other requests may have created or deleted topics
            keys = _collision_keys(ctx)
        if repeated:  # Kafka answers a repeated name once, with INVALID_REQUEST
            results.append(
                Result(name=topic.name, error_code=ErrorCode.INVALID_REQUEST,
                       error_message=REPEATED_MESSAGE, configs=[])
            )  # fmt: skip
            continue
        try:
            results.append(_create_one(ctx, topic, validate_only, keys))
            continue
        except TopicError as exc:
            code, message = exc.error_code, str(exc)
        except LogError as exc:  # the catalogue refused (it checks names and existence too)
            code, message = exc.error_code, str(exc)
        except OSError as exc:  # a disk error is a storage error
            code, message = StorageError.error_code, f"cannot create the topic: {exc}"
        results.append(Result(name=topic.name, error_code=code, error_message=message, configs=[]))
    return Resp(throttle_time_ms=0, topics=results)
