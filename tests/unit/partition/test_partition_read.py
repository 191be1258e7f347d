"""The partition's read entry (trio_broker/partition/read.py) on a real MemoryLog and a
real ProducerStateRegistry, with a term whose high watermark the test sets: how far
each isolation reads, the offsets it answers, the aborted transactions only a
read_committed read gets, a read skipped for want of room, and the errors (a follower
past the log end, a fetch offset below the log start). The Fetch handler's answers
are tested end to end in tests/integration and tests/e2e."""

from __future__ import annotations

from typing import Any

import attrs

from trio_broker.partition.append import Origin, append
from trio_broker.partition.partition import Partition
from trio_broker.partition.read import Isolation, ReplicaRead, read, read_by_replica
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, build_control_batch, iter_batches
from trio_broker.services.local_replication import LocalReplication, LocalTerm
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

T0 = 10_000
TXN_PID = 9


@attrs.frozen
class HeldTerm:
    """A leader's term as the read sees it: its high watermark, set by the test."""

    high_watermark: int


@attrs.define
class Answer:
    """A Fetch answer's partition as the read fills it."""

    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


def read_into(
    log: MemoryLog, term: Any, producers: ProducerStateRegistry, *args: Any, **kwargs: Any
) -> tuple[Answer, Any, Any]:
    answer = Answer()
    regions, aborted = read(
        answer, Partition("t", 0, log, producers.entry("t", 0), term), *args, **kwargs
    )
    return answer, regions, aborted


def partition() -> tuple[MemoryLog, ProducerStateRegistry]:
    """Offsets 0-1 plain, 2-3 an aborted transaction, 4 its marker, 5-6 plain, 7-8 an
    open transaction, 9-10 plain: the LSO is 7."""
    log, producers = MemoryLog(), ProducerStateRegistry(None, lambda: T0)
    kwargs: Any = dict(origin=Origin.CLIENT, now_ms=T0, durability=None)
    alone = Partition("t", 0, log, producers.entry("t", 0), LocalTerm(0, log))

    def txn(epoch: int) -> bytearray:
        records = [(None, b"t%d" % i) for i in range(2)]
        return build_batch(
            records, producer_id=TXN_PID, producer_epoch=epoch, base_sequence=0,
            is_transactional=True, base_timestamp=T0,
        )  # fmt: skip

    append(alone, build_batch([(None, b"a"), (None, b"b")], base_timestamp=T0), **kwargs)
    append(alone, txn(0), **kwargs)
    abort = build_control_batch(TXN_PID, 0, committed=False, coordinator_epoch=0, timestamp=T0)
    append(alone, abort, **{**kwargs, "origin": Origin.COORDINATOR})
    append(alone, build_batch([(None, b"c"), (None, b"d")], base_timestamp=T0), **kwargs)
    append(alone, txn(1), **kwargs)
    append(alone, build_batch([(None, b"e"), (None, b"f")], base_timestamp=T0), **kwargs)
    assert log.log_end_offset == 11
    return log, producers


def offsets_read(regions: Any) -> list[int]:
    data = b"".join(r.read_bytes() for r in regions)
    return [b.base_offset for b in iter_batches(data)]


def test_each_isolation_reads_as_far_as_it_may() -> None:
    log, producers = partition()
    term: Any = HeldTerm(high_watermark=9)
    reads = {
        isolation: read_into(log, term, producers, 0, 1 << 20, isolation, min_one=True)
        for isolation in Isolation
    }
    for answer, _, _ in reads.values():
        assert answer == Answer(ErrorCode.NONE, 9, 7, 0)
    assert offsets_read(reads[Isolation.LOG_END][1]) == [0, 2, 4, 5, 7, 9]
    assert offsets_read(reads[Isolation.HIGH_WATERMARK][1]) == [0, 2, 4, 5, 7]
    assert offsets_read(reads[Isolation.TXN_COMMITTED][1]) == [0, 2, 4, 5]
    assert reads[Isolation.LOG_END][2] is None and reads[Isolation.HIGH_WATERMARK][2] is None
    aborted = reads[Isolation.TXN_COMMITTED][2]
    assert [(a.producer_id, a.first_offset) for a in aborted] == [(TXN_PID, 2)]


def test_a_read_without_room_answers_the_offsets_only() -> None:
    log, producers = partition()
    term: Any = HeldTerm(high_watermark=11)
    answer, regions, aborted = read_into(
        log, term, producers, 99, None, Isolation.TXN_COMMITTED, min_one=False
    )
    # No read, so not even the fetch offset past the end is an error.
    assert (answer, regions, aborted) == (Answer(ErrorCode.NONE, 11, 7, 0), (), None)


def test_reads_that_fail_answer_no_offsets() -> None:
    log, producers = partition()
    term: Any = HeldTerm(high_watermark=11)
    past_end, _, _ = read_into(log, term, producers, 12, 1 << 20, Isolation.LOG_END, min_one=True)
    assert past_end == Answer(ErrorCode.OFFSET_OUT_OF_RANGE, -1, -1, -1)
    log.delete_records(5)
    below_start, _, _ = read_into(
        log, term, producers, 0, 1 << 20, Isolation.HIGH_WATERMARK, min_one=True
    )
    assert below_start == Answer(ErrorCode.OFFSET_OUT_OF_RANGE, -1, -1, -1)


class Progress(LocalReplication):
    """A node alone's replication that keeps what a replica's read reported to it."""

    reported: list[tuple[str, int, bool, object]]

    def progressed(self, topic: str, partition: int, term: Any, moved: bool, proposal: Any) -> None:
        self.reported.append((topic, partition, moved, proposal))


def test_a_replicas_read_of_a_node_alone_records_nothing_by_the_same_rules() -> None:
    """A node alone's term (a replica set of one) takes a replica's read as a cluster's
    does, with no branch on its type: no follower of it, so nothing moves, no ISR
    change, nothing reported; the read itself goes to the log end."""
    topics = TopicManager(None, LogConfig(), lambda: T0)
    topics.create("t", 1)
    followers = Progress.over(topics)
    followers.reported = []
    log = topics.log("t", 0)
    assert log is not None
    term = followers.leader_term("t", 0)
    assert term is not None
    producers = ProducerStateRegistry(None, lambda: T0)
    alone = Partition("t", 0, log, producers.entry("t", 0), term)
    for value in (b"a", b"b"):
        append(
            alone, build_batch([(None, value)], base_timestamp=T0), origin=Origin.CLIENT,
            now_ms=T0, durability=None,
        )  # fmt: skip
    log.flush()  # the high watermark of a node alone is its durable end
    answer = Answer()
    regions, _ = read_by_replica(
        answer, alone, 1, 1 << 20, ReplicaRead(7, T0, followers), 0, min_one=True
    )
    assert offsets_read(regions) == [1]
    assert (answer.error_code, answer.high_watermark) == (0, 2)
    assert followers.reported == []
    # Past the log end: refused as a cluster's leader refuses it, nothing recorded.
    answer = Answer()
    read_by_replica(answer, alone, 3, 1 << 20, ReplicaRead(7, T0, followers), 0, min_one=True)
    assert answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert followers.reported == []


def test_a_consumer_of_a_node_alone_reads_up_to_the_durable_end() -> None:
    """A node alone is a cluster of one whose high watermark is what its only replica
    counts: with acks.all.fsync (the default) the durable end, as a cluster's leader
    counts its own log, so that no consumer reads a record a power cut would lose; a
    sync moves it and names the partition whose long polls look again. Without
    acks.all.fsync it is the log end (page cache, as Kafka)."""
    topics = TopicManager(None, LogConfig(), lambda: T0)
    topics.create("t", 1)
    topics.create("u", 1)
    changed: list[tuple[str, int]] = []
    alone = LocalReplication(
        LocalReplication.over(topics).view, on_partition_changed=lambda *key: changed.append(key)
    )
    log = topics.log("t", 0)
    term = alone.leader_term("t", 0)
    assert log is not None and term is not None
    producers = ProducerStateRegistry(None, lambda: T0)
    led = Partition("t", 0, log, producers.entry("t", 0), term)
    for value in (b"a", b"b"):
        append(
            led, build_batch([(None, value)], base_timestamp=T0), origin=Origin.CLIENT,
            now_ms=T0, durability=None,
        )  # fmt: skip
    answer = Answer()
    regions, _ = read(answer, led, 0, 1 << 20, Isolation.HIGH_WATERMARK, min_one=True)
    assert (answer.high_watermark, offsets_read(regions)) == (0, [])
    assert term.visible_high_watermark() == 0 and alone.replica_high_watermark("t", 0) == 0
    # A follower's read (were there one) still copies up to the log end.
    regions, _ = read(Answer(), led, 0, 1 << 20, Isolation.LOG_END, min_one=True)
    assert offsets_read(regions) == [0, 1]
    log.flush()
    alone.log_synced(log)
    assert changed == [("t", 0)]
    answer = Answer()
    regions, _ = read(answer, led, 0, 1 << 20, Isolation.HIGH_WATERMARK, min_one=True)
    assert (answer.high_watermark, offsets_read(regions)) == (2, [0, 1])
    # A log it holds no term of (outside its topics) wakes nobody.
    alone.log_synced(MemoryLog(LogConfig()))
    assert changed == [("t", 0)]
    other = topics.log("u", 0)
    # acks.all.fsync=false: the log end counts, synced or not.
    page_cache = LocalReplication(LocalReplication.over(topics).view, counts_synced_only=False)
    unsynced = page_cache.leader_term("u", 0)
    assert other is not None and unsynced is not None
    append(
        Partition("u", 0, other, producers.entry("u", 0), unsynced),
        build_batch([(None, b"c")], base_timestamp=T0), origin=Origin.CLIENT, now_ms=T0,
        durability=None,
    )  # fmt: skip
    assert (other.durable_end_offset, unsynced.high_watermark) == (0, 1)
