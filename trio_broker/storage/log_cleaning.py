"""The cleaner's view of a log: which segments it may rewrite, and the swap.

Part of :class:`~trio_broker.storage.log.PartitionLog` (see ``log_state.py``); the
cleaning itself is :mod:`trio_broker.storage.cleaner`'s.

This module never imports trio.
"""

from __future__ import annotations

from trio_broker.storage.log_state import LogState
from trio_broker.storage.segment import Segment


class Cleaning(LogState):
    """The segments the cleaner may rewrite, and putting the cleaned one in their place."""

    def cleanable_segments(self) -> list[Segment]:
        """The oldest segments the cleaner may rewrite: sealed and fully synced, never the
        active one (a prefix of the log)."""
        cleanable: list[Segment] = []
        for segment in self._segments[:-1]:
            if not (segment.sealed and segment.fully_synced) or segment.deleted:
                break
            cleanable.append(segment)
        return cleanable

    def active_segment(self) -> Segment:
        return self._segments[-1]

    def replace_segments(self, group: list[Segment], cleaned: Segment, now_ms: int) -> bool:
        """Put ``cleaned`` where the consecutive segments ``group`` are (storage/cleaner.py).

        False (nothing changed) unless ``group`` is still in the log as it was. The old
        segments keep their descriptors for ``file.delete.delay.ms`` (in-flight sendfiles).
        """
        with self._lock:
            segments = self._segments
            try:
                k = next(i for i, s in enumerate(segments) if s is group[0])
            except StopIteration:
                return False
            if segments[k : k + len(group)] != group or k + len(group) >= len(segments):
                return False
            self._segments = [*segments[:k], cleaned, *segments[k + len(group) :]]
            delay = now_ms + self.config.file_delete_delay_ms
            for segment in group:
                segment.deleted = True
                self._retired.append((delay, segment))
        return True
