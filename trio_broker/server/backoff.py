"""Trying a background job again after a failure, on a timer with exponential backoff.

For jobs that nothing else would retry soon enough: the deletion of a deleted topic's
share state (server/broker.py) was tried again only at the next change of the
cluster's topics, which may never come.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("trio_broker")


async def retry_with_backoff(
    attempt: Callable[[], Awaitable[bool]], *, first_s: float, max_s: float, what: str
) -> int:
    """Await ``attempt()`` until it answers True (done, or nothing left to do); after
    each False (or exception, logged) wait ``first_s``, doubled after each further
    failure up to ``max_s``. The number of attempts made. Cancelled with its nursery."""
    delay = first_s
    attempts = 0
    while True:
        attempts += 1
        try:
            done = await attempt()
        except Exception:  # a background job: never the nursery's end
            log.exception("%s failed (attempt %d)", what, attempts)
            done = False
        if done:
            return attempts
        log.info("%s: trying again in %.1f s", what, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, max_s)
