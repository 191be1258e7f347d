"""The leader-epoch cache of one partition replica (KIP-101, KIP-279).

Every record batch carries the epoch of the leader that wrote it. The cache keeps, per
epoch, the first offset written in it, so that a replica can answer "where does epoch
E end in your log?" (OffsetForLeaderEpoch) without scanning the log. A follower that
returns after a leader change uses the answer to cut off the tail that the new leader
does not have, instead of trusting its high watermark (which lost data in KIP-101's
examples).
"""

from __future__ import annotations

import bisect

import attrs

from trio_broker.state.mute import StateMachineError

__all__ = [
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "EpochEntry",
    "EpochOrderViolation",
    "LeaderEpochCache",
]

#: Kafka's "no epoch" and "no offset" in OffsetForLeaderEpoch answers.
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class EpochOrderViolation(StateMachineError):
    """An epoch was assigned out of order: a bug in whoever appends to the log."""


@attrs.frozen
class EpochEntry:
    epoch: int
    start_offset: int


@attrs.define(eq=False)
class LeaderEpochCache:
    """Epoch -> start offset, in increasing order of both."""

    # Invariant: epochs strictly increase and start offsets never decrease along the list.
    _entries: list[EpochEntry] = attrs.field(factory=list)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Note that ``epoch`` begins at ``start_offset``; True if that is news.

        Called by a leader when its term begins (at its log end) and for every appended
        batch. A batch of the latest epoch changes nothing. Entries that start at or
        after ``start_offset`` describe no record any more (an epoch a leader began
        and never wrote in, then overwritten as a follower): they are dropped. An older
        epoch after records of a newer one is refused: appends come in log order.
        """
        if epoch < 0:
            raise EpochOrderViolation(f"epoch {epoch} is not a leader epoch")
        while self._entries and self._entries[-1].start_offset >= start_offset:
            if self._entries[-1].epoch == epoch:
                return False
            self._entries.pop()
        if self._entries:
            latest = self._entries[-1]
            if epoch == latest.epoch:
                return False
            if epoch < latest.epoch:
                raise EpochOrderViolation(
                    f"epoch {epoch} at offset {start_offset} after epoch {latest.epoch} "
                    f"at offset {latest.start_offset}"
                )
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch: where ``requested_epoch`` ends here.

        - the latest epoch ends at the log end;
        - an older epoch this log has ends where the next epoch starts;
        - an epoch this log skipped is answered with the largest epoch below it, ending
          where the next epoch starts (the asker then truncates there);
        - an epoch older than all we have answers the requested epoch with the first
          start offset (that data is gone from this log);
        - an unknown or newer epoch, or an empty cache: (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._entries[-1].epoch:
            return requested_epoch, log_end_offset
        epochs = [entry.epoch for entry in self._entries]
        higher = bisect.bisect_right(epochs, requested_epoch)  # first epoch > requested
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        next_start = self._entries[higher].start_offset
        if higher == 0:
            return requested_epoch, next_start
        return self._entries[higher - 1].epoch, next_start

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to end at ``end_offset``: forget epochs that start there or later."""
        while self._entries and self._entries[-1].start_offset >= end_offset:
            self._entries.pop()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: the epoch holding it starts there."""
        keep = [entry for entry in self._entries if entry.start_offset >= start_offset]
        older = [entry for entry in self._entries if entry.start_offset < start_offset]
        if older and not (keep and keep[0].start_offset == start_offset):
            keep.insert(0, EpochEntry(older[-1].epoch, start_offset))
        self._entries = keep
