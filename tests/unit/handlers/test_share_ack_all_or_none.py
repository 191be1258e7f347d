"""One request's acknowledgement batches for one partition count all or none, as Kafka's
share partition applies them (``SharePartition.acknowledge``: the first batch that
fails ends the loop and every state change of the request's batches for the partition
is rolled back, nothing written): the partition answers that batch's error, and the
records the other batches named stay acquired by the member, their locks running, so
that its retry without the bad batch is applied and stored.

In process on the broker of test_share_state_leader.py, the member holding offsets
0-5 as test_share_ack_write_fails.py sets it up.
"""

from __future__ import annotations

import uuid

import trio

from tests.unit.handlers.test_share_ack_write_fails import (
    ACCEPT,
    RELEASE,
    acknowledgement,
    assert_still_held_by_m1,
    fetch_with_acks,
    holding_six,
)
from tests.unit.handlers.test_share_state_leader import GROUP
from trio_broker.groups.share_state import ShareKey, StateBatch
from trio_broker.handlers.share_acknowledge import handle_share_acknowledge
from trio_broker.handlers.share_fetch import handle_share_fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import RecordState

#: 0-1 accepted, then offset 9 (never acquired: INVALID_RECORD_STATE), then 2-3
#: accepted and 4 released: the batches before the bad one and after it.
WITH_A_BAD_BATCH = [(0, 1, ACCEPT), (9, 9, ACCEPT), (2, 3, ACCEPT), (4, 4, RELEASE)]
#: The same without the bad batch.
RETRY = [(0, 1, ACCEPT), (2, 3, ACCEPT), (4, 4, RELEASE)]


def stored_batches(
    broker: object, topic_id: uuid.UUID
) -> tuple[int, tuple[StateBatch, ...]] | None:
    table = broker.share_coordinator.tables[0]  # type: ignore[attr-defined]
    snapshot = table.store.snapshots.get(ShareKey(GROUP, topic_id, 0))
    return None if snapshot is None else (snapshot.start_offset, snapshot.batches)


async def test_a_bad_batch_undoes_the_requests_other_batches_for_the_partition() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx, held = await holding_six(nursery)
        before = stored_batches(broker, topic_id)
        answer = await handle_share_acknowledge(ctx, acknowledgement(topic_id, 1, WITH_A_BAD_BATCH))
        assert answer.error_code == ErrorCode.NONE
        [part] = answer.responses[0].partitions
        assert part.error_code == ErrorCode.INVALID_RECORD_STATE
        # Neither 0-1 (before the bad batch) nor 2-4 (after it) counted, nor was stored.
        assert_still_held_by_m1(held, ctx.now_ms())
        assert stored_batches(broker, topic_id) == before

        answer = await handle_share_acknowledge(ctx, acknowledgement(topic_id, 2, RETRY))
        [part] = answer.responses[0].partitions
        assert part.error_code == ErrorCode.NONE
        assert held.start_offset == 4 and held.state_of(4) is RecordState.AVAILABLE
        assert stored_batches(broker, topic_id) == (
            4,
            (StateBatch(4, 5, RecordState.AVAILABLE, 1),),
        )
        nursery.cancel_scope.cancel()


async def test_a_share_fetchs_bad_batch_undoes_its_other_batches_for_the_partition() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx, held = await holding_six(nursery)
        answer = await handle_share_fetch(ctx, fetch_with_acks(topic_id, 1, WITH_A_BAD_BATCH))
        assert isinstance(answer, m.ShareFetchResponse) and answer.error_code == ErrorCode.NONE
        [part] = answer.responses[0].partitions
        assert part.acknowledge_error_code == ErrorCode.INVALID_RECORD_STATE
        # Nothing released by the request: the fetch had nothing to acquire.
        assert part.acquired_records == []
        assert_still_held_by_m1(held, ctx.now_ms())
        assert stored_batches(broker, topic_id) is None
        nursery.cancel_scope.cancel()
