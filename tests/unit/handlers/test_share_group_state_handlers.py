"""The share coordinator's handlers of InitializeShareGroupState, ReadShareGroupState,
WriteShareGroupState and DeleteShareGroupState (handlers/share_group_state.py), called
in process on the broker of test_share_state_leader.py, which leads the one
``__share_group_state`` partition: per-partition checks and errors, the state epoch an
initialization raises and fences the leader's writes with, a summary read fencing no
one, tombstones, and CLUSTER_ACTION.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from tests.unit.handlers.test_share_state_leader import GROUP, start
from trio_broker.groups.share_state import ShareKey
from trio_broker.handlers.share_group_state import (
    handle_delete_share_group_state,
    handle_initialize_share_group_state,
    handle_read_share_group_state,
    handle_write_share_group_state,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import RecordState

Write = m.WriteShareGroupStateRequest
Init = m.InitializeShareGroupStateRequest
Read = m.ReadShareGroupStateRequest
Delete = m.DeleteShareGroupStateRequest


def write(topic_id: uuid.UUID, *parts: tuple[int, int, int, int, list[tuple[int, int]]]) -> Any:
    """(partition, leader epoch, state epoch, start offset, [(first, last) acknowledged])."""
    Part = Write.WriteStateData.PartitionData
    return Write(group_id=GROUP, topics=[Write.WriteStateData(topic_id=topic_id, partitions=[
        Part(partition=p, leader_epoch=leader, state_epoch=state, start_offset=start,
             state_batches=[Part.StateBatch(first_offset=f, last_offset=last,
                                            delivery_state=int(RecordState.ACKNOWLEDGED),
                                            delivery_count=1) for f, last in acked])
        for p, leader, state, start, acked in parts
    ])])  # fmt: skip


def initialize(topic_id: uuid.UUID, partition: int, state_epoch: int, start: int) -> Any:
    Part = Init.InitializeStateData.PartitionData
    return Init(group_id=GROUP, topics=[Init.InitializeStateData(topic_id=topic_id, partitions=[
        Part(partition=partition, state_epoch=state_epoch, start_offset=start)
    ])])  # fmt: skip


def read(topic_id: uuid.UUID, partition: int, leader_epoch: int) -> Any:
    Part = Read.ReadStateData.PartitionData
    return Read(group_id=GROUP, topics=[Read.ReadStateData(topic_id=topic_id, partitions=[
        Part(partition=partition, leader_epoch=leader_epoch)
    ])])  # fmt: skip


def delete(topic_id: uuid.UUID, *partitions: int) -> Any:
    Part = Delete.DeleteStateData.PartitionData
    return Delete(group_id=GROUP, topics=[Delete.DeleteStateData(topic_id=topic_id, partitions=[
        Part(partition=p) for p in partitions
    ])])  # fmt: skip


def errors(response: Any) -> dict[int, ErrorCode]:
    return {p.partition: ErrorCode(p.error_code) for r in response.results for p in r.partitions}


async def test_write_initialize_read_and_delete_answer_per_partition() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx = await start(nursery)
        table = broker.share_coordinator.tables[0]
        # A valid partition, a malformed batch (first > last), a negative partition.
        answer = await handle_write_share_group_state(
            ctx, write(topic_id, (0, 3, 0, 2, [(4, 5)]), (1, 3, 0, 0, [(3, 2)]), (-1, 3, 0, 0, []))
        )
        assert errors(answer) == {
            0: ErrorCode.NONE,
            1: ErrorCode.INVALID_REQUEST,
            -1: ErrorCode.INVALID_REQUEST,
        }
        key = ShareKey(GROUP, topic_id, 0)
        assert (table.store.snapshots[key].start_offset, table.leader_epochs[key]) == (2, 3)

        # A summary read (leader epoch -1) fences no one: the leader still writes in 3.
        summary = await handle_read_share_group_state(ctx, read(topic_id, 0, -1))
        [part] = summary.results[0].partitions
        assert (part.error_code, part.start_offset, part.state_epoch) == (0, 2, 0)
        assert errors(
            await handle_write_share_group_state(ctx, write(topic_id, (0, 3, 0, 6, [])))
        ) == {0: ErrorCode.NONE}
        # A leader's read in an older epoch is fenced.
        [old] = (
            (await handle_read_share_group_state(ctx, read(topic_id, 0, 2))).results[0].partitions
        )
        assert old.error_code == ErrorCode.FENCED_LEADER_EPOCH

        # Initializing needs a state epoch above the stored one; then the share
        # partition starts over there, and the leader's writes of the old epoch are fenced.
        refused = await handle_initialize_share_group_state(ctx, initialize(topic_id, 0, 0, 1))
        assert errors(refused) == {0: ErrorCode.FENCED_STATE_EPOCH}
        done = await handle_initialize_share_group_state(ctx, initialize(topic_id, 0, 1, 1))
        assert errors(done) == {0: ErrorCode.NONE}
        stored = table.store.snapshots[key]
        assert (stored.start_offset, stored.state_epoch, stored.batches) == (1, 1, ())
        assert stored.leader_epoch == 3  # kept: it still fences the leaders before
        assert errors(
            await handle_write_share_group_state(ctx, write(topic_id, (0, 3, 0, 7, [])))
        ) == {0: ErrorCode.FENCED_STATE_EPOCH}
        assert errors(
            await handle_initialize_share_group_state(ctx, initialize(topic_id, 0, 2, -1))
        ) == {0: ErrorCode.INVALID_REQUEST}

        # Deleting: a tombstone for the key, NONE for a key without state too.
        gone = await handle_delete_share_group_state(ctx, delete(topic_id, 0, 5, -1))
        assert errors(gone) == {0: ErrorCode.NONE, 5: ErrorCode.NONE, -1: ErrorCode.INVALID_REQUEST}
        assert key not in table.store.snapshots
        [after] = (
            (await handle_read_share_group_state(ctx, read(topic_id, 0, 3))).results[0].partitions
        )
        assert (after.error_code, after.start_offset) == (0, -1)
        nursery.cancel_scope.cancel()


class DenyAll:
    def allowed(self, *args: Any) -> bool:
        return False


async def test_each_needs_cluster_action() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx = await start(nursery)
        broker.authorizer = DenyAll()
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert errors(
            await handle_write_share_group_state(ctx, write(topic_id, (0, 3, 0, 2, [])))
        ) == {0: denied}
        assert errors(
            await handle_initialize_share_group_state(ctx, initialize(topic_id, 0, 1, 0))
        ) == {0: denied}
        assert errors(await handle_delete_share_group_state(ctx, delete(topic_id, 0))) == {
            0: denied
        }
        assert errors(await handle_read_share_group_state(ctx, read(topic_id, 0, 3))) == {0: denied}
        assert not broker.share_coordinator.tables[0].store.snapshots
        nursery.cancel_scope.cancel()
