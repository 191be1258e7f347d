"""A follower that truncates drops the producer state of the records it cut (issue 29,
slice 3's check; Kafka's ``truncateAndReload``).

A follower keeps no producer state between rolls: at each segment roll it stages a
snapshot of the state below the roll (``ProducerStateRegistry.replica_appended``,
written by the next sync), so that, elected, it rebuilds from the latest snapshot and
the segment after it. When it truncates (``cluster/replica_fetcher.py``'s ``_truncate``:
``log.truncate_to``, then ``discard_snapshot``), the snapshots past the new end describe
batches that are gone: they must go too, else the leader it becomes would take a
producer's retry of a cut batch for a duplicate (answered with offsets that hold
nothing) and its next batch for out of order; and a leader that becomes a follower must
drop the state it held in memory. Here a real ``PartitionLog`` that rolls at every batch,
and a real registry, driven as the append path and the fetcher drive them. The snapshots
past the new end already go with ``truncate_to``; the memory state with
``discard_snapshot``'s ``forget`` (the first test fails without it).
"""

from __future__ import annotations

from pathlib import Path

from trio_broker.partition.append import Origin, append
from trio_broker.partition.partition import Partition
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
    # A follower of a new leader whose log ends at 2: the fetcher's _truncate.
    log.truncate_to(2)
    registry.discard_snapshot("t", 0, log)
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
    for base_offset, base_sequence in ((0, 0), (2, 2), (4, 4)):  # sequences 0-5
        results = log.append_replicated_batches(leader_batch(base_offset, base_sequence), now_ms=T0)
        registry.replica_appended("t", 0, log, [r.base_offset for r in results])
    log.flush()  # the staged snapshot (at the roll at 4) is written
    assert sorted(p.name for p in (data_dir / "t-0").glob("*.snapshot")) == [
        "00000000000000000004.snapshot"
    ]
    log.truncate_to(2)
    registry.discard_snapshot("t", 0, log)
    assert not list((data_dir / "t-0").glob("*.snapshot"))
    retry = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 2)))
    assert isinstance(retry, Append), retry
    kept = registry.check("t", 0, log, RecordBatchView(leader_batch(0, 0)))
    assert isinstance(kept, Duplicate) and kept.original_base_offset == 0
    log.close()
