"""A pending acknowledgement (its share state write not settled yet): its records take no
other transition until it settles, and a failed write puts them back as they were
(Kafka's state transition in progress and its rollback)."""

from __future__ import annotations

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import RecordState, SharePartition

NOW = 1_000
ACCEPT, RELEASE = 1, 2


def held_by_a(count: int = 4, lock_ms: int = 30_000) -> SharePartition:
    share = SharePartition(0, lock_duration_ms=lock_ms)
    assert share.acquire("a", count, count, NOW)
    return share


def test_a_pending_release_is_not_acquired_again_and_a_pending_accept_holds_the_start() -> None:
    share = held_by_a()
    assert share.acknowledge("a", 0, 0, [ACCEPT], NOW, pending=True) is ErrorCode.NONE
    assert share.acknowledge("a", 1, 1, [RELEASE], NOW, pending=True) is ErrorCode.NONE
    # Written as it will be once stored (the snapshot holds the new states)...
    assert share.state_of(0) is RecordState.ACKNOWLEDGED
    assert share.state_of(1) is RecordState.AVAILABLE
    # ... but the start stays, and the released record goes to no one yet.
    assert share.start_offset == 0
    assert share.next_fetch_offset(NOW) == 4
    assert share.acquire("b", 4, 4, NOW) == []
    # Nor can it be acknowledged again meanwhile.
    assert share.acknowledge("a", 0, 0, [ACCEPT], NOW) is ErrorCode.INVALID_RECORD_STATE

    share.settle(0, 0, stored=True)
    share.settle(1, 1, stored=True)
    assert share.start_offset == 1 and not share.pending
    assert [(r.first_offset, r.last_offset) for r in share.acquire("b", 4, 4, NOW)] == [(1, 1)]


def test_a_failed_write_gives_the_records_back_to_their_member() -> None:
    share = held_by_a()
    deadline = share.records[0].lock_deadline_ms
    assert share.acknowledge("a", 0, 1, [ACCEPT, RELEASE], NOW, pending=True) is ErrorCode.NONE
    share.settle(0, 1, stored=False)
    for offset in (0, 1):
        record = share.records[offset]
        assert (record.state, record.member_id, record.delivery_count) == (
            RecordState.ACQUIRED, "a", 1,
        )  # fmt: skip
        assert record.lock_deadline_ms == deadline
    assert share.start_offset == 0 and not share.pending
    # The member's retry finds them.
    assert share.acknowledge("a", 0, 1, [ACCEPT, RELEASE], NOW, pending=True) is ErrorCode.NONE
    share.settle(0, 1, stored=True)
    assert share.start_offset == 1 and share.state_of(1) is RecordState.AVAILABLE


def test_a_lock_that_ran_out_during_a_failed_write_gives_the_record_back() -> None:
    share = held_by_a(count=1, lock_ms=100)
    assert share.acknowledge("a", 0, 0, [ACCEPT], NOW, pending=True) is ErrorCode.NONE
    share.settle(0, 0, stored=False)
    later = NOW + 100
    assert share.next_fetch_offset(later) == 0
    assert share.acknowledge("a", 0, 0, [ACCEPT], later) is ErrorCode.INVALID_RECORD_STATE
    [again] = share.acquire("b", 1, 1, later)
    assert (again.first_offset, again.delivery_count) == (0, 2)


def test_records_the_log_dropped_while_pending_stay_finished() -> None:
    share = held_by_a()
    assert share.acknowledge("a", 0, 1, [RELEASE], NOW, pending=True) is ErrorCode.NONE
    share.skip_to(2)  # retention or DeleteRecords passed them meanwhile
    share.settle(0, 1, stored=False)
    assert share.start_offset == 2 and not share.pending
    assert share.state_of(0) is None and share.state_of(1) is None
