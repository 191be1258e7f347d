"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups, DeleteGroups.

The handlers translate between wire versions and the coordinator
(``ctx.services.groups``); the protocol's rules live in ``trio_broker.state.group``.
JoinGroup and SyncGroup often cannot be answered at once: they return a
:class:`Deferred` that waits for the rebalance (or the leader), while the
connection keeps serving the client's other requests.

In a cluster a group this broker does not coordinate (another leads its
``__consumer_offsets`` partition) gets NOT_COORDINATOR, and one whose partition's
table is still loading COORDINATOR_LOAD_IN_PROGRESS (after the request's own checks,
as Kafka); ListGroups lists the groups this broker coordinates.
"""

from __future__ import annotations

import uuid

from trio_broker.groups.coordinator import GroupCoordinator, Waiter, store_error
from trio_broker.groups.offsets_store import PendingWrite, group_of
from trio_broker.groups.share import SHARE_PROTOCOL_TYPE
from trio_broker.handlers.authorization import (
    Operation,
    ResourceType,
    authorized,
    authorized_operations,
)
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.consumer_group_heartbeat import topic_table
from trio_broker.handlers.share_persist import persist
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.state.group import GroupState, JoinRequest, JoinResult, SyncResult

JoinResp = m.JoinGroupResponse
SyncResp = m.SyncGroupResponse
LeaveResp = m.LeaveGroupResponse
ListResp = m.ListGroupsResponse
DescribeResp = m.DescribeGroupsResponse
DeleteResp = m.DeleteGroupsResponse
HeartbeatResp = m.HeartbeatResponse


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    groups: GroupCoordinator = ctx.services.groups
    return groups


def client_host(ctx: RequestContext) -> str:
    return f"/{ctx.client.host}"  # Kafka's spelling (an InetAddress's toString)


# ------------------------------------------------------------------------- JoinGroup


def join_response(version: int, result: JoinResult) -> m.JoinGroupResponse:
    protocol_name = result.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # nullable only from v7
    return JoinResp(
        throttle_time_ms=0,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            JoinResp.JoinGroupResponseMember(
                member_id=member_id, group_instance_id=instance_id, metadata=metadata
            )
            for member_id, instance_id, metadata in result.members
        ],
    )


@handles(m.ApiKey.JOIN_GROUP)
async def handle_join_group(
    ctx: RequestContext, request: m.JoinGroupRequest
) -> m.JoinGroupResponse | Deferred:
    version = ctx.api_version
    if not request.group_id:
        return join_response(
            version, JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=request.member_id)
        )
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return join_response(
            version, JoinResult(ErrorCode.GROUP_AUTHORIZATION_FAILED, member_id=request.member_id)
        )
    if (not_here := coordinator(ctx).coordinator_error(request.group_id)) is not ErrorCode.NONE:
        return join_response(version, JoinResult(not_here, member_id=request.member_id))
    join = JoinRequest(
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if version >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=request.session_timeout_ms,
        # v0 has no rebalance timeout: the session timeout bounds the join phase.
        rebalance_timeout_ms=(
            request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        ),
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
    )
    groups = coordinator(ctx)

    def partition_counts() -> dict[str, int]:
        # Only asked for a classic member of a consumer-protocol group (its subscription).
        return {name: count for name, (_, count) in topic_table(ctx).items()}

    outcome = groups.join_group(request.group_id, join, partition_counts)
    if isinstance(outcome, JoinResult):
        consumer_group = groups.consumer_group(request.group_id)
        if consumer_group is None or not groups.group_write_pending(request.group_id):
            return join_response(version, outcome)
        joined = outcome

        async def when_stored() -> m.JoinGroupResponse:
            # A classic member of a consumer-protocol group: answered once the group's
            # new epoch and assignment are stored, as a ConsumerGroupHeartbeat is.
            await groups.wait_group_stored(request.group_id)
            return join_response(version, joined)

        return Deferred(when_stored)
    waiter: Waiter = outcome

    async def when_joined() -> m.JoinGroupResponse:
        result = await waiter.wait()
        assert isinstance(result, JoinResult)
        return join_response(version, result)

    return Deferred(when_joined)


# ------------------------------------------------------------------------- SyncGroup


def sync_response(result: SyncResult) -> m.SyncGroupResponse:
    return SyncResp(
        throttle_time_ms=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


@handles(m.ApiKey.SYNC_GROUP)
async def handle_sync_group(
    ctx: RequestContext, request: m.SyncGroupRequest
) -> m.SyncGroupResponse | Deferred:
    version = ctx.api_version
    if not request.group_id:
        return sync_response(SyncResult(ErrorCode.INVALID_GROUP_ID))
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return sync_response(SyncResult(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    if (not_here := coordinator(ctx).coordinator_error(request.group_id)) is not ErrorCode.NONE:
        return sync_response(SyncResult(not_here))
    outcome = coordinator(ctx).sync_group(
        request.group_id,
        request.member_id,
        request.group_instance_id if version >= 3 else None,
        request.generation_id,
        request.protocol_type if version >= 5 else None,
        request.protocol_name if version >= 5 else None,
        {a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    if isinstance(outcome, SyncResult):
        return sync_response(outcome)
    waiter: Waiter = outcome

    async def when_synced() -> m.SyncGroupResponse:
        result = await waiter.wait()
        assert isinstance(result, SyncResult)
        return sync_response(result)

    return Deferred(when_synced)


# ------------------------------------------------------------------------- Heartbeat / Leave


@handles(m.ApiKey.HEARTBEAT)
async def handle_heartbeat(ctx: RequestContext, request: m.HeartbeatRequest) -> m.HeartbeatResponse:
    if not request.group_id:
        error = ErrorCode.INVALID_GROUP_ID
    elif not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif (not_here := coordinator(ctx).coordinator_error(request.group_id)) is not ErrorCode.NONE:
        error = not_here
    else:
        error = coordinator(ctx).heartbeat(
            request.group_id,
            request.member_id,
            request.group_instance_id if ctx.api_version >= 3 else None,
            request.generation_id,
        )
    return HeartbeatResp(throttle_time_ms=0, error_code=error)


@handles(m.ApiKey.LEAVE_GROUP)
async def handle_leave_group(
    ctx: RequestContext, request: m.LeaveGroupRequest
) -> m.LeaveGroupResponse | Deferred:
    batched = ctx.api_version >= 3  # v3+ (KIP-345) may remove several members by instance id
    if batched:
        leaving = [(member.member_id, member.group_instance_id) for member in request.members]
    else:
        leaving = [(request.member_id, None)]
    if not request.group_id:
        return LeaveResp(throttle_time_ms=0, error_code=ErrorCode.INVALID_GROUP_ID, members=[])
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        return LeaveResp(
            throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, members=[]
        )
    if (not_here := coordinator(ctx).coordinator_error(request.group_id)) is not ErrorCode.NONE:
        return LeaveResp(throttle_time_ms=0, error_code=not_here, members=[])
    errors = coordinator(ctx).leave_group(request.group_id, leaving)
    if not batched:
        response = LeaveResp(throttle_time_ms=0, error_code=errors[0])
    else:
        response = LeaveResp(
            throttle_time_ms=0,
            error_code=ErrorCode.NONE,
            members=[
                LeaveResp.MemberResponse(
                    member_id=member_id, group_instance_id=instance_id, error_code=error
                )
                for (member_id, instance_id), error in zip(leaving, errors, strict=True)
            ],
        )
    if not coordinator(ctx).group_write_pending(request.group_id):
        return response

    async def when_stored() -> m.LeaveGroupResponse:
        # The group emptied: answer once that is stored, so a restart does not bring
        # the members back (a failed write is logged; the members are gone anyway).
        await coordinator(ctx).wait_group_stored(request.group_id)
        return response

    return Deferred(when_stored)


# ------------------------------------------------------------------------- ListGroups


def share_groups(ctx: RequestContext) -> list[tuple[str, str, str, str]]:
    """Share groups as ListGroups lists them (Kafka: protocol type and group type "share"),
    those this broker coordinates: a share partition's leader knows the group too."""
    shares, now = ctx.services.shares, ctx.now_ms()
    listed = []
    for group_id in list(shares.groups):
        if ctx.services.groups.coordinator_error(group_id) is not ErrorCode.NONE:
            continue
        group = shares.group(group_id, now)  # a member whose session ran out is gone
        if group is not None:
            listed.append((group_id, SHARE_PROTOCOL_TYPE, group.state, "share"))
    return listed


@handles(m.ApiKey.LIST_GROUPS)
async def handle_list_groups(
    ctx: RequestContext, request: m.ListGroupsRequest
) -> m.ListGroupsResponse:
    version = ctx.api_version
    # Kafka matches state names case-insensitively; an empty filter matches all.
    states = {s.lower() for s in request.states_filter} if version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if version >= 5 else set()
    # Kafka lists every group to DESCRIBE on the cluster, else the describable ones.
    see_all = authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER)
    listed = [
        ListResp.ListedGroup(
            group_id=group_id,
            protocol_type=protocol_type,
            group_state=state,
            group_type=group_type,
        )
        for group_id, protocol_type, state, group_type in [
            *coordinator(ctx).list_groups(),
            *share_groups(ctx),
        ]
        if (not states or state.lower() in states)
        and (not types or group_type in types)
        and (see_all or authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id))
    ]
    # As Kafka: the groups known so far, and COORDINATOR_LOAD_IN_PROGRESS while a led
    # partition's table is still loading (some groups may be missing).
    loading = coordinator(ctx).loading()
    error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE
    return ListResp(throttle_time_ms=0, error_code=error, groups=listed)


# ------------------------------------------------------------------------- DescribeGroups

#: DescribeGroups v6 reports unknown groups as GROUP_ID_NOT_FOUND (older: state "Dead").
FIRST_NOT_FOUND_VERSION = 6


@handles(m.ApiKey.DESCRIBE_GROUPS)
async def handle_describe_groups(
    ctx: RequestContext, request: m.DescribeGroupsRequest
) -> m.DescribeGroupsResponse:
    described: list[DescribeResp.DescribedGroup] = []
    groups = coordinator(ctx)
    for group_id in request.groups:
        summary = groups.describe_group(group_id) if group_id else None
        if group_id and not authorized(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(
                DescribeResp.DescribedGroup(
                    error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=f"DESCRIBE on group {group_id!r}",
                    group_id=group_id, group_state="", protocol_type="", protocol_data="",
                    members=[],
                )
            )  # fmt: skip
            continue
        not_here = groups.coordinator_error(group_id) if group_id else ErrorCode.NONE
        if not_here is not ErrorCode.NONE:
            described.append(
                DescribeResp.DescribedGroup(
                    error_code=not_here, error_message=f"group {group_id!r}", group_id=group_id,
                    group_state="", protocol_type="", protocol_data="", members=[],
                )
            )  # fmt: skip
            continue
        if summary is None:
            error = ErrorCode.INVALID_GROUP_ID if not group_id else ErrorCode.NONE
            if group_id and ctx.api_version >= FIRST_NOT_FOUND_VERSION:
                error = ErrorCode.GROUP_ID_NOT_FOUND
            described.append(
                DescribeResp.DescribedGroup(
                    error_code=error,
                    error_message=None if error is ErrorCode.NONE else f"group {group_id!r}",
                    group_id=group_id,
                    group_state=GroupState.DEAD.value,
                    protocol_type="",
                    protocol_data="",
                    members=[],
                )
            )
            continue
        described.append(
            DescribeResp.DescribedGroup(
                error_code=ErrorCode.NONE,
                group_id=group_id,
                group_state=summary.state.value,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol_name,
                members=[
                    DescribeResp.DescribedGroup.DescribedGroupMember(
                        member_id=member.member_id,
                        group_instance_id=member.group_instance_id,
                        client_id=member.client_id,
                        client_host=member.client_host,
                        member_metadata=member.metadata,
                        member_assignment=member.assignment,
                    )
                    for member in summary.members
                ],
            )
        )
    # Without an authorizer, or unasked, the field keeps its "not provided" default.
    asked = ctx.api_version >= 3 and request.include_authorized_operations
    if ctx.services.authorizer is not None and asked:
        for group in described:
            if group.error_code == ErrorCode.NONE:
                group.authorized_operations = authorized_operations(
                    ctx, ResourceType.GROUP, group.group_id
                )
    return DescribeResp(throttle_time_ms=0, groups=described)


# ------------------------------------------------------------------------- DeleteGroups


@handles(m.ApiKey.DELETE_GROUPS)
async def handle_delete_groups(
    ctx: RequestContext, request: m.DeleteGroupsRequest
) -> m.DeleteGroupsResponse | Deferred:
    names = list(request.groups_names)
    groups = coordinator(ctx)
    results: dict[str, ErrorCode] = {}
    writes: list[PendingWrite] = []
    refused = {
        n for n in names if n and not authorized(ctx, Operation.DELETE, ResourceType.GROUP, n)
    }
    # Share groups first (Kafka chains them the same way): an empty one goes with its
    # share state, one with members is NON_EMPTY_GROUP; the others are the coordinator's.
    # Only those this broker coordinates: a share partition's leader knows the groups
    # it serves, and a former coordinator may too; the coordinator's delete_groups
    # answers the others NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS), as Kafka.
    shares = ctx.services.shares
    share_results: dict[str, ErrorCode] = {}
    share_deleted: dict[str, list[tuple[uuid.UUID, int]]] = {}
    for name in names:
        if (
            name
            and name not in refused
            and name not in share_results
            and groups.coordinator_error(name) is ErrorCode.NONE
        ):
            empty = shares.is_empty(name, ctx.now_ms())
            if empty is None and groups.share_group(name) is not None:
                # Its records stay until its share state is deleted (below): a delete
                # that failed on that (COORDINATOR_NOT_AVAILABLE, which the Admin client
                # retries) dropped only its membership, and the retry deletes it again.
                empty = True
            if empty is False:
                share_results[name] = ErrorCode.NON_EMPTY_GROUP
            elif empty:
                share_results[name] = ErrorCode.NONE
                recorded = groups.share_group(name)
                share_deleted[name] = sorted({*shares.delete_group(name), *(
                    (key.topic_id, key.partition)
                    for key in ctx.services.share_coordinator.keys(group_id=name)
                ), *(() if recorded is None else recorded.partitions())})  # fmt: skip
    try:
        # Deleted now, in request order; only the wait for the tombstones is deferred.
        results, writes = groups.delete_groups(
            [n for n in names if n and n not in refused and n not in share_results]
        )
    except KafkaError as exc:  # leadership moved under the write, or the disk failed
        results = dict.fromkeys(names, exc.error_code)
    results.update(dict.fromkeys(refused, ErrorCode.GROUP_AUTHORIZATION_FAILED))
    results.update(share_results)

    def response() -> m.DeleteGroupsResponse:
        return DeleteResp(
            throttle_time_ms=0,
            results=[
                DeleteResp.DeletableGroupResult(
                    group_id=name, error_code=results.get(name, ErrorCode.INVALID_GROUP_ID)
                )
                for name in names
            ],
        )

    if not writes and not share_deleted:
        return response()

    async def when_durable() -> m.DeleteGroupsResponse:
        for name, gone in share_deleted.items():  # their snapshots' tombstones
            if (stored := await persist(ctx, name, gone)) is not ErrorCode.NONE:
                results[name] = stored
                continue
            try:  # then the group's own records' (groups/share_records.py)
                if (write := groups.store_share_group(name, None)) is not None:
                    await groups.wait_offsets_durable(write)
            except KafkaError as exc:
                results[name] = store_error(exc.error_code)
        for pending in writes:  # one per offsets partition: a failure fails its groups
            failed = None
            try:
                await groups.wait_offsets_durable(pending)
            except KafkaError as exc:
                failed = exc.error_code
            if failed is not None:
                for name in {group_of(record) for record in pending.entries}:
                    if results.get(name) is ErrorCode.NONE:
                        results[name] = failed
        return response()

    return Deferred(when_durable)
