"""ProducerStateManager against the reference model in spec/producer_model.py.

Simulated clients send in-order, retried, reordered, gapped and stale-epoch batches
(and batches of unknown producers, near the Int32 sequence wrap) to one partition;
every verdict must equal the model's, and the partition's log must keep Kafka's
promises: contiguous offsets, no batch appended twice, a retry answered with the
original offsets, and a gap-free accepted sequence per producer and epoch. Snapshots,
rebuilds from the log and retention run in between, and the clock moves past
producer.id.expiration.ms (sentence 7: batches carry the clock as timestamp); retention
forgets no producer (sentence 8), a rebuild from the log those with no batch left.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.state.producer import (
    INT32_MAX,
    Append,
    Duplicate,
    ProducerStateManager,
    Reject,
)

# spec/ is a folder of the repository, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.producer_model import Appended, ModelPartition

MODULUS = 2**31
CLIENTS = 3
#: producer.id.expiration.ms here; ``time_passes`` lands on it exactly sometimes.
EXPIRATION_MS = 10_000


@attrs.define
class Sent:
    producer_id: int
    epoch: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return (self.first_seq + self.count - 1) % MODULUS


@attrs.define
class Client:
    """What an idempotent producer keeps: its id, epoch, next sequence, what it sent."""

    producer_id: int
    epoch: int = 0
    next_seq: int = 0
    sent: list[Sent] = attrs.field(factory=list)

    def make(self, count: int) -> Sent:
        batch = Sent(self.producer_id, self.epoch, self.next_seq, count)
        self.next_seq = (self.next_seq + count) % MODULUS
        self.sent.append(batch)
        return batch


class ProducerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.manager = ProducerStateManager()
        self.model = ModelPartition()
        self.log: list[RecordBatchView] = []
        self.log_start = 0
        self.clock = 1_000
        #: Producers expiry forgot at some point: a rebuild from the log may remember
        #: more of them than the live state (their batches from before are still there).
        self.expired: set[int] = set()
        self.next_pid = 0
        self.clients = [self._new_client() for _ in range(CLIENTS)]
        # (pid, epoch, first_seq, last_seq) of every batch appended since the pid was
        # last forgotten: an idempotent producer's batch must never be appended twice.
        self.appended: dict[tuple[int, int, int, int], RecordBatchView] = {}
        # Every copy ever appended, forgotten pids included: a producer that expired and
        # sent the batch again has two copies in the log, and after a rebuild from the
        # log the broker (as Kafka's findDuplicateBatch, the first match) may name
        # either one as the original of a retry.
        self.copies: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
        # pid -> (epoch, last_seq) of its last appended batch, for the gap-free check.
        self.last_appended: dict[int, tuple[int, int]] = {}

    def _new_client(self) -> Client:
        self.next_pid += 1
        return Client(self.next_pid)

    @property
    def log_end(self) -> int:
        return self.log[-1].next_offset if self.log else 0

    # -------------------------------------------------------------------- producing

    def produce(self, batch: Sent) -> None:
        pid, epoch, first, last = batch.producer_id, batch.epoch, batch.first_seq, batch.last_seq
        expected = self.model.verdict(pid, epoch, first, last)
        verdict = self.manager.check(pid, epoch, first, last)
        note(f"pid={pid} epoch={epoch} seq={first}..{last} -> {verdict} (model {expected})")
        kind, detail = expected
        if kind == "reject":
            assert isinstance(verdict, Reject) and verdict.error_code == detail
            return
        if kind == "duplicate":
            assert isinstance(detail, Appended)
            assert isinstance(verdict, Duplicate)
            assert (verdict.batch.first_offset, verdict.batch.last_offset) == (
                detail.first_offset,
                detail.last_offset,
            )
            # The original batch really is in the log at those offsets.
            copies = self.copies[(pid, epoch, first, last)]
            assert (verdict.original_base_offset, verdict.batch.last_offset) in copies, copies
            return
        assert isinstance(verdict, Append)
        self.append(batch)

    def append(self, batch: Sent) -> None:
        pid, epoch, first, last = batch.producer_id, batch.epoch, batch.first_seq, batch.last_seq
        base = self.log_end
        raw = build_batch(
            [(None, b"x")] * batch.count,
            base_offset=base,
            producer_id=pid,
            producer_epoch=epoch if pid >= 0 else -1,
            base_sequence=first if pid >= 0 else -1,
            base_timestamp=self.clock,
        )
        view = RecordBatchView(raw)
        assert view.last_sequence == (last if pid >= 0 else -1)
        self.log.append(view)
        self.manager.append(pid, epoch, first, last, base, view.last_offset, view.max_timestamp)
        if pid < 0:
            return
        self.model.appended(
            pid, Appended(epoch, first, last, base, view.last_offset, view.max_timestamp)
        )
        key = (pid, epoch, first, last)
        assert key not in self.appended, f"batch {key} appended twice"
        self.appended[key] = view
        self.copies.setdefault(key, []).append((view.base_offset, view.last_offset))
        previous = self.last_appended.get(pid)
        if previous is not None:
            prev_epoch, prev_last = previous
            if epoch == prev_epoch:
                assert first == (prev_last + 1) % MODULUS, "gap in the accepted sequence"
            else:
                assert epoch > prev_epoch and first == 0, "a new epoch must start at 0"
        self.last_appended[pid] = (epoch, last)

    # -------------------------------------------------------------------- the rules

    @rule(client=st.integers(0, CLIENTS - 1), count=st.integers(1, 4))
    def send_next(self, client: int, count: int) -> None:
        self.produce(self.clients[client].make(count))

    @rule(client=st.integers(0, CLIENTS - 1), back=st.integers(1, 8))
    def retry(self, client: int, back: int) -> None:
        """Resend an earlier batch: in the window it is a duplicate, older ones are refused."""
        sent = self.clients[client].sent
        if sent:
            self.produce(sent[-min(back, len(sent))])

    @rule(
        client=st.integers(0, CLIENTS - 1),
        counts=st.lists(st.integers(1, 3), min_size=5, max_size=5),
    )
    def five_in_flight_resent(self, client: int, counts: list[int]) -> None:
        """A connection drops with five batches in flight (the most an idempotent client
        sends): all five arrived, and the client resends every one, oldest first. Each
        must be answered as a duplicate: the window holds exactly five."""
        for count in counts:
            self.produce(self.clients[client].make(count))
        for batch in self.clients[client].sent[-5:]:
            self.produce(batch)

    @rule(client=st.integers(0, CLIENTS - 1), first=st.integers(1, 3), second=st.integers(1, 3))
    def reordered(self, client: int, first: int, second: int) -> None:
        """Two batches arrive swapped (a retry overtaken by its successor), then in order."""
        c = self.clients[client]
        a, b = c.make(first), c.make(second)
        self.produce(b)
        self.produce(a)
        self.produce(b)

    @rule(client=st.integers(0, CLIENTS - 1), gap=st.integers(1, 3))
    def lose_a_batch(self, client: int, gap: int) -> None:
        """The client numbered records it never sent: its next batch leaves a gap."""
        c = self.clients[client]
        c.next_seq = (c.next_seq + gap) % MODULUS

    @rule(client=st.integers(0, CLIENTS - 1))
    def bump_epoch(self, client: int) -> None:
        """KIP-360: the client bumps its epoch and restarts its sequence at 0."""
        c = self.clients[client]
        c.epoch += 1
        c.next_seq = 0

    @rule(client=st.integers(0, CLIENTS - 1), stale=st.integers(1, 2), count=st.integers(1, 3))
    def zombie(self, client: int, stale: int, count: int) -> None:
        """A batch from an older incarnation of the producer."""
        c = self.clients[client]
        self.produce(Sent(c.producer_id, max(0, c.epoch - stale), c.next_seq, count))

    @rule(
        client=st.integers(0, CLIENTS - 1),
        epoch=st.integers(0, 3),
        start=st.one_of(st.integers(0, 10), st.integers(INT32_MAX - 6, INT32_MAX)),
    )
    def new_producer(self, client: int, epoch: int, start: int) -> None:
        """A producer this partition never saw, starting anywhere (maybe near the wrap)."""
        c = self._new_client()
        c.epoch, c.next_seq = epoch, start
        self.clients[client] = c

    @rule(
        pid=st.integers(1, 6),
        epoch=st.integers(0, 3),
        first=st.one_of(st.integers(0, 12), st.just(INT32_MAX)),
        count=st.integers(1, 3),
    )
    def arbitrary(self, pid: int, epoch: int, first: int, count: int) -> None:
        self.produce(Sent(pid, epoch, first, count))

    @rule(count=st.integers(1, 3))
    def not_idempotent(self, count: int) -> None:
        self.produce(Sent(-1, -1, 0, count))  # aiokafka's shape: id -1 with sequence 0

    # ------------------------------------------------------ restarts and retention

    @rule()
    def restart_from_snapshot(self) -> None:
        data = self.manager.to_snapshot()
        restored = ProducerStateManager.from_snapshot(data)
        assert restored.producers == self.manager.producers
        assert restored.next_offset == self.manager.next_offset
        self.manager = restored

    @rule()
    def rebuild_from_log(self) -> None:
        """An unclean restart: no snapshot, replay every batch header above the log start."""
        rebuilt = ProducerStateManager(next_offset=self.log_start)
        rebuilt.replay(v for v in self.log if v.last_offset >= self.log_start)
        rebuilt.remove_expired(self.clock, EXPIRATION_MS)  # as a partition's load does
        # Batches below the log start are gone, so windows may be shorter than live
        # state; the model forgets them the same way.
        self.model = ModelPartition()
        for v in self.log:
            if v.producer_id >= 0 and v.last_offset >= self.log_start:
                self.model.appended(
                    v.producer_id,
                    Appended(
                        v.producer_epoch,
                        v.base_sequence,
                        v.last_sequence,
                        v.base_offset,
                        v.last_offset,
                        v.max_timestamp,
                    ),
                )
        self.model.expire(self.clock, EXPIRATION_MS)
        # The replay recovers every producer with a batch left in the log exactly, except
        # for window batches retention removed; one with none left is lost (a gap of
        # ours: Kafka would find it in a snapshot at a segment boundary).
        assert set(rebuilt.producers) == set(self.model.history)
        assert set(rebuilt.producers) <= set(self.manager.producers)
        for pid, entry in rebuilt.producers.items():
            live = self.manager.producers[pid]
            assert entry.epoch == live.epoch
            if pid in self.expired:
                continue  # it came back after expiry: the log holds its older batches
            assert entry.batches == tuple(
                b for b in live.batches if b.last_offset >= self.log_start
            )
        self.manager = rebuilt
        self._forget_gone()  # those with no batch left are new producers now

    @precondition(lambda self: len(self.log) > 0)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        """The log start moves to a batch boundary (or into a batch, as DeleteRecords can)."""
        target = data.draw(st.integers(self.log_start, self.log_end))
        self.log_start = target
        self.manager.truncate_head(target)  # sentence 8: the model forgets nothing

    @rule(ms=st.sampled_from([1_000, 4_000, EXPIRATION_MS]))
    def time_passes(self, ms: int) -> None:
        """The clock moves, then the partition's expiry check runs (sentence 7)."""
        self.clock += ms
        self.manager.remove_expired(self.clock, EXPIRATION_MS)
        before = set(self.model.history)
        self.model.expire(self.clock, EXPIRATION_MS)
        self.expired |= before - set(self.model.history)
        self._forget_gone()

    def _forget_gone(self) -> None:
        """A forgotten producer starts afresh: its old batches no longer count."""
        for pid in [p for p in self.last_appended if p not in self.model.history]:
            del self.last_appended[pid]
            for key in [k for k in self.appended if k[0] == pid]:
                del self.appended[key]

    # -------------------------------------------------------------------- invariants

    @invariant()
    def offsets_are_contiguous(self) -> None:
        for before, after in zip(self.log, self.log[1:]):
            assert after.base_offset == before.next_offset
        assert self.manager.next_offset == max(self.log_end, self.log_start)

    @invariant()
    def same_producers_as_model(self) -> None:
        assert set(self.manager.producers) == set(self.model.history)
        for pid, entry in self.manager.producers.items():
            last = self.model.history[pid][-1]
            assert (entry.epoch, entry.last_seq, entry.last_offset) == (
                last.epoch,
                last.last_seq,
                last.last_offset,
            )


ProducerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestProducerMachine = ProducerMachine.TestCase
