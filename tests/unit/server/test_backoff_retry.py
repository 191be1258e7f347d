"""server/backoff.py: a failed background job is tried again on a timer, the wait
doubling after each failure up to its maximum; an exception counts as a failure (and
does not end the job); the job ends at its first success."""

from __future__ import annotations

import trio
import trio.testing

from trio_broker.server.backoff import retry_with_backoff


async def test_the_waits_double_up_to_the_maximum_and_a_success_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started = trio.current_time()
    tried_at: list[float] = []

    async def attempt() -> bool:
        tried_at.append(trio.current_time() - started)
        if len(tried_at) == 3:
            raise OSError("a peer went away")  # a failure like the others
        return len(tried_at) == 6

    attempts = await retry_with_backoff(attempt, first_s=1.0, max_s=5.0, what="a job")
    assert attempts == 6
    # Waits of 1, 2, 4, then 5 (the maximum) twice.
    assert tried_at == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0]


async def test_a_job_done_at_once_is_tried_once(autojump_clock: trio.testing.MockClock) -> None:
    async def attempt() -> bool:
        return True

    assert await retry_with_backoff(attempt, first_s=1.0, max_s=5.0, what="a job") == 1
