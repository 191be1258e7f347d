"""A follower that truncates drops the producer state of the records it cut (issue 29;
Kafka's ``truncateAndReload``), through its ``Partition``'s follower methods.

A follower keeps no producer state between rolls: at each segment roll it stages a
snapshot of the state below the roll (``Partition.replica_appended``, written by the
next sync), so that, elected, it rebuilds from the latest snapshot and the segment
after it. When it truncates (``cluster/replica_fetcher.py``'s ``_truncate`` and its
out-of-range reset: ``Partition.truncate_to``, ``truncate_fully_and_start_at``, which
cut the log and then ``discard_snapshot``), the snapshots past the new end describe
batches that are gone: they must go too, else the leader it becomes would take a
producer's retry of a cut batch for a duplicate (answered with offsets that hold
nothing) and its next batch for out of order; and a leader that becomes a follower must
drop the state it held in memory. Here a real ``PartitionLog`` that rolls at every batch,
and a real registry, driven through a ``Partition`` as the append path and the fetcher
drive it. The snapshots past the new end already go with the log's ``truncate_to``; the
memory state with ``discard_snapshot``'s ``forget`` (the first test fails without it).
"""

from __future__ import annotations

from pathlib import Path

from trio_broker.partition.append import Origin, append
from trio_broker.partition.partition import NOT_LED, Follows, Partition
from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.services.local_replication import LocalTerm
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.state.producer import Append, Duplicate
from trio_broker.storage.log import LogConfig, PartitionLog

T0 = 10_000
PID = 7


def leader_batch(base_offset: int, base_sequence: int) -> bytearray:
    """Two records of producer ``PID``, as the leader's log holds them (its offsets)."""
    return build_batch(
        [(None, b"r%d" % base_sequence), (None, b"r%d" % (base_sequence + 1))],
        base_offset=base_offset, producer_id=PID, producer_epoch=0,
        base_sequence=base_sequence, base_timestamp=T0, partition_leader_epoch=0,
    )  # fmt: skip


def test_a_leader_become_follower_drops_the_producer_state_of_the_records_it_cuts(
    tmp_path: Path,
) -> None:
    """The state a leader holds in memory (sequences 0-5 of producer ``PID``) goes with
    the records its truncation as a follower cuts (offsets 2-5): elected again, it takes
    the producer's retry of sequences 2-3 as new, and still knows 0-1."""
    data_dir = tmp_path / "data"
    log = PartitionLog.open(data_dir / "t-0", LogConfig(segment_bytes=1))  # a roll per batch
    registry = ProducerStateRegistry(data_dir, lambda: T0)
    led = Partition("t", 0, log, registry.entry("t", 0), LocalTerm(0, log))
    for base_sequence in (0, 2, 4):  # as the leader: checked and recorded
        append(led, leader_batch(0, base_sequence), origin=Origin.CLIENT, now_ms=T0,
               durability=None)  # fmt: skip
    log.flush()
    assert log.log_end_offset == 6
    # A follower of a new leader whose log ends at 2: the same Partition, demoted, and
    # the fetcher's _truncate.
    led.term, led.follows = NOT_LED, Follows(1, 1)
    assert led.truncate_to(2) == 2
    retry = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 2)))
    assert isinstance(retry, Append), retry  # not a duplicate of records that are gone
    kept = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 0)))
    assert isinstance(kept, Duplicate) and kept.original_base_offset == 0
    log.close()


def test_a_truncating_follower_drops_the_snapshots_of_the_cut_records(
    tmp_path: Path,
) -> None:
    """A follower's state is its snapshots (staged at its rolls): those past the new end
    go with the truncation, and the state rebuilt from what is left starts after 0-1."""
    data_dir = tmp_path / "data"
    log = PartitionLog.open(data_dir / "t-0", LogConfig(segment_bytes=1))  # a roll per batch
    registry = ProducerStateRegistry(data_dir, lambda: T0)
    follower = Partition("t", 0, log, registry.entry("t", 0), None, Follows(1, 0))
    _copy_sequences_0_to_5(follower)
    follower.truncate_to(2)
    assert not list((data_dir / "t-0").glob("*.snapshot"))
    retry = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 2)))
    assert isinstance(retry, Append), retry
    kept = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 0)))
    assert isinstance(kept, Duplicate) and kept.original_base_offset == 0
    log.close()


def _copy_sequences_0_to_5(follower: Partition) -> None:
    """Three of the leader's batches, as the fetcher copies them (a roll at each: the
    fetcher stages a snapshot, in a worker thread, only when the append rolled)."""
    for base_offset, base_sequence in ((0, 0), (2, 2), (4, 4)):
        results = follower.append_as_follower(leader_batch(base_offset, base_sequence), now_ms=T0)
        assert follower.rolled(results) == (base_offset > 0)  # the first segment is no roll
        if follower.rolled(results):
            follower.replica_appended(results)
    follower.log.flush()  # the staged snapshot (at the roll at 4) is written
    directory = follower.log.directory  # type: ignore[attr-defined]
    assert sorted(p.name for p in directory.glob("*.snapshot")) == ["00000000000000000004.snapshot"]


def test_a_follower_emptied_below_its_leaders_log_start_drops_its_producer_state(
    tmp_path: Path,
) -> None:
    """Out of range below the leader's log start, the follower empties its log and
    starts it there (``truncate_fully_and_start_at``): no state of the records it held
    is left (the state in memory goes, the snapshot below the new start is not used),
    so the producer's batches are new to it."""
    data_dir = tmp_path / "data"
    log = PartitionLog.open(data_dir / "t-0", LogConfig(segment_bytes=1))  # a roll per batch
    registry = ProducerStateRegistry(data_dir, lambda: T0)
    follower = Partition("t", 0, log, registry.entry("t", 0), None, Follows(1, 0))
    _copy_sequences_0_to_5(follower)
    registry.check("t", 0, log, RecordBatchView(leader_batch(0, 0)))  # the state loaded
    follower.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    again = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 0)))
    assert not isinstance(again, Duplicate), again
    # The snapshot below the new log start went when the state was rebuilt (the load
    # deletes one it cannot use).
    assert not list((data_dir / "t-0").glob("*.snapshot"))
    log.close()


def test_a_follower_append_within_a_segment_is_no_roll(tmp_path: Path) -> None:
    """Batches appended inside the active segment stage no snapshot: the fetcher then
    hands nothing to a worker thread."""
    log = PartitionLog.open(tmp_path / "data" / "t-0", LogConfig())
    registry = ProducerStateRegistry(tmp_path / "data", lambda: T0)
    follower = Partition("t", 0, log, registry.entry("t", 0), NOT_LED, Follows(1, 0))
    for base_offset in (0, 2, 4):
        results = follower.append_as_follower(leader_batch(base_offset, base_offset), now_ms=T0)
        assert not follower.rolled(results)
    log.roll()
    results = follower.append_as_follower(leader_batch(6, 6), now_ms=T0)
    assert follower.rolled(results)
    log.close()
