"""AlterPartitionReassignments: move partitions to other brokers, or cancel a move (KIP-455).

In a cluster only the controller answers (others: NOT_CONTROLLER); it writes each move
to ZooKeeper and finishes it once the joining replicas are in sync (docs/cluster.md,
"Moving partitions"). The answer comes when the move has started, not when it ends:
ListPartitionReassignments shows it until then.

Per partition, as Kafka: UNKNOWN_TOPIC_OR_PARTITION; INVALID_REPLICA_ASSIGNMENT for an
empty or repeated replica list or an unregistered broker; NO_REASSIGNMENT_IN_PROGRESS
for cancelling (null replicas) a partition that is not moving; with
``allow_replication_factor_change`` false (v1), INVALID_REPLICATION_FACTOR for a
different replica count. The moves go to ``services.admin.controller``
(services/topic_admin.py): a broker alone is its own controller with nowhere to move
to, so only its own id is a valid target (nothing to do). Needs ALTER on the cluster.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.AlterPartitionReassignmentsResponse
TopicResult = Resp.ReassignableTopicResponse
PartitionResult = TopicResult.ReassignablePartitionResponse
Outcome = tuple[ErrorCode, str | None]


def _response(
    request: m.AlterPartitionReassignmentsRequest,
    outcomes: dict[tuple[str, int], Outcome],
    error: ErrorCode = ErrorCode.NONE,
    message: str | None = None,
) -> m.AlterPartitionReassignmentsResponse:
    by_topic: dict[str, list[PartitionResult]] = {}
    for (topic, partition), (code, text) in outcomes.items():
        by_topic.setdefault(topic, []).append(
            PartitionResult(partition_index=partition, error_code=code, error_message=text)
        )
    return Resp(
        throttle_time_ms=0,
        allow_replication_factor_change=request.allow_replication_factor_change,
        error_code=error,
        error_message=message,
        responses=[TopicResult(name=t, partitions=parts) for t, parts in by_topic.items()],
    )


@handles(m.ApiKey.ALTER_PARTITION_REASSIGNMENTS)
async def handle_alter_partition_reassignments(
    ctx: RequestContext, request: m.AlterPartitionReassignmentsRequest
) -> m.AlterPartitionReassignmentsResponse:
    moves = {
        (topic.name, p.partition_index): p.replicas
        for topic in request.topics
        for p in topic.partitions
    }
    if not authorized(ctx, Operation.ALTER, ResourceType.CLUSTER):
        refused = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
        return _response(
            request, dict.fromkeys(moves, refused), ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "ALTER on the cluster refused",
        )  # fmt: skip
    controller = ctx.services.admin.controller
    if controller is None:
        not_controller = (ErrorCode.NOT_CONTROLLER, None)
        return _response(
            request, dict.fromkeys(moves, not_controller), ErrorCode.NOT_CONTROLLER,
            "this broker is not the controller",
        )  # fmt: skip
    topics = ctx.services.admin.view.topics
    outcomes: dict[tuple[str, int], Outcome] = {}
    if ctx.api_version >= 1 and not request.allow_replication_factor_change:
        for key, target in moves.items():
            topic = topics.get(key[0])
            info = None if topic is None else topic.partitions.get(key[1])
            if info is None or target is None:
                continue
            original = [r for r in info.replicas if r not in info.adding_replicas]
            if len(target) != len(original):
                outcomes[key] = (
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"{len(target)} replicas asked, {len(original)} now, and the replication "
                    "factor may not change",
                )
    allowed = {key: target for key, target in moves.items() if key not in outcomes}
    outcomes.update(await controller.alter_reassignments(allowed))
    return _response(request, {key: outcomes[key] for key in moves})
