"""Bugs planted on purpose, to show that the simulation can fail (tests/sim).

Each is a context manager that patches one rule of the broker for the length of a run
(:func:`_patched`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from trio_broker.cluster import replica_fetcher
from trio_broker.partition import read as partition_read
from trio_broker.replication.leader import LeaderPartition
from trio_broker.replication.truncation import TruncationStep
from trio_broker.storage.epoch_cache import LeaderEpochCache
from trio_broker.storage.memory import MemoryLog

__all__ = ["PLANTED_BUGS"]


@contextmanager
def _patched(owner: object, name: str, replacement: object) -> Iterator[None]:
    """``owner.name`` is ``replacement`` for the length of the block."""
    saved = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def truncate_to_high_watermark() -> AbstractContextManager[None]:
    """KIP-101's bug: a follower whose leader changed cuts its log at its own HW, not
    where the leader's epoch ends (Kafka before 0.11). Its HW lags the leader's by a
    fetch, so it drops committed records; if it then leads, they are gone."""

    def plan(cache: Any, log_end: int, hw: int, epoch: int, end: int) -> TruncationStep:
        return TruncationStep(min(hw, log_end), done=True)

    return _patched(replica_fetcher, "plan_truncation", plan)


def high_watermark_ignores_followers() -> AbstractContextManager[None]:
    """The leader moves its HW to its own synced end, as if the ISR were itself alone:
    acks=all is answered before any follower has the write."""

    def advance(self: LeaderPartition) -> bool:
        if self.durable_end_offset > self.high_watermark:
            self.high_watermark = self.durable_end_offset
            return True
        return False

    return _patched(LeaderPartition, "_advance_high_watermark", advance)


def consumers_read_past_the_high_watermark() -> AbstractContextManager[None]:
    """A leader serves consumers up to its log end, as it serves followers: a consumer
    is shown records no follower holds yet, which a failover then takes back."""

    def readable_end(
        isolation: partition_read.Isolation,
        log_end_offset: int,
        high_watermark: int,
        last_stable_offset: int,
    ) -> int:
        return log_end_offset

    return _patched(partition_read, "readable_end", readable_end)


def follower_forgets_epoch_starts() -> AbstractContextManager[None]:
    """A follower stores its leader's batches without recording in its leader epoch
    cache where their epochs start: its OffsetForLeaderEpoch answers, and its own
    truncation when a leader changes, then go by epochs its log does not have."""
    saved = MemoryLog.append_replicated

    def append_replicated(
        self: MemoryLog, batch: bytes | bytearray | memoryview, *, now_ms: int
    ) -> Any:
        entries = list(self.epoch_cache.entries)
        result = saved(self, batch, now_ms=now_ms)
        self.epoch_cache = LeaderEpochCache(entries)
        return result

    return _patched(MemoryLog, "append_replicated", append_replicated)


def epoch_ends_where_it_starts() -> AbstractContextManager[None]:
    """OffsetForLeaderEpoch answers an older epoch with where that epoch starts, not
    where the next one does (an off-by-one in the leader's epoch cache): a follower
    asking after a leader change cuts its log short, below records already committed."""
    saved = LeaderEpochCache.end_offset_for

    def end_offset_for(
        self: LeaderEpochCache, requested_epoch: int, log_end_offset: int
    ) -> tuple[int, int]:
        epoch, end = saved(self, requested_epoch, log_end_offset)
        if end < 0 or requested_epoch == self.latest_epoch:
            return epoch, end
        starts = [e.start_offset for e in self.entries if e.epoch <= requested_epoch]
        return epoch, starts[-1] if starts else end

    return _patched(LeaderEpochCache, "end_offset_for", end_offset_for)


PLANTED_BUGS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "truncate-to-hw": truncate_to_high_watermark,
    "hw-ignores-followers": high_watermark_ignores_followers,
    "consumers-past-hw": consumers_read_past_the_high_watermark,
    "follower-forgets-epochs": follower_forgets_epoch_starts,
    "epoch-ends-at-its-start": epoch_ends_where_it_starts,
}
