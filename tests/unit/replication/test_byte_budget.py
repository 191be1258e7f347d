"""The leader's replication throttle (replication/throttle.py): a byte budget refilled
at its rate, at most one second's worth, overdrawn at most by what a fetch read."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.replication.throttle import ByteBudget


def test_starts_with_a_seconds_worth_and_refills_at_the_rate() -> None:
    budget = ByteBudget(1000)
    assert budget.available(0) == 1000
    budget.take(1000, 0)
    assert budget.available(0) == 0
    assert budget.available(250) == 250
    budget.take(600, 250)  # one batch may overdraw it
    assert budget.available(250) == 0
    assert budget.available(600) == 0  # 350 ms refill 350 of the 350 owed
    assert budget.available(700) == 100
    assert budget.available(10_000) == 1000  # never more than a second's worth


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5000)), max_size=50))
def test_never_more_than_the_rate_allows_over_time(steps: list[tuple[int, int]]) -> None:
    """Bytes taken within the budget over any run <= one second's worth + rate x time."""
    budget, now, taken = ByteBudget(2000), 0, 0
    for advance, wanted in steps:
        now += advance
        allowed = budget.available(now)
        read = min(wanted, allowed)
        budget.take(read, now)
        taken += read
    assert taken <= 2000 + now * 2000 // 1000 + 1


def test_an_older_clock_reading_refills_nothing_twice() -> None:
    # Two fetches that read the clock before either reached the budget report out of
    # order: the late one's older time must not make the same milliseconds count again.
    budget = ByteBudget(1000)
    budget.take(1000, 0)
    assert budget.available(500) == 500
    budget.take(500, 500)
    assert budget.available(300) == 0  # an older reading: nothing new
    assert budget.available(500) == 0  # the same 500 ms were already counted
    assert budget.available(600) == 100
