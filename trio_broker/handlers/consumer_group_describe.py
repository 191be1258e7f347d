"""ConsumerGroupDescribe (API 69, KIP-848): members, epochs and assignments of the
groups of the consumer rebalance protocol. A classic group, or none, is
GROUP_ID_NOT_FOUND here (the Java Admin then asks DescribeGroups, as with Kafka)."""

from __future__ import annotations

from trio_broker.groups.coordinator import GroupCoordinator
from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
)
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.handlers.consumer_group_heartbeat import assigned_by_topic, topic_table
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.consumer_group import Assignment

Resp = m.ConsumerGroupDescribeResponse
#: ConsumerGroupDescribe v1's MemberType (v0 leaves it out; -1 is "unknown").
CLASSIC_MEMBER, CONSUMER_MEMBER = 0, 1
Group = Resp.DescribedGroup


@handles(m.ApiKey.CONSUMER_GROUP_DESCRIBE)
async def handle_consumer_group_describe(
    ctx: RequestContext, request: m.ConsumerGroupDescribeRequest
) -> Resp:
    groups: GroupCoordinator = ctx.services.groups
    table = topic_table(ctx)

    def assignment(partitions: Assignment) -> Group.Member.Assignment:
        TopicPartitions = Group.Member.Assignment.TopicPartitions
        return Group.Member.Assignment(
            topic_partitions=[
                TopicPartitions(topic_id=topic_id, topic_name=name, partitions=parts)
                for topic_id, name, parts in assigned_by_topic(partitions, table)
            ]
        )

    described: list[Group] = []
    for group_id in request.group_ids:
        out = Group(
            error_code=ErrorCode.NONE, group_id=group_id, group_state="", group_epoch=0,
            assignment_epoch=0, assignor_name="", members=[],
        )  # fmt: skip
        described.append(out)
        if not group_id:
            out.error_code, out.error_message = ErrorCode.INVALID_GROUP_ID, "Group id is empty."
            continue
        if not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            out.error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            continue
        if (not_here := groups.coordinator_error(group_id)) is not ErrorCode.NONE:
            out.error_code = not_here
            continue
        group = groups.consumer_group(group_id)
        if group is None:
            out.error_code = ErrorCode.GROUP_ID_NOT_FOUND
            out.error_message = (
                f"Group {group_id} is not a consumer group"
                if group_id in groups.groups
                else f"Group {group_id} not found."
            )
            continue
        out.group_state = group.state.value
        out.group_epoch = group.group_epoch
        out.assignment_epoch = group.assignment_epoch
        out.assignor_name = group.assignor_name
        out.members = [
            Group.Member(
                member_id=member.member_id,
                instance_id=member.instance_id,
                rack_id=member.rack_id,
                member_epoch=member.epoch,
                client_id=member.client_id,
                client_host=member.client_host,
                subscribed_topic_names=list(member.subscribed),
                subscribed_topic_regex=member.regex,
                assignment=assignment(member.assigned),
                target_assignment=assignment(group.target.get(member.member_id, frozenset())),
                # v1 (KIP-1099): 0 a classic member (KIP-848's migration), 1 a consumer one.
                member_type=CLASSIC_MEMBER if member.classic is not None else CONSUMER_MEMBER,
            )
            for member in group.members.values()
        ]
        if request.include_authorized_operations and ctx.services.authorizer is not None:
            out.authorized_operations = authorized_operations(ctx, ResourceType.GROUP, group_id)
    return Resp(throttle_time_ms=0, groups=described)
