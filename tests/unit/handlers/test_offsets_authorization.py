"""ListOffsets and OffsetForLeaderEpoch authorize as Kafka's KafkaApis does, with the
broker's real ACL authorizer (no ACL file: bindings added in memory):

- ListOffsets refuses a topic the principal may not describe whole, duplicated
  partitions included: TOPIC_AUTHORIZATION_FAILED (was INVALID_REQUEST for a partition
  named twice: the duplicate check came first); an allowed topic's duplicates stay
  INVALID_REQUEST;
- OffsetForLeaderEpoch lets a principal with CLUSTER_ACTION on the cluster (a broker's
  replica fetcher) ask for any topic (was TOPIC_AUTHORIZATION_FAILED without DESCRIBE
  on it); others need DESCRIBE on the topic.
"""

from __future__ import annotations

from typing import Any

import attrs

from tests.unit.handlers.test_handler_effects import Services
from trio_broker.handlers.base import ClientInfo, RequestContext
from trio_broker.handlers.list_offsets import handle_list_offsets
from trio_broker.handlers.offset_for_leader_epoch import handle_offset_for_leader_epoch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from trio_broker.security.authorize import Authorizer

READER, BROKER = "User:reader", "User:replica"


def secured(*grants: tuple[str, Operation, ResourceType, str]) -> Services:
    authorizer = Authorizer("", allow_if_no_acl=False, data_dir=None)
    authorizer.store.add(
        AclBinding(kind, name, PatternType.LITERAL, who, "*", op, Permission.ALLOW)
        for who, op, kind, name in grants
    )
    services = Services(authorizer=authorizer)
    services.topics.create("open", 1)
    services.topics.create("closed", 1)
    return services


def context(services: Services, principal: str, api_key: int, version: int) -> RequestContext:
    header = RequestHeader(api_key, version, 1, "auth")
    ctx = RequestContext(header=header, services=services, client=ClientInfo(1, "127.0.0.1", 1))
    return attrs.evolve(ctx, principal=principal)


def errors_of(topics: list[Any], name: str = "name") -> dict[str, list[int]]:
    return {getattr(t, name): [p.error_code for p in t.partitions] for t in topics}


async def test_list_offsets_authorizes_before_it_looks_for_duplicates() -> None:
    services = secured((READER, Operation.DESCRIBE, ResourceType.TOPIC, "open"))
    Req = m.ListOffsetsRequest
    twice = [Req.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)] * 2
    request = Req(replica_id=-1, isolation_level=0, topics=[
        Req.ListOffsetsTopic(name="open", partitions=twice),
        Req.ListOffsetsTopic(name="closed", partitions=twice),
    ])  # fmt: skip
    response = await handle_list_offsets(
        context(services, READER, m.ApiKey.LIST_OFFSETS, 7), request
    )
    assert errors_of(response.topics) == {
        "open": [ErrorCode.INVALID_REQUEST] * 2,
        "closed": [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 2,
    }


async def test_offset_for_leader_epoch_takes_cluster_action_for_any_topic() -> None:
    services = secured(
        (BROKER, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME),
        (READER, Operation.DESCRIBE, ResourceType.TOPIC, "open"),
    )
    Req = m.OffsetForLeaderEpochRequest
    part = Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=-1, leader_epoch=0
    )
    request = Req(replica_id=-1, topics=[
        Req.OffsetForLeaderTopic(topic=name, partitions=[part]) for name in ("open", "closed")
    ])  # fmt: skip
    for principal, closed in (
        (BROKER, ErrorCode.NONE),
        (READER, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    ):
        ctx = context(services, principal, m.ApiKey.OFFSET_FOR_LEADER_EPOCH, 4)
        response = await handle_offset_for_leader_epoch(ctx, request)
        assert errors_of(response.topics, "topic") == {
            "open": [ErrorCode.NONE],
            "closed": [closed],
        }, principal
