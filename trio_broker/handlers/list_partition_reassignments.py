"""ListPartitionReassignments: the partitions being moved, with their joining and leaving
replicas (KIP-455).

Answered by the controller (others: NOT_CONTROLLER) from the cluster's topics as
ZooKeeper holds them. Null topics lists every move; named partitions that are not moving,
or do not exist, are left out, as Kafka does. A broker alone is its own controller
(``services.admin``) and never moves anything.
Needs DESCRIBE on the cluster.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

Resp = m.ListPartitionReassignmentsResponse
TopicMoves = Resp.OngoingTopicReassignment
PartitionMove = TopicMoves.OngoingPartitionReassignment


@handles(m.ApiKey.LIST_PARTITION_REASSIGNMENTS)
async def handle_list_partition_reassignments(
    ctx: RequestContext, request: m.ListPartitionReassignmentsRequest
) -> m.ListPartitionReassignmentsResponse:
    response = Resp(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, topics=[])
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER):
        response.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        response.error_message = "DESCRIBE on the cluster refused"
        return response
    admin = ctx.services.admin
    if admin.controller is None:
        response.error_code = ErrorCode.NOT_CONTROLLER
        response.error_message = "this broker is not the controller"
        return response
    topics = admin.view.topics
    if request.topics is None:
        wanted = [(name, sorted(topics[name].partitions)) for name in sorted(topics)]
    else:
        wanted = [(t.name, t.partition_indexes) for t in request.topics]
    for name, indexes in wanted:
        topic = topics.get(name)
        moves = []
        for index in indexes:
            info = topic.partitions.get(index) if topic is not None else None
            if info is not None and (info.adding_replicas or info.removing_replicas):
                moves.append(
                    PartitionMove(
                        partition_index=index,
                        replicas=list(info.replicas),
                        adding_replicas=list(info.adding_replicas),
                        removing_replicas=list(info.removing_replicas),
                    )
                )
        if moves:
            response.topics.append(TopicMoves(name=name, partitions=moves))
    return response
