"""The replica manager's pure decisions (replication/replica_rules.py), by example: a
leader's log counts for its term only as far as it is counted (synced), never going back;
a follower's fetch past the log end records nothing; a replica a finishing reassignment
removes does not rejoin the ISR; a new role's HW starts at what ended terms reached."""

from __future__ import annotations

from trio_broker.replication.leader import LeaderPartition
from trio_broker.replication.replica_rules import (
    HighWatermarkFloors,
    leader_log_progress,
    leaving_replica,
    record_follower_fetch,
)


def _term(log_end: int = 10) -> LeaderPartition:
    return LeaderPartition.become_leader(
        broker_id=1, leader_epoch=3, replicas=(1, 2), isr=frozenset({1, 2}),
        log_end_offset=log_end, high_watermark=0, now_ms=0,
    )  # fmt: skip


def test_the_log_counts_as_far_as_it_is_synced_and_never_goes_back() -> None:
    term = _term()
    assert leader_log_progress(term, 12, 11)  # appended past the term's log end
    assert (term.log_end_offset, term.durable_end_offset) == (12, 11)
    assert not leader_log_progress(term, 12, 11)  # nothing new
    assert not leader_log_progress(term, 8, 5)  # a stale reading moves nothing back
    assert (term.log_end_offset, term.durable_end_offset) == (12, 11)


def test_a_follower_fetch_moves_the_hw_and_past_the_log_end_records_nothing() -> None:
    term = _term()
    leader_log_progress(term, 10, 10)
    assert record_follower_fetch(term, 2, 11, 0, 0, may_join=True) == (False, None)
    assert term.high_watermark == 0
    moved, proposal = record_follower_fetch(term, 2, 10, 0, 0, may_join=True)
    assert moved and proposal is None and term.high_watermark == 10
    # A replica the term does not know (a reassignment removed it) records nothing.
    assert record_follower_fetch(term, 7, 10, 0, 0, may_join=True) == (False, None)


def test_a_removed_replica_rejoins_only_while_the_move_is_under_way() -> None:
    assert leaving_replica(1, removing=(1,), adding=(3,), isr={1, 2, 3})
    assert not leaving_replica(1, removing=(1,), adding=(3,), isr={1, 2})  # 3 still joining
    assert not leaving_replica(2, removing=(1,), adding=(3,), isr={1, 2, 3})


def test_a_new_role_starts_at_the_hw_ended_terms_reached() -> None:
    floors = HighWatermarkFloors()
    key = ("t", 0)
    assert floors.leader_start(key, 10) == 0
    floors.term_ended(key, 8)
    floors.term_ended(key, 6)  # a lower one does not lower the floor
    assert key in floors
    assert floors.leader_start(key, 10, 5) == 8
    assert floors.leader_start(key, 10, 9, 5) == 9
    assert floors.leader_start(key, 7) == 7  # capped at the log end
    assert floors.follower_start(key, 3) == 8
    floors.forget_topic("t")
    assert key not in floors and floors.follower_start(key, 3) == 3
