"""CreateTopics: validate each topic as Kafka does, then hand it to the controller.

Each topic is judged on its own: one bad topic does not fail the others. The
checks run in Kafka's order (duplicate in the request, name, existence, name
collision, partitions and replication, configs), against the brokers and topics of
``services.admin.view``, so clients see the same first error alone and in a
cluster. ``validate_only`` runs every check and creates nothing.

The topics that pass go to ``services.admin.create_topic`` (services/topic_admin.py).
A node alone is a cluster of one: its admin creates the topic at once, and the answer
comes at once. In a cluster the topic's replica assignment is written to ZooKeeper,
and the answer waits, within the request's timeout, until the controller has given
every partition a leader.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from trio_broker.handlers.authorization import may_create_topic
from trio_broker.handlers.base import Deferred, LoopBudget, RequestContext, handles, when_applied
from trio_broker.handlers.describe_configs import topic_config_values
from trio_broker.handlers.repeated import REPEATED_MESSAGE, each_once
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.topics import MAX_PARTITIONS, TopicError, validate_topic_name

Resp = m.CreateTopicsResponse
RequestedTopic = m.CreateTopicsRequest.CreatableTopic
Result = Resp.CreatableTopicResult
ResultConfig = Result.CreatableTopicConfigs
#: (result, partitions, replication factor, configs, manual assignment or None).
Plan = tuple[Result, int, int, dict[str, str], dict[int, list[int]] | None]


def _placement(
    ctx: RequestContext, topic: RequestedTopic
) -> tuple[int, int, dict[int, list[int]] | None]:
    """(partitions, replication factor, manual assignment or None), checked against the
    live brokers of ``services.admin.view`` (a node alone: itself)."""
    config = ctx.services.config
    brokers = ctx.services.admin.view.brokers
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "a manual assignment needs num_partitions and replication_factor of -1",
            )
        assignment = {a.partition_index: list(a.broker_ids) for a in topic.assignments}
        if sorted(assignment) != list(range(len(topic.assignments))):
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "assigned partitions must be numbered 0..n-1 without gaps or repeats",
            )
        for partition, replicas in assignment.items():
            if not replicas or len(set(replicas)) != len(replicas) or set(replicas) - set(brokers):
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {partition}: replicas {replicas} must be distinct live brokers "
                    f"(live: {sorted(brokers)})",
                )
        if len({len(replicas) for replicas in assignment.values()}) > 1:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "all partitions in a manual assignment must have the same number of replicas",
            )
        if len(assignment) > MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"partitions must be in 1..{MAX_PARTITIONS}"
            )
        return len(assignment), len(assignment[0]), assignment
    rf = (
        config.default_replication_factor
        if topic.replication_factor == -1
        else topic.replication_factor
    )
    if rf <= 0:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR, f"replication factor {rf} is not positive"
        )
    if rf > len(brokers):
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {rf} is larger than the {len(brokers)} live broker(s)",
        )
    partitions = config.num_partitions if topic.num_partitions == -1 else topic.num_partitions
    if partitions <= 0 or partitions > MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.INVALID_PARTITIONS,
            f"{topic.num_partitions} partitions: must be in 1..{MAX_PARTITIONS}",
        )
    return int(partitions), rf, None


def _configs(topic: RequestedTopic) -> dict[str, str]:
    """The topic's configs as a dict; a null value is refused here."""
    configs: dict[str, str] = {}
    for entry in topic.configs:
        if entry.value is None:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"config {entry.name!r} has a null value")
        configs[entry.name] = entry.value
    return configs  # the values are checked by TopicManager (storage/topic_configs.py)


def _collision_keys(names: Mapping[str, object]) -> dict[str, str]:
    """Existing topics by their collision key: a lookup per new name, not a scan of
    every topic (a CreateTopics of 10,000 names was quadratic: seconds on the loop)."""
    return {_collision_key(name): name for name in names}


def _collision_key(name: str) -> str:
    # Metric names turn '.' into '_', so Kafka refuses names that differ only there.
    return name.replace(".", "_")


def _check_collision(name: str, keys: dict[str, str]) -> None:
    existing = keys.get(_collision_key(name))
    if existing is not None and existing != name:
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r} collides with {existing!r}"
        )


def _plan(ctx: RequestContext, topic: RequestedTopic, keys: dict[str, str]) -> Plan:
    """Every check of one topic, in Kafka's order; TopicError if refused."""
    services = ctx.services
    name = topic.name
    if not may_create_topic(ctx, name):
        raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"CREATE on {name!r} refused")
    validate_topic_name(name)
    if name in services.admin.view.topics:
        raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    _check_collision(name, keys)
    partitions, rf, assignment = _placement(ctx, topic)
    configs = _configs(topic)
    services.topics.check_configs(configs)
    result = Result(
        name=name, topic_id=uuid.UUID(int=0), error_code=ErrorCode.NONE, error_message=None,
        num_partitions=partitions, replication_factor=rf,
    )  # fmt: skip
    result.configs = [
        ResultConfig(
            name=v.name, value=v.value, read_only=False, config_source=v.source, is_sensitive=False
        )
        for v in topic_config_values(services.config, configs, services.topics.broker_configs)
    ]
    return result, partitions, rf, configs, assignment


@handles(m.ApiKey.CREATE_TOPICS)
async def handle_create_topics(
    ctx: RequestContext, request: m.CreateTopicsRequest
) -> m.CreateTopicsResponse | Deferred:
    validate_only = ctx.api_version >= 1 and request.validate_only
    admin = ctx.services.admin
    results: list[Result] = []
    plans: list[Plan] = []
    keys = _collision_keys(admin.view.topics)
    budget = LoopBudget(ctx.services)
    for topic, repeated in each_once(request.topics, lambda t: t.name):
        if await budget.tick():  # other requests may have created or deleted topics
            keys = _collision_keys(admin.view.topics)
        if repeated:  # Kafka answers a repeated name once, with INVALID_REQUEST
            results.append(
                Result(name=topic.name, error_code=ErrorCode.INVALID_REQUEST,
                       error_message=REPEATED_MESSAGE, configs=[])
            )  # fmt: skip
            continue
        try:
            plan = _plan(ctx, topic, keys)
        except TopicError as exc:
            results.append(
                Result(name=topic.name, error_code=exc.error_code, error_message=str(exc),
                       configs=[])
            )  # fmt: skip
            continue
        results.append(plan[0])
        if not validate_only:
            plans.append(plan)
            keys[_collision_key(topic.name)] = topic.name  # a later name may collide with it

    async def create() -> m.CreateTopicsResponse:
        for result, partitions, rf, configs, assignment in plans:
            await budget.tick()
            try:
                result.topic_id = await admin.create_topic(
                    result.name, partitions, rf, configs, assignment
                )
            except TopicError as exc:
                result.error_code, result.error_message = exc.error_code, str(exc)
                result.configs = []
        return Resp(throttle_time_ms=0, topics=results)

    def timed_out() -> m.CreateTopicsResponse:
        for result, *_ in plans:
            if not result.error_code and result.name not in admin.view.topics:
                result.error_code = ErrorCode.REQUEST_TIMED_OUT
                result.error_message = "the cluster did not create the topic in time"
        return Resp(throttle_time_ms=0, topics=results)

    return await when_applied(
        ctx.services, create, timeout_s=max(request.timeout_ms, 1000) / 1000, on_timeout=timed_out
    )
