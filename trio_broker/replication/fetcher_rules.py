"""A follower fetcher's decisions, pure: what to do with a fetch answer, when to sync.

``cluster/replica_fetcher.py`` performs them (sockets, logs, sleeps); the replication
machine (statemachine/) and the simulator drive the same functions, so a slip here is a
slip they can see.

- **Sync before counting**: the leader counts a fetch at offset X as "the follower holds
  everything below X", and by default that means on disk: what was fetched is synced
  before the next fetch is sent (:func:`sync_before_fetch`).
- **Stale answers are dropped**: an answer is taken only if the partition is still
  fetched from the same leader, in the same leader epoch, at the same offset as when the
  request left (:func:`answer_applies`); a leader change while the answer travelled (the
  follower truncated for the new leader, or leads now) makes it stale, as Kafka's
  fetcher drops answers whose partition fetch state changed.
- **Errors** (:func:`answer_action`): out of range means ask where the leader's log
  starts and reset to it (:func:`out_of_range_reset`); "the cluster moved on" errors (not
  leader, fenced, unknown epoch and the rest) wait for the next view change or a pause;
  no error: append and take the HW (``follower.high_watermark_after_fetch``).
- **Out of range** (:func:`out_of_range_reset`, after Kafka's fetchOffsetAndTruncate): a
  leader whose log starts above this replica's end (DeleteRecords or retention there
  while this replica was away) holds nothing this replica has and nothing between: the
  replica is emptied and starts at the leader's log start. Otherwise the replica agrees
  with the leader again (OffsetForLeaderEpoch), which cuts it to at most the leader's log
  end when that is below its own (after an unclean election) and keeps it otherwise.
  Kafka cuts straight to the leader's end there, and says that may leave the logs
  mismatched; the epochs do not. Truncating again alone never moves a log end up: a
  replica below its leader's log start stayed there for good.
- **The log start follows the leader's** (:func:`follower_log_start`): every fetch answer
  names the leader's log start, and a replica's moves up to it (up to its own HW), as
  Kafka's follower does: records deleted on the leader do not come back after a failover.
"""

from __future__ import annotations

import enum

import attrs

from trio_broker.protocol.error_codes import ErrorCode

__all__ = [
    "AnswerAction",
    "FetchPosition",
    "OutOfRangeReset",
    "ResetKind",
    "answer_action",
    "answer_applies",
    "follower_log_start",
    "out_of_range_reset",
    "sync_before_fetch",
]


@attrs.frozen
class FetchPosition:
    """Where a partition is fetched from: the leader, its epoch, the fetch offset."""

    leader: int
    leader_epoch: int
    fetch_offset: int


class AnswerAction(enum.Enum):
    APPEND = "append"  # take the records and the leader's HW
    RESET = "reset"  # out of range: ask where the leader's log starts (out_of_range_reset)
    WAIT = "wait"  # the cluster moved on: wait for the view to say who leads


def answer_applies(sent: FetchPosition, now: FetchPosition | None) -> bool:
    """Whether an answer to a fetch sent at ``sent`` may be taken; ``now`` is where the
    partition is fetched from when it arrives (None: it is not fetched any more, it
    leads or must truncate first)."""
    return now is not None and now == sent


def answer_action(error_code: int) -> AnswerAction:
    if error_code == ErrorCode.NONE:
        return AnswerAction.APPEND
    if error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
        return AnswerAction.RESET
    return AnswerAction.WAIT


class ResetKind(enum.Enum):
    TRUNCATE = "truncate"  # agree with the leader again (OffsetForLeaderEpoch)
    START_AT = "start_at"  # empty the log; it starts (and ends) at the offset


@attrs.frozen
class OutOfRangeReset:
    kind: ResetKind
    #: START_AT: the leader's log start, where the emptied log begins.
    offset: int


def out_of_range_reset(log_end_offset: int, leader_log_start: int) -> OutOfRangeReset:
    """After OFFSET_OUT_OF_RANGE: what to do with this replica's log, given where the
    leader's log starts now (ListOffsets, earliest)."""
    if leader_log_start > log_end_offset:
        return OutOfRangeReset(ResetKind.START_AT, leader_log_start)
    return OutOfRangeReset(ResetKind.TRUNCATE, log_end_offset)


def follower_log_start(log_start: int, leader_log_start: int, high_watermark: int) -> int | None:
    """Where this replica's log start moves after a fetch answer naming the leader's
    (DeleteRecords or retention there), or None: it stays. As Kafka's follower, which
    moves it on every fetch, so that a failover does not bring deleted records back;
    never past the HW kept here (a replica below the leader's start resets instead)."""
    if log_start < leader_log_start <= high_watermark:
        return leader_log_start
    return None


def sync_before_fetch(
    sync_before_counting: bool, durable_end_offset: int, log_end_offset: int
) -> bool:
    """Whether to sync the log before fetching at its end: the fetch offset tells the
    leader what this replica holds, which counts towards acks=all (unless
    acks.all.fsync=false: then page cache is enough)."""
    return sync_before_counting and durable_end_offset < log_end_offset
