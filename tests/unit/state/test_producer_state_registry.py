"""The producer-state shell: registry bookkeeping, statistics, expiry timing, snapshots on
disk, the id-block file, InitProducerId decisions at their edges, and the messages an
operator reads. ``test_producer_state.py`` covers the sequence rules themselves.

Everything runs on real logs (``PartitionLog`` in a temporary directory, ``MemoryLog``)
and a real, unstarted ``Broker`` for ``attached_to``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.state.test_producer_state import duplicate_offset, error_of
from trio_broker.config import BrokerConfig
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.producers import (
    EXPIRATION_CHECK_INTERVAL_MS,
    PRODUCER_ID_FILE,
    SNAPSHOT_FILE,
    ProducerIdAllocator,
    ProducerStateRegistry,
    ProducerStateStatistics,
    latest_snapshot,
    log_directory,
    read_batch_headers,
)
from trio_broker.state.producer import (
    MAX_PRODUCER_EPOCH,
    Append,
    BatchMetadata,
    Duplicate,
    ProducerStateEntry,
    ProducerStateManager,
    Reject,
    SnapshotError,
    check_append,
    decide_init_producer_id,
)
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.log_snapshots import snapshot_path
from trio_broker.storage.memory import MemoryLog

OOO = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
FENCED = ErrorCode.INVALID_PRODUCER_EPOCH
T0 = 10_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(pid: int, epoch: int, seq: int, count: int = 1, timestamp: int = T0) -> bytearray:
    return build_batch(
        [(None, b"v%d" % i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp=timestamp,
    )


def produce(
    registry: ProducerStateRegistry, log: Any, raw: bytearray, topic: str = "t", part: int = 0
) -> Any:
    """The broker's produce path: check; on Append, append to the log and record it."""
    view = RecordBatchView(raw)
    verdict = registry.check(topic, part, log, view)
    if isinstance(verdict, Append):
        result = log.append(raw, now_ms=T0)
        registry.record_append(topic, part, view, result.base_offset, result.last_offset)
        return result.base_offset
    return verdict


# ------------------------------------------------------------------ messages operators read


def test_reject_messages_name_the_numbers() -> None:
    entry = ProducerStateEntry(3, (BatchMetadata(0, 4, 100, 104, T0),))
    fenced = check_append(entry, 2, 5, 5)
    assert fenced == Reject(FENCED, "producer epoch 2 is older than the partition's epoch 3")
    new_epoch = check_append(entry, 4, 7, 7)
    assert new_epoch == Reject(OOO, "new producer epoch 4 must start at sequence 0, not 7")
    gap = check_append(entry, 3, 9, 9)
    assert gap == Reject(OOO, "sequence 9 is out of order: expected 5")


def test_entry_size_error_message() -> None:
    with pytest.raises(ValueError, match=r"^a producer entry holds 1 to 5 batches, not 0$"):
        ProducerStateEntry(0, ())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"version": 7, "next_offset": 0, "producers": []}', "unknown snapshot version 7"),
        (
            b'{"version": 1, "next_offset": 0, "producers": [["x", 0, [[0, 0, 0, 0, 0]]]]}',
            "producer id and epoch must be integers",
        ),
        (
            b'{"version": 1, "next_offset": 0, "producers": [[4, 0, []]]}',
            "producer 4 has 0 batches",
        ),
        (b'{"version": 1, "next_offset": -3, "producers": []}', "bad next offset -3"),
        (b'{"version": 1, "next_offset": "7", "producers": []}', "bad next offset '7'"),
        (b'{"version": 1, "producers": []}', "unreadable producer state snapshot: 'next_offset'"),
    ],
)
def test_snapshot_error_messages(data: bytes, message: str) -> None:
    with pytest.raises(SnapshotError, match=f"^{re.escape(message)}$"):
        ProducerStateManager.from_snapshot(data)


def test_snapshot_bytes_are_compact_json() -> None:
    manager = ProducerStateManager(next_offset=0)
    manager.append(5, 0, 0, 2, 0, 2, 1234)
    manager.append(2, 1, 7, 7, 3, 3, 99)
    assert manager.to_snapshot() == (
        b'{"version":4,"next_offset":4,"producers":[[2,1,[[7,7,3,3,99]]],[5,0,[[0,2,0,2,1234]]]],'
        b'"txns":{"ongoing":[],"aborted":[],"markers":[]}}'
    )
    assert ProducerStateManager.from_snapshot(manager.to_snapshot()).producers == manager.producers


def test_version_1_snapshot_still_loads_without_transactions() -> None:
    old = b'{"version":1,"next_offset":4,"producers":[[2,1,[[7,7,3,3,99]]]]}'
    loaded = ProducerStateManager.from_snapshot(old)
    assert loaded.next_offset == 4 and list(loaded.producers) == [2]
    assert loaded.txns.ongoing == {} and loaded.txns.aborted == []


# ------------------------------------------------------------------ InitProducerId edges


def test_init_producer_id_edges() -> None:
    refused = decide_init_producer_id(-1, 0, 10)
    assert (refused.error_code, refused.producer_id, refused.epoch) == (
        ErrorCode.INVALID_REQUEST,
        -1,
        -1,
    )
    # Producer id 0 and epoch 0 are real: the first id a fresh broker hands out.
    first = decide_init_producer_id(0, 0, 1)
    assert (first.error_code, first.producer_id, first.epoch) == (ErrorCode.NONE, 0, 1)
    never_issued = decide_init_producer_id(1, 0, 1)
    assert (never_issued.error_code, never_issued.producer_id, never_issued.epoch) == (
        ErrorCode.NONE,
        None,
        0,
    )
    top = decide_init_producer_id(0, MAX_PRODUCER_EPOCH, 1)
    assert (top.error_code, top.producer_id, top.epoch) == (ErrorCode.NONE, None, 0)


# ------------------------------------------------------------------ the id block file


def test_memory_allocator_counts_past_any_block(tmp_path: Path) -> None:
    allocator = ProducerIdAllocator(None, block_size=10)
    assert [allocator.allocate() for _ in range(300)] == list(range(300))
    assert allocator.issued_below == 300
    assert list(tmp_path.iterdir()) == []


def test_block_file_starting_at_zero_is_valid(tmp_path: Path) -> None:
    path = tmp_path / PRODUCER_ID_FILE
    path.write_text('{"next_block_start": 0}')
    allocator = ProducerIdAllocator(path, block_size=4)
    assert allocator.issued_below == 0
    assert allocator.allocate() == 0
    assert json.loads(path.read_text()) == {"next_block_start": 4}
    assert allocator.issued_below == 4


def test_block_file_errors_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / PRODUCER_ID_FILE
    path.write_text('{"next_block_start": -5}')
    with pytest.raises(
        SnapshotError, match=f"^{re.escape(str(path))}: negative producer id block -5$"
    ):
        ProducerIdAllocator(path).allocate()
    path.write_text("{}")
    with pytest.raises(
        SnapshotError,
        match=f"^{re.escape(str(path))}: unreadable producer id block: 'next_block_start'$",
    ):
        ProducerIdAllocator(path).allocate()


def test_registry_reserves_ids_in_its_data_dir(tmp_path: Path) -> None:
    registry = ProducerStateRegistry(tmp_path, Clock())
    assert registry.data_dir == tmp_path
    assert [registry.allocator.allocate() for _ in range(3)] == [0, 1, 2]
    assert json.loads((tmp_path / PRODUCER_ID_FILE).read_text())["next_block_start"] == 1000
    again = ProducerStateRegistry(tmp_path, Clock())
    assert again.allocator.allocate() == 1000


def test_memory_registry_writes_no_id_file(tmp_path: Path) -> None:
    registry = ProducerStateRegistry(None, Clock())
    assert registry.data_dir is None
    assert registry.allocator.path is None
    assert registry.allocator.allocate() == 0


# ------------------------------------------------------------------ registry bookkeeping


def test_producer_id_zero_through_the_registry() -> None:
    registry = ProducerStateRegistry(None, Clock())
    log = MemoryLog()
    assert produce(registry, log, batch(0, 0, 0, 2)) == 0
    assert duplicate_offset(produce(registry, log, batch(0, 0, 0, 2))) == 0
    assert error_of(produce(registry, log, batch(0, 0, 5))) == OOO
    assert produce(registry, log, batch(0, 0, 2)) == 2
    stats = registry.statistics()
    assert (stats.appended, stats.duplicates, stats.rejected) == (2, 1, {OOO: 1})


def test_statistics_count_every_verdict() -> None:
    registry = ProducerStateRegistry(None, Clock())
    log = MemoryLog()
    assert registry.statistics() == ProducerStateStatistics()
    for seq in range(3):
        produce(registry, log, batch(5, 1, seq))
    produce(registry, log, batch(5, 1, 1))  # duplicate
    produce(registry, log, batch(5, 1, 2))  # duplicate
    produce(registry, log, batch(5, 1, 9))  # gap
    produce(registry, log, batch(5, 1, 8))  # gap
    produce(registry, log, batch(5, 0, 3))  # fenced
    produce(registry, log, build_batch([(None, b"plain")], base_timestamp=T0))  # not counted
    produce(registry, MemoryLog(), batch(6, 0, 0), topic="u")  # another partition
    stats = registry.statistics()
    assert stats == ProducerStateStatistics(
        appended=4, duplicates=2, rejected={OOO: 2, FENCED: 1}, partitions_loaded=2
    )
    # A copy: changing it changes nothing inside.
    stats.rejected[OOO] = 99
    assert registry.statistics().rejected == {OOO: 2, FENCED: 1}


def test_a_partition_is_loaded_once_per_log() -> None:
    registry = ProducerStateRegistry(None, Clock())
    log = MemoryLog()
    for seq in range(4):
        produce(registry, log, batch(5, 0, seq))
    assert registry.statistics().partitions_loaded == 1
    produce(registry, MemoryLog(), batch(5, 0, 0))  # recreated topic: a new log
    assert registry.statistics().partitions_loaded == 2


def test_duplicate_in_the_same_run_gets_the_recorded_offsets() -> None:
    registry = ProducerStateRegistry(None, Clock())
    log = MemoryLog()
    produce(registry, log, build_batch([(None, b"x")] * 3, base_timestamp=T0))
    assert produce(registry, log, batch(5, 0, 0, 2)) == 3
    verdict = produce(registry, log, batch(5, 0, 0, 2))
    assert isinstance(verdict, Duplicate)
    assert (verdict.batch.first_offset, verdict.batch.last_offset) == (3, 4)


def test_record_append_without_check_is_a_broker_bug() -> None:
    registry = ProducerStateRegistry(None, Clock())
    view = RecordBatchView(batch(5, 0, 0))
    with pytest.raises(RuntimeError, match=r"^no producer state for t-3$"):
        registry.record_append("t", 3, view, 0, 0)
    # Non-idempotent batches need no state at all.
    plain = RecordBatchView(build_batch([(None, b"x")], base_timestamp=T0))
    registry.record_append("t", 3, plain, 0, 0)
    assert registry.statistics().appended == 0


# ------------------------------------------------------------------ expiry timing


def test_expiry_runs_only_every_check_interval() -> None:
    clock = Clock()
    registry = ProducerStateRegistry(None, clock, expiration_ms=1_000)
    log = MemoryLog()
    produce(registry, log, batch(5, 0, 0))
    # Silent longer than the expiration, but the first check is an interval away.
    clock.now = T0 + 5_000
    assert error_of(produce(registry, log, batch(5, 0, 40))) == OOO
    # Exactly at the check: producer 5 (last batch at T0) is forgotten.
    clock.now = T0 + EXPIRATION_CHECK_INTERVAL_MS
    assert produce(registry, log, batch(5, 0, 40)) == 1
    # The next check is a whole interval later: an old producer survives until then.
    produce(registry, log, batch(8, 0, 0))
    clock.now += 1
    assert error_of(produce(registry, log, batch(8, 0, 5))) == OOO
    clock.now += 5_000
    assert error_of(produce(registry, log, batch(8, 0, 6))) == OOO
    clock.now = T0 + 2 * EXPIRATION_CHECK_INTERVAL_MS
    assert produce(registry, log, batch(8, 0, 7)) == 3


def test_the_first_expiry_check_is_an_interval_after_start(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0")
    log.append(batch(5, 0, 0), now_ms=T0)
    clock = Clock()
    registry = ProducerStateRegistry(None, clock, expiration_ms=1_000)
    registry.manager("t", 0, log)  # loaded at T0: producer 5 is fresh
    clock.now = T0 + 5_000  # silent too long, but no check is due yet
    assert error_of(produce(registry, log, batch(5, 0, 40))) == OOO
    log.close()


# ------------------------------------------------------------------ snapshots on disk


def open_log(tmp_path: Path) -> PartitionLog:
    return PartitionLog.open(tmp_path / "t-0")


def test_a_snapshot_ending_at_the_log_end_is_trusted(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, Clock())
    produce(registry, log, batch(5, 0, 0))
    log.close()
    # A snapshot that covers the log exactly is used as it is, not rebuilt: it names a
    # producer the log does not hold, and that producer's batch is then a duplicate.
    told = ProducerStateManager(next_offset=1)
    told.append(9, 0, 0, 0, 0, 0, T0)
    (tmp_path / "t-0" / SNAPSHOT_FILE).write_bytes(told.to_snapshot())
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, Clock())
    assert duplicate_offset(produce(registry, log, batch(9, 0, 0))) == 0
    log.close()


def test_replay_after_the_snapshot_takes_multi_record_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, Clock())
    produce(registry, log, batch(5, 0, 0, 3))  # offsets 0-2
    registry.close()  # snapshot covers offsets < 3
    registry = ProducerStateRegistry(tmp_path, Clock())
    assert produce(registry, log, batch(5, 0, 3, 3)) == 3  # offsets 3-5, after the snapshot
    assert produce(registry, log, batch(6, 0, 0, 4)) == 6  # offsets 6-9
    log.abort()
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, Clock())
    assert duplicate_offset(produce(registry, log, batch(5, 0, 3, 3))) == 3
    assert duplicate_offset(produce(registry, log, batch(6, 0, 0, 4))) == 6
    assert produce(registry, log, batch(5, 0, 6)) == 10
    log.close()


def test_an_unusable_snapshot_is_logged_with_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, Clock())
    produce(registry, log, batch(5, 0, 0))
    path = snapshot_path(tmp_path / "t-0", 1)
    path.write_bytes(b'{"version": 7, "next_offset": 1, "producers": []}')
    registry = ProducerStateRegistry(tmp_path, Clock())
    with caplog.at_level(logging.WARNING, logger="trio_broker.producer"):
        assert duplicate_offset(produce(registry, log, batch(5, 0, 0))) == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "trio_broker.producer"]
    assert messages == [f"{path}: unknown snapshot version 7; trying an older snapshot"]
    log.close()


def test_close_snapshots_every_partition_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = ProducerStateRegistry(tmp_path, Clock())
    memory = MemoryLog()
    produce(registry, memory, batch(4, 0, 0), topic="m")  # memory log: nothing to write
    gone = PartitionLog.open(tmp_path / "gone-0")
    produce(registry, gone, batch(5, 0, 0), topic="gone")
    kept = PartitionLog.open(tmp_path / "kept-0")
    produce(registry, kept, batch(6, 0, 0), topic="kept")
    broken = PartitionLog.open(tmp_path / "broken-0")
    produce(registry, broken, batch(7, 0, 0), topic="broken")
    gone.close()
    for child in (tmp_path / "gone-0").iterdir():
        child.unlink()
    (tmp_path / "gone-0").rmdir()  # the topic was deleted meanwhile
    snapshot_path(tmp_path / "broken-0", 1).mkdir()  # cannot be replaced by a file
    with caplog.at_level(logging.ERROR, logger="trio_broker.producer"):
        registry.close()  # logs, does not raise
    assert not (tmp_path / "gone-0").exists()
    kept_snapshot = latest_snapshot(tmp_path / "kept-0")
    assert kept_snapshot is not None
    restored = ProducerStateManager.from_snapshot(kept_snapshot.read_bytes())
    assert set(restored.producers) == {6}
    messages = [r.getMessage() for r in caplog.records if r.name == "trio_broker.producer"]
    assert messages == ["cannot snapshot producer state of broken-0"]
    # Closing forgets the partitions: the next batch loads them again.
    produce(registry, kept, batch(6, 0, 1), topic="kept")
    assert registry.statistics().partitions_loaded == 5
    kept.close()
    broken.close()


# ------------------------------------------------------------------ helpers


def test_log_directory_is_a_disk_logs_directory_and_none_in_memory(tmp_path: Path) -> None:
    assert log_directory(MemoryLog()) is None
    log = open_log(tmp_path)
    assert log_directory(log) == tmp_path / "t-0"
    log.close()


def test_read_batch_headers_starts_at_the_batch_holding_the_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for pid in (1, 2, 3):
        log.append(batch(pid, 0, 0, 2), now_ms=T0)  # offsets 0-1, 2-3, 4-5
    headers = list(read_batch_headers(log, 3))
    assert [(h.base_offset, h.producer_id) for h in headers] == [(2, 2), (4, 3)]
    log.close()


# ------------------------------------------------------------------ attached to a broker


def test_attached_to_a_file_broker(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(port=0, data_dir=tmp_path / "data"))
    registry = ProducerStateRegistry.attached_to(broker)
    assert ProducerStateRegistry.attached_to(broker) is registry  # one per broker
    assert registry.data_dir == tmp_path / "data"
    assert registry.now_ms is broker.now_ms
    assert registry.allocator.allocate() == 0
    assert (tmp_path / "data" / PRODUCER_ID_FILE).exists()
    log = PartitionLog.open(tmp_path / "data" / "t-0")
    produce(registry, log, batch(0, 0, 0))
    ProducerStateRegistry.close_attached(broker)
    assert latest_snapshot(tmp_path / "data" / "t-0") is not None
    log.close()


def test_attached_to_a_memory_broker(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(port=0, data_dir=tmp_path / "data", storage="memory"))
    ProducerStateRegistry.close_attached(broker)  # nothing attached yet: nothing to do
    registry = ProducerStateRegistry.attached_to(broker)
    assert registry.data_dir is None
    assert registry.allocator.path is None
    assert registry.expiration_ms == 86_400_000
    ProducerStateRegistry.close_attached(broker)


# ------------------------------------------------------------------ snapshots at rolls


def append_any(registry: ProducerStateRegistry, log: PartitionLog, raw: bytearray) -> int:
    """The write path (partition/append.py): check, append, record with the log."""
    view = RecordBatchView(raw)
    assert isinstance(registry.check("t", 0, log, view), Append)
    result = log.append(raw, now_ms=T0)
    registry.record_append("t", 0, view, result.base_offset, result.last_offset, log)
    return result.base_offset


def test_a_roll_snapshots_the_state_before_the_batch_that_began_the_segment(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=100))
    registry = ProducerStateRegistry(tmp_path, Clock())
    offsets = []
    for s in (0, 2, 4):
        offsets.append(append_any(registry, log, batch(5, 0, s, count=2)))
        log.flush()  # (a later roll's snapshot replaces one staged and not yet written)
    bases = log.segment_base_offsets()
    assert len(bases) == 3 and bases[1:] == offsets[1:]  # each batch began a segment
    assert log.producer_snapshot_offsets() == [2, 4]
    at_4 = ProducerStateManager.from_snapshot(log.read_producer_snapshot(4))
    assert at_4.next_offset == 4
    assert [b.first_seq for b in at_4.producers[5].batches] == [0, 2]  # not the batch at 4
    log.close()


def test_a_crash_after_retention_recovers_producers_from_the_roll_snapshot(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=100))
    registry = ProducerStateRegistry(tmp_path, Clock())
    append_any(registry, log, batch(5, 0, 0, count=2))
    fresh = ProducerStateRegistry(tmp_path, Clock())  # a restart: no state loaded yet
    # Plain records only: a registry that has not seen the partition builds its state at
    # the first roll, so the next snapshot still holds producer 5.
    for _ in range(3):
        append_any(fresh, log, build_batch([(None, b"x" * 60)] * 2))
    log.flush()
    log.delete_records(log.segment_base_offsets()[-1])
    log.apply_retention(T0)
    assert log.log_start_offset > 1 and log.producer_snapshot_offsets()
    log.abort()  # kill -9: no clean-shutdown snapshot

    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=100))
    registry = ProducerStateRegistry(tmp_path, Clock())
    assert duplicate_offset(produce(registry, log, batch(5, 0, 0, count=2))) == 0
    assert error_of(produce(registry, log, batch(5, 0, 7))) == OOO
    log.close()


def test_compaction_forgetting_aborted_transactions_replaces_the_snapshots(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=100))
    registry = ProducerStateRegistry(tmp_path, Clock())
    for s in (0, 2, 4):
        append_any(registry, log, batch(5, 0, s, count=2))
        log.flush()
    assert log.producer_snapshot_offsets() == [2, 4]
    registry.forget_aborted("t", 0, log, [])
    assert log.producer_snapshot_offsets() == []  # they may name what the cleaner removed
    log.flush()
    assert log.producer_snapshot_offsets() == [6]  # the state as it is now
    log.close()


def test_a_prepared_state_catches_up_with_what_was_appended_meanwhile(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    writer = ProducerStateRegistry(None, Clock())
    for seq in range(3):
        produce(writer, log, batch(5, 0, seq))
    registry = ProducerStateRegistry(None, Clock())
    registry.prepare("t", 0, log)  # a worker thread's load, up to offset 3
    assert registry.loaded("t", 0, log)
    produce(writer, log, batch(5, 0, 3))  # appended before the loop installs it
    produce(writer, log, batch(7, 0, 0))
    # Installed and replayed on from offset 3: both new batches are known, one load.
    assert duplicate_offset(produce(registry, log, batch(5, 0, 3))) == 3
    assert duplicate_offset(produce(registry, log, batch(7, 0, 0))) == 4
    assert registry.statistics().partitions_loaded == 1
    log.close()


def test_a_state_prepared_before_forget_is_not_installed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    writer = ProducerStateRegistry(None, Clock())
    produce(writer, log, batch(5, 0, 0))
    registry = ProducerStateRegistry(None, Clock())
    registry.prepare("t", 0, log)
    registry.forget("t", 0)  # a leader change: the log may be truncated next
    assert not registry.loaded("t", 0, log)
    assert duplicate_offset(produce(registry, log, batch(5, 0, 0))) == 0
    assert registry.statistics().partitions_loaded == 2  # loaded again, on the loop
    log.close()
