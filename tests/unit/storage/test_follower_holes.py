"""A follower copies a compacted leader: offset holes in fetched data (docs/compaction.md).

The leader's cleaner drops whole batches, so a fetch answer's first batch may start past
the follower's log end. The follower stores it there, and every other part of storage
(recovery, the indexes, truncation, the epoch cache, producer-state rebuilds, reads)
must treat the hole as the leader's log does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.storage import test_follower_storage as follower_storage
from tests.unit.storage.test_cleaner import read_all as records_of
from tests.unit.storage.test_follower_storage import (
    SMALL,
    bases_and_ends,
    epochs_of,
    fetched,
    read_all,
)
from trio_broker.protocol import batch_header
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.records import Record, build_batch
from trio_broker.storage.cleaner import clean_log
from trio_broker.storage.errors import UnexpectedAppendOffset
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.memory import MemoryLog
from trio_broker.storage.swap import REPLICA_GAPS_CHECKPOINT, read_replica_gaps_checkpoint

T0 = 1_700_000_000_000
COMPACT = LogConfig(
    segment_bytes=600,
    index_interval_bytes=64,
    retention_ms=None,
    compact=True,
    delete=False,
    min_cleanable_dirty_ratio=0.0,
)

AnyLog = PartitionLog | MemoryLog
#: A disk log and a memory log, each test run on both.
make_log = follower_storage.make_log


def reopen_after_crash(log: PartitionLog) -> PartitionLog:
    """What kill -9 leaves (no clean-shutdown marker: recovery scans), opened again."""
    log.flush()
    log.abort()
    return PartitionLog.open(log.directory, log.config)


# ---------------------------------------------------------------- appends and reads


def test_a_batch_past_the_log_end_is_stored_at_its_own_offset(make_log) -> None:
    log = make_log()
    log.append_replicated(fetched(0, 1), now_ms=5)
    result = log.append_replicated(fetched(10, 1), now_ms=5)  # [2, 10) was cleaned away
    assert (result.base_offset, result.last_offset) == (10, 11)
    assert log.log_end_offset == 12
    assert bases_and_ends(read_all(log)) == [(0, 2), (10, 12)]
    # A fetch from inside the hole starts at the next batch, as on the leader.
    for start in range(2, 11):
        first = log.read(start, 1 << 20, 12)[0].read_bytes()
        assert batch_header.base_offset_and_size(first)[0] == 10
    # Overlaps and batches going backwards are still refused, and change nothing.
    for base in (0, 5, 11):
        with pytest.raises(UnexpectedAppendOffset):
            log.append_replicated(fetched(base, 1), now_ms=5)
    assert log.log_end_offset == 12 and not log.offline
    # Producer state is rebuilt from headers: they read through the hole.
    assert [base for base, _ in log.iter_batch_headers()] == [0, 10]
    assert [base for base, _ in log.last_batches(5)] == [0, 10]


def test_a_fetch_answer_with_holes_records_epochs_at_their_batches(make_log) -> None:
    log = make_log()
    blob = fetched(0, 1) + fetched(4, 1) + fetched(9, 2, records=3) + fetched(20, 3)
    results = log.append_replicated_batches(blob, now_ms=5)
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 1), (4, 5), (9, 11), (20, 21)]
    assert read_all(log) == blob
    # Epoch 2 starts at the first offset this log has of it, as a Kafka follower records it.
    assert epochs_of(log) == [(1, 0), (2, 9), (3, 20)]
    # OffsetForLeaderEpoch from this replica: epoch 1 ends where epoch 2's data starts.
    assert log.epoch_cache.end_offset_for(1, log.log_end_offset) == (1, 9)
    assert log.epoch_cache.end_offset_for(3, log.log_end_offset) == (3, 22)


# ---------------------------------------------------------------- truncation


def test_truncate_into_a_hole_ends_the_log_there(make_log) -> None:
    log = make_log()
    log.append_replicated_batches(fetched(0, 1) + fetched(10, 2) + fetched(12, 2), now_ms=5)
    assert log.truncate_to(11) == 10  # inside a batch: it goes whole
    assert log.truncate_to(5) == 5  # in the hole: nothing after it stays
    assert bases_and_ends(read_all(log)) == [(0, 2)]
    assert epochs_of(log) == [(1, 0)]
    # The new leader's data may fill the rest of the hole.
    log.append_replicated(fetched(5, 3), now_ms=5)
    assert bases_and_ends(read_all(log)) == [(0, 2), (5, 7)]
    assert epochs_of(log) == [(1, 0), (3, 5)]


def test_truncate_into_a_hole_before_a_segment_named_after_its_batch(make_log) -> None:
    log = make_log()
    for base in range(0, 12, 2):
        log.append_replicated(fetched(base, 1, records=2), now_ms=5)
    full = log.segment_base_offsets()
    # The segment the next batch rolls into is named after it, past the hole.
    log.append_replicated(fetched(40, 1, records=2), now_ms=5)
    log.append_replicated(fetched(42, 1, records=2), now_ms=5)
    if len(log.segment_base_offsets()) == len(full):
        pytest.skip("no roll at the hole with this segment size")  # pragma: no cover
    assert 40 in log.segment_base_offsets()
    assert log.truncate_to(30) == 30
    assert log.segment_base_offsets() == full
    assert bases_and_ends(read_all(log))[-1] == (10, 12)
    log.append_replicated(fetched(30, 2), now_ms=5)
    assert bases_and_ends(read_all(log))[-2:] == [(10, 12), (30, 32)]


def test_truncate_into_a_hole_survives_a_crash(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "f", SMALL)
    log.append_replicated_batches(fetched(0, 1) + fetched(10, 2) + fetched(12, 2), now_ms=5)
    log.truncate_to(5)
    log.append_replicated(fetched(7, 3), now_ms=5)
    reopened = reopen_after_crash(log)
    try:
        assert bases_and_ends(read_all(reopened)) == [(0, 2), (7, 9)]
        assert reopened.log_end_offset == 9
        assert epochs_of(reopened) == [(1, 0), (3, 7)]
    finally:
        reopened.abort()


# ---------------------------------------------------------------- recovery


def test_recovery_keeps_batches_after_holes_and_the_checkpoint_is_what_allows_it(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "f", SMALL)
    bases = [0, 2, 9, 11, 30, 31, 60, 62, 64, 90]
    for base in bases:
        log.append_replicated(fetched(base, 1, records=1 if base in (30, 90) else 2), now_ms=5)
    before = read_all(log)
    segments = log.segment_base_offsets()
    assert len(segments) > 2
    assert read_replica_gaps_checkpoint(log.directory) == 90
    reopened = reopen_after_crash(log)
    assert read_all(reopened) == before
    assert reopened.segment_base_offsets() == segments
    assert reopened.log_end_offset == 91
    assert [b for b, _ in reopened.iter_batch_headers()] == bases
    for start in range(91):  # rebuilt indexes find every batch, holes or not
        got = batch_header.base_offset_and_size(reopened.read(start, 1, 91)[0].read_bytes())[0]
        assert got == min(b for b in bases if b + (0 if b in (30, 90) else 1) >= start)
    # Without the checkpoint the active segment (the one recovery scans) reads as
    # damaged at its hole [66, 90): the batch at 90 would be cut away.
    reopened.flush()
    reopened.abort()
    (tmp_path / "f" / REPLICA_GAPS_CHECKPOINT).unlink()
    damaged = PartitionLog.open(tmp_path / "f", SMALL)
    try:
        assert damaged.log_end_offset == 66
    finally:
        damaged.abort()


def test_a_hole_wider_than_relative_offsets_starts_a_segment_at_the_batch(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "f", SMALL)
    far = 5_000_000_000  # past 2**32 - 1, the index's relative offsets
    log.append_replicated(fetched(0, 1), now_ms=5)
    log.append_replicated(fetched(far, 1), now_ms=5)
    assert log.segment_base_offsets() == [0, far]
    reopened = reopen_after_crash(log)
    try:
        assert reopened.segment_base_offsets() == [0, far]
        assert bases_and_ends(read_all(reopened)) == [(0, 2), (far, far + 2)]
    finally:
        reopened.abort()


# ---------------------------------------------------------------- a real cleaned leader


def test_a_follower_copies_a_cleaned_leader_byte_for_byte(tmp_path: Path) -> None:
    leader = PartitionLog.open(tmp_path / "leader", COMPACT, now_ms=lambda: T0)
    for i in range(120):  # many updates of few keys, one batch each
        record = Record(0, 0, b"key-%d" % (i % 5), b"value-%d" % i)
        batch = build_batch([record], base_timestamp=T0 + i, compression=Compression.NONE)
        leader.append(batch, now_ms=T0 + i, leader_epoch=1)
    leader.flush()
    assert clean_log(leader, T0 + 10_000) is not None
    leader_bytes = read_all(leader)
    offsets = [b for b, _ in bases_and_ends(leader_bytes)]
    assert len(offsets) < 60, "the pass left holes"

    follower = PartitionLog.open(tmp_path / "follower", COMPACT, now_ms=lambda: T0)
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset and fetches < 500:
        # What the replica fetcher does: fetch at the log end, store the answer.
        answer = b"".join(
            r.read_bytes() for r in leader.read(follower.log_end_offset, 300, leader.log_end_offset)
        )
        follower.append_replicated_batches(answer, now_ms=T0)
        fetches += 1
    assert read_all(follower) == leader_bytes
    # Epoch 1 starts at the first batch the follower got of it (Kafka's follower rule).
    assert epochs_of(follower) == [(1, offsets[0])]
    follower = reopen_after_crash(follower)
    leader.abort()
    try:
        assert read_all(follower) == leader_bytes
        assert follower.log_end_offset == 120
        # Its own cleaner may now run over the copy (a follower cleans its own log).
        follower.roll(T0)
        follower.flush()
        clean_log(follower, T0 + 10_000)
        rows = records_of(follower)
        assert {key: (off, value) for off, key, value, _ in rows} == {
            b"key-%d" % k: (115 + k, b"value-%d" % (115 + k)) for k in range(5)
        }
        assert len(rows) == 5
    finally:
        follower.abort()


def test_a_clean_shutdown_reopens_a_log_with_holes_as_it_was(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "f", SMALL)
    bases = [0, 2, 9, 11, 30, 40, 70, 72]
    for base in bases:
        log.append_replicated(fetched(base, 1), now_ms=5)
    before, segments = read_all(log), log.segment_base_offsets()
    log.close()
    reopened = PartitionLog.open(tmp_path / "f", SMALL)
    try:
        assert reopened.recovery.clean
        assert read_all(reopened) == before
        assert reopened.segment_base_offsets() == segments
        assert reopened.log_end_offset == 74
        reopened.append_replicated(fetched(80, 1), now_ms=5)  # and it goes on
    finally:
        reopened.abort()
