"""A follower's high watermark, pure.

A follower learns the HW from the leader's fetch answers. It shows consumers (and its
log cleaner trusts) only records below its own HW, so the HW it keeps must be

- at most its own log end: the leader's HW may be ahead of what this replica has fetched
  yet, and records it does not hold cannot be committed *here* (after a failover it
  would show records it lacks as committed);
- never lower than before: a fetch answer from a leader that has not caught its own HW
  up (a new leader, KIP-207) does not take back what was shown.

After a truncation the log end may be below the HW kept so far: it is cut to the log end
(:func:`high_watermark_after_truncation`), the one place the HW goes back, as in Kafka.
"""

from __future__ import annotations

__all__ = ["high_watermark_after_fetch", "high_watermark_after_truncation"]


def high_watermark_after_fetch(
    current: int, leader_high_watermark: int, log_end_offset: int
) -> int:
    """The HW once a fetch answer (``leader_high_watermark``) is appended, the log now
    ending at ``log_end_offset``."""
    return max(current, min(leader_high_watermark, log_end_offset))


def high_watermark_after_truncation(current: int, log_end_offset: int) -> int:
    return min(current, log_end_offset)
