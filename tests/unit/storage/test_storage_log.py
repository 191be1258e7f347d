"""PartitionLog: appends, reads, rolls, recovery, retention, disk errors."""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol import batch_header
from trio_broker.protocol.records import build_batch
from trio_broker.storage.errors import OffsetOutOfRange, StorageError
from trio_broker.storage.log import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    FileRegion,
    LogConfig,
    PartitionLog,
)
from trio_broker.storage.memory import MemoryLog
from trio_broker.storage.recovery import valid_prefix
from trio_broker.storage.topic_configs import log_config

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=None)


def batch(n: int = 1, size: int = 10, ts: int = 1_000, tag: int = 0) -> bytearray:
    return build_batch([(b"k", bytes([tag % 256]) * size) for _ in range(n)], base_timestamp=ts)


def joined(regions: list) -> bytes:
    return b"".join(r.read_bytes() for r in regions)


def split_batches(data: bytes) -> list[batch_header.BatchHeader]:
    out, pos = [], 0
    while pos < len(data):
        header = batch_header.unpack_header(data, pos)
        assert batch_header.crc_matches(data[pos : pos + header.size])
        out.append(header)
        pos += header.size
    assert pos == len(data)
    return out


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


def fill(
    log: PartitionLog | MemoryLog, count: int, *, n: int = 2, size: int = 40, now: int = 1_000
):
    return [log.append(batch(n, size, ts=now + i, tag=i), now_ms=now + i) for i in range(count)]


# ---------------------------------------------------------------- appends


def test_append_assigns_offsets_and_rewrites_the_callers_buffer(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    first = batch(3)
    r1 = log.append(first, now_ms=5)
    second = batch(2)
    r2 = log.append(second, now_ms=6)
    assert (r1.base_offset, r1.last_offset, r1.position, r1.size) == (0, 2, 0, len(first))
    assert (r2.base_offset, r2.last_offset, r2.position) == (3, 4, len(first))
    assert r1.log_append_time == -1
    assert batch_header.unpack_header(second).base_offset == 3
    assert log.log_end_offset == 5
    assert joined(log.read(0, 1 << 20, 5)) == bytes(first) + bytes(second)
    log.close()


def test_append_rejects_inconsistent_buffers(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    good = batch()
    with pytest.raises(ValueError):
        log.append(good + b"x", now_ms=0)
    with pytest.raises(ValueError):
        log.append(good[:-1], now_ms=0)
    with pytest.raises(ValueError):
        log.append(bytearray(10), now_ms=0)
    with pytest.raises(TypeError):
        log.append(memoryview(bytes(good)), now_ms=0)
    bad_magic = bytearray(good)
    bad_magic[batch_header.MAGIC_AT] = 1
    with pytest.raises(ValueError):
        log.append(bad_magic, now_ms=0)
    assert log.log_end_offset == 0
    log.close()


def test_log_append_time_stamps_the_header_and_keeps_the_crc_valid(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    b = batch(2, ts=10)
    result = log.append(b, now_ms=777, log_append_time=True)
    assert result.log_append_time == 777
    stored = joined(log.read(0, 1000, 10))
    header = batch_header.unpack_header(stored)
    assert header.attributes & batch_header.TIMESTAMP_TYPE_BIT
    assert header.max_timestamp == 777
    assert batch_header.crc_matches(stored)
    log.close()


def test_append_does_not_copy_the_batch(logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(logdir, SMALL)
    seen = []
    real_write = os.write

    def spy(fd: int, data: object) -> int:
        seen.append(data)
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "write", spy)
    buf = batch(4)
    log.append(buf, now_ms=0)
    monkeypatch.undo()
    assert len(seen) == 1
    assert isinstance(seen[0], memoryview) and seen[0].obj is buf
    log.close()


# ---------------------------------------------------------------- reads


def test_read_semantics(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    results = fill(log, 30)  # 2 records each: offsets 0..59
    sizes = [r.size for r in results]
    # straddling start: offset 5 is in the batch [4, 5]
    got = split_batches(joined(log.read(5, sizes[0] * 2, 60)))
    assert [h.base_offset for h in got] == [4, 6]
    # KIP-74: the first batch comes back even if bigger than max_bytes
    assert [h.base_offset for h in split_batches(joined(log.read(5, 1, 60)))] == [4]
    assert log.read(5, 1, 60, min_one=False) == []
    # the high watermark bound: base offsets below max_offset only
    got = split_batches(joined(log.read(0, 1 << 20, 7)))
    assert [h.base_offset for h in got] == [0, 2, 4, 6]
    assert log.read(8, 1 << 20, 8) == []
    # spanning segments returns every batch, in order, whole
    got = split_batches(joined(log.read(0, 1 << 20, 60)))
    assert [h.base_offset for h in got] == list(range(0, 60, 2))
    assert len(log.segment_base_offsets()) > 3
    # end of log: empty; out of range: error
    assert log.read(60, 100, 60) == []
    with pytest.raises(OffsetOutOfRange):
        log.read(61, 100, 100)
    log.delete_records(10)
    with pytest.raises(OffsetOutOfRange):
        log.read(9, 100, 100)
    assert split_batches(joined(log.read(10, 1, 60)))[0].base_offset == 10
    log.close()


def test_read_regions_are_sendfile_ready(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 5)
    regions = log.read(0, 1 << 20, 100)
    assert all(isinstance(r, FileRegion) for r in regions)
    a, b = socket.socketpair()
    try:
        for region in regions:
            sent = 0
            while sent < region.length:
                sent += os.sendfile(
                    a.fileno(), region.fd, region.position + sent, region.length - sent
                )
        a.shutdown(socket.SHUT_WR)
        received = b"".join(iter(lambda: b.recv(65536), b""))
    finally:
        a.close()
        b.close()
    assert received == joined(regions)
    log.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 300)), min_size=1, max_size=40),
    queries=st.lists(
        st.tuples(st.integers(0, 200), st.integers(-10, 3000), st.integers(0, 210), st.booleans()),
        max_size=20,
    ),
    interval=st.sampled_from([0, 64, 4096]),
)
def test_read_matches_the_memory_model(tmp_path_factory, sizes, queries, interval) -> None:
    config = LogConfig(segment_bytes=900, index_interval_bytes=interval, retention_ms=None)
    log = PartitionLog.open(tmp_path_factory.mktemp("p") / "t-0", config)
    model = MemoryLog(config)
    for i, (n, size) in enumerate(sizes):
        log.append(batch(n, size, ts=i, tag=i), now_ms=i)
        model.append(batch(n, size, ts=i, tag=i), now_ms=i)
    assert log.segment_base_offsets() == model.segment_base_offsets()
    end = log.log_end_offset
    for start, max_bytes, max_offset, min_one in queries:
        start = min(start, end)
        assert joined(log.read(start, max_bytes, max_offset, min_one=min_one)) == joined(
            model.read(start, max_bytes, max_offset, min_one=min_one)
        )
    for ts in range(-1, len(sizes) + 1):
        assert log.offset_for_timestamp(ts) == model.offset_for_timestamp(ts)
    log.close()


def test_offset_for_timestamp_with_unordered_timestamps(logdir: Path) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=600, index_interval_bytes=0))
    model = MemoryLog()
    stamps = [50, 10, 70, 20, 90, 30, 90, 100, 5]
    for ts in stamps:
        log.append(batch(1, 50, ts=ts), now_ms=0)
        model.append(batch(1, 50, ts=ts), now_ms=0)
    for target in range(0, 110, 5):
        assert log.offset_for_timestamp(target) == model.offset_for_timestamp(target), target
    assert log.offset_for_timestamp(70) == (2, 70)
    assert log.offset_for_timestamp(101) is None
    log.close()
    reopened = PartitionLog.open(logdir, LogConfig(segment_bytes=600, index_interval_bytes=0))
    for target in range(0, 110, 5):
        assert reopened.offset_for_timestamp(target) == model.offset_for_timestamp(target)
    reopened.close()


def test_header_helpers(logdir: Path) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=700, index_interval_bytes=100))
    fill(log, 40, n=3)
    headers = list(log.iter_batch_headers(31))
    assert [off for off, _ in headers] == list(range(30, 120, 3))
    assert all(len(h) == batch_header.HEADER_SIZE for _, h in headers)
    last = log.last_batches(5)
    assert [off for off, _ in last] == list(range(105, 120, 3))
    assert batch_header.unpack_header(last[-1][1]).record_count == 3
    assert len(log.last_batches(1000)) == 40
    log.close()


# ---------------------------------------------------------------- segments and indexes


def test_segments_roll_by_size_and_age(logdir: Path) -> None:
    config = LogConfig(segment_bytes=1000, segment_ms=100, index_interval_bytes=100)
    log = PartitionLog.open(logdir, config)
    log.append(batch(1, 500, ts=0), now_ms=0)
    log.append(batch(1, 500, ts=0), now_ms=1)
    assert log.segment_base_offsets() == [0, 1]  # size: 2 x ~570 B > 1000 B
    log.append(batch(1, 10, ts=50), now_ms=50)
    assert log.segment_base_offsets() == [0, 1]
    log.append(batch(1, 10, ts=200), now_ms=200)  # age: first batch of segment 1 is at t=0
    assert log.segment_base_offsets() == [0, 1, 3]
    # a batch bigger than a segment still goes in (alone)
    log.append(batch(1, 5000), now_ms=200)
    assert log.segment_base_offsets() == [0, 1, 3, 4]
    log.flush()
    names = sorted(os.listdir(logdir))
    for base in (0, 1, 3):
        for suffix in (".log", ".index", ".timeindex"):
            assert f"{base:020d}{suffix}" in names
    log.close()


def test_sparse_index_entries_every_interval(logdir: Path) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=1 << 20, index_interval_bytes=1000))
    results = fill(log, 100, n=1, size=200)  # ~270 B each
    log.close()
    entries = (logdir / f"{0:020d}.index").read_bytes()
    pairs = [struct.unpack_from(">II", entries, i) for i in range(0, len(entries), 8)]
    by_pos = {r.position: r.base_offset for r in results}
    assert 20 <= len(pairs) <= 30
    for rel, pos in pairs:
        assert by_pos[pos] == rel
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(pairs)]
    assert all(1000 <= g < 1000 + 300 for g in gaps)


# ---------------------------------------------------------------- durability and recovery


def test_flush_reports_durable_end_and_survives_concurrent_appends(logdir: Path) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=5000, index_interval_bytes=200))
    assert log.durable_end_offset == 0
    stop = threading.Event()
    observed: list[tuple[int, int]] = []

    def flusher() -> None:
        while not stop.is_set():
            before = log.log_end_offset
            durable = log.flush()
            observed.append((before, durable))

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for i in range(400):
            log.append(batch(2, 30, tag=i), now_ms=i)
            assert log.durable_end_offset <= log.log_end_offset
    finally:
        stop.set()
        thread.join()
    assert all(before <= durable for before, durable in observed)
    assert log.flush() == log.log_end_offset == 800
    log.abort()
    reopened = PartitionLog.open(logdir, LogConfig(segment_bytes=5000, index_interval_bytes=200))
    assert reopened.log_end_offset == 800
    assert len(split_batches(joined(reopened.read(0, 1 << 30, 800)))) == 400
    reopened.close()


def test_clean_shutdown_skips_the_scan(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 30)
    log.close()
    assert (logdir / CLEAN_SHUTDOWN_MARKER).exists()
    reopened = PartitionLog.open(logdir, SMALL)
    assert reopened.recovery.clean and reopened.recovery.segments_scanned == 0
    assert not (logdir / CLEAN_SHUTDOWN_MARKER).exists()  # a crash from now on must scan
    assert reopened.log_end_offset == 60
    fill(reopened, 5)
    assert [h.base_offset for h in split_batches(joined(reopened.read(0, 1 << 20, 100)))] == list(
        range(0, 70, 2)
    )
    reopened.close()


def test_a_marker_that_does_not_match_the_files_is_ignored(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 3)
    log.close()
    active = logdir / f"{0:020d}.log"
    with open(active, "ab") as f:
        f.write(b"\x00" * 30)  # written after the marker: the marker is stale
    reopened = PartitionLog.open(logdir, SMALL)
    assert not reopened.recovery.clean
    assert reopened.log_end_offset == 6
    assert active.stat().st_size == reopened.size_bytes
    reopened.close()


def _crash_and_reopen(log: PartitionLog, config: LogConfig = SMALL) -> PartitionLog:
    directory = log.directory
    log.abort()
    return PartitionLog.open(directory, config)


@pytest.mark.parametrize(
    "damage",
    ["cut_mid_batch", "cut_mid_header", "garbage", "zeros", "flip_crc_area", "flip_offset"],
)
def test_recovery_truncates_a_damaged_tail(logdir: Path, damage: str) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=1 << 20, index_interval_bytes=100))
    results = fill(log, 10)
    log.flush()
    path = logdir / f"{0:020d}.log"
    last = results[-1]
    data = bytearray(path.read_bytes())
    if damage == "cut_mid_batch":
        data = data[: last.position + last.size - 5]
    elif damage == "cut_mid_header":
        data = data[: last.position + 30]
    elif damage == "garbage":
        data += os.urandom(100)
    elif damage == "zeros":
        data += bytes(4096)
    elif damage == "flip_crc_area":
        data[last.position + 70] ^= 0x40
    elif damage == "flip_offset":
        data[last.position + 7] ^= 0x01
    path.write_bytes(data)
    log.abort()
    reopened = PartitionLog.open(logdir, LogConfig(segment_bytes=1 << 20, index_interval_bytes=100))
    expected_end = 20 if damage in ("garbage", "zeros") else 18
    assert reopened.log_end_offset == expected_end
    assert not reopened.recovery.clean
    assert path.stat().st_size == reopened.size_bytes
    assert len(split_batches(joined(reopened.read(0, 1 << 20, 100)))) == expected_end // 2
    # the log continues where the valid data ends
    assert reopened.append(batch(), now_ms=0).base_offset == expected_end
    reopened.close()


def test_corruption_in_a_middle_segment_drops_everything_after(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 30)
    bases = log.segment_base_offsets()
    log.abort()  # no flush, no recovery point: every segment is scanned
    (logdir / RECOVERY_POINT_CHECKPOINT).unlink(missing_ok=True)
    second = logdir / f"{bases[1]:020d}.log"
    data = bytearray(second.read_bytes())
    data[batch_header.unpack_header(data).size + 70] ^= 0xFF  # inside its second batch
    second.write_bytes(data)
    reopened = PartitionLog.open(logdir, SMALL)
    assert reopened.segment_base_offsets() == bases[:2]
    assert reopened.recovery.segments_dropped == len(bases) - 2
    assert bases[1] <= reopened.log_end_offset < bases[2]
    for base in bases[2:]:
        assert not (logdir / f"{base:020d}.log").exists()
    reopened.close()


def test_recovery_point_limits_the_scan(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 40)
    log.flush()
    segments = len(log.segment_base_offsets())
    assert int((logdir / RECOVERY_POINT_CHECKPOINT).read_text()) == log.segment_base_offsets()[-1]
    reopened = _crash_and_reopen(log)
    assert reopened.recovery.segments_scanned == 1
    assert len(reopened.segment_base_offsets()) == segments
    assert reopened.log_end_offset == 80
    reopened.close()


def test_missing_or_damaged_indexes_are_rebuilt(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    model = MemoryLog(SMALL)
    fill(log, 40)
    fill(model, 40)
    bases = log.segment_base_offsets()
    log.close()
    (logdir / f"{bases[0]:020d}.index").unlink()
    with open(logdir / f"{bases[1]:020d}.index", "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"\xff" * 8)  # an entry pointing past the segment
    (logdir / f"{bases[2]:020d}.timeindex").unlink()
    reopened = PartitionLog.open(logdir, SMALL)
    assert not reopened.recovery.clean
    assert reopened.log_end_offset == 80
    for start in range(0, 80, 3):
        assert joined(reopened.read(start, 700, 100)) == joined(model.read(start, 700, 100))
    reopened.close()
    assert (logdir / f"{bases[0]:020d}.index").exists()


def simulate_power_loss(log: PartitionLog) -> None:
    """Drop everything not known durable: cut files, remove undurable ones."""
    durable = log.durable_state()
    directory = log.directory
    log.abort()
    for name in os.listdir(directory):
        if name not in durable:
            os.unlink(directory / name)
        else:
            os.truncate(directory / name, durable[name])


def test_valid_prefix_matches_scan(logdir: Path) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=1 << 20))
    fill(log, 5)
    log.close()
    data = (logdir / f"{0:020d}.log").read_bytes()
    assert valid_prefix(data, 0) == (len(data), 10)
    assert valid_prefix(data + b"\x01" * 70, 0) == (len(data), 10)
    assert valid_prefix(data, 1) == (0, 1)


def test_start_beyond_recovered_end_restarts_the_log_empty(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 10)
    log.flush()
    fill(log, 10, now=5_000)
    log.delete_records(30)  # persisted at once, but offsets 20..39 are not durable
    simulate_power_loss(log)
    reopened = PartitionLog.open(logdir, SMALL)
    # whatever survived ends below 30, so the log restarts empty at 30
    assert reopened.log_start_offset == reopened.log_end_offset == 30
    assert reopened.segment_base_offsets() == [30]
    assert reopened.append(batch(), now_ms=0).base_offset == 30
    reopened.close()


def test_power_loss_keeps_exactly_the_durable_prefix(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 25)
    durable = log.flush()
    expected = joined(log.read(0, 1 << 20, durable))
    fill(log, 25, now=9_000)
    simulate_power_loss(log)
    reopened = PartitionLog.open(logdir, SMALL)
    assert reopened.log_end_offset == durable
    assert joined(reopened.read(0, 1 << 20, durable)) == expected
    reopened.close()


# ---------------------------------------------------------------- retention


def test_retention_by_time_keeps_the_active_segment(logdir: Path) -> None:
    config = LogConfig(segment_bytes=600, index_interval_bytes=100, retention_ms=1000)
    log = PartitionLog.open(logdir, config)
    for i in range(20):
        log.append(batch(1, 200, ts=i * 100), now_ms=i * 100)
    bases = log.segment_base_offsets()
    assert log.apply_retention(now_ms=1500) > 0
    # every remaining sealed segment holds a timestamp within retention
    assert log.log_start_offset == log.segment_base_offsets()[0] > 0
    sealed = len(log.segment_base_offsets()) - 1
    assert log.apply_retention(now_ms=10**9) == sealed
    assert log.segment_base_offsets() == bases[-1:]
    assert log.log_start_offset == bases[-1]
    for base in bases[:-1]:
        assert not (logdir / f"{base:020d}.log").exists()
    log.close()
    reopened = PartitionLog.open(logdir, config)
    assert reopened.log_start_offset == bases[-1]
    reopened.close()


@pytest.mark.parametrize("storage", ["file", "memory"])
def test_retention_deletes_nothing_above_the_high_watermark(logdir: Path, storage: str) -> None:
    """Kafka's deletableSegments: a segment goes only once it lies wholly below the
    replica's high watermark, whatever retention.bytes or retention.ms say: a leader
    must not delete records its followers may not have copied yet."""
    config = LogConfig(
        segment_bytes=600, index_interval_bytes=100, retention_ms=1000, retention_bytes=600
    )
    log = PartitionLog.open(logdir, config) if storage == "file" else MemoryLog(config)
    for i in range(20):
        log.append(batch(1, 200, ts=i * 100), now_ms=i * 100)
    bases = log.segment_base_offsets()
    assert len(bases) > 4
    high_watermark = bases[2]  # the first two segments are committed, the rest not yet
    assert log.apply_retention(now_ms=10**9, high_watermark=high_watermark) == 2
    assert log.segment_base_offsets() == bases[2:]
    assert log.log_start_offset == high_watermark
    # Once the high watermark moves on, the same rules delete the rest but the active one.
    assert log.apply_retention(now_ms=10**9, high_watermark=log.log_end_offset) == len(bases) - 3
    assert log.segment_base_offsets() == bases[-1:]
    log.close()


def test_retention_by_size(logdir: Path) -> None:
    config = LogConfig(
        segment_bytes=1000, index_interval_bytes=100, retention_ms=None, retention_bytes=2500
    )
    log = PartitionLog.open(logdir, config)
    model = MemoryLog(config)
    for i in range(40):
        log.append(batch(1, 100, tag=i), now_ms=i)
        model.append(batch(1, 100, tag=i), now_ms=i)
    deleted = log.apply_retention(now_ms=100)
    assert deleted == model.apply_retention(now_ms=100) > 0
    assert log.size_bytes >= 2500
    assert log.size_bytes - 1000 < 2500
    assert log.log_start_offset == model.log_start_offset
    log.close()


def test_delete_records_and_log_start_retention(logdir: Path) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 30)
    with pytest.raises(OffsetOutOfRange):
        log.delete_records(61)
    assert log.delete_records(25) == 25
    assert log.delete_records(3) == 25  # never moves back
    assert int((logdir / LOG_START_CHECKPOINT).read_text()) == 25
    first_segments = log.segment_base_offsets()
    log.apply_retention(now_ms=0)
    assert log.segment_base_offsets()[0] <= 25 < log.segment_base_offsets()[1]
    assert len(log.segment_base_offsets()) < len(first_segments)
    assert log.log_start_offset == 25
    log.abort()
    reopened = PartitionLog.open(logdir, SMALL)
    assert reopened.log_start_offset == 25
    assert split_batches(joined(reopened.read(25, 1, 100)))[0].base_offset == 24
    reopened.close()


def test_regions_stay_readable_after_their_segment_is_deleted(logdir: Path) -> None:
    config = LogConfig(segment_bytes=600, retention_ms=None, file_delete_delay_ms=1000)
    log = PartitionLog.open(logdir, config)
    fill(log, 20)
    regions = log.read(0, 100, 100)
    before = joined(regions)
    log.delete_records(log.segment_base_offsets()[2])
    assert log.apply_retention(now_ms=0) == 2
    assert joined(regions) == before  # unlinked, but the descriptor is still open
    log.apply_retention(now_ms=999)
    assert joined(regions) == before
    log.apply_retention(now_ms=1000)
    with pytest.raises(OSError):
        regions[0].read_bytes()
    log.close()


# ---------------------------------------------------------------- disk errors


def _failing(real, exc: OSError, *, after: int = 0):
    calls = {"n": 0}

    def fn(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after:
            raise exc
        return real(*args, **kwargs)

    return fn


def test_enospc_on_append_takes_the_partition_offline(
    logdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 3)
    log.flush()
    size_before = log.size_bytes
    monkeypatch.setattr(os, "write", _failing(os.write, OSError(errno.ENOSPC, "full")))
    with pytest.raises(StorageError):
        log.append(batch(), now_ms=0)
    monkeypatch.undo()
    assert log.offline
    assert log.log_end_offset == 6
    with pytest.raises(StorageError):
        log.append(batch(), now_ms=0)
    with pytest.raises(StorageError):
        log.flush()
    # durable data is still served
    assert len(split_batches(joined(log.read(0, 1 << 20, 6)))) == 3
    assert (logdir / f"{0:020d}.log").stat().st_size == size_before
    log.close()
    reopened = PartitionLog.open(logdir, SMALL)
    assert reopened.log_end_offset == 6 and not reopened.offline
    reopened.close()


def test_a_short_write_is_cut_back(logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 2)
    real_write = os.write

    def half(fd: int, data) -> int:  # the disk fills up halfway through the batch
        return real_write(fd, memoryview(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(StorageError):
        log.append(batch(3, 100), now_ms=0)
    monkeypatch.undo()
    assert (logdir / f"{0:020d}.log").stat().st_size == log.size_bytes
    log.abort()
    assert PartitionLog.open(logdir, SMALL).log_end_offset == 4


def test_eio_on_fsync_keeps_the_durable_end(logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(logdir, SMALL)
    fill(log, 2)
    assert log.flush() == 4
    fill(log, 2)
    monkeypatch.setattr(os, "fdatasync", _failing(os.fdatasync, OSError(errno.EIO, "io")))
    with pytest.raises(StorageError):
        log.flush()
    monkeypatch.undo()
    assert log.offline and log.durable_end_offset == 4
    with pytest.raises(StorageError):
        log.append(batch(), now_ms=0)
    assert len(split_batches(joined(log.read(0, 1 << 20, 4)))) == 2
    log.close()


def test_enospc_while_rolling(logdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(logdir, LogConfig(segment_bytes=300))
    log.append(batch(1, 200), now_ms=0)
    real_open = os.open

    def no_new_files(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "full")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_new_files)
    with pytest.raises(StorageError):
        log.append(batch(1, 200), now_ms=0)
    monkeypatch.undo()
    assert log.offline and log.log_end_offset == 1
    log.abort()


def test_test_batches_decode_with_the_protocol_codec() -> None:
    """The batch_header helpers and trio_broker.protocol.records agree on the format."""
    from trio_broker.protocol.records import RecordBatchView

    buf = build_batch([(b"a", b"v1"), (b"b", None), (None, b"v333")], base_timestamp=1234)
    view = RecordBatchView(buf)
    view.validate()
    assert [(r.key, r.value) for r in view.records()] == [
        (b"a", b"v1"),
        (b"b", None),
        (None, b"v333"),
    ]
    assert view.max_timestamp == 1234 and view.last_offset_delta == 2
    batch_header.set_log_append_time(buf, 99)
    RecordBatchView(buf).validate()
    assert RecordBatchView(buf).timestamp_type == 1


def test_config_from_kafka_topic_configs() -> None:
    config = log_config(
        {
            "segment.bytes": "1000",
            "retention.ms": "-1",
            "retention.bytes": "5000",
            "cleanup.policy": "delete",
        }
    )
    assert config.segment_bytes == 1000
    assert config.retention_ms is None and config.retention_bytes == 5000
    assert config.segment_ms == LogConfig().segment_ms
    assert config.max_index_entries >= 1000 // 4096 + 1
    with pytest.raises(ValueError):
        LogConfig(segment_bytes=1 << 31)


def test_memory_log_open_and_regions() -> None:
    log = MemoryLog.open(None, LogConfig(retention_ms=None))
    log.append(batch(2), now_ms=0)
    regions = log.read(0, 10, 2)
    assert regions[0].length == len(regions[0].read_bytes()) > 10  # KIP-74
    assert log.flush() == log.durable_end_offset == 2
    log.close()
    assert log.closed
    with pytest.raises(StorageError):
        log.append(batch(), now_ms=0)


def test_a_trusted_segment_that_becomes_active_again_is_scanned_later(logdir: Path) -> None:
    config = LogConfig(segment_bytes=400, index_interval_bytes=0, retention_ms=None)
    log = PartitionLog.open(logdir, config)
    fill(log, 6)  # a few sealed segments
    log.roll(0)  # an empty active segment
    log.flush()  # recovery point = the empty active segment
    bases = log.segment_base_offsets()
    log.abort()
    # crash: the empty active segment is dropped; the last sealed one is active again
    reopened = PartitionLog.open(logdir, config)
    assert reopened.segment_base_offsets() == bases[:-1]
    assert int((logdir / RECOVERY_POINT_CHECKPOINT).read_text()) <= bases[-2]
    end = reopened.log_end_offset
    reopened.append(batch(1, 5), now_ms=0)  # lands in the reactivated segment, not synced
    path = logdir / f"{bases[-2]:020d}.log"
    reopened.abort()
    with open(path, "r+b") as f:  # its unsynced tail is torn
        f.truncate(path.stat().st_size - 3)
    again = PartitionLog.open(logdir, config)
    assert again.log_end_offset == end  # scanned and cut, not trusted blindly
    again.close()
