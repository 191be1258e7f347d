"""The partition side of transactions: open/aborted transactions, the LSO, marker epochs,
retention, snapshots and the rebuild from a log after a crash (real PartitionLog and
MemoryLog), and append_txn_marker on a real TopicManager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import RecordBatchView, build_batch, build_control_batch
from trio_broker.services.local_replication import LocalReplication
from trio_broker.services.producers import ProducerStateRegistry, latest_snapshot
from trio_broker.services.topics import TopicManager
from trio_broker.services.txn_markers import MarkerRejected, append_txn_marker
from trio_broker.state.partition_txns import AbortedTxn, MarkerEpochs, PartitionTransactions
from trio_broker.state.producer import Append, ProducerStateManager, Reject
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.memory import MemoryLog

T0 = 10_000


def now() -> int:
    return T0


def data(pid: int, epoch: int, seq: int, count: int = 1, txn: bool = True) -> bytearray:
    return build_batch(
        [(None, b"v%d" % i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp=T0,
        is_transactional=txn,
    )


def append(registry: ProducerStateRegistry, log: Any, raw: bytearray) -> int:
    """The produce path (check, append, record); returns the base offset."""
    view = RecordBatchView(raw)
    assert isinstance(registry.check("t", 0, log, view), Append)
    result = log.append(raw, now_ms=T0)
    registry.record_append("t", 0, RecordBatchView(raw), result.base_offset, result.last_offset)
    return int(result.base_offset)


def marker(registry: ProducerStateRegistry, log: Any, pid: int, epoch: int, committed: bool) -> int:
    code, _ = registry.check_marker("t", 0, log, pid, epoch, 0)
    assert code == ErrorCode.NONE
    raw = build_control_batch(pid, epoch, committed=committed, coordinator_epoch=0, timestamp=T0)
    result = log.append(raw, now_ms=T0)
    registry.record_append("t", 0, RecordBatchView(raw), result.base_offset, result.last_offset)
    return int(result.base_offset)


# ------------------------------------------------------------------ the pure rules


def test_lso_is_first_offset_of_oldest_open_transaction() -> None:
    txns = PartitionTransactions()
    assert txns.last_stable_offset(10) == 10
    txns.on_data(1, True, 3)
    txns.on_data(2, True, 5)
    txns.on_data(1, True, 7)  # same transaction: the first offset stays
    txns.on_data(3, False, 8)  # idempotent, not transactional: no transaction
    assert txns.ongoing == {1: 3, 2: 5}
    assert txns.last_stable_offset(10) == 3
    assert txns.last_stable_offset(2) == 2  # never above the high watermark
    assert txns.on_marker(1, 0, 0, committed=True, offset=9, timestamp=T0) is None
    assert txns.last_stable_offset(10) == 5
    assert txns.on_marker(2, 0, 0, committed=False, offset=10, timestamp=T0) == AbortedTxn(10, 2, 5)
    assert txns.last_stable_offset(11) == 11
    assert txns.aborted == [AbortedTxn(10, 2, 5)]


def test_marker_without_open_transaction_ends_nothing() -> None:
    txns = PartitionTransactions()
    assert txns.on_marker(4, 0, 0, committed=False, offset=0, timestamp=T0) is None
    assert txns.aborted == [] and txns.markers == {4: MarkerEpochs(0, 0, 0, T0)}


def test_aborted_between_selects_overlapping_ranges() -> None:
    txns = PartitionTransactions(
        aborted=[AbortedTxn(4, 1, 0), AbortedTxn(9, 2, 6), AbortedTxn(20, 3, 12)]
    )
    assert txns.aborted_between(0, 100) == txns.aborted
    assert txns.aborted_between(5, 100) == [AbortedTxn(9, 2, 6), AbortedTxn(20, 3, 12)]
    assert txns.aborted_between(5, 12) == [AbortedTxn(9, 2, 6)]
    assert txns.aborted_between(10, 12) == []
    assert txns.aborted_between(9, 10) == [AbortedTxn(9, 2, 6)]  # the marker itself


def test_marker_epoch_checks() -> None:
    manager = ProducerStateManager()
    manager.append(1, 3, 0, 0, 0, 0, T0, is_transactional=True)
    code, _ = manager.check_marker(1, 2, 0)
    assert code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert manager.check_marker(1, 3, 5)[0] == ErrorCode.NONE
    manager.append_marker(
        1, 4, 5, committed=False, offset=1, timestamp=T0
    )  # a newer epoch: accepted
    assert manager.txns.aborted == [AbortedTxn(1, 1, 0)]
    assert manager.check_marker(1, 3, 5)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert manager.check_marker(1, 4, 4)[0] == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    # The marker's epoch fences the producer's older epoch and its data epoch moves on.
    verdict = manager.check(1, 3, 1, 1)
    assert isinstance(verdict, Reject) and verdict.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert isinstance(manager.check(1, 4, 0, 0), Append)
    verdict = manager.check(1, 4, 1, 1)  # a new epoch starts at sequence 0
    assert (
        isinstance(verdict, Reject) and verdict.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )


def test_log_start_move_drops_aborted_entries_but_keeps_open_transactions() -> None:
    manager = ProducerStateManager()
    manager.append(1, 0, 0, 0, 0, 0, T0, is_transactional=True)
    manager.append_marker(1, 0, 0, committed=False, offset=1, timestamp=T0)
    manager.append(2, 0, 0, 0, 2, 2, T0, is_transactional=True)
    manager.append(3, 0, 0, 0, 3, 3, T0, is_transactional=True)
    manager.append(2, 0, 1, 1, 4, 4, T0, is_transactional=True)
    manager.truncate_head(1)
    assert manager.txns.aborted == [AbortedTxn(1, 1, 0)]  # its marker is still in the log
    manager.truncate_head(2)
    assert manager.txns.aborted == []
    assert 1 in manager.txns.markers  # producer 1 is kept (Kafka 2.5+), its marker epochs too
    manager.truncate_head(4)  # producer 3's whole transaction is gone; 2's last batch is not
    # Kafka keeps an open transaction the log start passed: the LSO is the log start.
    assert manager.txns.ongoing == {2: 2, 3: 3}
    assert manager.txns.last_stable_offset(5, 4) == 4


def test_producers_with_open_transactions_do_not_expire() -> None:
    manager = ProducerStateManager()
    manager.append(1, 0, 0, 0, 0, 0, 0, is_transactional=True)
    manager.append(2, 0, 0, 0, 1, 1, 0, is_transactional=False)
    manager.remove_expired(now_ms=10**9, expiration_ms=1000)
    assert list(manager.producers) == [1]


def test_snapshot_round_trip_carries_transactions() -> None:
    manager = ProducerStateManager()
    manager.append(1, 0, 0, 0, 0, 0, T0, is_transactional=True)
    manager.append(2, 0, 0, 0, 1, 1, T0, is_transactional=True)
    manager.append_marker(1, 0, 7, committed=False, offset=2, timestamp=T0)
    loaded = ProducerStateManager.from_snapshot(manager.to_snapshot())
    assert loaded.txns.ongoing == {2: 1}
    assert loaded.txns.aborted == [AbortedTxn(2, 1, 0)]
    assert loaded.txns.markers == {1: MarkerEpochs(0, 7, 2, T0)}


# ------------------------------------------------------------------ the registry on logs


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_rebuild_from_log_without_snapshot_reads_markers(kind: str, tmp_path: Path) -> None:
    log: Any = PartitionLog.open(tmp_path / "t-0", LogConfig()) if kind == "file" else MemoryLog()
    registry = ProducerStateRegistry(tmp_path if kind == "file" else None, now)
    a = append(registry, log, data(1, 0, 0, count=3))  # producer 1: aborted
    append(registry, log, data(9, 0, 0, txn=False))  # idempotent only
    b = append(registry, log, data(2, 0, 0))  # producer 2: stays open
    abort_at = marker(registry, log, 1, 0, committed=False)
    append(registry, log, data(3, 0, 0))
    marker(registry, log, 3, 0, committed=True)
    before = registry.manager("t", 0, log).txns
    assert before.ongoing == {2: b}
    assert before.aborted == [AbortedTxn(abort_at, 1, a)]
    # A crash: no snapshot was written; a new registry replays the whole log.
    fresh = ProducerStateRegistry(tmp_path if kind == "file" else None, now)
    after = fresh.manager("t", 0, log).txns
    assert after.ongoing == before.ongoing and after.aborted == before.aborted
    assert fresh.last_stable_offset("t", 0, log, log.log_end_offset) == b
    assert fresh.aborted_between("t", 0, log, 0, log.log_end_offset) == before.aborted


def test_stale_snapshot_is_completed_from_the_log(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    registry = ProducerStateRegistry(tmp_path, now)
    first = append(registry, log, data(1, 0, 0))
    registry.close()  # snapshot: producer 1 open
    path = latest_snapshot(tmp_path / "t-0")
    assert path is not None
    snapshot = path.read_bytes()
    registry = ProducerStateRegistry(tmp_path, now)
    abort_at = marker(registry, log, 1, 0, committed=False)
    second = append(registry, log, data(2, 0, 0))
    # A crash after the snapshot: the old snapshot is on disk, the log has more.
    path.write_bytes(snapshot)
    fresh = ProducerStateRegistry(tmp_path, now)
    txns = fresh.manager("t", 0, log).txns
    assert txns.ongoing == {2: second}
    assert txns.aborted == [AbortedTxn(abort_at, 1, first)]


def test_truncation_rebuilds_from_the_log(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    registry = ProducerStateRegistry(tmp_path, now)
    first = append(registry, log, data(1, 0, 0))
    abort_at = marker(registry, log, 1, 0, committed=False)
    registry.close()
    log.truncate_to(abort_at)  # a follower drops the marker
    registry = ProducerStateRegistry(tmp_path, now)
    registry.discard_snapshot("t", 0, log)
    txns = registry.manager("t", 0, log).txns
    assert txns.ongoing == {1: first} and txns.aborted == []


# ------------------------------------------------------------------ append_txn_marker


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def mark_dirty(self, log: Any, messages: int = 1) -> None:
        self.calls.append("dirty")

    def notify(self, topic: str, partition: int) -> None:
        self.calls.append(f"notify {topic}-{partition}")


def test_append_txn_marker_ends_the_transaction_and_checks_epochs() -> None:
    topics = TopicManager(None, LogConfig(), now)
    topics.create("t", 1)
    log = topics.log("t", 0)
    registry = ProducerStateRegistry(None, now)
    first = append(registry, log, data(5, 2, 0, count=2))
    durability, appends = Recorder(), Recorder()
    args = (topics, registry, durability, appends, "t", 0, 5)
    alone = LocalReplication.over(topics, producers=registry)
    with pytest.raises(MarkerRejected) as refused:
        append_txn_marker(*args, 1, False, 0, T0, leaders=alone)
    assert refused.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.log_end_offset == 2  # nothing written
    returned_log, offset = append_txn_marker(*args, 2, False, 0, T0, leaders=alone)
    assert returned_log is log and offset == 2
    assert durability.calls == ["dirty"] and appends.calls == ["notify t-0"]
    assert registry.aborted_between("t", 0, log, 0, 3) == [AbortedTxn(2, 5, first)]
    with pytest.raises(MarkerRejected) as unknown:
        append_txn_marker(
            topics, registry, durability, appends, "t", 1, 5, 2, True, 0, T0, leaders=alone
        )
    assert unknown.value.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(MarkerRejected) as fenced:
        append_txn_marker(*args, 2, True, -1, T0, leaders=alone)
    assert fenced.value.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED


# Edges found by mutation testing (issue 31).


def test_lso_without_a_log_start_is_an_open_transaction_at_offset_0() -> None:
    txns = PartitionTransactions()
    txns.on_data(5, True, 0)
    assert txns.last_stable_offset(10) == 0  # the default log start is 0, not past it


def test_a_fetch_from_an_abort_marker_names_that_transaction() -> None:
    """As Kafka's collectAbortedTxns (last offset >= fetch start), also for producer id 0,
    which sorts below any probe made of a positive id."""
    txns = PartitionTransactions()
    txns.on_data(0, True, 3)
    txns.on_marker(0, 0, 0, committed=False, offset=6, timestamp=T0)
    assert txns.aborted_between(6, 10) == [AbortedTxn(6, 0, 3)]
    assert txns.aborted_between(7, 10) == []


def test_forgotten_aborted_transactions_are_no_longer_named() -> None:
    txns = PartitionTransactions()
    for pid, (first, marker) in {1: (0, 2), 2: (3, 5), 3: (6, 8)}.items():
        txns.on_data(pid, True, first)
        txns.on_marker(pid, 0, 0, committed=False, offset=marker, timestamp=T0)
    txns.forget_aborted([(2, 5), (9, 99)])  # the second names nothing
    assert txns.aborted == [AbortedTxn(2, 1, 0), AbortedTxn(8, 3, 6)]
    assert txns.aborted_between(0, 100) == [AbortedTxn(2, 1, 0), AbortedTxn(8, 3, 6)]
    txns.forget_aborted(iter([(1, 2)]))  # any iterable, read once
    assert txns.aborted == [AbortedTxn(8, 3, 6)]


@pytest.mark.parametrize(
    ("doc", "error", "message"),
    [
        ([], TypeError, "transactions must be an object"),
        ({"ongoing": [[1]], "aborted": [], "markers": []}, ValueError, "expected 2 integers"),
        ({"ongoing": "ab", "aborted": [], "markers": []}, ValueError, "expected 2 integers"),
        ({"ongoing": [[1, "2"]], "aborted": [], "markers": []}, ValueError, "expected integers"),
        ({"ongoing": [[1, True]], "aborted": [], "markers": []}, ValueError, "expected integers"),
        ({"ongoing": [], "aborted": [[1, 2, 3.0]], "markers": []}, ValueError, "integers"),
    ],
)
def test_a_damaged_snapshot_is_refused(doc: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        PartitionTransactions.from_json(doc)


def test_a_replayed_marker_is_recorded_once_and_in_marker_order() -> None:
    """A snapshot plus the log after it can replay markers already recorded, or older."""
    txns = PartitionTransactions()
    for pid, first, marker in ((1, 0, 2), (2, 3, 5)):
        txns.on_data(pid, True, first)
        txns.on_marker(pid, 0, 0, committed=False, offset=marker, timestamp=T0)
    txns.on_data(2, True, 3)
    txns.on_marker(2, 0, 0, committed=False, offset=5, timestamp=T0)  # the last one again
    txns.on_data(1, True, 0)
    txns.on_marker(1, 0, 0, committed=False, offset=2, timestamp=T0)  # an older one again
    txns.on_data(3, True, 1)
    txns.on_marker(
        3, 0, 0, committed=False, offset=4, timestamp=T0
    )  # an older one not yet recorded
    assert txns.aborted == [AbortedTxn(2, 1, 0), AbortedTxn(4, 3, 1), AbortedTxn(5, 2, 3)]


def test_a_log_start_at_a_marker_keeps_it_and_open_producers_keep_their_epochs() -> None:
    txns = PartitionTransactions()
    txns.on_data(0, True, 1)
    txns.on_marker(0, 0, 0, committed=False, offset=4, timestamp=T0)  # producer id 0
    txns.on_marker(
        7, 2, 0, committed=True, offset=5, timestamp=T0
    )  # ended nothing; its epochs stay known
    txns.on_data(7, True, 6)  # producer 7 is open again
    txns.truncate_head(4)
    assert txns.aborted == [AbortedTxn(4, 0, 1)]  # the marker at the new start is kept
    assert set(txns.markers) == {0, 7}
    txns.truncate_head(6)
    assert txns.aborted == [] and set(txns.markers) == {0, 7}  # epochs outlive markers


def test_a_marker_alone_keeps_its_epoch_past_the_log_start_until_expiry() -> None:
    """A fencing abort in a partition the producer never wrote to: the marker is its only
    entry there, and the epoch it carries fences the old one (Kafka's producer entry),
    after the log start passes the marker too (KIP-360: only expiry forgets a producer,
    counted from the marker's timestamp)."""
    manager = ProducerStateManager()
    manager.append(-1, -1, -1, -1, 0, 1, T0)  # someone else's records, offsets 0-1
    manager.append_marker(5, 3, 0, committed=False, offset=2, timestamp=T0)
    for start in (0, 1, 2, 3, 10):  # a restart truncates to the start too; so does DeleteRecords
        manager.truncate_head(start)
        verdict = manager.check(5, 2, 0, 0)
        assert isinstance(verdict, Reject), start
        assert verdict.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert manager.check_marker(5, 2, 0)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    loaded = ProducerStateManager.from_snapshot(manager.to_snapshot())
    assert loaded.txns.markers == {5: MarkerEpochs(3, 0, 2, T0)}
    assert loaded.check_marker(5, 2, 0)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    manager.remove_expired(now_ms=T0 + 999, expiration_ms=1000)
    assert 5 in manager.txns.markers
    manager.remove_expired(now_ms=T0 + 1000, expiration_ms=1000)
    assert 5 not in manager.txns.markers
    assert isinstance(manager.check(5, 2, 0, 0), Append)


def test_a_marker_keeps_its_producers_batches_from_expiring() -> None:
    """Kafka's marker append updates the entry's lastTimestamp: a producer whose last
    data batch is old but whose marker is recent is not expired, nor is its window."""
    manager = ProducerStateManager()
    manager.append(5, 0, 0, 0, 0, 0, T0, is_transactional=True)
    manager.append_marker(5, 0, 0, committed=True, offset=1, timestamp=T0 + 500)
    manager.remove_expired(now_ms=T0 + 1200, expiration_ms=1000)
    assert 5 in manager.producers and 5 in manager.txns.markers
    manager.remove_expired(now_ms=T0 + 1500, expiration_ms=1000)
    assert manager.producers == {} and manager.txns.markers == {}


@pytest.mark.parametrize("version", [2, 3])
def test_an_old_snapshot_gives_marker_epochs_the_loaders_clock(version: int) -> None:
    """Version 2 did not store where a marker is, versions 2 and 3 not its timestamp: the
    loader's clock stands in, so the producer gets a whole expiry period."""
    row = b"[5,3,0]" if version == 2 else b"[5,3,0,4]"
    doc = (
        b'{"version":%d,"next_offset":10,"producers":[],'
        b'"txns":{"ongoing":[],"aborted":[],"markers":[%s]}}' % (version, row)
    )
    loaded = ProducerStateManager.from_snapshot(doc, now_ms=T0)
    assert loaded.txns.markers == {5: MarkerEpochs(3, 0, 9 if version == 2 else 4, T0)}
    loaded.truncate_head(10)
    assert loaded.check_marker(5, 2, 0)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    loaded.remove_expired(now_ms=T0 + 999, expiration_ms=1000)
    assert 5 in loaded.txns.markers
