"""replication/fetcher_rules.py: the fetcher's decisions, directly (issue 31).

The replication machine and the simulator drive these through whole clusters; here each
rule is checked on its own over generated inputs.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.fetcher_rules import (
    AnswerAction,
    FetchPosition,
    OutOfRangeReset,
    ResetKind,
    answer_action,
    answer_applies,
    follower_log_start,
    out_of_range_reset,
    sync_before_fetch,
)

positions = st.builds(FetchPosition, st.integers(0, 3), st.integers(0, 3), st.integers(0, 5))


@given(positions, st.none() | positions)
def test_an_answer_is_taken_only_at_the_position_it_was_asked_from(
    sent: FetchPosition, now: FetchPosition | None
) -> None:
    assert answer_applies(sent, now) == (now == sent)


@given(positions)
def test_a_partition_that_leads_or_truncates_takes_no_answer(sent: FetchPosition) -> None:
    assert answer_applies(sent, None) is False
    assert answer_applies(sent, sent) is True


def test_what_each_error_means() -> None:
    for code in ErrorCode:
        expected = {
            ErrorCode.NONE: AnswerAction.APPEND,
            ErrorCode.OFFSET_OUT_OF_RANGE: AnswerAction.RESET,
        }.get(code, AnswerAction.WAIT)
        assert answer_action(code) is expected, code


def test_a_follower_below_its_leaders_log_start_starts_there() -> None:
    # DeleteRecords (or retention) on the leader up to 13 while the follower, ending at
    # 5, was away: nothing it holds is in the leader's log; it starts again at 13.
    assert out_of_range_reset(5, 13) == OutOfRangeReset(ResetKind.START_AT, 13)
    # Ending exactly at the leader's start, or above it: it agrees with the leader again
    # (OffsetForLeaderEpoch), which keeps the log or cuts it to the leader's end.
    assert out_of_range_reset(13, 13).kind is ResetKind.TRUNCATE
    assert out_of_range_reset(25, 13).kind is ResetKind.TRUNCATE


@given(st.integers(0, 30), st.integers(0, 30))
def test_after_a_reset_the_fetch_offset_is_in_the_leaders_log(
    log_end: int, leader_start: int
) -> None:
    # Truncating never moves the end up, so it must only be chosen where the end is at
    # or above the leader's start; starting at the leader's start is always in range.
    reset = out_of_range_reset(log_end, leader_start)
    if reset.kind is ResetKind.START_AT:
        assert reset.offset == leader_start > log_end
    else:
        assert log_end >= leader_start


def test_a_followers_log_start_follows_the_leaders_up_to_its_hw() -> None:
    assert follower_log_start(0, 13, 21) == 13  # DeleteRecords on the leader
    assert follower_log_start(0, 13, 13) == 13
    assert follower_log_start(0, 13, 12) is None  # not past this replica's HW
    assert follower_log_start(13, 13, 21) is None  # nothing to move
    assert follower_log_start(15, 13, 21) is None  # never back


@given(st.booleans(), st.integers(0, 10), st.integers(0, 10))
def test_the_log_is_synced_before_its_end_is_counted(
    sync: bool, durable: int, log_end: int
) -> None:
    # Whatever the fetch offset (the log end) counts is on disk once the rule was followed.
    durable_after = log_end if sync_before_fetch(sync, durable, log_end) else durable
    if sync:
        assert durable_after >= log_end
    else:
        assert not sync_before_fetch(sync, durable, log_end)  # page cache is enough
