"""ElectLeaders: an administrator asks for preferred or unclean leader elections (KIP-460).

In a cluster only the controller answers (the Java admin, librdkafka and kafka-python
send it there, as Metadata names it); any other broker answers NOT_CONTROLLER, which
makes them look the controller up again and retry. The controller decides each
partition with ``replication/controller_rules.requested_election`` and writes the new
state to ZooKeeper (``cluster/controller.py``'s ControllerActions). The handler asks
``services.admin.controller`` (services/topic_admin.py): a broker that runs alone is its
own controller and leads every partition already, so every named partition that exists
needs no election (ELECTION_NOT_NEEDED). With no partitions named (null), every
partition is meant and, as Kafka does, only those that needed an election are listed.
Needs ALTER on the cluster.
"""

from __future__ import annotations

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import ElectionType

Resp = m.ElectLeadersResponse
Result = Resp.ReplicaElectionResult
PartitionResult = Result.PartitionResult


def _requested(ctx: RequestContext, request: m.ElectLeadersRequest) -> list[tuple[str, int]]:
    if request.topic_partitions is not None:
        named = [(t.topic, p) for t in request.topic_partitions for p in t.partitions]
        return list(dict.fromkeys(named))  # a partition named twice is elected once
    topics = ctx.services.admin.view.topics
    return [(name, p) for name in sorted(topics) for p in sorted(topics[name].partitions)]


def _response(
    ctx: RequestContext,
    outcomes: dict[tuple[str, int], tuple[ErrorCode, str | None]],
    error: ErrorCode = ErrorCode.NONE,
) -> m.ElectLeadersResponse:
    by_topic: dict[str, list[PartitionResult]] = {}
    for (topic, partition), (code, message) in outcomes.items():
        by_topic.setdefault(topic, []).append(
            PartitionResult(partition_id=partition, error_code=code, error_message=message)
        )
    return Resp(
        throttle_time_ms=0,
        error_code=error if ctx.api_version >= 1 else ErrorCode.NONE,
        replica_election_results=[
            Result(topic=topic, partition_result=results) for topic, results in by_topic.items()
        ],
    )


@handles(m.ApiKey.ELECT_LEADERS, 0, 2)
async def handle_elect_leaders(
    ctx: RequestContext, request: m.ElectLeadersRequest
) -> m.ElectLeadersResponse:
    # v0 has no election type: it asks for preferred elections only.
    raw_type = request.election_type if ctx.api_version >= 1 else ElectionType.PREFERRED
    partitions = _requested(ctx, request)
    if not authorized(ctx, Operation.ALTER, ResourceType.CLUSTER):
        refused = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster refused")
        return _response(
            ctx, dict.fromkeys(partitions, refused), ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
    if raw_type not in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        bad = (ErrorCode.INVALID_REQUEST, f"unknown election type {raw_type}")
        return _response(ctx, dict.fromkeys(partitions, bad), ErrorCode.INVALID_REQUEST)
    election_type = ElectionType(raw_type)
    controller = ctx.services.admin.controller
    if controller is None:
        not_controller = (ErrorCode.NOT_CONTROLLER, "this broker is not the controller")
        return _response(ctx, dict.fromkeys(partitions, not_controller), ErrorCode.NOT_CONTROLLER)
    outcomes = await controller.elect_leaders(election_type, partitions)
    if request.topic_partitions is None:  # "all partitions": list only those that moved
        outcomes = {k: v for k, v in outcomes.items() if v[0] != ErrorCode.ELECTION_NOT_NEEDED}
    return _response(ctx, outcomes)
