"""The partition's write path (trio_broker/partition/append.py) on a real MemoryLog and
a real ProducerStateRegistry: what each origin checks, what an append leaves behind
(the producer state, the flusher's dirty mark, the long polls woken), and what each
acks waits for. The flusher and the replica manager are recorders (their own tests
are elsewhere); produce, the coordinators and the markers are tested end to end
through it in tests/integration and tests/cluster.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_broker.partition.append import (
    AppendRejected,
    NotLeader,
    Origin,
    acked_at_once,
    append,
    wait_acked,
)
from trio_broker.partition.partition import (
    NO_PRODUCERS,
    Partition,
    coordinator_partition,
    led_term,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, build_control_batch
from trio_broker.replication.leader import AckState
from trio_broker.services.local_replication import LeadsNothing, LocalTerm, OwnLog
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.storage.errors import StorageError
from trio_broker.storage.memory import MemoryLog

T0 = 10_000


def batch(pid: int = 7, epoch: int = 0, seq: int = 0, count: int = 2) -> bytearray:
    return build_batch(
        [(b"k", b"v%d" % i) for i in range(count)],
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, base_timestamp=T0,
    )  # fmt: skip


class LeaderTerm:
    """A cluster's term as the write path reads it: its epoch is stamped on the batch."""

    def __init__(self, leader_epoch: int) -> None:
        self.leader_epoch = leader_epoch
        self.replicated = True


def entry(producers: Any, topic: str) -> Any:
    """The partition's own producer state: its entry in a registry, or none."""
    return producers.entry(topic, 0) if isinstance(producers, ProducerStateRegistry) else producers


def local(log: MemoryLog, producers: Any = NO_PRODUCERS, topic: str = "t") -> Partition:
    """``log`` as a node alone leads it: the local term (no epoch stamped)."""
    return Partition(topic, 0, log, entry(producers, topic), LocalTerm(0, log))


def led(log: MemoryLog, leader_epoch: int, producers: Any = NO_PRODUCERS) -> Partition:
    """``log`` as a cluster's leader leads it in ``leader_epoch``."""
    return Partition("t", 0, log, entry(producers, "t"), LeaderTerm(leader_epoch))  # type: ignore[arg-type]


class Flusher:
    def __init__(self, fail: bool = False) -> None:
        self.dirty: list[tuple[Any, int]] = []
        self.waited: list[int] = []
        self.fail = fail

    def mark_dirty(self, log: Any, messages: int = 1) -> None:
        self.dirty.append((log, messages))

    async def wait_durable(self, log: Any, offset: int) -> None:
        self.waited.append(offset)
        if self.fail:
            raise StorageError("fsync failed")


class Appends:
    def __init__(self) -> None:
        self.woken: list[tuple[str, int]] = []

    def notify(self, topic: str, partition: int) -> None:
        self.woken.append((topic, partition))


def test_a_client_batch_is_checked_appended_recorded_marked_and_announced() -> None:
    log, producers, flusher, appends = (
        MemoryLog(),
        ProducerStateRegistry(None, lambda: T0),
        Flusher(),
        Appends(),
    )
    kwargs: Any = dict(origin=Origin.CLIENT, now_ms=T0, durability=flusher, appends=appends)
    partition = local(log, producers)
    first = append(partition, batch(seq=0), **kwargs)
    assert (first.base_offset, first.last_offset, first.duplicate) == (0, 1, False)
    assert flusher.dirty == [(log, 1)] and appends.woken == [("t", 0)]
    # A retry is answered with the original offsets and not written again.
    retry = append(partition, batch(seq=0), **kwargs)
    assert (retry.base_offset, retry.duplicate, log.log_end_offset) == (0, True, 2)
    assert len(flusher.dirty) == 1 and len(appends.woken) == 1
    # A gap in the sequence: refused, nothing written.
    with pytest.raises(AppendRejected) as refused:
        append(partition, batch(seq=5), **kwargs)
    assert refused.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == 2
    second = append(partition, batch(seq=2), **kwargs)
    assert (second.base_offset, second.last_offset) == (2, 3)


def test_a_marker_is_checked_against_the_producer_state_before_it_is_written() -> None:
    log, producers, flusher = MemoryLog(), ProducerStateRegistry(None, lambda: T0), Flusher()
    partition = local(log, producers)

    def marker(epoch: int, coordinator_epoch: int) -> Any:
        buf = build_control_batch(
            7, epoch, committed=True, coordinator_epoch=coordinator_epoch, timestamp=T0
        )
        return append(partition, buf, origin=Origin.COORDINATOR, now_ms=T0, durability=flusher)

    append(partition, batch(epoch=3), origin=Origin.CLIENT, now_ms=T0, durability=flusher)
    with pytest.raises(AppendRejected) as stale:
        marker(epoch=2, coordinator_epoch=0)
    assert stale.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert marker(epoch=3, coordinator_epoch=4).base_offset == 2
    with pytest.raises(AppendRejected) as fenced:
        marker(epoch=3, coordinator_epoch=1)  # an older coordinator than the last marker's
    assert fenced.value.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert log.log_end_offset == 3


def test_a_coordinator_record_needs_no_producer_state_and_counts_its_messages() -> None:
    log, flusher = MemoryLog(), Flusher()
    records = build_batch([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], base_timestamp=T0)
    written = append(led(log, 4), records, origin=Origin.COORDINATOR, now_ms=T0,
                     durability=flusher, messages=3)  # fmt: skip
    assert (written.last_offset, written.replicated) == (2, True)
    assert flusher.dirty == [(log, 3)]
    assert log.epoch_cache.entries[-1].epoch == 4  # stamped as the leader


def test_a_coordinator_partition_has_no_producer_state_to_write_a_client_batch_or_marker() -> None:
    """A coordinator's own partition (no producer state) refuses what needs one, and
    writes nothing: a client's batch, a marker."""
    log = MemoryLog()
    own = coordinator_partition(OwnLog(0, log), "__consumer_offsets", 0, log)
    with pytest.raises(AppendRejected) as client:
        append(own, batch(), origin=Origin.CLIENT, now_ms=T0, durability=None)
    marker = build_control_batch(7, 0, committed=True, coordinator_epoch=0, timestamp=T0)
    with pytest.raises(AppendRejected) as control:
        append(own, marker, origin=Origin.COORDINATOR, now_ms=T0, durability=None)
    assert client.value.error_code == control.value.error_code == ErrorCode.INVALID_RECORD
    assert log.log_end_offset == 0
    # Its own records go in; a consumer reading it would see everything committed.
    append(own, build_batch([(b"k", b"v")]), origin=Origin.COORDINATOR, now_ms=T0,
           durability=None)  # fmt: skip
    assert own.producers.last_stable_offset(log, 1) == 1
    assert own.producers.aborted_between(log, 0, 1) == ()


def test_the_term_a_partition_is_written_in() -> None:
    class Replication:
        def leader_term(self, topic: str, partition: int) -> Any:
            return None if partition else LeaderTerm(9)

    # A node alone's own log: its term is local, the batch keeps its own epoch.
    log = MemoryLog()
    own = coordinator_partition(OwnLog(0, log), "t", 0, log)
    written = append(own, build_batch([(b"k", b"v")]), origin=Origin.COORDINATOR, now_ms=T0,
                     durability=None)  # fmt: skip
    assert not written.replicated and not log.epoch_cache.entries
    assert led_term(Replication(), "t", 0).leader_epoch == 9  # type: ignore[arg-type]
    with pytest.raises(NotLeader):
        led_term(Replication(), "t", 1)  # type: ignore[arg-type]
    with pytest.raises(NotLeader):  # a clustered broker before it joined leads nothing
        coordinator_partition(LeadsNothing(0), "t", 0, log)


def test_a_coordinators_partition_is_looked_up_not_made_per_write() -> None:
    """One Partition per coordinator log (issue 29): every write finds the same object,
    in the term the leadership gives now (a new term replaces the old one in it); another
    log, or the same log written as another partition, has its own."""

    class Terms:
        """A cluster's leadership whose term of the partition the test replaces."""

        def __init__(self) -> None:
            self.term = LeaderTerm(3)

        def leader_term(self, topic: str, partition: int) -> Any:
            return self.term

    log = MemoryLog()
    leadership = Terms()
    first = coordinator_partition(leadership, "__consumer_offsets", 0, log)  # type: ignore[arg-type]
    again = coordinator_partition(leadership, "__consumer_offsets", 0, log)  # type: ignore[arg-type]
    assert again is first and first.term is leadership.term
    leadership.term = LeaderTerm(4)  # the leadership moved away and back: a new term
    moved = coordinator_partition(leadership, "__consumer_offsets", 0, log)  # type: ignore[arg-type]
    assert moved is first and first.term.leader_epoch == 4
    written = append(moved, build_batch([(b"k", b"v")]), origin=Origin.COORDINATOR,
                     now_ms=T0, durability=None)  # fmt: skip
    assert written.replicated and log.epoch_cache.entries[-1].epoch == 4
    other = MemoryLog()
    assert coordinator_partition(leadership, "__consumer_offsets", 0, other) is not first  # type: ignore[arg-type]
    renamed = coordinator_partition(leadership, "__transaction_state", 0, log)  # type: ignore[arg-type]
    assert renamed is not first and renamed.topic == "__transaction_state"
    # A node alone's own log: one term, so one partition in it for every write.
    own_log = MemoryLog()
    own = OwnLog(0, own_log)
    alone = coordinator_partition(own, "__consumer_offsets", 0, own_log)
    assert coordinator_partition(own, "__consumer_offsets", 0, own_log) is alone
    assert alone.term is own.leader_term("__consumer_offsets", 0)


async def test_what_each_acks_waits_for() -> None:
    log, flusher = MemoryLog(), Flusher()
    producers = ProducerStateRegistry(None, lambda: T0)
    alone = append(local(log, producers), batch(pid=-1, seq=-1), origin=Origin.CLIENT,
                           now_ms=T0, durability=flusher)  # fmt: skip
    own = OwnLog(0, log)  # a node alone: its term's HW is the durable end
    for acks in (0, 1):
        assert (await wait_acked(alone, acks, durability=flusher, replication=own)).ok
    assert flusher.waited == []  # acks 0 and 1 answer once the batch is in the log
    assert (await wait_acked(alone, -1, durability=flusher, replication=own)).ok
    assert flusher.waited == [alone.last_offset]
    # acks.all.fsync=false: no sync; a broker alone then acks at once.
    assert (await wait_acked(alone, -1, durability=flusher, replication=own, fsync=False)).ok
    assert flusher.waited == [alone.last_offset]

    failing = Flusher(fail=True)
    acked = await wait_acked(alone, -1, durability=failing, replication=own)
    assert not acked.ok and isinstance(acked.sync_error, StorageError)

    class Replication:
        def __init__(self, state: AckState) -> None:
            self.state = state
            self.asked: list[int] = []

        def leader_term(self, topic: str, partition: int) -> Any:
            return None

        async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
            self.asked.append(last_offset)
            await trio.lowlevel.checkpoint()
            return self.state

    replicated = append(led(log, 1, producers), batch(pid=-1, seq=-1), origin=Origin.CLIENT,
                        now_ms=T0, durability=flusher)  # fmt: skip
    shrunk = Replication(AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    acked = await wait_acked(replicated, -1, durability=flusher, replication=shrunk)
    assert acked.state is AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert shrunk.asked == [replicated.last_offset]
    committed = Replication(AckState.DONE)
    assert (await wait_acked(replicated, -1, durability=flusher, replication=committed)).ok
    # The broker left the cluster while the write waited: it leads nothing now.
    acked = await wait_acked(replicated, -1, durability=flusher, replication=LeadsNothing(0))
    assert acked.state is AckState.LEADERSHIP_LOST


async def test_acked_at_once_is_what_wait_acked_answers_without_waiting() -> None:
    """Produce answers at once what acked_at_once passes, without wait_acked: for those
    wait_acked is DONE, and a node alone's write needs no sync with acks.all.fsync=false."""
    log, producers = MemoryLog(), ProducerStateRegistry(None, lambda: T0)
    alone = append(local(log, producers), batch(pid=-1, seq=-1), origin=Origin.CLIENT,
                           now_ms=T0, durability=Flusher())  # fmt: skip
    replicated = append(led(log, 1, producers), batch(pid=-1, seq=-1), origin=Origin.CLIENT,
                        now_ms=T0, durability=Flusher())  # fmt: skip

    for appended in (alone, replicated):
        for acks in (0, 1):
            assert acked_at_once(appended, acks)
    assert not acked_at_once(alone, -1)  # not synced yet
    assert acked_at_once(alone, -1, fsync=False)  # a node alone: nothing past the sync
    assert not acked_at_once(replicated, -1, fsync=False)  # the ISR's high watermark
    log.flush()
    assert log.durable_end_offset > replicated.last_offset
    assert acked_at_once(alone, -1)
    assert not acked_at_once(replicated, -1)  # synced, but the HW is not known here
    # Where acked_at_once says yes, wait_acked answers DONE.
    flusher = Flusher()
    for acks, fsync in ((0, True), (1, True), (-1, True), (-1, False)):
        assert acked_at_once(alone, acks, fsync=fsync)
        acked = await wait_acked(alone, acks, durability=flusher, replication=OwnLog(0, log),
                                 fsync=fsync)  # fmt: skip
        assert acked.ok
    assert flusher.waited == [alone.last_offset]  # acks=-1 with fsync: durable already
