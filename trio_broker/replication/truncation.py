"""Where a follower cuts its log after a leader change (KIP-279's rounds).

The follower asks the leader, with OffsetForLeaderEpoch, where the follower's latest
epoch ends in the leader's log, and compares the answer with its own cache:

- the leader knows no end offset: fall back to the follower's high watermark;
- the follower has no epoch at or below the leader's answer: cut at the leader's offset;
- the leader answered with an older epoch than the follower has at that point: cut where
  that older epoch ends here, and ask again with it (another round);
- otherwise both agree on the epoch: cut at the smaller of the two end offsets.

The cut never goes past the follower's own log end. Pure: the caller performs the cut
(log and epoch cache) and sends the next request.
"""

from __future__ import annotations

import attrs

from trio_broker.storage.epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    LeaderEpochCache,
)

__all__ = ["TruncationStep", "plan_truncation"]


@attrs.frozen
class TruncationStep:
    #: Cut the log so that it ends here (a no-op when it already ends here or before).
    truncate_to: int
    #: True: start fetching at ``truncate_to``. False: ask the leader again about
    #: ``next_epoch``, the follower's latest epoch after the cut.
    done: bool
    next_epoch: int = UNDEFINED_EPOCH


def plan_truncation(
    cache: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    leader_epoch: int,
    leader_end_offset: int,
) -> TruncationStep:
    """One round: the leader answered (``leader_epoch``, ``leader_end_offset``)."""
    if leader_end_offset == UNDEFINED_OFFSET:
        return TruncationStep(min(high_watermark, log_end_offset), done=True)
    if leader_epoch == UNDEFINED_EPOCH:
        return TruncationStep(min(leader_end_offset, log_end_offset), done=True)
    own_epoch, own_end = cache.end_offset_for(leader_epoch, log_end_offset)
    if own_end == UNDEFINED_OFFSET:
        return TruncationStep(min(leader_end_offset, log_end_offset), done=True)
    if own_epoch != leader_epoch:
        return TruncationStep(min(own_end, log_end_offset), done=False, next_epoch=own_epoch)
    return TruncationStep(min(leader_end_offset, own_end, log_end_offset), done=True)
