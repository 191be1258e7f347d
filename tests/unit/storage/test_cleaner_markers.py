"""The cleaner and transactions: markers go by Kafka's two-pass delete-horizon rule,
aborted data goes, read_committed reads and the rebuilt transaction state stay right;
and a bounded key map cleans in several passes to the same result as one big pass.

Real PartitionLogs in tmp dirs, written through the producer-state registry as the
produce path does; the facts handed to the cleaner are built as the broker builds them
(server/broker.py ``_transaction_facts``).
"""

from __future__ import annotations

from pathlib import Path

from trio_broker.config import load_config
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import (
    Record,
    RecordBatchView,
    build_batch,
    build_control_batch,
    iter_batches,
)
from trio_broker.server.log_cleaner import LogCleaner
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.state.producer import Append
from trio_broker.storage.cleaner import (
    DELETE_HORIZON_BIT,
    CleanResult,
    TransactionFacts,
    clean_log,
    delete_horizon,
    plan_for,
    verify_segment,
)
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.swap import read_cleaner_checkpoint

DAY = 86_400_000
T0 = 1_700_000_000_000
CONFIG = LogConfig(
    segment_bytes=600,
    index_interval_bytes=64,
    retention_ms=None,
    compact=True,
    delete=False,
    delete_retention_ms=DAY,
    min_cleanable_dirty_ratio=0.0,
)


class TxnLog:
    """A partition log written through the registry, as the produce path does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = PartitionLog.open(path / "t-0", CONFIG, now_ms=lambda: T0)
        self.registry = ProducerStateRegistry(None, lambda: T0)
        self.sequences: dict[int, int] = {}
        self.fillers = 0

    def _append(self, raw: bytearray) -> int:
        view = RecordBatchView(raw)
        if view.is_control:
            code, _ = self.registry.check_marker("t", 0, self.log, view.producer_id, 0, 0)
            assert code == ErrorCode.NONE
        elif view.producer_id >= 0:
            assert isinstance(self.registry.check("t", 0, self.log, view), Append)
        result = self.log.append(raw, now_ms=T0)
        self.registry.record_append(
            "t", 0, RecordBatchView(raw), result.base_offset, result.last_offset
        )
        return int(result.base_offset)

    def txn(self, pid: int, key: bytes, value: bytes) -> int:
        seq = self.sequences.get(pid, 0)
        self.sequences[pid] = seq + 1
        raw = build_batch([(key, value)], producer_id=pid, producer_epoch=0,
                          base_sequence=seq, base_timestamp=T0, is_transactional=True)  # fmt: skip
        return self._append(raw)

    def marker(self, pid: int, committed: bool) -> int:
        raw = build_control_batch(pid, 0, committed=committed, coordinator_epoch=0, timestamp=T0)
        return self._append(raw)

    def plain(self, key: bytes, value: bytes | None) -> int:
        return self._append(build_batch([Record(0, 0, key, value)], base_timestamp=T0))

    def fill(self, count: int = 12) -> None:
        """Plain writes of a key of their own: they roll (and close) segments."""
        for _ in range(count):
            self.fillers += 1
            self.plain(b"filler", b"f%d" % self.fillers)
        self.log.flush()

    def facts(self) -> TransactionFacts:
        lso = self.registry.last_stable_offset("t", 0, self.log, self.log.log_end_offset)
        aborted = self.registry.aborted_between("t", 0, self.log, self.log.log_start_offset, lso)
        return TransactionFacts(
            lso, tuple((a.producer_id, a.first_offset, a.last_offset) for a in aborted)
        )

    def clean(self, now_ms: int, *, due: bool = False) -> CleanResult | None:
        plan = plan_for(self.log, now_ms, tombstones_due=due)
        result = clean_log(self.log, now_ms, plan=plan, txns=self.facts())
        if result is not None and result.aborts_without_data:  # as the cleaner task does
            self.registry.forget_aborted("t", 0, self.log, result.aborts_without_data)
        return result

    def batches(self) -> list[RecordBatchView]:
        out = []
        for region in self.log.read(self.log.log_start_offset, 1 << 30, self.log.log_end_offset):
            for batch in iter_batches(region.read_bytes()):
                assert batch.crc_is_valid()
                out.append(batch)
        return out

    def markers(self) -> dict[int, RecordBatchView]:
        return {b.base_offset: b for b in self.batches() if b.is_control}

    def read_committed(self) -> dict[bytes, bytes | None]:
        """Each key's latest value as a read_committed consumer sees it: below the LSO,
        without the aborted transactions' records (the fetch path's aborted list)."""
        facts = self.facts()
        latest: dict[bytes, bytes | None] = {}
        for batch in self.batches():
            if batch.is_control or batch.base_offset >= facts.last_stable_offset:
                continue
            if facts.is_aborted(batch):
                continue
            for record in batch.records():
                assert record.key is not None
                latest[record.key] = record.value
        return latest


def test_markers_go_after_their_data_and_horizon_and_reads_stay_right(tmp_path: Path) -> None:
    t = TxnLog(tmp_path)
    t.txn(11, b"k0", b"c-old")
    m_commit = t.marker(11, committed=True)  # its data is compacted away below
    t.txn(12, b"k0", b"aborted")
    m_abort = t.marker(12, committed=False)  # its data goes as aborted
    t.plain(b"k0", b"new")
    t.txn(13, b"k6", b"c13")
    m_live = t.marker(13, committed=True)  # its data stays the latest of k6
    for pid, key in ((11, b"k5"), (12, b"k7"), (13, b"k8")):  # every producer's last batch
        t.txn(pid, key, b"last-%d" % pid)
        t.marker(pid, committed=True)
    lasts = set(t.markers()) - {m_commit, m_abort, m_live}
    t.fill()
    expected = {b"k0": b"new", b"k6": b"c13", b"k5": b"last-11", b"k7": b"last-12",
                b"k8": b"last-13"}  # fmt: skip
    visible = t.read_committed()
    assert {k: v for k, v in visible.items() if k != b"filler"} == expected
    assert t.facts().aborted  # the aborted transaction is in the fetch path's list

    # Pass 1: the committed and the aborted data go; their markers stay (the pass met
    # their data), without a horizon.
    t1 = T0 + 1000
    first = t.clean(t1)
    assert first is not None and first.markers_dropped == 0
    assert first.next_horizon == t1  # their data all went: the next pass is due now
    assert first.aborts_without_data == [] and t.facts().aborted  # the marker is there
    values = [r.value for b in t.batches() if not b.is_control for r in b.records()]
    assert b"c-old" not in values and b"aborted" not in values and b"c13" in values
    markers = t.markers()
    assert set(markers) == {m_commit, m_abort, m_live} | lasts
    assert all(delete_horizon(b) is None for b in markers.values())
    assert {k: v for k, v in t.read_committed().items() if k != b"filler"} == expected

    # Pass 2 (the one pass 1 asked for): the two markers whose data is gone get the
    # horizon; the one whose data is there and the producers' last ones do not.
    t2 = T0 + 2000
    second = t.clean(t2, due=True)
    assert second is not None and second.next_horizon == t2 + DAY
    markers = t.markers()
    for offset in (m_commit, m_abort):
        stamped = markers[offset]
        assert stamped.attributes & DELETE_HORIZON_BIT and delete_horizon(stamped) == t2 + DAY
        assert stamped.is_control and stamped.is_transactional and stamped.producer_id in (11, 12)
        (record,) = stamped.records()
        assert stamped.timestamp_of(record) == T0  # the marker's own timestamp is kept
    assert all(delete_horizon(markers[o]) is None for o in {m_live} | lasts)
    # The aborted transaction has no data left: fetches stop naming it before its marker
    # goes (a consumer would skip producer 12's later records looking for the marker).
    assert second.aborts_without_data == [(12, m_abort)]
    assert t.facts().aborted == ()

    # Before the horizon they stay; at it they go (the task runs this pass when due).
    third = t.clean(t2 + DAY - 1, due=True)
    assert third is not None and third.markers_dropped == 0
    assert {m_commit, m_abort} <= set(t.markers())
    fourth = t.clean(t2 + DAY, due=True)
    assert fourth is not None and fourth.markers_dropped == 2
    assert set(t.markers()) == {m_live} | lasts
    assert {k: v for k, v in t.read_committed().items() if k != b"filler"} == expected

    # A restart rebuilds the transaction state from what cleaning left: nothing open,
    # nothing aborted left to hide, the same read_committed view; segments scan whole.
    t.log.close()
    reopened = TxnLog.__new__(TxnLog)
    reopened.__dict__.update(t.__dict__)
    reopened.log = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=lambda: T0)
    reopened.registry = ProducerStateRegistry(None, lambda: T0)
    assert reopened.facts() == TransactionFacts(reopened.log.log_end_offset, ())
    assert {k: v for k, v in reopened.read_committed().items() if k != b"filler"} == expected
    gaps = read_cleaner_checkpoint(reopened.log.directory)
    for segment in reopened.log.cleanable_segments():
        assert verify_segment(segment.fd, segment.size, segment.base_offset, gaps)
    reopened.log.close()


def test_open_transaction_marker_and_data_wait_for_the_lso(tmp_path: Path) -> None:
    t = TxnLog(tmp_path)
    t.txn(21, b"k0", b"old")
    t.marker(21, committed=True)
    t.plain(b"k0", b"newer")
    t.fill()
    open_at = t.txn(22, b"k1", b"open")  # undecided: the LSO stays here
    t.fill()
    assert t.facts().last_stable_offset == open_at
    result = t.clean(T0 + 1000)
    assert result is not None
    assert all(s.base_offset < open_at for s in t.log.cleanable_segments()[: result.segments_out])
    assert any(r.value == b"open" for b in t.batches() for r in b.records())
    t.log.close()


def _write_updates(path: Path) -> PartitionLog:
    log = PartitionLog.open(path, CONFIG, now_ms=lambda: T0)
    for i in range(240):  # 30 keys, some deleted, in batches of one record
        key = b"key-%d" % ((i * 7) % 30)
        value = None if i % 11 == 0 else b"v%d" % i
        log.append(build_batch([Record(0, 0, key, value)], base_timestamp=T0 + i,
                               compression=Compression.NONE), now_ms=T0 + i)  # fmt: skip
    log.flush()
    return log


def _rows(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None, int]]:
    rows = []
    for region in log.read(log.log_start_offset, 1 << 30, log.log_end_offset):
        for batch in iter_batches(region.read_bytes()):
            for record in batch.records():
                rows.append((batch.offset_of(record), record.key, record.value,
                             batch.timestamp_of(record)))  # fmt: skip
    return rows


def test_a_small_key_map_cleans_in_passes_to_what_one_big_pass_leaves(tmp_path: Path) -> None:
    small, big = _write_updates(tmp_path / "small-0"), _write_updates(tmp_path / "big-0")
    assert _rows(small) == _rows(big)
    now = T0 + 10_000
    max_keys = 10  # a 600-byte segment holds at most 9 one-record batches: 9 keys
    passes = []
    for _ in range(40):  # bounded: each pass maps at least one dirty segment
        result = clean_log(small, now, max_keys=max_keys)
        if result is None:
            break
        passes.append(result)
    one = clean_log(big, now)
    assert one is not None and clean_log(big, now) is None
    assert len(passes) >= 3, "the map should have been full more than twice"
    assert all(p.keys_mapped <= max_keys for p in passes)
    assert one.keys_mapped > max_keys
    assert _rows(small) == _rows(big)
    latest = {key: value for _, key, value, _ in _rows(small)}
    assert len(latest) == 30
    small.close()
    big.close()


def test_truncation_lowers_the_cleaner_checkpoint(tmp_path: Path) -> None:
    log = _write_updates(tmp_path / "t-0")
    assert clean_log(log, T0 + 10_000) is not None
    checkpoint = read_cleaner_checkpoint(log.directory)
    assert checkpoint > 100
    end = log.truncate_to(100)
    # Writes after the cut land below the old checkpoint: they are dirty, not clean.
    assert read_cleaner_checkpoint(log.directory) == end <= 100
    log.close()


def test_dedupe_buffer_size_bounds_the_cleaner_task_in_keys(tmp_path: Path) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text("log.cleaner.dedupe.buffer.size=2400\n")
    config = load_config(properties)
    assert config.log_cleaner_dedupe_buffer_size == 2400
    cleaner = LogCleaner(list, lambda: T0, backoff_ms=100, io_max_bytes_per_second=1e9,
                         dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size)  # fmt: skip
    assert cleaner.max_keys == 100  # Kafka's 24 bytes a key
    assert LogCleaner(list, lambda: T0, backoff_ms=1, io_max_bytes_per_second=1e9).max_keys == (
        134_217_728 // 24
    )


def test_an_aborted_entry_whose_marker_is_already_gone_is_reported(tmp_path: Path) -> None:
    """State from before a marker went (an old snapshot) names a transaction the log no
    longer has: the next pass reports it, so fetches stop naming it."""
    t = TxnLog(tmp_path)
    t.txn(31, b"k0", b"v")
    t.marker(31, committed=True)
    t.fill()
    gone_marker = t.log.log_start_offset + 1  # the commit marker's offset: never an abort
    stale = TransactionFacts(t.log.log_end_offset, ((99, 0, gone_marker + 1000),))
    result = clean_log(t.log, T0 + 1000, txns=stale)
    assert result is not None and result.aborts_without_data == []  # beyond the range
    t.fill()
    cleaned_to = t.log.log_end_offset
    stale = TransactionFacts(cleaned_to, ((99, 0, 2),))  # offset 2: a filler, no marker
    result = clean_log(t.log, T0 + 2000, txns=stale)
    assert result is not None and result.aborts_without_data == [(99, 2)]
    t.log.close()


def test_a_producers_last_data_batch_stays_when_a_marker_follows_it(tmp_path: Path) -> None:
    """Kafka's cleaner retains the batch of each producer's last data offset (its last
    sequence), not only its last batch (here the commit marker): rebuilt from the log,
    the state still refuses a gap."""
    t = TxnLog(tmp_path)
    data_at = t.txn(7, b"k", b"old")
    t.marker(7, committed=True)
    t.plain(b"k", b"new")  # the transaction's only record is superseded
    t.fill(30)
    for day in range(1, 5):
        t.clean(T0 + day * 2 * DAY, due=True)
    assert [b.base_offset for b in t.batches() if b.producer_id == 7] == [data_at, data_at + 1]
    fresh = ProducerStateRegistry(None, lambda: T0)
    gap = build_batch([(b"k", b"x")], producer_id=7, producer_epoch=0, base_sequence=5,
                      base_timestamp=T0, is_transactional=True)  # fmt: skip
    verdict = fresh.check("t", 0, t.log, RecordBatchView(gap))
    assert getattr(verdict, "error_code", None) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
