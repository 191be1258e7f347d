"""Idempotent producer rules, the per-partition manager, snapshots, ids and the registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.services.producers import (
    PRODUCER_ID_FILE,
    SNAPSHOT_FILE,
    ProducerIdAllocator,
    ProducerStateRegistry,
    latest_snapshot,
)
from trio_broker.state.producer import (
    BATCHES_TO_RETAIN,
    INT32_MAX,
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
    next_sequence,
)
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_snapshots import snapshot_path
from trio_broker.storage.memory import MemoryLog

OOO = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
FENCED = ErrorCode.INVALID_PRODUCER_EPOCH


class Partition:
    """A manager plus a fake log end: produce() runs check, then append on success."""

    def __init__(self) -> None:
        self.manager = ProducerStateManager()
        self.end = 0

    def produce(self, pid: int, epoch: int, first: int, count: int = 1) -> Any:
        last = (first + count - 1) % 2**31
        verdict = self.manager.check(pid, epoch, first, last)
        if isinstance(verdict, Append):
            base, self.end = self.end, self.end + count
            self.manager.append(pid, epoch, first, last, base, base + count - 1, 1000)
            return base
        return verdict


def error_of(verdict: Any) -> ErrorCode:
    assert isinstance(verdict, Reject), verdict
    return verdict.error_code


def duplicate_offset(verdict: Any) -> int:
    assert isinstance(verdict, Duplicate), verdict
    return verdict.original_base_offset


# ----------------------------------------------------------------------------- rules


def test_in_order_batches_are_appended() -> None:
    p = Partition()
    assert [p.produce(7, 0, s * 3, 3) for s in range(4)] == [0, 3, 6, 9]


def test_gap_is_out_of_order_and_changes_nothing() -> None:
    p = Partition()
    p.produce(7, 0, 0, 2)
    before = dict(p.manager.producers)
    assert error_of(p.produce(7, 0, 3)) == OOO
    assert p.manager.producers == before
    assert p.produce(7, 0, 2) == 2


def test_sequence_wraps_at_int32_max() -> None:
    p = Partition()
    p.produce(7, 0, INT32_MAX - 1, 2)  # unknown producer: any start (KIP-360)
    assert p.manager.producers[7].last_seq == INT32_MAX
    # (MAX, MAX) was never a batch of its own, so it is no duplicate: out of order.
    assert error_of(p.produce(7, 0, INT32_MAX)) == OOO
    assert p.produce(7, 0, 0, 2) == 2
    assert p.manager.producers[7].last_seq == 1
    assert next_sequence(INT32_MAX) == 0


def test_a_batch_spanning_the_wrap() -> None:
    p = Partition()
    p.produce(7, 0, INT32_MAX - 5, 4)  # ..MAX-2
    assert p.produce(7, 0, INT32_MAX - 1, 4) == 4  # MAX-1, MAX, 0, 1
    assert p.manager.producers[7].last_seq == 1
    assert duplicate_offset(p.produce(7, 0, INT32_MAX - 1, 4)) == 4
    assert p.produce(7, 0, 2) == 8
    # The batch header computes the same wrapped last sequence.
    view = RecordBatchView(
        build_batch(
            [(None, b"x")] * 4, producer_id=7, producer_epoch=0, base_sequence=INT32_MAX - 1
        )
    )
    assert view.last_sequence == 1


def test_older_epoch_is_fenced() -> None:
    p = Partition()
    p.produce(7, 3, 0)
    assert error_of(p.produce(7, 2, 1)) == FENCED
    assert error_of(p.produce(7, 2, 0)) == FENCED


def test_new_epoch_must_start_at_zero() -> None:
    p = Partition()
    p.produce(7, 0, 0, 5)
    assert error_of(p.produce(7, 1, 5)) == OOO
    assert p.produce(7, 1, 0) == 5
    # The old epoch's batches left the window with the epoch: a late retry is fenced.
    assert error_of(p.produce(7, 0, 0, 5)) == FENCED
    assert len(p.manager.producers[7].batches) == 1


def test_duplicates_in_the_window_get_their_original_offsets() -> None:
    p = Partition()
    bases = [p.produce(7, 0, s * 2, 2) for s in range(BATCHES_TO_RETAIN)]
    for s, base in enumerate(bases):
        assert duplicate_offset(p.produce(7, 0, s * 2, 2)) == base
    assert p.end == 2 * BATCHES_TO_RETAIN  # nothing appended twice


def test_a_retry_older_than_the_window_is_out_of_order() -> None:
    # Kafka keeps five batches; the sixth-oldest is neither a duplicate nor next.
    p = Partition()
    for s in range(BATCHES_TO_RETAIN + 1):
        p.produce(7, 0, s)
    assert error_of(p.produce(7, 0, 0)) == OOO
    assert duplicate_offset(p.produce(7, 0, 1)) == 1


def test_duplicate_needs_the_same_first_and_last_sequence() -> None:
    p = Partition()
    p.produce(7, 0, 0, 3)
    assert error_of(p.produce(7, 0, 0, 2)) == OOO
    assert error_of(p.produce(7, 0, 1, 2)) == OOO
    assert duplicate_offset(p.produce(7, 0, 0, 3)) == 0


def test_unknown_producer_is_accepted_at_any_sequence() -> None:
    # Kafka 2.5+ (KIP-360): no UNKNOWN_PRODUCER_ID; the state may have been removed.
    p = Partition()
    assert p.produce(7, 4, 12345) == 0
    assert p.produce(7, 4, 12346) == 1


def test_no_producer_id_means_no_checks() -> None:
    p = Partition()
    # aiokafka sends sequence 0 with producer id -1; librdkafka sends -1.
    assert [p.produce(-1, -1, 0) for _ in range(3)] == [0, 1, 2]
    assert p.manager.producers == {}


def test_producer_id_zero_is_idempotent() -> None:
    # A fresh broker hands out id 0 first: it must be checked like any other id.
    p = Partition()
    assert p.produce(0, 0, 0) == 0
    retry = p.produce(0, 0, 0)
    assert isinstance(retry, Duplicate) and retry.original_base_offset == 0
    assert error_of(p.produce(0, 0, 5)) == OOO
    assert 0 in p.manager.producers


def test_pipelined_batches_after_a_failed_one_are_out_of_order() -> None:
    # Batch 1 of a pipeline fails validation (never appended); 2-4 then fail as in Kafka.
    p = Partition()
    p.produce(7, 0, 0)
    assert [error_of(p.produce(7, 0, s)) for s in (2, 3, 4)] == [OOO] * 3
    assert p.produce(7, 0, 1) == 1  # the client's retry of batch 1, then the rest
    assert [p.produce(7, 0, s) for s in (2, 3, 4)] == [2, 3, 4]


def test_producers_are_independent() -> None:
    p = Partition()
    p.produce(1, 0, 0)
    p.produce(2, 0, 0)
    assert duplicate_offset(p.produce(1, 0, 0)) == 0
    assert duplicate_offset(p.produce(2, 0, 0)) == 1


def test_entry_invariants() -> None:
    with pytest.raises(ValueError):
        ProducerStateEntry(0, ())
    batch = BatchMetadata(0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        ProducerStateEntry(0, (batch,) * (BATCHES_TO_RETAIN + 1))
    with pytest.raises(ValueError):
        BatchMetadata(-1, 0, 0, 0, 0)
    assert isinstance(check_append(None, 0, 5, 5), Append)


# -------------------------------------------------------------- retention and expiry


def test_truncate_head_keeps_producers_below_the_log_start() -> None:
    p = Partition()
    p.produce(1, 0, 0, 2)  # offsets 0-1
    p.produce(2, 0, 0, 2)  # offsets 2-3
    p.manager.truncate_head(4)  # both producers' batches are gone; Kafka 2.5+ keeps them
    assert set(p.manager.producers) == {1, 2}
    assert p.manager.next_offset == 4
    assert duplicate_offset(p.produce(1, 0, 0, 2)) == 0  # a retry, not appended again
    assert error_of(p.produce(1, 0, 99)) == OOO


def test_remove_expired() -> None:
    m = ProducerStateManager()
    m.append(1, 0, 0, 0, 0, 0, timestamp=1_000)
    m.append(2, 0, 0, 0, 1, 1, timestamp=5_000)
    m.remove_expired(now_ms=6_000, expiration_ms=5_000)
    assert set(m.producers) == {2}


# --------------------------------------------------------------------------- snapshots


def test_snapshot_round_trip_keeps_the_whole_window() -> None:
    p = Partition()
    for s in range(7):
        p.produce(3, 2, s)
    p.produce(4, 0, 10, 3)
    restored = ProducerStateManager.from_snapshot(p.manager.to_snapshot())
    assert restored.producers == p.manager.producers
    assert restored.next_offset == p.manager.next_offset == p.end


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"[]",
        b'{"version": 99, "next_offset": 0, "producers": []}',
        b'{"version": 1, "next_offset": -1, "producers": []}',
        b'{"version": 1, "next_offset": 0, "producers": [[1, 0, []]]}',
        b'{"version": 1, "next_offset": 0, "producers": [[1, 0, [[0, 0, 0]]]]}',
        b'{"version": 1, "next_offset": 0, "producers": [["x", 0, [[0, 0, 0, 0, 0]]]]}',
    ],
)
def test_bad_snapshots_raise_snapshot_error(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        ProducerStateManager.from_snapshot(data)


# ------------------------------------------------------------------------ producer ids


def test_ids_never_repeat_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / PRODUCER_ID_FILE
    first = ProducerIdAllocator(path, block_size=10)
    ids = [first.allocate() for _ in range(13)]
    assert ids == list(range(13))
    # The reserved block end is on disk before any id of the block is handed out.
    assert json.loads(path.read_text())["next_block_start"] == 20
    second = ProducerIdAllocator(path, block_size=10)  # a restart (clean or not)
    more = [second.allocate() for _ in range(3)]
    assert more == [20, 21, 22]
    assert not set(ids) & set(more)
    # The restarted allocator reserved its block before handing out 20, so a third
    # start (after a crash, say) cannot hand 20 out again.
    assert json.loads(path.read_text())["next_block_start"] == 30
    assert ProducerIdAllocator(path, block_size=10).allocate() == 30


def test_memory_mode_just_counts() -> None:
    allocator = ProducerIdAllocator(None)
    assert [allocator.allocate() for _ in range(3)] == [0, 1, 2]
    assert allocator.issued_below == 3


def test_unreadable_id_file_refuses_to_guess(tmp_path: Path) -> None:
    path = tmp_path / PRODUCER_ID_FILE
    path.write_text("garbage")
    allocator = ProducerIdAllocator(path)  # read lazily: the produce path never fails on it
    with pytest.raises(SnapshotError):
        allocator.allocate()
    with pytest.raises(SnapshotError):
        _ = allocator.issued_below


def test_init_producer_id_decisions() -> None:
    fresh = decide_init_producer_id(-1, -1, 10)
    assert (fresh.error_code, fresh.producer_id, fresh.epoch) == (ErrorCode.NONE, None, 0)
    bump = decide_init_producer_id(4, 7, 10)
    assert (bump.error_code, bump.producer_id, bump.epoch) == (ErrorCode.NONE, 4, 8)
    overflow = decide_init_producer_id(4, MAX_PRODUCER_EPOCH, 10)
    assert (overflow.producer_id, overflow.epoch) == (None, 0)
    assert decide_init_producer_id(4, MAX_PRODUCER_EPOCH - 1, 10).epoch == MAX_PRODUCER_EPOCH
    never_issued = decide_init_producer_id(10, 0, 10)
    assert (never_issued.producer_id, never_issued.epoch) == (None, 0)
    assert decide_init_producer_id(-1, 3, 10).error_code == ErrorCode.INVALID_REQUEST
    assert decide_init_producer_id(3, -1, 10).error_code == ErrorCode.INVALID_REQUEST


# ---------------------------------------------------------------------------- registry


def idempotent_batch(pid: int, epoch: int, seq: int, count: int = 1) -> bytearray:
    return build_batch(
        [(None, b"v%d" % i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp=10_000,
    )


def produce(registry: ProducerStateRegistry, log: Any, raw: bytearray) -> Any:
    """What the broker's produce path does: check, append on None, record."""
    view = RecordBatchView(raw)
    verdict = registry.check("t", 0, log, view)
    if isinstance(verdict, Append):
        result = log.append(raw, now_ms=10_000)
        registry.record_append("t", 0, view, result.base_offset, result.last_offset)
        return result.base_offset
    return verdict


def now() -> int:
    return 10_000


def open_log(tmp_path: Path) -> PartitionLog:
    return PartitionLog.open(tmp_path / "t-0")


def test_registry_survives_a_clean_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    assert [produce(registry, log, idempotent_batch(5, 0, s * 2, 2)) for s in range(3)] == [0, 2, 4]
    log.close()
    registry.close()
    assert latest_snapshot(tmp_path / "t-0") == snapshot_path(tmp_path / "t-0", 6)

    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    assert duplicate_offset(produce(registry, log, idempotent_batch(5, 0, 4, 2))) == 4
    assert duplicate_offset(produce(registry, log, idempotent_batch(5, 0, 0, 2))) == 0
    assert produce(registry, log, idempotent_batch(5, 0, 6)) == 6
    log.close()


def test_registry_rebuilds_from_the_log_without_a_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    for s in range(3):
        produce(registry, log, idempotent_batch(5, 0, s))
    log.abort()  # a crash: no snapshot, no clean-shutdown marker

    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    assert duplicate_offset(produce(registry, log, idempotent_batch(5, 0, 2))) == 2
    assert error_of(produce(registry, log, idempotent_batch(5, 0, 9))) == OOO
    log.close()


def test_registry_replays_batches_appended_after_the_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    produce(registry, log, idempotent_batch(5, 0, 0))
    registry.close()  # snapshot at offset 1
    registry = ProducerStateRegistry(tmp_path, now)
    produce(registry, log, idempotent_batch(5, 0, 1))
    produce(registry, log, idempotent_batch(6, 0, 0))
    log.abort()  # crash: the snapshot is stale

    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    assert duplicate_offset(produce(registry, log, idempotent_batch(5, 0, 1))) == 1
    assert duplicate_offset(produce(registry, log, idempotent_batch(6, 0, 0))) == 2
    log.close()


def test_snapshot_beyond_the_log_end_is_ignored(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    produce(registry, log, idempotent_batch(5, 0, 0))
    log.close()
    claims_more = ProducerStateManager(next_offset=50)
    claims_more.append(5, 0, 0, 40, 0, 40, 10_000)  # state for offsets the log lacks
    (tmp_path / "t-0" / SNAPSHOT_FILE).write_bytes(claims_more.to_snapshot())

    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    assert produce(registry, log, idempotent_batch(5, 0, 1)) == 1  # rebuilt: last seq 0
    log.close()


def test_corrupt_snapshot_falls_back_to_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    registry = ProducerStateRegistry(tmp_path, now)
    produce(registry, log, idempotent_batch(5, 0, 0))
    (tmp_path / "t-0" / SNAPSHOT_FILE).write_bytes(b"{not json")
    registry = ProducerStateRegistry(tmp_path, now)
    assert duplicate_offset(produce(registry, log, idempotent_batch(5, 0, 0))) == 0
    log.close()


def test_recreated_topic_starts_with_no_state(tmp_path: Path) -> None:
    registry = ProducerStateRegistry(None, now)
    old = MemoryLog()
    produce(registry, old, idempotent_batch(5, 0, 0))
    new = MemoryLog()  # same (topic, partition), a different log
    assert produce(registry, new, idempotent_batch(5, 3, 7)) == 0


def test_retention_keeps_producers(tmp_path: Path) -> None:
    registry = ProducerStateRegistry(None, now)
    log = MemoryLog()
    produce(registry, log, idempotent_batch(5, 0, 0))
    produce(registry, log, idempotent_batch(6, 0, 0))
    log.delete_records(2)
    # Both producers' batches are gone but not their state: a gap is still out of order.
    assert error_of(produce(registry, log, idempotent_batch(5, 0, 40))) == OOO
    assert error_of(produce(registry, log, idempotent_batch(6, 0, 40))) == OOO
    assert produce(registry, log, idempotent_batch(5, 0, 1)) == 2


def test_registry_expires_silent_producers() -> None:
    clock = [10_000]
    registry = ProducerStateRegistry(None, lambda: clock[0], expiration_ms=1_000)
    log = MemoryLog()
    produce(registry, log, idempotent_batch(5, 0, 0))
    clock[0] += 3_600_000  # past the expiry check interval too
    assert produce(registry, log, idempotent_batch(5, 0, 40)) == 1


def test_non_idempotent_batches_create_no_state() -> None:
    registry = ProducerStateRegistry(None, now)
    log = MemoryLog()
    raw = build_batch([(None, b"x")], base_timestamp=10_000)
    assert produce(registry, log, raw) == 0
    assert registry._partitions == {}
