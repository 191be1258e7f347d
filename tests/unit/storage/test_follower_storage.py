"""Follower storage: replicated appends, truncate_to, the leader-epoch checkpoint.

PartitionLog and MemoryLog side by side where they share the rule; the disk log
alone for files, crashes and power cuts (``tests/powerloss.py``'s recorder: a cut
after every fsync of a truncation or a checkpoint rewrite).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec import storage_model
from tests.powerloss import PowerCut
from trio_broker.protocol import batch_header
from trio_broker.protocol.records import build_batch
from trio_broker.storage import log_state
from trio_broker.storage.epoch_cache import (
    EpochEntry,
    LeaderEpochCache,
    batch_leader_epoch,
    format_checkpoint,
    parse_checkpoint,
    set_batch_leader_epoch,
)
from trio_broker.storage.errors import (
    InvalidReplicatedBatch,
    OffsetOutOfRange,
    UnexpectedAppendOffset,
)
from trio_broker.storage.log import (
    LEADER_EPOCH_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogConfig,
    PartitionLog,
)
from trio_broker.storage.memory import MemoryLog

SMALL = LogConfig(segment_bytes=400, index_interval_bytes=64, retention_ms=None)

AnyLog = PartitionLog | MemoryLog


def batch(records: int = 2, tag: int = 0, ts: int = 1_000) -> bytearray:
    return build_batch([(b"k", bytes([tag % 256]) * 30)] * records, base_timestamp=ts)


def fetched(base: int, epoch: int, records: int = 2, tag: int = 0) -> bytes:
    """A batch as a leader serves it: its offsets and leader epoch set."""
    b = batch(records, tag)
    batch_header.set_base_offset(b, base)
    set_batch_leader_epoch(b, epoch)
    return bytes(b)


def read_all(log: AnyLog) -> bytes:
    regions = log.read(log.log_start_offset, 1 << 30, log.log_end_offset)
    return b"".join(r.read_bytes() for r in regions)


def bases_and_ends(data: bytes) -> list[tuple[int, int]]:
    out, pos = [], 0
    while pos < len(data):
        header = batch_header.unpack_header(data, pos)
        out.append((header.base_offset, header.last_offset + 1))
        pos += header.size
    return out


def epochs_of(log: AnyLog) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in log.epoch_cache.entries]


def scanned_epochs(log: AnyLog) -> list[tuple[int, int]]:
    """What a scan of the log's batch headers says the cache must be."""
    cache = LeaderEpochCache()
    for base, header in log.iter_batch_headers():
        cache.assign_from_log(batch_leader_epoch(header), base)
    cache.truncate_from_start(log.log_start_offset)
    return [(e.epoch, e.start_offset) for e in cache.entries]


@pytest.fixture(params=["disk", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[type]:
    logs: list[AnyLog] = []

    def make(config: LogConfig = SMALL) -> AnyLog:
        if request.param == "disk":
            log: AnyLog = PartitionLog.open(tmp_path / f"t-{len(logs)}", config)
        else:
            log = MemoryLog(config)
        logs.append(log)
        return log

    yield make  # type: ignore[misc]
    for log in logs:
        log.abort()


# ---------------------------------------------------------------- replicated appends


def test_a_replicated_batch_is_stored_unchanged(make_log) -> None:
    log = make_log()
    first, second = fetched(0, 3, records=2), fetched(2, 3, records=3, tag=1)
    a = log.append_replicated(first, now_ms=5)  # bytes: read-only buffers are fine
    b = log.append_replicated(memoryview(second), now_ms=5)
    assert (a.base_offset, a.last_offset, a.log_append_time, a.position) == (0, 1, -1, 0)
    assert (b.base_offset, b.last_offset, b.position, b.size) == (2, 4, a.size, len(second))
    assert log.log_end_offset == 5
    assert read_all(log) == first + second
    assert epochs_of(log) == [(3, 0)]


def test_a_replicated_batch_may_not_start_before_the_log_end(make_log) -> None:
    log = make_log()
    log.append_replicated(fetched(0, 1), now_ms=5)
    for base in (0, 1):
        with pytest.raises(UnexpectedAppendOffset, match=f"offset {base} but the log ends at 2"):
            log.append_replicated(fetched(base, 1), now_ms=5)
    assert log.log_end_offset == 2 and not log.offline
    assert bases_and_ends(read_all(log)) == [(0, 2)]
    # After the log end is an offset hole the leader's cleaner left (test_follower_holes.py).
    log.append_replicated(fetched(3, 1), now_ms=5)
    assert bases_and_ends(read_all(log)) == [(0, 2), (3, 5)]


def test_a_replicated_batch_with_a_bad_crc_or_header_is_refused(make_log) -> None:
    log = make_log()
    damaged = bytearray(fetched(0, 1))
    damaged[-1] ^= 0xFF
    with pytest.raises(InvalidReplicatedBatch, match="CRC"):
        log.append_replicated(damaged, now_ms=5)
    wrong_magic = bytearray(fetched(0, 1))
    wrong_magic[batch_header.MAGIC_AT] = 1
    with pytest.raises(InvalidReplicatedBatch, match="magic"):
        log.append_replicated(wrong_magic, now_ms=5)
    with pytest.raises(InvalidReplicatedBatch, match="shorter than a batch header"):
        log.append_replicated(fetched(0, 1)[:40], now_ms=5)
    assert log.log_end_offset == 0 and read_all(log) == b""
    assert epochs_of(log) == []
    log.append_replicated(fetched(0, 1), now_ms=5)  # still writable


def test_a_replicated_epoch_may_not_go_back(make_log) -> None:
    log = make_log()
    log.append_replicated(fetched(0, 4), now_ms=5)
    with pytest.raises(InvalidReplicatedBatch, match="epoch 2 at offset 2 after epoch 4"):
        log.append_replicated(fetched(2, 2), now_ms=5)
    assert log.log_end_offset == 2
    # Batches without an epoch (a leader that stamps none) change nothing.
    log.append_replicated(fetched(2, -1), now_ms=5)
    log.append_replicated(fetched(4, 6), now_ms=5)
    assert epochs_of(log) == [(4, 0), (6, 4)]


def test_a_fetch_response_blob_is_appended_batch_by_batch(make_log) -> None:
    log = make_log()
    blob = fetched(0, 1) + fetched(2, 1, records=1) + fetched(3, 2, records=3)
    results = log.append_replicated_batches(blob + fetched(6, 2)[:50], now_ms=5)
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 1), (2, 2), (3, 5)]
    assert read_all(log) == blob
    assert epochs_of(log) == [(1, 0), (2, 3)]
    # Partial batches alone (fewer bytes than a length field, or than the length says).
    assert log.append_replicated_batches(fetched(6, 2)[:11], now_ms=5) == []
    assert log.append_replicated_batches(b"", now_ms=5) == []
    assert log.log_end_offset == 6


def test_a_bad_batch_in_a_blob_stores_none_of_it(make_log) -> None:
    log = make_log()
    bad = bytearray(fetched(2, 1))
    bad[-3] ^= 1
    for blob in (
        fetched(0, 1) + bytes(bad),
        fetched(0, 1) + fetched(1, 1),  # an overlap
        fetched(0, 2) + fetched(2, 1),  # the epoch goes back
    ):
        with pytest.raises(InvalidReplicatedBatch):
            log.append_replicated_batches(blob, now_ms=5)
        assert log.log_end_offset == 0 and epochs_of(log) == []
    too_small = bytearray(fetched(0, 1))
    too_small[8:12] = (20).to_bytes(4, "big")  # batchLength below a header's
    with pytest.raises(InvalidReplicatedBatch, match="too small"):
        log.append_replicated_batches(bytes(too_small), now_ms=5)


def test_replicated_appends_roll_segments_like_leader_appends(make_log) -> None:
    follower, leader = make_log(), make_log()
    for i in range(12):
        leader.append(batch(tag=i), now_ms=5, leader_epoch=2)
    follower.append_replicated_batches(read_all(leader), now_ms=5)
    assert follower.segment_base_offsets() == leader.segment_base_offsets()
    assert len(follower.segment_base_offsets()) > 3
    assert read_all(follower) == read_all(leader)
    for start in range(24):
        assert follower.read(start, 100, 24) and (
            [r.read_bytes() for r in follower.read(start, 300, 24)]
            == [r.read_bytes() for r in leader.read(start, 300, 24)]
        )


# ---------------------------------------------------------------- leader epochs on append


def test_leader_append_stamps_the_epoch_only_when_asked(make_log) -> None:
    log = make_log()
    plain = batch()
    set_batch_leader_epoch(plain, 77)  # whatever the producer sent stays
    log.append(plain, now_ms=5)
    assert batch_leader_epoch(plain) == 77 and epochs_of(log) == []
    stamped = batch()
    log.append(stamped, now_ms=5, leader_epoch=3)
    assert batch_leader_epoch(stamped) == 3
    assert batch_header.crc_matches(stamped)  # the field is outside the CRC
    log.append(batch(), now_ms=5, leader_epoch=3)
    log.append(batch(), now_ms=5, leader_epoch=5)
    assert epochs_of(log) == [(3, 2), (5, 6)]


def test_begin_epoch_starts_a_term_at_the_log_end(make_log) -> None:
    log = make_log()
    log.append(batch(), now_ms=5, leader_epoch=1)
    assert log.begin_epoch(2) and not log.begin_epoch(2)
    assert epochs_of(log) == [(1, 0), (2, 2)]
    log.append(batch(), now_ms=5, leader_epoch=2)
    assert epochs_of(log) == [(1, 0), (2, 2)]


def test_the_checkpoint_is_written_only_when_an_epoch_begins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[str] = []
    real = log_state.write_file_atomically

    def counting(path: Path, data: bytes, **kwargs: int) -> None:
        writes.append(Path(path).name)
        real(path, data, **kwargs)

    # The leader-epoch checkpoint is written by the log state (storage/log_state.py).
    monkeypatch.setattr(log_state, "write_file_atomically", counting)
    log = PartitionLog.open(tmp_path / "t-0", SMALL)
    for _ in range(5):
        log.append(batch(), now_ms=5)
    assert LEADER_EPOCH_CHECKPOINT not in writes
    assert not (tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT).exists()
    for epoch in (1, 1, 1, 2, 2):
        log.append(batch(), now_ms=5, leader_epoch=epoch)
    log.begin_epoch(2)
    log.append_replicated(fetched(log.log_end_offset, 2), now_ms=5)
    log.append_replicated(fetched(log.log_end_offset, 3), now_ms=5)
    assert writes.count(LEADER_EPOCH_CHECKPOINT) == 3
    text = (tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT).read_text()
    assert text == "0\n3\n1 10\n2 16\n3 22\n"
    log.close()


# ---------------------------------------------------------------- truncate_to


def filled(make_log, batches: int = 12, epochs: tuple[int, ...] = (1,)) -> AnyLog:
    log = make_log()
    for i in range(batches):
        log.append(batch(tag=i), now_ms=5, leader_epoch=epochs[i * len(epochs) // batches])
    return log


def test_truncate_inside_a_batch_removes_the_whole_batch(make_log) -> None:
    log = filled(make_log)
    before = read_all(log)
    assert log.truncate_to(7) == 6  # offset 7 is the second record of batch [6, 7]
    assert log.log_end_offset == 6
    assert read_all(log) == before[: len(before) * 6 // 24]
    assert log.truncate_to(4) == 4  # a batch boundary: exactly there
    assert bases_and_ends(read_all(log))[-1] == (2, 4)


def test_truncate_at_or_past_the_end_is_a_no_op(make_log) -> None:
    log = filled(make_log)
    before = read_all(log)
    assert log.truncate_to(24) == 24 and log.truncate_to(10**9) == 24
    assert read_all(log) == before


def test_truncate_across_segment_boundaries(make_log) -> None:
    log = filled(make_log, 20)
    bases = log.segment_base_offsets()
    assert len(bases) >= 5
    before = read_all(log)
    target = bases[2] + 1  # inside the first batch of the third segment
    assert log.truncate_to(target) == bases[2]
    # The segment holding the cut stays (now empty, active); later ones are gone.
    assert log.segment_base_offsets() == bases[:3]
    assert read_all(log) == before[: sum(len(r.read_bytes()) for r in log.read(0, 1 << 30, 40))]
    assert bases_and_ends(read_all(log))[-1][1] == bases[2]
    # Appends continue at the new end, reusing the offsets.
    result = log.append(batch(tag=99), now_ms=6, leader_epoch=2)
    assert result.base_offset == bases[2]
    assert bases_and_ends(read_all(log))[-1] == (bases[2], bases[2] + 2)


def test_truncate_inside_a_sealed_segment_makes_it_active_again(make_log) -> None:
    log = filled(make_log, 20)
    bases = log.segment_base_offsets()
    target = bases[1] + 3  # inside the second batch of the second segment
    assert log.truncate_to(target) == bases[1] + 2
    assert log.segment_base_offsets() == bases[:2]
    for i in range(10):  # fills it and rolls again
        log.append(batch(tag=50 + i), now_ms=6)
    assert log.segment_base_offsets()[:2] == bases[:2]
    assert len(log.segment_base_offsets()) > 2
    assert [b for b, _ in bases_and_ends(read_all(log))] == list(range(0, log.log_end_offset, 2))


def test_truncate_to_the_log_start_and_below(make_log) -> None:
    log = filled(make_log)
    log.delete_records(6)
    with pytest.raises(OffsetOutOfRange):
        log.truncate_to(5)
    log.delete_records(7)  # the start is now inside batch [6, 7]
    with pytest.raises(OffsetOutOfRange):
        log.truncate_to(7)  # would remove the batch holding the log start
    assert log.log_end_offset == 24
    log.delete_records(8)
    assert log.truncate_to(8) == 8  # to the log start: an empty log
    assert read_all(log) == b"" and log.log_end_offset == log.log_start_offset == 8
    assert log.append(batch(), now_ms=5).base_offset == 8


def test_truncate_cuts_the_epoch_cache(make_log) -> None:
    log = filled(make_log, 12, epochs=(1, 2, 3))
    assert epochs_of(log) == [(1, 0), (2, 8), (3, 16)]
    log.truncate_to(17)
    assert epochs_of(log) == [(1, 0), (2, 8)]
    log.truncate_to(8)
    assert epochs_of(log) == [(1, 0)]
    log.append_replicated(fetched(8, 4), now_ms=5)
    assert epochs_of(log) == [(1, 0), (4, 8)]


def test_a_begun_epoch_with_no_records_goes_when_a_follower_appends(make_log) -> None:
    log = filled(make_log, 4)
    log.begin_epoch(5)  # led epoch 5, wrote nothing, then followed the epoch-6 leader
    log.append_replicated(fetched(8, 6), now_ms=5)
    assert epochs_of(log) == [(1, 0), (6, 8)]


def test_truncation_keeps_durable_end_and_recovery_point_truthful(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL)
    for i in range(20):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1)
    log.flush()
    bases = log.segment_base_offsets()
    point = int((tmp_path / "t-0" / RECOVERY_POINT_CHECKPOINT).read_bytes())
    assert point == bases[-1]
    log.truncate_to(bases[1] + 1)
    assert log.durable_end_offset == log.log_end_offset == bases[1]
    assert int((tmp_path / "t-0" / RECOVERY_POINT_CHECKPOINT).read_bytes()) == bases[1]
    names = set(os.listdir(tmp_path / "t-0"))
    assert {f"{b:020d}.log" for b in bases[2:]}.isdisjoint(names)
    assert not any(n.endswith(".tmp") for n in names)
    log.append(batch(tag=70), now_ms=6)
    assert log.durable_end_offset == bases[1]
    assert log.flush() == bases[1] + 2
    log.close()


def test_in_flight_reads_keep_the_bytes_they_were_given(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL)
    for i in range(20):
        log.append(batch(tag=i), now_ms=5)
    regions = log.read(0, 1 << 30, log.log_end_offset)
    expected = [r.read_bytes() for r in regions]
    log.truncate_to(log.segment_base_offsets()[1] + 1)
    log.append(batch(tag=200), now_ms=6)  # new bytes where the old ones were
    assert [r.read_bytes() for r in regions] == expected
    log.close()


def test_indexes_after_a_truncation_are_those_recovery_builds(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=4000, index_interval_bytes=150, retention_ms=None)
    log = PartitionLog.open(tmp_path / "t-0", config)
    for i in range(40):
        log.append(batch(tag=i, ts=1_000 + (i * 37) % 50), now_ms=5)
    log.truncate_to(41)
    active = log._segments[-1]
    entries = active.offset_index.entries(), active.time_index.entries()
    assert entries[0] and all(rel < 40 for rel, _ in entries[0])
    for offset in range(0, 40, 3):
        assert bases_and_ends(log.read(offset, 1, 40)[0].read_bytes())[0][0] == offset // 2 * 2
    stamps = [1_000 + (i * 37) % 50 for i in range(20)]  # of the batches kept
    for t in (1_000, max(stamps), max(stamps) - 5):
        first = next(i for i, ts in enumerate(stamps) if ts >= t)
        assert log.offset_for_timestamp(t) == (2 * first, stamps[first])
    assert log.offset_for_timestamp(max(stamps) + 1) is None
    log.abort()
    reopened = PartitionLog.open(tmp_path / "t-0", config)  # a scan rebuilds them
    again = reopened._segments[-1]
    assert (again.offset_index.entries(), again.time_index.entries()) == entries
    reopened.close()


def test_truncation_survives_reopening_clean_or_not(tmp_path: Path) -> None:
    for clean in (True, False):
        directory = tmp_path / f"t-{clean}"
        log = PartitionLog.open(directory, SMALL)
        for i in range(20):
            log.append(batch(tag=i), now_ms=5, leader_epoch=1 + i // 8)
        log.flush()
        log.truncate_to(21)
        kept, epochs = read_all(log), epochs_of(log)
        log.close() if clean else log.abort()
        reopened = PartitionLog.open(directory, SMALL)
        assert reopened.recovery.clean == clean
        assert read_all(reopened) == kept and reopened.log_end_offset == 20
        assert epochs_of(reopened) == epochs == [(1, 0), (2, 16)]
        reopened.close()


def test_truncate_fully_and_start_at_empties_the_log_past_its_end(make_log) -> None:
    # A follower ending at 24 below its leader's log start 40 (DeleteRecords there).
    log = filled(make_log, epochs=(1, 2))
    with pytest.raises(ValueError):
        log.truncate_fully_and_start_at(log.log_end_offset)  # only past the end
    log.truncate_fully_and_start_at(40)
    assert (log.log_start_offset, log.log_end_offset, log.durable_end_offset) == (40, 40, 40)
    assert read_all(log) == b"" and epochs_of(log) == []
    # The leader's batches from its log start on follow.
    log.append_replicated_batches(fetched(40, 3) + fetched(42, 3), now_ms=5)
    assert log.log_end_offset == 44 and epochs_of(log) == [(3, 40)]
    assert bases_and_ends(read_all(log)) == [(40, 42), (42, 44)]
    log.apply_retention(10)  # the old segments are below the log start: they go
    assert log.segment_base_offsets()[0] == 40


def test_a_log_started_past_its_end_reopens_there(tmp_path: Path) -> None:
    for clean in (True, False):
        directory = tmp_path / f"t-{clean}"
        log = PartitionLog.open(directory, SMALL)
        for i in range(6):
            log.append(batch(tag=i), now_ms=5, leader_epoch=1)
        log.truncate_fully_and_start_at(40)
        log.append_replicated(fetched(40, 3), now_ms=5)
        log.flush()
        kept = read_all(log)
        log.close() if clean else log.abort()
        reopened = PartitionLog.open(directory, SMALL)
        assert (reopened.log_start_offset, reopened.log_end_offset) == (40, 42)
        assert read_all(reopened) == kept and epochs_of(reopened) == [(3, 40)]
        reopened.close()


# ---------------------------------------------------------------- the checkpoint file


def test_checkpoint_format_round_trip() -> None:
    entries = [EpochEntry(0, 0), EpochEntry(3, 10), EpochEntry(7, 10), EpochEntry(9, 400)]
    text = format_checkpoint(entries)
    assert text == b"0\n4\n0 0\n3 10\n7 10\n9 400\n"
    parsed = parse_checkpoint(text)
    assert parsed is not None and list(parsed.entries) == entries
    empty = parse_checkpoint(format_checkpoint([]))
    assert empty is not None and empty.entries == ()


@pytest.mark.parametrize(
    "damaged",
    [
        b"",
        b"1\n0\n",  # unknown version
        b"0\n2\n1 0\n",  # count says more lines
        b"0\n1\n1 0\n2 5\n",  # count says fewer
        b"0\n1\n1\n",  # a field missing
        b"0\n2\n3 0\n2 5\n",  # epochs going back
        b"0\n2\n1 9\n2 5\n",  # start offsets going back
        b"0\n1\n-1 0\n",
        b"0\n1\nx 0\n",
        b"\xff\xfe",
    ],
)
def test_a_damaged_checkpoint_is_rebuilt_from_the_batch_headers(
    tmp_path: Path, damaged: bytes
) -> None:
    assert parse_checkpoint(damaged) is None
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, SMALL)
    for i in range(12):
        log.append(batch(tag=i), now_ms=5, leader_epoch=(2, 2, 5)[i // 4 % 3])
    log.delete_records(3)
    want = epochs_of(log)
    assert want == [(2, 3), (5, 16)]
    log.close()
    (directory / LEADER_EPOCH_CHECKPOINT).write_bytes(damaged)
    reopened = PartitionLog.open(directory, SMALL)
    assert reopened.recovery.epoch_cache_rebuilt
    assert epochs_of(reopened) == want == scanned_epochs(reopened)
    reopened.close()
    # The rebuilt cache was written back: the next open reads it.
    assert parse_checkpoint((directory / LEADER_EPOCH_CHECKPOINT).read_bytes()) is not None
    again = PartitionLog.open(directory, SMALL)
    assert not again.recovery.epoch_cache_rebuilt and epochs_of(again) == want
    again.close()


def test_the_checkpoint_is_trimmed_to_the_recovered_log(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, SMALL)
    for i in range(12):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1 + i // 4)
    log.flush()
    log.begin_epoch(9)  # at the log end: describes no record
    log.close()
    # A crash lost the tail the checkpoint still names (epoch 3 and the begun 9).
    text = (directory / LEADER_EPOCH_CHECKPOINT).read_text()
    assert text == "0\n4\n1 0\n2 8\n3 16\n9 24\n"
    (directory / LEADER_EPOCH_CHECKPOINT).write_text("0\n5\n0 0\n1 0\n2 8\n3 16\n9 24\n")
    reopened = PartitionLog.open(directory, SMALL)
    reopened.truncate_to(13)  # then cut, reopened again
    reopened.close()
    log = PartitionLog.open(directory, SMALL)
    assert epochs_of(log) == [(0, 0), (1, 0), (2, 8)] or epochs_of(log) == [(1, 0), (2, 8)]
    log.close()


def test_log_start_moves_trim_the_cache_from_the_start(make_log) -> None:
    log = filled(make_log, 12, epochs=(1, 2, 3))
    log.delete_records(10)
    assert epochs_of(log) == [(2, 10), (3, 16)]


def test_a_log_emptied_from_the_start_keeps_its_latest_epoch(make_log) -> None:
    # DeleteRecords to the log end: Kafka's truncateFromStart keeps the latest epoch,
    # moved to the new start, so a leader still answers OffsetForLeaderEpoch with its
    # log end (an empty cache answers "no epoch": followers fell back to their HW).
    log = filled(make_log, 12, epochs=(1, 2, 3))
    end = log.log_end_offset
    log.delete_records(end)
    assert epochs_of(log) == [(3, end)]
    assert log.epoch_cache.end_offset_for(3, end) == (3, end)


# ---------------------------------------------------------------- the two logs agree


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4), st.sampled_from([None, 0, 1, 2])),
        st.tuples(st.just("replicated"), st.integers(1, 4), st.integers(-1, 3)),
        st.tuples(st.just("truncate"), st.floats(0, 1.2), st.just(0)),
        st.tuples(st.just("begin"), st.integers(0, 4), st.just(0)),
        st.tuples(st.just("delete"), st.floats(0, 0.5), st.just(0)),
    ),
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=ops)
def test_disk_and_memory_logs_agree(tmp_path_factory: pytest.TempPathFactory, operations) -> None:
    disk = PartitionLog.open(tmp_path_factory.mktemp("agree") / "t-0", SMALL)
    memory = MemoryLog(SMALL)
    try:
        for i, (kind, a, b) in enumerate(operations):
            outcomes = []
            for log in (disk, memory):
                try:
                    if kind == "append":
                        outcomes.append(log.append(batch(a, i), now_ms=5, leader_epoch=b))
                    elif kind == "replicated":
                        blob = fetched(log.log_end_offset, b, records=a, tag=i)
                        outcomes.append(log.append_replicated(blob, now_ms=5))
                    elif kind == "truncate":
                        end = log.log_end_offset
                        outcomes.append(log.truncate_to(int(a * end)))
                    elif kind == "begin":
                        outcomes.append(log.begin_epoch(a))
                    else:
                        start, end = log.log_start_offset, log.log_end_offset
                        outcomes.append(log.delete_records(start + int(a * (end - start))))
                except (OffsetOutOfRange, InvalidReplicatedBatch) as exc:
                    outcomes.append(type(exc))
                except Exception as exc:
                    if type(exc).__name__ != "EpochOrderViolation":
                        raise
                    outcomes.append(type(exc))
            assert outcomes[0] == outcomes[1], (kind, a, b)
            assert read_all(disk) == read_all(memory)
            assert epochs_of(disk) == epochs_of(memory)
            assert disk.segment_base_offsets() == memory.segment_base_offsets()
            assert (disk.log_start_offset, disk.log_end_offset) == (
                memory.log_start_offset,
                memory.log_end_offset,
            )
    finally:
        disk.abort()


# ---------------------------------------------------------------- power cuts


@pytest.fixture
def cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PowerCut:
    return PowerCut(tmp_path / "disk", monkeypatch)


def _open(state: Path) -> PartitionLog:
    return PartitionLog.open(state / "t-0", SMALL)


@pytest.mark.parametrize("where", ["active", "middle", "first", "boundary"])
def test_a_power_cut_anywhere_in_a_truncation_leaves_a_prefix(cut: PowerCut, where: str) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(24):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1 + i // 6)
    log.flush()
    before, bases = read_all(log), log.segment_base_offsets()
    target = {
        "active": log.log_end_offset - 3,
        "middle": bases[len(bases) // 2] + 3,
        "first": 3,
        "boundary": bases[2],
    }[where]
    start = len(cut.events)
    new_end = log.truncate_to(target)
    after = read_all(log)
    assert new_end < log.log_end_offset + 1 and after == before[: len(after)]
    log.abort()
    outcomes = set()
    for state in cut.every_cut(start):
        reopened = _open(state)
        try:
            got = read_all(reopened)
            assert before.startswith(got), f"not a prefix of the old log ({state.name})"
            assert reopened.log_end_offset >= new_end
            assert bases_and_ends(got)[-1][1] == reopened.log_end_offset
            assert epochs_of(reopened) == scanned_epochs(reopened)
            outcomes.add(reopened.log_end_offset)
        finally:
            reopened.abort()
    assert new_end in outcomes and len(outcomes) == 2  # the cut before and after it


def test_truncated_records_never_come_back_after_new_appends(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(16):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1)
    log.flush()
    old = read_all(log)
    new_end = log.truncate_to(11)
    start = len(cut.events)
    for i in range(5):
        log.append_replicated(fetched(log.log_end_offset, 2, tag=100 + i), now_ms=5)
    log.flush()
    new = read_all(log)
    log.abort()
    for state in cut.every_cut(start):
        reopened = _open(state)
        try:
            got = read_all(reopened)
            assert new.startswith(got) and reopened.log_end_offset >= new_end
            assert not old.startswith(got) or reopened.log_end_offset == new_end
            assert epochs_of(reopened) == scanned_epochs(reopened)
        finally:
            reopened.abort()


def test_a_power_cut_during_a_checkpoint_rewrite_keeps_old_or_new(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(6):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1)
    log.flush()
    start = len(cut.events)
    log.append(batch(tag=7), now_ms=5, leader_epoch=2)  # a checkpoint rewrite, then the batch
    log.flush()
    log.abort()
    seen = set()
    for state in cut.every_cut(start):
        raw = (state / "t-0" / LEADER_EPOCH_CHECKPOINT).read_bytes()
        assert raw in (b"0\n1\n1 0\n", b"0\n2\n1 0\n2 12\n"), raw
        seen.add(raw)
        reopened = _open(state)
        try:
            assert not reopened.recovery.epoch_cache_rebuilt
            assert epochs_of(reopened) == scanned_epochs(reopened)
        finally:
            reopened.abort()
    assert len(seen) == 2


MIXED = LogConfig(segment_bytes=1200, index_interval_bytes=300, retention_ms=None)


@pytest.mark.parametrize("survived", ["rename only", "unlinks only", "some unlinks"])
def test_a_truncation_half_made_durable_still_leaves_a_prefix(
    tmp_path: Path, survived: str
) -> None:
    """Directory changes that a cut keeps in any mix (a journal may commit some of the
    unlinks and the rename without the directory fsync): recovery must still find a
    prefix. The cut lands after the segment's last index entry, so that its old index
    files would pass the open-time sanity check if the segment were trusted."""
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, MIXED)
    for i in range(40):
        log.append(batch(tag=i), now_ms=5, leader_epoch=1 + i // 10)
    log.flush()
    before = read_all(log)
    segment = log._segments[1]
    last_entry = segment.offset_index.last_entry()
    assert last_entry is not None and len(log.segment_base_offsets()) > 3
    cut_at = next(info for info in _batches_of(segment) if info.position > last_entry[1])
    old_files = {p.name: p.read_bytes() for p in directory.iterdir()}
    new_end = log.truncate_to(cut_at.base_offset + 1)
    assert new_end == cut_at.base_offset
    log.abort()
    later = [n for n in old_files if n.endswith(".log")][2:]
    stem = f"{segment.base_offset:020d}"
    restore: list[str] = []
    if survived == "rename only":  # unlinks lost: later segments and old indexes back
        restore = [n for n in old_files if n[:20] != stem or not n.endswith(".log")]
        restore = [n for n in restore if n.endswith((".log", ".index", ".timeindex"))]
        restore = [n for n in restore if n[:20] >= stem]
    elif survived == "unlinks only":  # the rename lost: the old segment file back
        restore = [f"{stem}.log"]
    else:
        restore = [f"{stem}.log", *later[1::2]]
    # Cut before the directory fsync of step 3: the epoch checkpoint is not rewritten
    # yet (step 4); the recovery point was (step 1).
    for name in [*restore, LEADER_EPOCH_CHECKPOINT]:
        (directory / name).write_bytes(old_files[name])
    reopened = PartitionLog.open(directory, MIXED)
    try:
        got = read_all(reopened)
        assert before.startswith(got)
        assert reopened.log_end_offset >= new_end
        assert epochs_of(reopened) == scanned_epochs(reopened)
    finally:
        reopened.close()


def _batches_of(segment):  # type: ignore[no-untyped-def]
    from trio_broker.storage.segment import iter_batches

    return list(iter_batches(segment.fd, 0, segment.size))


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), max_size=8),
    target=st.integers(0, 40),
    log_start=st.integers(0, 40),
)
def test_the_spec_truncation_rule(sizes: list[int], target: int, log_start: int) -> None:
    batches, base = [], 0
    for n in sizes:
        batches.append((base, base + n - 1, 100))
        base += n
    log_start = min(log_start, base)
    kept = storage_model.truncate(batches, target, log_start)
    if kept is None:
        assert target < log_start or any(
            b <= target <= last and b < log_start for b, last, _ in batches
        )
        return
    assert 0 <= kept <= len(batches)
    assert all(last < target for _, last, _ in batches[:kept])
    if kept < len(batches):
        assert batches[kept][1] >= target and batches[kept][0] >= log_start


def test_segment_ms_counts_again_in_a_reopened_segment_a_truncation_reactivates(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=10_000, segment_ms=40, retention_ms=None)
    log = PartitionLog.open(tmp_path / "t-0", config)
    log.append(batch(ts=1_000), now_ms=1_000)
    log.append(batch(ts=1_020), now_ms=1_020)
    log.append(batch(ts=1_050), now_ms=1_050)  # 50 ms after the first: rolls
    assert log.segment_base_offsets() == [0, 4]
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", config)  # segment 0 loaded sealed
    assert log.truncate_to(3) == 2
    log.append(batch(ts=1_045), now_ms=1_045)  # 45 ms after segment 0's first batch
    assert log.segment_base_offsets() == [0, 2]
    log.close()
