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
    answer_action,
    answer_applies,
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
            ErrorCode.OFFSET_OUT_OF_RANGE: AnswerAction.TRUNCATE,
        }.get(code, AnswerAction.WAIT)
        assert answer_action(code) is expected, code


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
