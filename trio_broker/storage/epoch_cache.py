"""The leader-epoch cache of one partition replica (KIP-101, KIP-279), and its file format.

Every record batch carries the epoch of the leader that wrote it. The cache keeps, per
epoch, the first offset written in it, so that a replica can answer "where does epoch
E end in your log?" (OffsetForLeaderEpoch) without scanning the log. A follower that
returns after a leader change uses the answer to cut off the tail that the new leader
does not have, instead of trusting its high watermark (which lost data in KIP-101's
examples).

Pure: :class:`~trio_broker.storage.log.PartitionLog` keeps one per partition, persists
it as ``leader-epoch-checkpoint`` (:func:`format_checkpoint`, :func:`parse_checkpoint`)
and rebuilds it from the batch headers when that file is unreadable. It lives in
``storage`` because the log maintains it on every append and truncation; the
replication rules (``trio_broker.replication``, a layer above) read it from there.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterable

import attrs

from trio_broker.protocol.batch_header import LEADER_EPOCH_AT
from trio_broker.storage.errors import LogError

__all__ = [
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "EpochEntry",
    "EpochOrderViolation",
    "LeaderEpochCache",
    "batch_leader_epoch",
    "format_checkpoint",
    "parse_checkpoint",
    "set_batch_leader_epoch",
]

#: Kafka's "no epoch" and "no offset" in OffsetForLeaderEpoch answers.
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

#: The first line of a ``leader-epoch-checkpoint`` file (Kafka's format version).
CHECKPOINT_VERSION = 0

# partitionLeaderEpoch of a batch header (int32, outside the CRC: stamping it needs no
# CRC recompute). protocol.batch_header places the field; storage alone reads it.
_EPOCH_FIELD = struct.Struct(">i")


def batch_leader_epoch(batch: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The partitionLeaderEpoch of the batch header at ``batch[pos:]`` (-1: none)."""
    return int(_EPOCH_FIELD.unpack_from(batch, pos + LEADER_EPOCH_AT)[0])


def set_batch_leader_epoch(batch: bytearray | memoryview, epoch: int) -> None:
    _EPOCH_FIELD.pack_into(batch, LEADER_EPOCH_AT, epoch)


class EpochOrderViolation(LogError):
    """An epoch was assigned out of order: a bug in whoever appends to the log.

    (A leader whose batches go back in epoch, or a follower that did not truncate
    before fetching from a new leader.)
    """


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

    def _plan_assign(self, epoch: int, start_offset: int) -> tuple[int, bool]:
        """(entries ``assign`` keeps, whether it appends one) - raising EpochOrderViolation
        where ``assign`` would, and changing nothing."""
        if epoch < 0:
            raise EpochOrderViolation(f"epoch {epoch} is not a leader epoch")
        entries = self._entries
        kept = len(entries)
        while kept and entries[kept - 1].start_offset >= start_offset:
            if entries[kept - 1].epoch == epoch:
                return kept, False
            kept -= 1
        if kept:
            latest = entries[kept - 1]
            if epoch == latest.epoch:
                return kept, False
            if epoch < latest.epoch:
                raise EpochOrderViolation(
                    f"epoch {epoch} at offset {start_offset} after epoch {latest.epoch} "
                    f"at offset {latest.start_offset}"
                )
        return kept, True

    def check_assign(self, epoch: int, start_offset: int) -> bool:
        """Whether :meth:`assign` would change the cache; raises where it would, changing nothing."""
        kept, append = self._plan_assign(epoch, start_offset)
        return append or kept != len(self._entries)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Note that ``epoch`` begins at ``start_offset``; True if the cache changed.

        Called by a leader when its term begins (at its log end) and for every appended
        batch. A batch of the latest epoch changes nothing. Entries that start at or
        after ``start_offset`` describe no record any more (an epoch a leader began
        and never wrote in, then overwritten as a follower): they are dropped. An older
        epoch after records of a newer one is refused: appends come in log order.
        """
        kept, append = self._plan_assign(epoch, start_offset)
        changed = append or kept != len(self._entries)
        del self._entries[kept:]
        if append:
            self._entries.append(EpochEntry(epoch, start_offset))
        return changed

    def assign_from_log(self, epoch: int, start_offset: int) -> bool:
        """Rebuilding from batches found on disk: like ``assign``, but never refuses.

        Batches without an epoch (-1, as clients send them) count for nothing. An epoch
        below the latest replaces the entries it contradicts (epoch >= it or starting at
        or after it), as Kafka's cache does: what is on disk is the truth here.
        """
        if epoch < 0:
            return False
        entries = self._entries
        if entries and entries[-1].epoch == epoch and entries[-1].start_offset <= start_offset:
            return False
        while entries and (entries[-1].epoch >= epoch or entries[-1].start_offset >= start_offset):
            entries.pop()
        entries.append(EpochEntry(epoch, start_offset))
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

    def truncate_from_end(self, end_offset: int) -> bool:
        """The log was cut to end at ``end_offset``: forget epochs that start there or later.

        True if anything was forgotten.
        """
        before = len(self._entries)
        while self._entries and self._entries[-1].start_offset >= end_offset:
            self._entries.pop()
        return len(self._entries) != before

    def clear(self) -> bool:
        """Forget every epoch (the log was emptied); True if there was one."""
        changed = bool(self._entries)
        self._entries = []
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset``: the epoch holding it starts there.

        The last entry below the start is moved up to it even when the log is left
        empty (start == end), as Kafka's truncateFromStart: the leader then still knows
        its latest epoch and answers OffsetForLeaderEpoch with its log end, instead of
        "no epoch" (which sends a follower back to its high watermark). True if the
        entries changed.
        """
        keep = [entry for entry in self._entries if entry.start_offset >= start_offset]
        older = [entry for entry in self._entries if entry.start_offset < start_offset]
        if older and not (keep and keep[0].start_offset == start_offset):
            keep.insert(0, EpochEntry(older[-1].epoch, start_offset))
        changed = keep != self._entries
        self._entries = keep
        return changed


def format_checkpoint(entries: Iterable[EpochEntry]) -> bytes:
    """Kafka's ``leader-epoch-checkpoint`` text: version line, count line, ``epoch offset`` lines."""
    listed = list(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(listed))]
    lines += [f"{entry.epoch} {entry.start_offset}" for entry in listed]
    return ("\n".join(lines) + "\n").encode("ascii")


def parse_checkpoint(data: bytes) -> LeaderEpochCache | None:
    """The cache a checkpoint file holds, or None when the file is not one we wrote.

    Strict: a wrong version, a count that does not match the lines, a malformed line
    or entries out of order all mean damage, and the caller rebuilds the cache from
    the log instead of guessing.
    """
    try:
        lines = data.decode("ascii").splitlines()
        if len(lines) < 2 or int(lines[0]) != CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        body = lines[2:]
        if count != len(body):
            return None
        entries = []
        for line in body:
            fields = line.split(" ")
            if len(fields) != 2:
                return None
            entries.append(EpochEntry(int(fields[0]), int(fields[1])))
    except ValueError:  # UnicodeDecodeError included
        return None
    for entry in entries:
        if entry.epoch < 0 or entry.start_offset < 0:
            return None
    for a, b in itertools.pairwise(entries):
        if not (a.epoch < b.epoch and a.start_offset <= b.start_offset):
            return None
    return LeaderEpochCache(entries)
