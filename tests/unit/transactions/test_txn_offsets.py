"""Transactional offsets in the group coordinator (TxnOffsetCommit's group side).

* The offsets store: staged ("pending for producer P") and end records round-trip,
  replay rebuilds the pending set, a commit moves pending offsets into the table by
  Kafka's rule (the newer *record* wins), an abort drops them, a tombstone drops
  them too, and a power cut between staging and the end leaves them pending.
* The group machine's KIP-447 check for TxnOffsetCommit.
* The coordinator (Trio shell, memory storage): ``complete_transaction`` waits for
  the producer's staged offsets, fences older epochs, and cleanup keeps what an open
  transaction holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.powerloss import PowerCut
from tests.unit.groups.test_group_state import join_req, start_coordinator
from trio_broker.groups.offsets_store import (
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    TxnEnd,
    TxnOffset,
    decode_record,
    encode_record,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import build_batch
from trio_broker.state.group import Group, GroupConfig, GroupState
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog
from trio_broker.storage.replay import iter_log_records

PRODUCER = 7000
OTHER = 7001


def staged(offset: int, partition: int = 0, producer: int = PRODUCER, epoch: int = 0) -> TxnOffset:
    return TxnOffset(producer, epoch, OffsetKey("g", "t", partition), OffsetAndMetadata(offset))


def end(committed: bool, producer: int = PRODUCER, epoch: int = 0) -> TxnEnd:
    return TxnEnd("g", producer, epoch, committed)


def write_durably(store: OffsetsStore, *records: object) -> None:
    write = store.append(list(records), now_ms=1_000)  # type: ignore[arg-type]
    store.log.flush()
    store.apply(write)


def reopen(store: OffsetsStore, data_dir: Path) -> OffsetsStore:
    store.close()
    return OffsetsStore.open(data_dir, LogConfig())


# ----------------------------------------------------------------------------- the store


def test_transactional_records_round_trip() -> None:
    for record in (staged(42, 3, epoch=5), end(True, epoch=5), end(False, OTHER)):
        key, value = encode_record(record)
        assert decode_record(key, value) == record
    plain = (OffsetKey("g", "t", 0), OffsetAndMetadata(9, 1, "m", 5))
    assert decode_record(*encode_record(plain)) == plain


def test_commit_moves_pending_into_the_table_and_survives_a_restart(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, staged(10, 0), staged(20, 1))
    assert store.get("g", "t", 0) is None  # pending is not committed
    assert store.has_pending("g", "t", 0) and store.has_pending("g", "t", 1)
    assert store.has_offsets("g") and store.group_ids() == ["g"]
    store = reopen(store, tmp_path)
    assert dict(store.pending_offsets("g", PRODUCER)) == {
        ("t", 0): OffsetAndMetadata(10),
        ("t", 1): OffsetAndMetadata(20),
    }
    write_durably(store, end(committed=True))
    assert not store.has_pending("g", "t", 0)
    assert store.get("g", "t", 0) == OffsetAndMetadata(10)
    store = reopen(store, tmp_path)
    assert (store.get("g", "t", 0), store.get("g", "t", 1)) == (
        OffsetAndMetadata(10),
        OffsetAndMetadata(20),
    )
    assert store.pending_partitions("g") == set()
    store.close()


def test_abort_drops_pending_and_keeps_the_committed_offset(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, (OffsetKey("g", "t", 0), OffsetAndMetadata(5)))
    write_durably(store, staged(10))
    write_durably(store, end(committed=False))
    assert store.get("g", "t", 0) == OffsetAndMetadata(5)
    assert not store.has_pending("g", "t", 0)
    store = reopen(store, tmp_path)
    assert store.get("g", "t", 0) == OffsetAndMetadata(5)
    assert store.pending_producers("g") == []
    store.close()


@pytest.mark.parametrize("storage", ["file", "memory"])
def test_the_newer_record_wins_at_commit(tmp_path: Path, storage: str) -> None:
    """Kafka's rule: a plain commit appended after the staged offset beats it."""
    data_dir = tmp_path if storage == "file" else None
    store = OffsetsStore.open(data_dir, LogConfig())
    write_durably(store, staged(10, 0), staged(10, 1))
    write_durably(store, (OffsetKey("g", "t", 0), OffsetAndMetadata(99)))
    assert store.has_pending("g", "t", 0)  # a plain commit does not end a transaction
    write_durably(store, end(committed=True))
    assert store.get("g", "t", 0) == OffsetAndMetadata(99)  # the later plain commit
    assert store.get("g", "t", 1) == OffsetAndMetadata(10)
    if data_dir is not None:
        store = reopen(store, data_dir)
        assert store.get("g", "t", 0) == OffsetAndMetadata(99)
        assert store.get("g", "t", 1) == OffsetAndMetadata(10)
    store.close()


def test_transactions_ending_in_the_other_order_leave_the_later_staged_offset(
    tmp_path: Path,
) -> None:
    """Two producers stage offsets of one partition; the first to stage commits last.
    Kafka counts each from its own staged record: the later one (OTHER's) wins. The
    first end's rewrite of its offset (a plain record, for compaction) counts from the
    record it rewrites, not from its own place after OTHER's (the offsets store machine
    found this)."""
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, staged(1))
    write_durably(store, staged(2, producer=OTHER))
    write_durably(store, *store.end_records("g", PRODUCER, 0, committed=True))
    assert store.get("g", "t", 0) == OffsetAndMetadata(1)
    write_durably(store, *store.end_records("g", OTHER, 0, committed=True))
    assert store.get("g", "t", 0) == OffsetAndMetadata(2)
    store = reopen(store, tmp_path)
    assert store.get("g", "t", 0) == OffsetAndMetadata(2)
    store.close()


def test_a_plain_commit_after_an_end_counts_from_its_own_place(tmp_path: Path) -> None:
    """Only the end's own batch holds rewrites: the same offset committed again by a
    consumer afterwards is newer than OTHER's staged record, and wins."""
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, staged(1))
    write_durably(store, staged(2, producer=OTHER))
    write_durably(store, *store.end_records("g", PRODUCER, 0, committed=True))
    write_durably(store, (OffsetKey("g", "t", 0), OffsetAndMetadata(1)))
    write_durably(store, *store.end_records("g", OTHER, 0, committed=True))
    assert store.get("g", "t", 0) == OffsetAndMetadata(1)
    store = reopen(store, tmp_path)
    assert store.get("g", "t", 0) == OffsetAndMetadata(1)
    store.close()


def test_ends_are_per_producer_and_per_group(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(
        store,
        staged(10, 0),
        staged(30, 0, producer=OTHER),
        TxnOffset(PRODUCER, 0, OffsetKey("h", "t", 0), OffsetAndMetadata(50)),
    )
    write_durably(store, end(committed=True))  # ends PRODUCER's transaction in "g" only
    assert store.get("g", "t", 0) == OffsetAndMetadata(10)
    assert store.has_pending("g", "t", 0)  # OTHER's offset still pending
    assert store.pending_producers("g") == [OTHER]
    assert store.has_pending("h", "t", 0) and store.get("h", "t", 0) is None
    store.close()


def test_a_tombstone_drops_pending_offsets_too(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, staged(10))
    write_durably(store, (OffsetKey("g", "t", 0), None))
    assert not store.has_pending("g", "t", 0) and not store.has_offsets("g")
    write_durably(store, end(committed=True))
    assert store.get("g", "t", 0) is None
    store = reopen(store, tmp_path)
    assert store.get("g", "t", 0) is None and not store.has_pending("g", "t", 0)
    store.close()


def test_a_counted_write_applies_the_earlier_ones_first(tmp_path: Path) -> None:
    """A producer's end is appended, its next transaction stages the same partition
    right after, and the staging write's waiter resumes first (both counted by one
    sync). The end must still settle the first transaction's offset by its own place:
    OTHER's later staged offset then wins, live as after a restart. Applying the
    staging alone first replaced the ended transaction's staged offset, the end
    settled nothing, and the live table answered 1 where a replay answers 2 (the
    offsets store machine found it)."""
    store = OffsetsStore.open(tmp_path, LogConfig())
    write_durably(store, staged(1))
    write_durably(store, staged(2, producer=OTHER))
    ending = store.append(store.end_records("g", PRODUCER, 0, committed=True), now_ms=1)
    next_staging = store.append([staged(3)], now_ms=2)
    store.log.flush()
    store.apply_counted(next_staging)  # its waiter resumes first
    store.apply_counted(ending)
    assert store.get("g", "t", 0) == OffsetAndMetadata(1)
    assert store.pending_offsets("g", PRODUCER) == {("t", 0): OffsetAndMetadata(3)}
    write_durably(store, *store.end_records("g", OTHER, 0, committed=True))
    assert store.get("g", "t", 0) == OffsetAndMetadata(2)
    store = reopen(store, tmp_path)
    assert store.get("g", "t", 0) == OffsetAndMetadata(2)
    assert store.pending_offsets("g", PRODUCER) == {("t", 0): OffsetAndMetadata(3)}
    store.close()


def test_a_write_applies_once_and_a_late_apply_does_not_resurrect(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    stage = store.append([staged(10)], now_ms=1)
    tombstone = store.append([(OffsetKey("g", "t", 0), None)], now_ms=2)
    store.log.flush()
    store.apply(tombstone)  # out of order: the later write lands first
    store.apply(stage)
    assert not store.has_pending("g", "t", 0)
    write_durably(store, staged(11))
    write_durably(store, end(committed=False))
    store.apply(stage)  # applied already: a no-op
    assert not store.has_pending("g", "t", 0)
    store.close()


def test_producer_epochs_are_remembered(tmp_path: Path) -> None:
    store = OffsetsStore.open(tmp_path, LogConfig())
    assert store.producer_epoch(PRODUCER) == -1
    write_durably(store, staged(10, epoch=3))
    write_durably(store, end(committed=False, epoch=4))
    assert store.producer_epoch(PRODUCER) == 4
    store = reopen(store, tmp_path)
    assert store.producer_epoch(PRODUCER) == 4
    store.close()


def test_a_power_cut_between_stage_and_end_leaves_the_offsets_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut = PowerCut(tmp_path / "disk", monkeypatch)
    store = OffsetsStore.open(cut.root / "data", LogConfig())
    write_durably(store, staged(10))  # TxnOffsetCommit answered after this
    store.append([end(committed=True)], now_ms=2)  # the end is not synced yet
    store.log.abort()
    after = cut.power_cut()
    again = OffsetsStore.open(after / "data", LogConfig())
    try:
        assert again.has_pending("g", "t", 0) and again.get("g", "t", 0) is None
        write_durably(again, end(committed=True))  # the coordinator ends it again
        assert again.get("g", "t", 0) == OffsetAndMetadata(10)
    finally:
        again.close()


# ----------------------------------------------------------------------------- KIP-447 check


def test_txn_offset_commit_fencing() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    check = group.validate_txn_offset_commit
    # Empty: a producer naming no generation (or none at all) is accepted.
    assert check("", None, -1) is ErrorCode.NONE
    assert check("whoever", None, -1) is ErrorCode.NONE
    assert check("whoever", None, 1) is ErrorCode.UNKNOWN_MEMBER_ID
    group.join(join_req(instance="i0"), 0, "s0", "w0")
    group.advance_to(0)  # CompletingRebalance, generation 1
    assert group.state is GroupState.COMPLETING_REBALANCE
    # Unlike OffsetCommit, no REBALANCE_IN_PROGRESS: the member and generation decide.
    assert check("s0", "i0", 1) is ErrorCode.NONE
    assert check("s0", None, 1) is ErrorCode.NONE
    assert check("s0", "i0", 0) is ErrorCode.ILLEGAL_GENERATION
    assert check("s9", "i0", 1) is ErrorCode.FENCED_INSTANCE_ID
    assert check("s0", "i9", 1) is ErrorCode.UNKNOWN_MEMBER_ID
    assert check("s9", None, 1) is ErrorCode.UNKNOWN_MEMBER_ID
    # v0-2 producers send no group metadata: accepted even in a non-empty group.
    assert check("", None, -1) is ErrorCode.NONE
    assert check("s0", None, -1) is ErrorCode.ILLEGAL_GENERATION
    session_deadline = group.members["s0"].session_deadline_ms
    check("s0", "i0", 1)
    assert group.members["s0"].session_deadline_ms == session_deadline  # not a heartbeat
    group.leave("s0", "i0", 5)
    group.delete(6)
    assert check("", None, -1) is ErrorCode.COORDINATOR_NOT_AVAILABLE


# ----------------------------------------------------------------------------- the coordinator


#: Far ahead of the mock clock: the coordinator's cleanup task (which autojump_clock
#: runs at once) must not expire these by commit age.
FRESH = 1 << 50


def entries(*offsets: int) -> list[tuple[OffsetKey, OffsetAndMetadata]]:
    return [(OffsetKey("g", "t", p), fresh(o)) for p, o in enumerate(offsets)]


def fresh(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, commit_timestamp_ms=FRESH)


async def test_complete_transaction_commits_and_aborts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        groups = await start_coordinator(nursery, delay=0)
        assert groups.validate_txn_offset_commit("g", PRODUCER, 0, "", None, -1) is ErrorCode.NONE
        assert "g" in groups.groups
        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 0, entries(5, 6)))
        assert groups.has_pending_offset("g", "t", 0) and groups.committed("g", "t", 0) is None
        await groups.complete_transaction("g", PRODUCER, 0, committed=True)
        assert not groups.has_pending_offset("g", "t", 0)
        assert groups.committed("g", "t", 1) == fresh(6)

        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 0, entries(50)))
        await groups.complete_transaction("g", PRODUCER, 0, committed=False)
        assert groups.committed("g", "t", 0) == fresh(5)
        await groups.complete_transaction("g", OTHER, 0, committed=True)  # nothing staged
        nursery.cancel_scope.cancel()


async def test_the_end_waits_for_offsets_still_on_their_way_to_disk(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        groups = await start_coordinator(nursery, delay=0)
        groups.stage_txn_offsets(PRODUCER, 0, entries(8))  # nobody waits for it
        assert not groups.has_pending_offset("g", "t", 0)  # not durable yet
        await groups.complete_transaction("g", PRODUCER, 0, committed=True)
        assert groups.committed("g", "t", 0) == fresh(8)
        nursery.cancel_scope.cancel()


async def test_an_older_producer_epoch_is_fenced(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        groups = await start_coordinator(nursery, delay=0)
        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 3, entries(1)))
        assert groups.validate_txn_offset_commit("g", PRODUCER, 2, "", None, -1) is (
            ErrorCode.INVALID_PRODUCER_EPOCH
        )
        assert groups.validate_txn_offset_commit("g", PRODUCER, 3, "", None, -1) is ErrorCode.NONE
        with pytest.raises(KafkaError) as refused:
            await groups.complete_transaction("g", PRODUCER, 2, committed=True)
        assert refused.value.error_code is ErrorCode.INVALID_PRODUCER_EPOCH
        assert groups.has_pending_offset("g", "t", 0)
        # A fencing abort comes with a bumped epoch.
        await groups.complete_transaction("g", PRODUCER, 4, committed=False)
        assert not groups.has_pending_offset("g", "t", 0)
        nursery.cancel_scope.cancel()


async def test_cleanup_and_delete_respect_open_transactions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        groups = await start_coordinator(nursery, delay=0)
        groups.validate_txn_offset_commit("g", PRODUCER, 0, "", None, -1)
        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 0, entries(1)))
        far_future = groups.clock_ms() + 10 * groups.offsets_retention_ms
        groups.cleanup(far_future)
        assert "g" in groups.groups  # an open transaction keeps the group
        # An expired plain offset of a partition with a pending one is kept as well.
        long_ago = -2 * groups.offsets_retention_ms
        old = OffsetAndMetadata(0, commit_timestamp_ms=long_ago)
        old_elsewhere = (OffsetKey("g", "t", 1), old)
        plain = groups.append_offsets([(OffsetKey("g", "t", 0), old), old_elsewhere])
        await groups.wait_offsets_durable(plain)
        groups.cleanup(far_future)
        assert groups.committed("g", "t", 0) == old
        assert groups.committed("g", "t", 1) is None  # expired: no transaction holds it
        # DeleteGroups removes the pending offsets along with the group.
        results, tombstones = groups.delete_groups(["g"])
        assert results == {"g": ErrorCode.NONE} and len(tombstones) == 1
        await groups.wait_offsets_durable(tombstones[0])
        assert not groups.has_pending_offset("g", "t", 0)
        await groups.complete_transaction("g", PRODUCER, 0, committed=True)
        assert groups.committed("g", "t", 0) is None
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------- compaction


def compacted(store: OffsetsStore, *, drop_tombstones: bool) -> OffsetsStore:
    """What a replay of the log sees once the cleaner kept the latest record per key
    (and, past the delete horizon, dropped the tombstones too)."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in iter_log_records(store.log):
        assert key is not None
        latest[key] = (offset, value)
    kept = sorted((offset, key, value) for key, (offset, value) in latest.items())
    again = OffsetsStore(MemoryLog(LogConfig()))
    for _, key, value in kept:
        if value is None and drop_tombstones:
            continue
        again.log.append(build_batch([(key, value)], base_timestamp=1), now_ms=1)
    again.load()
    return again


@pytest.mark.parametrize("drop_tombstones", [False, True])
async def test_ended_transactions_replay_the_same_after_compaction(
    autojump_clock: trio.testing.MockClock, drop_tombstones: bool
) -> None:
    """An aborted offset must not be committed by the producer's next transaction's end
    once compaction dropped the abort (the end records share a key)."""
    async with trio.open_nursery() as nursery:
        groups = await start_coordinator(nursery, delay=0)
        t0 = [(OffsetKey("g", "t", 0), fresh(100))]
        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 0, t0))
        await groups.complete_transaction("g", PRODUCER, 0, committed=False)
        t1_t2 = [(OffsetKey("g", "t", 1), fresh(200)), (OffsetKey("g", "t", 2), fresh(50))]
        await groups.wait_offsets_durable(groups.stage_txn_offsets(PRODUCER, 0, t1_t2))
        # A plain commit of t2 after the staged one: it wins at the end (Kafka's rule).
        plain = groups.append_offsets([(OffsetKey("g", "t", 2), fresh(5))])
        await groups.complete_transaction("g", PRODUCER, 0, committed=True)
        await groups.wait_offsets_durable(plain)
        live = [groups.committed("g", "t", p) for p in range(3)]
        assert live == [None, fresh(200), fresh(5)]
        replayed = compacted(groups.store, drop_tombstones=drop_tombstones)
        assert [replayed.get("g", "t", p) for p in range(3)] == live
        assert replayed.pending_partitions("g") == set()
        nursery.cancel_scope.cancel()
