"""The share coordinator's APIs, broker to broker (KIP-932): InitializeShareGroupState
(83), ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86).

In a cluster a share partition lives on its data partition's leader, and its durable
state on the share coordinator: the leader of its ``__share_group_state`` partition
(``groups/share_coordinator.py``). A leader reads the state when it starts serving the
share partition and writes each durable change (``handlers/share_persist.py``); when
the coordinator is this broker it calls :func:`read_local` and :func:`write_local`
directly, else it sends these requests. A write is appended to the state partition's
log through the one append path, in this broker's leader epoch of it, and answered once
it counts (synced and below the high watermark: the in-sync replicas have it), so it
survives the coordinator's ``kill -9``. Errors per partition, as Kafka's coordinator:
NOT_COORDINATOR (the state partition is led elsewhere),
COORDINATOR_LOAD_IN_PROGRESS, FENCED_LEADER_EPOCH, FENCED_STATE_EPOCH,
INVALID_REQUEST. CLUSTER_ACTION on the cluster, as Kafka.

A node alone is a share coordinator of one: its ``__share_group_state`` has one
partition, kept in its own log (``<data_dir>/__share_group_state-0``, not a topic) and
led by an ``OwnPartition`` (services/own_partition.py); its share partitions read and
write there through :func:`read_local` and :func:`write_local`, as a cluster's do when
their coordinator is their own broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from trio_broker.groups.share_coordinator import (
    NO_LEADER_EPOCH,
    ShareCoordinatorTable,
    StateWrite,
)
from trio_broker.groups.share_state import (
    DURABLE_STATES,
    SHARE_GROUP_STATE,
    Entry,
    ShareKey,
    ShareSnapshot,
    StateBatch,
    encode_batch,
)
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import NotCommitted, append_as_leader, wait_counted
from trio_broker.state.share_partition import RecordState


def read_local(services: Any, key: ShareKey, leader_epoch: int) -> tuple[ErrorCode, Any]:
    """ReadShareGroupState of one key at this broker's coordinator: (NONE, the snapshot
    or None for no state yet), or (the error, None)."""
    table = services.share_coordinator.table_for(key)
    if isinstance(table, ErrorCode):
        return table, None
    result = table.read(key, leader_epoch)
    return result.error, result.snapshot


def append_entries(
    services: Any, table: ShareCoordinatorTable, entries: list[Entry], now_ms: int
) -> int:
    """Append ``entries`` to the table's partition through the coordinators' append path,
    in this broker's leadership of it, and hold them in the table; the last offset.
    Raises ``NotCommitted`` (nothing appended)."""
    written = append_as_leader(
        table.log, encode_batch(entries, now_ms), now_ms=now_ms,
        durability=services.durability, replication=services.share_coordinator.replication,
        topic=SHARE_GROUP_STATE, partition=table.partition, messages=len(entries),
    )  # fmt: skip
    table.appended(entries)
    return written.last_offset


async def _store(
    services: Any, by_table: dict[int, tuple[ShareCoordinatorTable, list[Entry]]], now_ms: int
) -> dict[ShareKey, ErrorCode]:
    """Append each table's entries (all before the first wait, so they land in the order
    taken), then wait until each counts: NONE per key, else the append's or wait's error."""
    answers: dict[ShareKey, ErrorCode] = {}
    appended = []
    for table, entries in by_table.values():
        try:
            appended.append((table, entries, append_entries(services, table, entries, now_ms)))
        except NotCommitted as exc:
            answers.update((key, exc.error_code) for key, _ in entries)
    for table, entries, last_offset in appended:
        answers.update((key, ErrorCode.NONE) for key, _ in entries)
        try:
            await wait_counted(
                table.log, last_offset, durability=services.durability,
                replication=services.share_coordinator.replication, topic=SHARE_GROUP_STATE,
                partition=table.partition,
            )  # fmt: skip
        except NotCommitted as exc:
            answers.update((key, exc.error_code) for key, _ in entries)
    return answers


async def write_local(
    services: Any, writes: Sequence[StateWrite], now_ms: int
) -> dict[ShareKey, ErrorCode]:
    """WriteShareGroupState (and InitializeShareGroupState: a write without a leader
    epoch) at this broker's coordinator: each key's error, NONE once its snapshot counts."""
    answers: dict[ShareKey, ErrorCode] = {}
    by_table: dict[int, tuple[ShareCoordinatorTable, list[Entry]]] = {}
    for write in writes:
        table = services.share_coordinator.table_for(write.key)
        if isinstance(table, ErrorCode):
            answers[write.key] = table
            continue
        error = table.check_write(write.key, write.leader_epoch, write.snapshot.state_epoch)
        if error is not ErrorCode.NONE:
            answers[write.key] = error
            continue
        entry = table.entry_for(write.key, write.snapshot, write.leader_epoch, now_ms)
        by_table.setdefault(table.partition, (table, []))[1].append(entry)
    return answers | await _store(services, by_table, now_ms)


async def delete_local(
    services: Any, keys: Sequence[ShareKey], now_ms: int
) -> dict[ShareKey, ErrorCode]:
    """DeleteShareGroupState at this broker's coordinator: tombstones, NONE once they
    count (at once for a key without state)."""
    answers: dict[ShareKey, ErrorCode] = {}
    by_table: dict[int, tuple[ShareCoordinatorTable, list[Entry]]] = {}
    for key in keys:
        table = services.share_coordinator.table_for(key)
        if isinstance(table, ErrorCode):
            answers[key] = table
            continue
        answers[key] = ErrorCode.NONE
        by_table.setdefault(table.partition, (table, []))[1].extend(table.store.tombstones([key]))
    by_table = {p: (table, entries) for p, (table, entries) in by_table.items() if entries}
    return answers | await _store(services, by_table, now_ms)


# ---------------------------------------------------------------------------- the handlers

Part = TypeVar("Part")


async def _per_partition(
    ctx: RequestContext,
    request: Any,
    checked: Callable[[ShareKey, Any], Part | None],
    apply: Callable[[Any, list[Part], int], Awaitable[dict[ShareKey, ErrorCode]]],
) -> dict[tuple[uuid.UUID, int], ErrorCode]:
    """The shape of InitializeShareGroupState, WriteShareGroupState and
    DeleteShareGroupState: CLUSTER_ACTION on the cluster, each partition checked
    (``checked``: what to apply, or None when malformed: INVALID_REQUEST), the valid ones
    applied at this broker's coordinator in one call; each partition's error."""
    allowed = authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    errors: dict[tuple[uuid.UUID, int], ErrorCode] = {}
    valid: list[Part] = []
    for topic in request.topics:
        for p in topic.partitions:
            key = ShareKey(request.group_id, topic.topic_id, p.partition)
            if not allowed:
                errors[topic.topic_id, p.partition] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            elif p.partition < 0 or (part := checked(key, p)) is None:
                errors[topic.topic_id, p.partition] = ErrorCode.INVALID_REQUEST
            else:
                valid.append(part)
    for key, error in (await apply(ctx.services, valid, ctx.now_ms())).items():
        errors[key.topic_id, key.partition] = error
    return errors


def _results(
    request: Any, errors: dict[tuple[uuid.UUID, int], ErrorCode], result: Any
) -> list[Any]:
    """Each topic's partitions with their errors, in the request's order."""
    return [
        result(topic_id=topic.topic_id, partitions=[
            result.PartitionResult(
                partition=p.partition, error_code=errors[topic.topic_id, p.partition]
            )
            for p in topic.partitions
        ])
        for topic in request.topics
    ]  # fmt: skip


# ---------------------------------------------------------------------------- wire forms


def batches_of(wire: Sequence[Any]) -> tuple[StateBatch, ...] | None:
    """The request's state batches, or None when one is malformed (INVALID_REQUEST)."""
    batches = []
    previous_last = None
    for b in sorted(wire, key=lambda b: b.first_offset):
        if b.delivery_state not in DURABLE_STATES:  # an acquisition is not durable
            return None
        state = RecordState(b.delivery_state)
        if b.first_offset > b.last_offset or (
            previous_last is not None and b.first_offset <= previous_last
        ):
            return None
        batches.append(StateBatch(b.first_offset, b.last_offset, state, b.delivery_count))
        previous_last = b.last_offset
    return tuple(batches)


WriteResp = m.WriteShareGroupStateResponse


@handles(m.ApiKey.WRITE_SHARE_GROUP_STATE)
async def handle_write_share_group_state(
    ctx: RequestContext, request: m.WriteShareGroupStateRequest
) -> m.WriteShareGroupStateResponse:
    def checked(key: ShareKey, p: Any) -> StateWrite | None:
        batches = batches_of(p.state_batches)
        if batches is None or p.start_offset < 0:
            return None
        snapshot = ShareSnapshot(p.start_offset, batches, state_epoch=p.state_epoch)
        return StateWrite(key, snapshot, p.leader_epoch)

    errors = await _per_partition(ctx, request, checked, write_local)
    return WriteResp(results=_results(request, errors, WriteResp.WriteStateResult))


ReadResp = m.ReadShareGroupStateResponse
ReadResult = ReadResp.ReadStateResult
ReadPart = ReadResult.PartitionResult


@handles(m.ApiKey.READ_SHARE_GROUP_STATE)
async def handle_read_share_group_state(
    ctx: RequestContext, request: m.ReadShareGroupStateRequest
) -> m.ReadShareGroupStateResponse:
    """A leader's read in its leader epoch; a read with leader epoch -1 is a summary (the
    group coordinator's, for the admin APIs), which fences no one."""
    allowed = authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    results = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            part = ReadPart(partition=p.partition, error_code=ErrorCode.NONE, state_epoch=0,
                            start_offset=-1, state_batches=[])  # fmt: skip
            if not allowed:
                part.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            elif p.partition < 0:
                part.error_code = ErrorCode.INVALID_REQUEST
            else:
                key = ShareKey(request.group_id, topic.topic_id, p.partition)
                error, snapshot = read_local(ctx.services, key, p.leader_epoch)
                part.error_code = error
                if snapshot is not None:
                    part.state_epoch = snapshot.state_epoch
                    part.start_offset = snapshot.start_offset
                    part.state_batches = [
                        ReadPart.StateBatch(
                            first_offset=b.first_offset,
                            last_offset=b.last_offset,
                            delivery_state=int(b.delivery_state),
                            delivery_count=b.delivery_count,
                        )
                        for b in snapshot.batches
                    ]
            parts.append(part)
        results.append(ReadResult(topic_id=topic.topic_id, partitions=parts))
    return ReadResp(results=results)


InitResp = m.InitializeShareGroupStateResponse


@handles(m.ApiKey.INITIALIZE_SHARE_GROUP_STATE)
async def handle_initialize_share_group_state(
    ctx: RequestContext, request: m.InitializeShareGroupStateRequest
) -> m.InitializeShareGroupStateResponse:
    """A share partition's state starts over at the start offset with the state epoch:
    nothing in flight (what the group coordinator writes for AlterShareGroupOffsets). It
    comes with no leader's epoch: it fences no reader or writer but by its state epoch."""

    def checked(key: ShareKey, p: Any) -> StateWrite | None:
        if p.start_offset < 0:
            return None
        snapshot = ShareSnapshot(p.start_offset, state_epoch=p.state_epoch)
        return StateWrite(key, snapshot, NO_LEADER_EPOCH)

    errors = await _per_partition(ctx, request, checked, write_local)
    return InitResp(results=_results(request, errors, InitResp.InitializeStateResult))


DeleteResp = m.DeleteShareGroupStateResponse


@handles(m.ApiKey.DELETE_SHARE_GROUP_STATE)
async def handle_delete_share_group_state(
    ctx: RequestContext, request: m.DeleteShareGroupStateRequest
) -> m.DeleteShareGroupStateResponse:
    errors = await _per_partition(ctx, request, lambda key, p: key, delete_local)
    return DeleteResp(results=_results(request, errors, DeleteResp.DeleteStateResult))
