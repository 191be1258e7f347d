"""trio_broker.replication by example: the cases KIP-101, KIP-279 and KIP-497 were written for."""

from __future__ import annotations

import pytest

from trio_broker.replication.leader import AckState, LeaderPartition, NotAReplica
from trio_broker.replication.truncation import TruncationStep, plan_truncation
from trio_broker.state.mute import StateMachineError
from trio_broker.storage.epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochOrderViolation,
    LeaderEpochCache,
    format_checkpoint,
    parse_checkpoint,
)


def cache_of(*entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache()
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_end_offsets_of_known_skipped_older_and_newer_epochs() -> None:
    cache = cache_of((1, 0), (3, 10), (5, 20))
    assert cache.end_offset_for(5, 25) == (5, 25)  # latest: the log end
    assert cache.end_offset_for(3, 25) == (3, 20)  # ends where epoch 5 starts
    assert cache.end_offset_for(4, 25) == (3, 20)  # skipped: the epoch below it
    assert cache.end_offset_for(0, 25) == (0, 0)  # older than all: first start offset
    assert cache.end_offset_for(6, 25) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 25) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert LeaderEpochCache().end_offset_for(1, 0) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_assign_keeps_order_and_drops_epochs_that_hold_no_record() -> None:
    cache = cache_of((1, 0), (2, 5))
    assert not cache.assign(2, 7)  # a later batch of the latest epoch
    with pytest.raises(EpochOrderViolation):
        cache.assign(1, 8)  # an older epoch after records of a newer one
    # Epoch 3 was begun at 9 by a leader that wrote nothing; as a follower it then
    # appends the new leader's epoch-2 records at 9: epoch 3 described no record.
    cache.assign(3, 9)
    cache.assign(2, 9)
    assert [(e.epoch, e.start_offset) for e in cache.entries] == [(1, 0), (2, 5)]


def test_truncation_from_either_end() -> None:
    cache = cache_of((1, 0), (2, 5), (4, 9))
    cache.truncate_from_end(9)
    assert cache.latest_epoch == 2
    cache.truncate_from_start(7)  # retention moved the log start into epoch 2
    assert [(e.epoch, e.start_offset) for e in cache.entries] == [(2, 7)]


def test_kip_101_follower_keeps_what_its_high_watermark_would_have_lost() -> None:
    # Follower B fetched offsets 0-1 of epoch 0 but its HW is only 1; leader A died and
    # B leads epoch 1... here B returns as follower of a leader whose epoch 0 also ends
    # at 2: B keeps offset 1 (truncating to its HW would have dropped it).
    follower = cache_of((0, 0))
    leader = cache_of((0, 0), (1, 2))
    answer = leader.end_offset_for(follower.latest_epoch, 3)
    assert answer == (0, 2)
    step = plan_truncation(follower, log_end_offset=2, high_watermark=1, leader_epoch=0,
                           leader_end_offset=2)  # fmt: skip
    assert step == TruncationStep(2, done=True)


def test_kip_279_divergent_epochs_take_two_rounds() -> None:
    # Follower: epoch 1 from 0, epoch 3 from 4. Leader: epoch 1 from 0, 2 from 3, 4 from 6.
    # Round 1 asks about 3 and hears (2, 6); the follower has no epoch 2, its epoch 1
    # ends at 4 -> cut to 4 and ask about 1. Round 2 hears (1, 3) -> cut to 3.
    follower = cache_of((1, 0), (3, 4))
    leader = cache_of((1, 0), (2, 3), (4, 6))
    first = plan_truncation(follower, 6, 0, *leader.end_offset_for(3, 8))
    assert first == TruncationStep(4, done=False, next_epoch=1)
    follower.truncate_from_end(4)
    second = plan_truncation(follower, 4, 0, *leader.end_offset_for(1, 8))
    assert second == TruncationStep(3, done=True)


def test_same_epoch_cuts_at_the_shorter_end() -> None:
    follower = cache_of((1, 0), (2, 4))  # wrote epoch 2 at 4-5, lost by the leader
    leader = cache_of((1, 0), (3, 3))
    step = plan_truncation(follower, 6, 0, *leader.end_offset_for(2, 8))
    assert step == TruncationStep(3, done=True)


def test_unknown_answer_falls_back_to_the_high_watermark() -> None:
    step = plan_truncation(cache_of((1, 0)), 9, 4, UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert step == TruncationStep(4, done=True)


def leader(**overrides: object) -> LeaderPartition:
    args: dict[str, object] = dict(
        broker_id=1, leader_epoch=3, replicas=(1, 2, 3), isr=frozenset({1, 2}),
        log_end_offset=10, high_watermark=10, now_ms=0, min_insync_replicas=2,
        replica_lag_time_max_ms=100,
    )  # fmt: skip
    args.update(overrides)
    return LeaderPartition.become_leader(**args)  # type: ignore[arg-type]


def test_high_watermark_waits_for_the_leaders_sync_and_every_isr_member() -> None:
    term = leader()
    term.leader_appended(12)
    assert term.ack_state(11) is AckState.WAITING
    term.follower_fetched(2, 12, now_ms=5)
    assert term.high_watermark == 10  # the leader has not synced offsets 10-11
    assert term.leader_synced(12)
    assert term.high_watermark == 12 and term.ack_state(11) is AckState.DONE
    term.follower_fetched(3, 4, now_ms=5)  # not in the ISR: does not hold the HW back
    assert term.high_watermark == 12


def test_a_joining_follower_counts_before_its_isr_change_is_stored() -> None:
    # KIP-497: while the change that adds broker 3 is pending, the HW must not pass it,
    # or broker 3 would join the stored ISR without a committed record.
    term = leader()
    _, proposal = term.follower_fetched(3, 10, now_ms=1)
    assert proposal is not None and proposal.isr == {1, 2, 3}
    term.leader_appended(11)
    term.follower_fetched(2, 11, now_ms=2)
    term.leader_synced(11)
    assert term.high_watermark == 10
    assert term.isr_stored(proposal) is False
    term.follower_fetched(3, 11, now_ms=3)
    assert term.high_watermark == 11 and term.isr == {1, 2, 3}


def test_a_follower_below_the_high_watermark_does_not_join() -> None:
    term = leader()
    assert term.follower_fetched(3, 9, now_ms=1) == (False, None)


def test_lagging_follower_is_proposed_for_removal_and_min_isr_holds_acks() -> None:
    term = leader()
    term.leader_appended(11)
    term.leader_synced(11)
    term.follower_fetched(2, 10, now_ms=50)  # behind since the term began at t=0
    assert term.check_lagging(now_ms=100) is None
    proposal = term.check_lagging(now_ms=101)
    assert proposal is not None and proposal.isr == {1}
    assert term.high_watermark == 10  # the pending removal still counts broker 2
    term.isr_stored(proposal)
    assert term.high_watermark == 11
    assert not term.can_accept_acks_all()  # NOT_ENOUGH_REPLICAS before an append
    assert term.ack_state(10) is AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def test_min_insync_above_the_replica_count_means_all_replicas() -> None:
    """Kafka's effective min ISR (3.7+): min(min.insync.replicas, replicas). A topic of one
    replica under a broker's min.insync.replicas=2 takes acks=all writes, instead of
    NOT_ENOUGH_REPLICAS forever; two replicas need both in the ISR."""
    alone = leader(replicas=(1,), isr=frozenset({1}), min_insync_replicas=2)
    assert alone.effective_min_insync_replicas == 1
    assert alone.can_accept_acks_all()
    alone.leader_appended(11)
    alone.leader_synced(11)
    assert alone.ack_state(10) is AckState.DONE
    pair = leader(replicas=(1, 2), isr=frozenset({1}), min_insync_replicas=3)
    assert pair.effective_min_insync_replicas == 2
    assert not pair.can_accept_acks_all()
    _, proposal = pair.follower_fetched(2, 10, now_ms=1)
    assert proposal is not None
    pair.isr_stored(proposal)
    assert pair.can_accept_acks_all()
    # Within the replica count the setting holds as it is.
    assert leader(min_insync_replicas=2).effective_min_insync_replicas == 2


def test_caught_up_at_the_previous_fetch_counts_as_caught_up_then() -> None:
    term = leader()
    term.follower_fetched(2, 10, now_ms=40)  # all there was at t=40
    term.leader_appended(15)
    term.follower_fetched(2, 10, now_ms=120)  # behind now, but had everything at t=40
    assert term.followers[2].last_caught_up_ms == 40
    assert term.check_lagging(now_ms=140) is None
    assert term.check_lagging(now_ms=141) is not None


def test_new_leader_hides_its_high_watermark_until_it_reaches_its_epoch_start() -> None:
    term = leader(high_watermark=7)  # its predecessor may have shown up to 10
    assert term.visible_high_watermark() is None  # ListOffsets: OFFSET_NOT_AVAILABLE
    term.follower_fetched(2, 10, now_ms=1)
    assert term.visible_high_watermark() == 10


def test_a_refused_isr_change_is_dropped_and_strangers_cannot_fetch() -> None:
    term = leader()
    proposal = term.check_lagging(now_ms=1000)
    assert proposal is not None
    term.isr_refused()
    assert term.pending is None and term.isr == {1, 2}
    with pytest.raises(NotAReplica):
        term.follower_fetched(9, 0, now_ms=1)


# Edges found by mutation testing (issue 31): the branches the KIP cases above do not
# reach, and the rule that a cut never goes past the follower's own log end.


def test_an_answer_without_an_epoch_cuts_at_the_leaders_offset_within_the_own_log() -> None:
    # OffsetForLeaderEpoch v0 answers an offset and no epoch: cut there, never past the
    # follower's own end.
    follower = cache_of((1, 0), (2, 4))
    assert plan_truncation(follower, 9, 2, UNDEFINED_EPOCH, 6) == TruncationStep(6, done=True)
    assert plan_truncation(follower, 5, 2, UNDEFINED_EPOCH, 6) == TruncationStep(5, done=True)


def test_a_follower_without_epochs_cuts_at_the_leaders_end_within_the_own_log() -> None:
    empty = LeaderEpochCache()
    assert plan_truncation(empty, 8, 0, 3, 5) == TruncationStep(5, done=True)
    assert plan_truncation(empty, 4, 0, 3, 5) == TruncationStep(4, done=True)


def test_an_older_epoch_both_hold_cuts_where_it_ends_here_not_at_the_log_end() -> None:
    # Follower: epoch 1 from 0, epoch 3 from 6 (it led epoch 3 and wrote 6-8 alone).
    # Leader: epoch 1 from 0, epoch 4 from 8. Asked about 3, the leader answers (1, 8);
    # the follower's epoch 1 ends at 6: offsets 6-8 are epoch 3's and must go.
    follower = cache_of((1, 0), (3, 6))
    leader = cache_of((1, 0), (4, 8))
    step = plan_truncation(follower, 9, 0, *leader.end_offset_for(3, 10))
    assert step == TruncationStep(6, done=True)


def epochs_of(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


def test_rebuilding_from_disk_keeps_epoch_0_and_lets_older_epochs_replace_newer() -> None:
    cache = LeaderEpochCache()
    cache.assign_from_log(-1, 0)  # a client's batch without an epoch counts for nothing
    cache.assign_from_log(0, 0)  # the first leader epoch is an epoch
    cache.assign_from_log(0, 3)
    cache.assign_from_log(2, 5)
    assert epochs_of(cache) == [(0, 0), (2, 5)]
    # On disk an older epoch follows at a later offset: the disk is the truth, epoch 2's
    # entry is contradicted and goes (the cache stays ordered).
    cache.assign_from_log(1, 7)
    assert epochs_of(cache) == [(0, 0), (1, 7)]
    # An epoch that begins where the previous one began held no record: replaced.
    cache.assign_from_log(3, 7)
    assert epochs_of(cache) == [(0, 0), (3, 7)]
    assert cache.end_offset_for(1, 9) == (0, 7)


def test_truncations_report_whether_the_checkpoint_must_be_rewritten() -> None:
    # The log rewrites leader-epoch-checkpoint only when a truncation says it changed.
    cache = cache_of((1, 0), (2, 5))
    assert not cache.truncate_from_end(7)
    assert cache.truncate_from_end(5)
    assert epochs_of(cache) == [(1, 0)]
    cache = cache_of((1, 0), (2, 5))
    assert not cache.truncate_from_start(0)
    assert cache.truncate_from_start(6)
    assert epochs_of(cache) == [(2, 6)]
    assert not cache.truncate_from_start(6)


def test_a_log_emptied_from_the_start_keeps_its_latest_epoch_at_the_start() -> None:
    # DeleteRecords up to the log end (start == end): as Kafka's truncateFromStart, the
    # last entry below the start is moved there, not dropped. The leader then answers
    # OffsetForLeaderEpoch for its latest epoch with its log end, and for an older one
    # with the start ("that data is gone"); an empty cache answered "no epoch", which
    # sent followers back to their high watermark.
    cache = cache_of((1, 0), (2, 5))
    assert cache.truncate_from_start(9)
    assert epochs_of(cache) == [(2, 9)]
    assert cache.end_offset_for(2, 9) == (2, 9)
    assert cache.end_offset_for(1, 9) == (1, 9)
    assert not cache.truncate_from_start(9)


def test_a_checkpoint_is_read_back_and_damage_is_refused() -> None:
    entries = cache_of((1, 0), (4, 7)).entries
    assert format_checkpoint(entries) == b"0\n2\n1 0\n4 7\n"
    parsed = parse_checkpoint(format_checkpoint(entries))
    assert parsed is not None and parsed.entries == entries
    # A repeated epoch, or fields not separated by exactly one space: damage.
    assert parse_checkpoint(b"0\n2\n1 0\n1 7\n") is None
    assert parse_checkpoint(b"0\n1\n1  0\n") is None
    assert parse_checkpoint(b"0\n1\n1\t0\n") is None


def test_a_term_refuses_a_leader_outside_the_isr_and_a_log_end_that_goes_back() -> None:
    # A broker outside the ISR may hold less than was committed: it must not lead.
    with pytest.raises(StateMachineError):
        LeaderPartition.become_leader(1, 3, (1, 2), frozenset({2}), 10, 10, 0)
    with pytest.raises(StateMachineError):
        LeaderPartition.become_leader(1, 3, (2, 3), frozenset({1, 2}), 10, 10, 0)
    term = leader()
    # The replica manager reports the log end on every refresh, moved or not.
    term.leader_appended(10)
    term.leader_appended(12)
    with pytest.raises(StateMachineError):
        term.leader_appended(11)
    assert term.log_end_offset == 12


# Lag edges found by mutation testing of leader.py (issue 31).


def test_a_term_begun_late_counts_lag_from_its_own_start() -> None:
    term = leader(now_ms=10_000)
    assert term.check_lagging(10_100) is None  # 100 ms since the term began: not yet
    assert term.check_lagging(10_101) is not None


def test_a_fetch_at_exactly_the_leader_end_is_caught_up_now() -> None:
    term = leader()  # log end 10, lag limit 100 ms
    term.follower_fetched(2, 10, now_ms=90)
    assert term.check_lagging(150) is None  # caught up at 90, not at the term's start
    assert term.check_lagging(191) is not None


def test_reaching_the_leader_end_of_the_previous_fetch_is_caught_up_then() -> None:
    """Kafka's rule: a follower that fetches from where the leader's log ended at its
    previous fetch held all the leader had then (at that previous fetch's time)."""
    term = leader()
    term.follower_fetched(2, 5, now_ms=60)  # the leader's end is 10 at this fetch
    term.leader_appended(15)
    term.follower_fetched(2, 10, now_ms=80)  # exactly that end: caught up as of 60
    assert term.check_lagging(150) is None
    assert term.check_lagging(161) is not None
