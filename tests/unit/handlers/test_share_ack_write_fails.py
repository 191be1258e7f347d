"""An acknowledgement whose share state write fails is undone, as Kafka's share partition
undoes it (``rollbackOrProcessStateUpdates``): the partition answers the write's error,
its records stay acquired by the member with their locks running, and the member's
retry of the same acknowledgement succeeds and is stored.

In process on the broker of test_share_state_leader.py, which leads the data partition
and the key's ``__share_group_state`` partition; its replica manager stand-in lets the
next state write miss the high watermark (a state partition whose ISR still names a
dead follower: COORDINATOR_NOT_AVAILABLE, what a cluster answered after a kill -9).
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from tests.unit.handlers.test_share_state_leader import GROUP, start
from trio_broker.groups.share_state import ShareKey, StateBatch
from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.share_acknowledge import handle_share_acknowledge
from trio_broker.handlers.share_fetch import handle_share_fetch
from trio_broker.handlers.share_persist import ensure_loaded
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import RecordState, SharePartition

SA = m.ShareAcknowledgeRequest
SF = m.ShareFetchRequest
ACCEPT, RELEASE = 1, 2
#: What the member acknowledges of the offsets 0-5 it holds: 0-3 accepted, 4 released.
BATCHES = [(0, 3, ACCEPT), (4, 4, RELEASE)]


async def holding_six(
    nursery: trio.Nursery,
) -> tuple[Any, uuid.UUID, RequestContext, SharePartition]:
    """The broker, the topic, a context, and the share partition in which member m1,
    its share session open (next epoch 1), holds offsets 0-5."""
    broker, topic_id, ctx = await start(nursery)
    assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {}
    # (A session opened gives back what the member held: opened first.)
    assert broker.shares.open_session(GROUP, "m1").epoch == 1
    held = broker.shares.ensure_partition(GROUP, topic_id, 0, 0)
    held.acquire("m1", 6, 6, ctx.now_ms())
    return broker, topic_id, ctx, held


def acknowledgement(
    topic_id: uuid.UUID, epoch: int, batches: list[tuple[int, int, int]] = BATCHES
) -> SA:
    Part = SA.AcknowledgeTopic.AcknowledgePartition
    return SA(
        group_id=GROUP, member_id="m1", share_session_epoch=epoch,
        topics=[SA.AcknowledgeTopic(topic_id=topic_id, partitions=[Part(
            partition_index=0, acknowledgement_batches=[
                Part.AcknowledgementBatch(first_offset=f, last_offset=la, acknowledge_types=[t])
                for f, la, t in batches])])],
    )  # fmt: skip


def fetch_with_acks(
    topic_id: uuid.UUID, epoch: int, batches: list[tuple[int, int, int]] = BATCHES
) -> SF:
    Part = SF.FetchTopic.FetchPartition
    return SF(
        group_id=GROUP, member_id="m1", share_session_epoch=epoch, max_wait_ms=0,
        min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
        topics=[SF.FetchTopic(topic_id=topic_id, partitions=[Part(
            partition_index=0, acknowledgement_batches=[
                Part.AcknowledgementBatch(first_offset=f, last_offset=la, acknowledge_types=[t])
                for f, la, t in batches])])],
        forgotten_topics_data=[],
    )  # fmt: skip


def assert_still_held_by_m1(held: SharePartition, now_ms: int) -> None:
    """Offsets 0-5 acquired by m1, their locks running; the start where it was; and
    another member acquires none of them."""
    assert held.start_offset == 0
    for offset in range(6):
        record = held.records[offset]
        assert (record.state, record.member_id) == (RecordState.ACQUIRED, "m1"), offset
        assert record.lock_deadline_ms > now_ms
    assert not held.pending
    assert held.acquire("m2", 6, 6, now_ms) == []


def assert_stored(broker: Any, topic_id: uuid.UUID, held: SharePartition) -> None:
    """The acknowledgement counts in memory and at the share coordinator: 0-3 done, 4
    released after one delivery, 5 held (stored as what losing its lock makes it)."""
    assert held.start_offset == 4
    assert held.state_of(4) is RecordState.AVAILABLE
    stored = broker.share_coordinator.tables[0].store.snapshots[ShareKey(GROUP, topic_id, 0)]
    assert stored.start_offset == 4
    assert stored.batches == (StateBatch(4, 5, RecordState.AVAILABLE, 1),)


async def test_a_share_acknowledge_whose_write_fails_is_undone_and_its_retry_is_stored() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx, held = await holding_six(nursery)
        broker.replication.uncommitted_writes = 1
        answer = await handle_share_acknowledge(ctx, acknowledgement(topic_id, 1))
        assert answer.error_code == ErrorCode.NONE
        [part] = answer.responses[0].partitions
        assert part.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert_still_held_by_m1(held, ctx.now_ms())

        answer = await handle_share_acknowledge(ctx, acknowledgement(topic_id, 2))
        [part] = answer.responses[0].partitions
        assert part.error_code == ErrorCode.NONE
        assert_stored(broker, topic_id, held)
        nursery.cancel_scope.cancel()


async def test_a_share_fetchs_acknowledgements_whose_write_fails_are_undone_then_stored() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx, held = await holding_six(nursery)
        broker.replication.uncommitted_writes = 1
        answer = await handle_share_fetch(ctx, fetch_with_acks(topic_id, 1))
        assert isinstance(answer, m.ShareFetchResponse) and answer.error_code == ErrorCode.NONE
        [part] = answer.responses[0].partitions
        assert part.acknowledge_error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        # The fetch acquired nothing: what was acknowledged is m1's again, not released.
        assert part.acquired_records == []
        assert_still_held_by_m1(held, ctx.now_ms())

        answer = await handle_share_fetch(ctx, fetch_with_acks(topic_id, 2))
        assert isinstance(answer, m.ShareFetchResponse)
        [part] = answer.responses[0].partitions
        assert part.acknowledge_error_code == ErrorCode.NONE
        assert_stored(broker, topic_id, held)
        nursery.cancel_scope.cancel()


async def test_a_closing_sessions_acknowledgements_whose_write_fails_are_given_back() -> None:
    """Epoch -1 ends the session whatever the write does: what its acknowledgements
    would have finished goes back with everything else the member held (Kafka releases
    the session's records once its acknowledgements complete), for another delivery."""
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx, held = await holding_six(nursery)
        broker.replication.uncommitted_writes = 1
        answer = await handle_share_acknowledge(ctx, acknowledgement(topic_id, -1))
        [part] = answer.responses[0].partitions
        assert part.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert broker.shares.session(GROUP, "m1") is None
        assert held.start_offset == 0 and not held.pending
        assert [held.state_of(o) for o in range(6)] == [RecordState.AVAILABLE] * 6
        nursery.cancel_scope.cancel()
