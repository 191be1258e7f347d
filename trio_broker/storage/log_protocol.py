"""``Log``: what the broker asks of a partition log, whichever backend stores it.

:class:`~trio_broker.storage.log.PartitionLog` (``--storage file``) and
:class:`~trio_broker.storage.memory.MemoryLog` (``--storage memory``, and the storage
tests' reference model) both implement it; the assignments at the end of this module
make mypy prove that. Everything outside storage holds a log as ``Log``.

What only the disk log has stays off the protocol, and its few users narrow with
``isinstance(log, PartitionLog)``: its directory, going offline after a disk error and
coming back (``take_offline``, ``reload``, ``adopt``: the flusher), and the cleaner's
view of its segments (``cleanable_segments``, ``replace_segments``, ``cleaning_lock``).
A memory log never fails a flush, so it has nothing to recover from.

This module never imports trio.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from trio_broker.storage.epoch_cache import LeaderEpochCache
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_types import AppendResult, LogConfig
from trio_broker.storage.memory import MemoryLog


class Region(Protocol):
    """Stored bytes a read returns: a file range to sendfile, or bytes in memory."""

    @property
    def length(self) -> int: ...

    def read_bytes(self) -> bytes: ...


class Log(Protocol):
    """One partition's log: offsets, appends (leader and follower), reads, durability,
    retention, truncation and closing. Appends and reads belong to the event loop's
    thread; ``flush``, ``apply_retention``, ``delete_records`` and ``truncate_to`` may
    run in a worker thread (docs/storage.md)."""

    #: The topic's log settings; replaced whole when its configs change.
    config: LogConfig

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        ...

    @property
    def durable_end_offset(self) -> int:
        """Every offset below it is on stable storage (moves on ``flush``)."""
        ...

    @property
    def offline(self) -> bool:
        """A disk error stopped the log taking appends (never for a memory log)."""
        ...

    @property
    def epoch_cache(self) -> LeaderEpochCache: ...

    @property
    def closed(self) -> bool: ...

    @property
    def size_bytes(self) -> int: ...

    # -- appends
    def append(
        self,
        batch: bytearray | memoryview,
        *,
        now_ms: int,
        log_append_time: bool = False,
        leader_epoch: int | None = None,
    ) -> AppendResult:
        """Assign the next offsets to ``batch`` (rewritten in place) and store it."""
        ...

    def append_replicated(
        self, batch: bytes | bytearray | memoryview, *, now_ms: int
    ) -> AppendResult:
        """Store a leader's batch unchanged, at the offsets it carries."""
        ...

    def append_replicated_batches(
        self, records: bytes | bytearray | memoryview, *, now_ms: int
    ) -> list[AppendResult]:
        """Every whole batch of a fetch response's records, all checked before any is stored."""
        ...

    def begin_epoch(self, epoch: int) -> bool:
        """A leader's term begins at the log end; False if the cache already had it."""
        ...

    def roll(self, now_ms: int | None = None) -> None: ...

    # -- reads
    def read(
        self, start_offset: int, max_bytes: int, max_offset: int, *, min_one: bool = True
    ) -> Sequence[Region]:
        """Whole batches from the one holding ``start_offset``, below ``max_offset``."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None: ...

    def iter_batch_headers(
        self, from_offset: int | None = None
    ) -> Iterator[tuple[int, memoryview]]: ...

    def last_batches(self, n: int) -> list[tuple[int, bytes]]: ...

    # -- durability, retention, truncation
    def flush(self) -> int:
        """Make everything appended durable; the new ``durable_end_offset``."""
        ...

    def apply_retention(self, now_ms: int, high_watermark: int | None = None) -> int: ...

    def delete_records(self, before_offset: int) -> int: ...

    def truncate_to(self, offset: int) -> int: ...

    def truncate_fully_and_start_at(self, offset: int) -> None: ...

    # -- lifecycle
    def close(self) -> None: ...

    def abort(self) -> None: ...

    def segment_base_offsets(self) -> list[int]: ...


# mypy checks both backends against the protocol here (a missing or mismatched member
# is an error on these lines); at run time they are two harmless assignments.
_FILE_BACKEND: type[Log] = PartitionLog
_MEMORY_BACKEND: type[Log] = MemoryLog
