"""Producer state snapshot files beside a log (storage/log_snapshots.py): written by the
flush that makes every offset below them durable, bounded in number, gone with the
segments below the log start and, on request, above a truncation point."""

from __future__ import annotations

from pathlib import Path

from trio_broker.protocol.records import build_batch
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.log_snapshots import PRODUCER_SNAPSHOTS_KEPT, snapshot_path

T0 = 1_000


def plain(log: PartitionLog, count: int = 1) -> None:
    for _ in range(count):
        log.append(build_batch([(None, b"x" * 100)]), now_ms=T0)


def test_a_staged_snapshot_waits_for_the_flush_that_covers_it(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0")
    plain(log, 3)
    log.stage_producer_snapshot(5, b"five")
    log.flush()  # durable up to 3: a crash could still lose offsets 3 and 4
    assert log.producer_snapshot_offsets() == []
    assert "00000000000000000005.snapshot" not in log.durable_state()
    plain(log, 2)
    log.flush()
    assert log.producer_snapshot_offsets() == [5]
    assert log.read_producer_snapshot(5) == b"five"
    assert log.durable_state()["00000000000000000005.snapshot"] == 4
    log.close()


def test_snapshots_are_bounded_and_go_below_the_log_start(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=300))
    for _ in range(PRODUCER_SNAPSHOTS_KEPT + 2):
        plain(log, 2)
        log.stage_producer_snapshot(log.log_end_offset, b"%d" % log.log_end_offset)
        log.flush()
    assert log.producer_snapshot_offsets() == [6, 8, 10][-PRODUCER_SNAPSHOTS_KEPT:]
    log.delete_records(7)
    assert log.apply_retention(T0) > 0  # segments wholly below 7 go, and snapshot 6
    assert log.producer_snapshot_offsets() == [8, 10]
    log.close()


def test_snapshots_above_a_truncation_point_are_deleted(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0")
    plain(log, 6)
    for offset in (2, 4, 6):
        snapshot_path(log.directory, offset).write_bytes(b"s")
    log.stage_producer_snapshot(6, b"staged")
    log.delete_producer_snapshots(above=4)
    log.flush()  # the staged one is gone too
    assert log.producer_snapshot_offsets() == [2, 4]
    log.delete_producer_snapshots()
    assert log.producer_snapshot_offsets() == []
    log.close()
