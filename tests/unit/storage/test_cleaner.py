"""Log compaction: the pure rules (storage/cleaner.py) and passes over real log directories."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol.compression import Compression
from trio_broker.protocol.records import (
    Record,
    RecordBatchView,
    build_batch,
    build_control_batch,
    iter_batches,
)
from trio_broker.storage.cleaner import (
    DELETE_HORIZON_BIT,
    SegmentFacts,
    TransactionFacts,
    clean_log,
    delete_horizon,
    filter_batch,
    group_segments,
    plan_cleaning,
    plan_for,
)
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.recovery import scan_segment
from trio_broker.storage.swap import CLEANER_CHECKPOINT, read_cleaner_checkpoint

DAY = 86_400_000
CONFIG = LogConfig(
    segment_bytes=600,
    index_interval_bytes=64,
    retention_ms=None,
    compact=True,
    delete=False,
    delete_retention_ms=DAY,
    min_cleanable_dirty_ratio=0.0,
)
T0 = 1_700_000_000_000

Update = tuple[int, bytes | None]  # (key number, value or None for a tombstone)


def key_of(k: int) -> bytes:
    return b"key-%d" % k


def write(log: PartitionLog, batches: list[list[Update]], codec: Compression, ts: int = T0) -> None:
    for i, updates in enumerate(batches):
        records = [Record(j, j, key_of(k), value) for j, (k, value) in enumerate(updates)]
        log.append(build_batch(records, base_timestamp=ts + i, compression=codec), now_ms=ts + i)


def read_all(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record, from the log start."""
    out = []
    for region in log.read(log.log_start_offset, 1 << 30, log.log_end_offset):
        for batch in iter_batches(region.read_bytes()):
            assert batch.crc_is_valid()
            for record in batch.records():
                out.append(
                    (batch.offset_of(record), record.key, record.value, batch.timestamp_of(record))
                )
    return out


def latest_by_key(rows: list[tuple[int, bytes | None, bytes | None, int]]) -> dict:
    latest: dict[bytes | None, tuple[int, bytes | None, int]] = {}
    for offset, key, value, ts in rows:
        latest[key] = (offset, value, ts)
    return latest


def open_log(path: Path, config: LogConfig = CONFIG) -> PartitionLog:
    log = PartitionLog.open(path, config, now_ms=lambda: T0)
    return log


def sealed(log: PartitionLog) -> PartitionLog:
    log.flush()  # sealed segments become fully synced: cleanable
    return log


updates_strategy = st.lists(
    st.lists(
        st.tuples(st.integers(0, 7), st.one_of(st.none(), st.binary(min_size=1, max_size=30))),
        min_size=1,
        max_size=6,
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=updates_strategy,
    codec=st.sampled_from(
        [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
    ),
)
def test_latest_value_survives_at_its_offset(tmp_path_factory, batches, codec) -> None:
    path = tmp_path_factory.mktemp("log")
    log = sealed(open_log(path))
    write(log, batches, codec)
    log.flush()
    before = read_all(log)
    active = log.active_segment()
    active_bytes = os.pread(active.fd, active.size, 0)
    cleaned_end = active.base_offset
    clean_log(log, T0 + 1000)
    after = read_all(log)
    # Offsets strictly increase, and every record is one that was written, unchanged.
    offsets = [row[0] for row in after]
    assert offsets == sorted(set(offsets))
    written = {row[0]: row for row in before}
    assert all(written[row[0]] == row for row in after)
    # The latest record of every key survives at its original offset, tombstones
    # included (their horizon has not passed).
    assert latest_by_key(after) == latest_by_key(before)
    # In the cleaned range each key appears once.
    cleaned_keys = [row[1] for row in after if row[0] < cleaned_end]
    assert len(cleaned_keys) == len(set(cleaned_keys))
    # The active segment is untouched.
    assert os.pread(active.fd, active.size, 0) == active_bytes
    assert log.active_segment() is active
    # Tombstones go once delete.retention.ms has passed since they were first cleaned.
    clean_log(
        log, T0 + 1000 + DAY + 1, plan=plan_for(log, T0 + 1000 + DAY + 1, tombstones_due=True)
    )
    final = read_all(log)
    tombstoned = {
        k for k, (off, v, _) in latest_by_key(before).items() if v is None and off < cleaned_end
    }
    assert not any(row[1] in tombstoned for row in final)
    assert {k: v for k, v in latest_by_key(final).items()} == {
        k: v for k, v in latest_by_key(before).items() if k not in tombstoned
    }
    # And the directory reads back the same after a crash (recovery scans) ...
    log.abort()
    with contextlib.suppress(FileNotFoundError):  # then every segment is scanned
        os.unlink(path / "recovery-point.checkpoint")
    again = open_log(path)
    assert read_all(again) == final
    again.close()
    # ... and after a clean shutdown (indexes trusted).
    again = open_log(path)
    assert read_all(again) == final
    again.close()


def test_cleaned_segments_keep_offsets_holes_indexes_and_time_lookups(tmp_path: Path) -> None:
    log = sealed(open_log(tmp_path))
    # 30 batches of key 0..2, timestamps T0 + i.
    write(log, [[(i % 3, b"v%d" % i)] for i in range(30)], Compression.NONE)
    log.flush()
    assert len(log.segment_base_offsets()) > 2
    result = clean_log(log, T0 + 1000)
    assert result is not None and result.batches_dropped > 0
    rows = read_all(log)
    end = log.active_segment().base_offset
    kept = [row[0] for row in rows if row[0] < end]
    assert len(kept) == 3 and kept == sorted(kept)
    # A fetch from an offset in a hole starts at the next batch that is there.
    regions = log.read(0, 1 << 20, log.log_end_offset)
    first = next(iter_batches(regions[0].read_bytes()))
    assert first.base_offset == kept[0]
    # Time lookups land on the first surviving batch at or after the time.
    offset, ts = log.offset_for_timestamp(T0)
    assert offset == kept[0] and ts >= T0
    offset, _ = log.offset_for_timestamp(T0 + kept[1])
    assert offset == kept[1]
    # Indexes: each cleaned segment scans clean with holes allowed below the checkpoint.
    assert read_cleaner_checkpoint(tmp_path) >= end
    for base in log.segment_base_offsets()[:-1]:
        fd = os.open(tmp_path / f"{base:020d}.log", os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            assert scan_segment(fd, size, base, gaps_below=end).valid_size == size
            assert scan_segment(fd, size, base).valid_size < size or size == 0 or base == kept[0]
        finally:
            os.close(fd)
    log.close()


def test_transactional_and_last_producer_batches_are_kept_whole(tmp_path: Path) -> None:
    log = sealed(open_log(tmp_path))
    for i in range(3):  # the idempotent producer 7 writes key 0 three times
        b = build_batch(
            [(key_of(0), b"idem%d" % i)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=i,
            base_timestamp=T0,
        )
        log.append(b, now_ms=T0)
    txn = build_batch(
        [(key_of(1), b"txn")],
        producer_id=9,
        producer_epoch=0,
        base_sequence=0,
        base_timestamp=T0,
        is_transactional=True,
    )
    log.append(txn, now_ms=T0)
    log.append(
        build_control_batch(9, 0, committed=False, coordinator_epoch=0, timestamp=T0), now_ms=T0
    )
    write(log, [[(1, b"plain")], [(0, b"plain0")]] * 20, Compression.NONE)
    log.flush()
    clean_log(log, T0 + 1000)
    rows = read_all(log)
    values = [row[2] for row in rows]
    # The transactional record stays, and it hides nothing: key 1's plain value after it
    # is still the latest, and the abort marker stays.
    assert b"txn" in values
    # Producer 7's last batch stays (its sequence state), the two before it go.
    assert b"idem2" in values and b"idem0" not in values and b"idem1" not in values
    log.close()


def test_transactional_data_is_cleaned_by_kafkas_rules_below_the_lso(tmp_path: Path) -> None:
    """Committed transactions compact like plain data, aborted ones go, open ones wait."""
    log = sealed(open_log(tmp_path))
    pid_commit, pid_abort, pid_open = 11, 12, 13
    seq = dict.fromkeys((pid_commit, pid_abort, pid_open), 0)

    def txn(pid: int, key: int, value: bytes) -> None:
        batch = build_batch([(key_of(key), value)], producer_id=pid, producer_epoch=0,
                            base_sequence=seq[pid], base_timestamp=T0, is_transactional=True)  # fmt: skip
        seq[pid] += 1
        log.append(batch, now_ms=T0)

    def marker(pid: int, committed: bool) -> int:
        control = build_control_batch(pid, 0, committed=committed, coordinator_epoch=0,
                                      timestamp=T0)  # fmt: skip
        return log.append(control, now_ms=T0).base_offset

    aborted_first = None
    for round_ in range(6):
        txn(pid_commit, 0, b"committed-%d" % round_)
        marker(pid_commit, committed=True)
        first = log.log_end_offset
        txn(pid_abort, 0, b"aborted-%d" % round_)  # would hide key 0's committed value
        last = marker(pid_abort, committed=False)
        aborted_first = aborted_first or []
        aborted_first.append((pid_abort, first, last))
        write(log, [[(1, b"plain-%d" % round_)]], Compression.NONE)
    lso = log.log_end_offset
    txn(pid_open, 2, b"open")  # undecided: at the LSO
    write(log, [[(3, b"after-%d" % i)] for i in range(12)], Compression.NONE)
    log.flush()
    facts = TransactionFacts(lso, tuple(aborted_first or ()))
    clean_log(log, T0 + 1000, txns=facts)
    rows = read_all(log)
    values = [row[2] for row in rows]
    below = [row for row in rows if row[0] < lso]
    # Aborted data is gone; committed data compacts: key 0's latest committed value
    # stays (the aborted writes after it do not hide it), its older ones go.
    assert not any(v is not None and v.startswith(b"aborted") for v in values)
    assert b"committed-5" in values
    assert not any(v == b"committed-%d" % i for i in range(4) for v in values)
    assert latest_by_key(below)[key_of(1)][1] == b"plain-5"
    # Nothing at or above the LSO was touched: the open transaction's record stays.
    assert b"open" in values
    # Markers stay after this first pass: it met every transaction's data (a marker goes
    # only once its data is gone and its delete horizon has passed: test_cleaner_markers.py).
    markers = [b for r in log.read(0, 1 << 30, log.log_end_offset)
               for b in iter_batches(r.read_bytes()) if b.is_control]  # fmt: skip
    assert len(markers) == 12
    log.close()


def test_stopped_swap_at_every_step_recovers_whole(tmp_path: Path) -> None:
    class Crash(Exception):
        pass

    for step in (
        "cleaned-written",
        "checkpoint-written",
        "swap-committed",
        "old-deleted",
        "swap-renamed",
        "indexes-written",
    ):
        path = tmp_path / step
        log = sealed(open_log(path))
        write(log, [[(i % 4, b"value-%d" % i)] for i in range(40)], Compression.GZIP)
        log.flush()
        before = latest_by_key(read_all(log))

        def crash(name: str, step: str = step) -> None:
            if name == step:
                raise Crash

        with pytest.raises(Crash):
            clean_log(log, T0 + 1000, after_step=crash)
        log.abort()  # a crash: no clean-shutdown marker
        names = set(os.listdir(path))
        reopened = open_log(path)
        assert latest_by_key(read_all(reopened)) == before, (step, names)
        assert not any(n.endswith((".swap", ".cleaned")) for n in os.listdir(path))
        # The next pass finishes the job.
        clean_log(reopened, T0 + 2000, plan=plan_for(reopened, T0 + 2000))
        assert latest_by_key(read_all(reopened)) == before
        reopened.close()


@pytest.mark.parametrize("xerial", [False, True])
def test_rewritten_snappy_batches_keep_their_framing(xerial: bool) -> None:
    from trio_broker.protocol.compression import XERIAL_MAGIC

    raw = build_batch(
        [(b"a", b"1"), (b"a", b"2")],
        compression=Compression.SNAPPY,
        snappy_xerial=xerial,
        base_timestamp=T0,
    )
    batch = RecordBatchView(raw)
    verdict = filter_batch(batch, batch.records(), {b"a": 1}, now_ms=T0, delete_retention_ms=1)
    assert verdict.rewritten is not None
    payload = verdict.rewritten[61:69]
    assert (payload == XERIAL_MAGIC) is xerial
    assert [r.value for r in RecordBatchView(verdict.rewritten).records()] == [b"2"]


def test_filter_batch_stamps_and_honours_the_delete_horizon() -> None:
    batch = RecordBatchView(build_batch([(b"a", None), (b"b", b"x")], base_timestamp=T0))
    records = batch.records()
    offsets = {b"a": 0, b"b": 1}
    first = filter_batch(batch, records, offsets, now_ms=T0 + 5, delete_retention_ms=100)
    assert first.rewritten is not None and first.horizon == T0 + 105
    stamped = RecordBatchView(first.rewritten)
    assert stamped.attributes & DELETE_HORIZON_BIT and delete_horizon(stamped) == T0 + 105
    assert stamped.crc_is_valid() and stamped.last_offset_delta == 1
    # Record timestamps do not move with the horizon.
    assert [stamped.timestamp_of(r) for r in stamped.records()] == [T0, T0]
    early = filter_batch(
        stamped, stamped.records(), offsets, now_ms=T0 + 104, delete_retention_ms=100
    )
    assert early.rewritten is None and len(early.kept) == 2
    late = filter_batch(
        stamped, stamped.records(), offsets, now_ms=T0 + 105, delete_retention_ms=100
    )
    assert late.rewritten is not None and [r.key for r in late.kept] == [b"b"]
    assert RecordBatchView(late.rewritten).last_offset_delta == 1


def facts(*specs: tuple[int, int, int, int]) -> list[SegmentFacts]:
    return [SegmentFacts(b, e, size, ts, ts) for b, e, size, ts in specs]


def test_plan_honours_lag_ratio_and_max_lag() -> None:
    segs = facts((0, 10, 100, 1000), (10, 20, 100, 2000), (20, 30, 100, 3000))
    cfg = attrs.evolve(CONFIG, min_cleanable_dirty_ratio=0.5)
    plan = plan_cleaning(segs, first_dirty=0, now_ms=5000, config=cfg)
    assert plan is not None and plan.count == 3 and plan.end_offset == 30
    # min.compaction.lag.ms: segments with a record younger than the lag stay dirty.
    lagged = attrs.evolve(cfg, min_compaction_lag_ms=2500)
    plan = plan_cleaning(segs, first_dirty=0, now_ms=5000, config=lagged)
    assert plan is not None and plan.count == 2
    # Ratio: 1 dirty segment of 3 is below 0.5 ...
    assert plan_cleaning(segs, first_dirty=20, now_ms=5000, config=cfg) is None
    # ... unless max.compaction.lag.ms is exceeded, or a tombstone is due.
    overdue = attrs.evolve(cfg, max_compaction_lag_ms=1000)
    plan = plan_cleaning(segs, first_dirty=20, now_ms=5000, config=overdue)
    assert plan is not None and plan.forced
    assert plan_cleaning(segs, first_dirty=30, now_ms=5000, config=cfg) is None
    assert plan_cleaning(segs, first_dirty=30, now_ms=5000, config=cfg, tombstones_due=True)


def test_a_young_clean_segment_does_not_hold_back_an_overdue_dirty_one() -> None:
    """Found by the cleaner machine (a restart): a clean segment a pass emptied is dated
    by its file's mtime, which can be later than the log's clock; the min-lag check ran
    over the clean segments too, so no pass was planned though a dirty record was past
    max.compaction.lag.ms. Kafka applies the lag from the first dirty offset only, and
    not at all when it is 0."""
    segs = facts((0, 10, 0, 9_000), (10, 20, 100, 1000))
    overdue = attrs.evolve(CONFIG, max_compaction_lag_ms=1000, min_compaction_lag_ms=0)
    plan = plan_cleaning(segs, first_dirty=10, now_ms=5000, config=overdue)
    assert plan is not None and plan.forced and plan.end_offset == 20
    lagged = attrs.evolve(overdue, min_compaction_lag_ms=500)
    plan = plan_cleaning(segs, first_dirty=10, now_ms=5000, config=lagged)
    assert plan is not None and plan.forced and plan.end_offset == 20


def test_groups_fit_segment_bytes() -> None:
    segs = facts(*[(i * 10, i * 10 + 10, 300, 0) for i in range(5)])
    assert group_segments(segs, 600, 1000) == [2, 2, 1]
    assert group_segments(segs, 100, 1000) == [1, 1, 1, 1, 1]


def test_retention_by_age_only_with_the_delete_policy(tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, retention_ms=1)
    log = sealed(open_log(tmp_path, config))
    write(log, [[(i, b"x" * 50)] for i in range(30)], Compression.NONE)
    log.flush()
    segments = len(log.segment_base_offsets())
    assert log.apply_retention(T0 + DAY) == 0
    assert len(log.segment_base_offsets()) == segments
    log.config = attrs.evolve(config, delete=True)
    assert log.apply_retention(T0 + DAY) == segments - 1
    log.close()


def test_first_pass_checkpoint_marks_the_dirty_section(tmp_path: Path) -> None:
    log = sealed(open_log(tmp_path))
    write(log, [[(i % 2, b"v")] for i in range(20)], Compression.NONE)
    log.flush()
    assert not (tmp_path / CLEANER_CHECKPOINT).exists()
    clean_log(log, T0 + 1000)
    end = read_cleaner_checkpoint(tmp_path)
    assert end == log.active_segment().base_offset
    # Nothing new is dirty: with the default ratio no pass is due.
    log.config = attrs.evolve(CONFIG, min_cleanable_dirty_ratio=0.5)
    assert plan_for(log, T0 + 2000) is None
    log.close()


def test_committed_offsets_log_is_compacted_and_stops_growing(tmp_path: Path) -> None:
    from trio_broker.groups.offsets_store import OffsetAndMetadata, OffsetKey, OffsetsStore

    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, delete_retention_ms=0)
    store = OffsetsStore.open(tmp_path, config)
    assert store.log.config.compact and not store.log.config.delete
    keys = [OffsetKey("group", "topic", p) for p in range(5)]
    sizes = []
    for rounds in range(4):
        for i in range(200):  # 200 commits for 5 partitions, one batch each
            key = keys[i % 5]
            value = None if (rounds == 3 and key.partition == 4) else OffsetAndMetadata(i)
            store.apply(store.append([(key, value)], T0))
        store.log.flush()
        clean_log(store.log, T0 + 1000, plan=plan_for(store.log, T0 + 1000, tombstones_due=True))
        sizes.append(store.log.size_bytes)
    # The log holds about one segment of fresh commits plus the latest of each key.
    assert max(sizes) < 2 * 2048 + 5 * 100
    expected = {k: store.get(k.group_id, k.topic, k.partition) for k in keys}
    store.close()
    reopened = OffsetsStore.open(tmp_path, config)
    assert {k: reopened.get(k.group_id, k.topic, k.partition) for k in keys} == expected
    assert expected[keys[4]] is None
    reopened.close()


def test_transaction_log_is_compacted_and_replays_to_the_same_table(tmp_path: Path) -> None:
    from trio_broker.protocol.records import build_batch as batch_of
    from trio_broker.services.local_replication import OwnLog
    from trio_broker.transactions.coordinator import TransactionCoordinator, open_transaction_log
    from trio_broker.transactions.log_format import encode_key, encode_value
    from trio_broker.transactions.state import TxnMetadata, TxnState

    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, delete_retention_ms=0)
    # Replaying the log needs none of the coordinator's collaborators.
    unused = dict.fromkeys(("topics", "producers", "durability", "appends", "groups",
                            "allocate_producer_id", "write_marker"))  # fmt: skip

    def replayed() -> TransactionCoordinator:
        """A node alone's table over its own __transaction_state-0, loaded."""
        txn_log = open_transaction_log(tmp_path, config)
        table = TransactionCoordinator(
            txn_log, replication=OwnLog(0, txn_log), now_ms=lambda: T0, **unused
        )
        table.load()
        return table

    txn_log = replayed().log
    assert txn_log.config.compact and not txn_log.config.delete
    ids = [f"txn-{n}" for n in range(4)]
    sizes, latest = [], {}
    for rounds in range(4):
        for i in range(150):  # each id moves through epochs and states, one record each
            tid = ids[i % 4]
            meta = TxnMetadata(tid, producer_id=100 + i % 4, producer_epoch=rounds * 150 + i,
                               state=TxnState.COMPLETE_COMMIT if i % 2 else TxnState.EMPTY)  # fmt: skip
            value = None if (rounds == 3 and tid == ids[3]) else encode_value(meta)
            latest[tid] = None if value is None else (meta.producer_id, meta.producer_epoch,
                                                      meta.state)  # fmt: skip
            txn_log.append(batch_of([(encode_key(tid), value)], base_timestamp=T0), now_ms=T0)
        txn_log.flush()
        clean_log(txn_log, T0 + 1000, plan=plan_for(txn_log, T0 + 1000, tombstones_due=True))
        sizes.append(txn_log.size_bytes)
    assert max(sizes) < 2 * 2048 + 4 * 200, sizes  # one fresh segment + the latest per id
    txn_log.close()
    reopened = replayed()
    table = {m.transactional_id: (m.producer_id, m.producer_epoch, m.state) for m in reopened.all()}
    assert table == {tid: value for tid, value in latest.items() if value is not None}
    assert ids[3] not in table and len(table) == 3  # the tombstoned id is gone
    reopened.log.close()


def test_log_end_survives_a_crash_when_the_cleaned_tail_ends_in_a_hole(tmp_path: Path) -> None:
    log = sealed(open_log(tmp_path))
    write(log, [[(i % 3, b"v%d" % i)] for i in range(20)] + [[(9, None)]], Compression.NONE)
    log.roll(T0)  # the active segment is empty; the tombstone ends the last closed one
    log.flush()
    end = log.log_end_offset
    clean_log(log, T0 + 1000)
    later = T0 + 1000 + DAY + 1
    clean_log(log, later, plan=plan_for(log, later, tombstones_due=True))
    assert all(row[1] != key_of(9) for row in read_all(log))
    log.abort()
    # Recovery scans the cleaned segment (as after a swap that recovery finished, whose
    # indexes were never written), so its end is where its last batch ends.
    os.unlink(tmp_path / "recovery-point.checkpoint")
    reopened = open_log(tmp_path)
    assert reopened.log_end_offset == end  # offsets are never handed out twice
    reopened.close()


def test_a_tombstone_stays_while_a_whole_kept_batch_holds_an_older_value(tmp_path: Path) -> None:
    log = sealed(open_log(tmp_path))
    # Producer 7's only (so last) batch sets key 5; a plain tombstone deletes it later.
    log.append(
        build_batch(
            [(key_of(5), b"old")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            base_timestamp=T0,
        ),
        now_ms=T0,
    )
    write(log, [[(5, None)]] + [[(i % 3, b"v%d" % i)] for i in range(20)], Compression.NONE)
    log.flush()
    clean_log(log, T0 + 1000)
    later = T0 + 1000 + DAY + 1
    result = clean_log(log, later, plan=plan_for(log, later, tombstones_due=True))
    # Dropping the tombstone would bring b"old" back as key 5's latest value.
    assert latest_by_key(read_all(log))[key_of(5)][1] is None
    assert result is not None and result.next_horizon is None  # no pass is due for it
    log.close()


def test_a_batch_no_longer_kept_whole_loses_its_superseded_records(tmp_path: Path) -> None:
    # Producer 7's batch sets key 5 and is kept whole while it is the producer's last; a
    # plain tombstone deletes key 5. Then producer 7 writes again: its old batch is
    # kept whole no more, and lies in the clean part, where the key map never looked.
    # The tombstone, past its horizon and no longer pinned, must not go while b"old"
    # stays: b"old" goes first (found by statemachine/test_cleaner_machine.py).
    log = sealed(open_log(tmp_path))

    def produce(key: int, value: bytes, sequence: int, ts: int) -> None:
        batch = build_batch([(key_of(key), value)], producer_id=7, producer_epoch=0,
                            base_sequence=sequence, base_timestamp=ts)  # fmt: skip
        log.append(batch, now_ms=ts)

    produce(5, b"old", 0, T0)
    write(log, [[(5, None)]], Compression.NONE)
    log.roll(T0 + 1)
    log.flush()
    clean_log(log, T0 + 1000)  # stamps the tombstone's horizon; b"old" is kept whole
    produce(6, b"new", 1, T0 + 2000)
    log.roll(T0 + 2000)
    log.flush()
    later = T0 + 2000 + DAY + 1
    clean_log(log, later, plan=plan_for(log, later, tombstones_due=True))
    assert all(row[1] != key_of(5) or row[2] is None for row in read_all(log))
    log.close()


@given(
    sizes=st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 10_000)), min_size=0, max_size=8),
    first_dirty=st.integers(0, 100),
    min_lag=st.integers(0, 5000),
    ratio=st.floats(0, 1),
    due=st.booleans(),
)
def test_plan_covers_a_prefix_of_old_enough_segments(
    sizes, first_dirty, min_lag, ratio, due
) -> None:
    segs = facts(*[(i * 10, i * 10 + 10, size, ts) for i, (size, ts) in enumerate(sizes)])
    cfg = attrs.evolve(CONFIG, min_compaction_lag_ms=min_lag, min_cleanable_dirty_ratio=ratio)
    plan = plan_cleaning(
        segs, first_dirty=first_dirty, now_ms=10_000, config=cfg, tombstones_due=due
    )
    if plan is None:
        return
    assert 1 <= plan.count <= len(segs)
    assert plan.end_offset == segs[plan.count - 1].end_offset
    # The lag holds back dirty segments only (clean ones are rewritten whatever their age).
    dirty = [s for s in segs[: plan.count] if s.end_offset > first_dirty]
    assert all(10_000 - s.max_timestamp >= min_lag for s in dirty)
    assert plan.forced or plan.dirty_ratio >= ratio
