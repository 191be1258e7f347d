"""Transactions in one partition (producer state registry + append_txn_marker) against
the reference model in spec/partition_txn_model.py.

Several transactional producers write to one real on-disk partition, interleaved with
plain records; their transactions commit or abort (sometimes with an epoch bump, as a
fencing abort does); DeleteRecords moves the log start (up to the LSO, or past it into
an open transaction, as retention may); the clock moves past producer.id.expiration.ms;
the broker restarts cleanly (snapshot), crashes (rebuild from the log) or crashes with
a stale snapshot on disk; a follower-style truncation cuts the log's tail. After every
step: the LSO equals the model's (within sentence 6's bounds once the log start passed
an open transaction) and never moved back (but on truncation), the aborted list
equals the model's aborted transactions, and the read_committed view
(records below the LSO, minus control batches, minus what the aborted list hides, read
back from the log as a consumer does) equals the model's committed records; and while a
producer fenced by a bumping abort has written nothing since, a stale marker (its old
epoch, as a WriteTxnMarkers retried from before the fence) is refused until the producer
expires, when the log start has passed the marker too (but after a rebuild from a log
that no longer holds it), and so is a transactional batch of its old epoch, data of its
own in the partition or not (sentence 8); a producer with
an open transaction is remembered however long it was silent (its sequence is still
checked: sentence 7).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import RecordBatchView, build_batch, iter_batches
from trio_broker.services.local_replication import LocalReplication
from trio_broker.services.producers import ProducerStateRegistry, latest_snapshot
from trio_broker.services.topics import TopicManager
from trio_broker.services.txn_markers import append_txn_marker
from trio_broker.state.producer import Append, Reject
from trio_broker.storage.errors import OffsetOutOfRange
from trio_broker.storage.log import LogConfig

# spec/ is a folder of the repository, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.partition_txn_model import Entry, ModelLog

T0 = 1_000_000
PRODUCERS = 3
TOPIC = "t"
#: producer.id.expiration.ms here: a few ``time_passes`` steps.
EXPIRATION_MS = 20 * 60_000


class Quiet:
    """Durability and appends as append_txn_marker needs them (nothing waits here)."""

    def mark_dirty(self, log: Any, messages: int = 1) -> None:
        pass

    def notify(self, topic: str, partition: int) -> None:
        pass


@attrs.define
class Producer:
    producer_id: int
    epoch: int = 0
    next_seq: int = 0
    in_txn: bool = False
    #: where the last marker that bumped this producer's epoch went, if any.
    bumped_at: int | None = None
    #: the clock at its last data batch (expiry counts from the last batch's timestamp).
    last_data_ms: int = T0
    #: the clock at its last marker (which counts for expiry as a data batch does).
    last_marker_ms: int = T0
    #: (offset, clock, is a marker) of each of its batches: a truncation takes the
    #: clocks of the batches it cuts away with them.
    written: list[tuple[int, int, bool]] = attrs.Factory(list)

    def cut(self, new_end: int) -> None:
        """Its batches at or past ``new_end`` are gone: the clocks fall back to the rest."""
        self.written = [w for w in self.written if w[0] < new_end]
        self.last_data_ms = max([T0] + [t for _, t, marker in self.written if not marker])
        self.last_marker_ms = max([T0] + [t for _, t, marker in self.written if marker])


class PartitionTxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="txn-machine-"))
        self.clock = T0
        self.topics = TopicManager(self.dir, LogConfig(), self.now)
        self.topics.create(TOPIC, 1)
        self._start_registry()
        self.model = ModelLog()
        self.producers = [Producer(1000 + i) for i in range(PRODUCERS)]
        self.values = 0
        self.last_lso = 0
        #: (file name, bytes) of a snapshot a clean shutdown wrote.
        self.saved_snapshot: tuple[str, bytes] | None = None
        #: Aborts the cleaner named as gone (sentence 9): (producer id, marker offset).
        self.forgotten: set[tuple[int, int]] = set()

    def now(self) -> int:
        return self.clock

    def _start_registry(self) -> None:
        """A (re)start: the producer state registry, and the node alone's replication
        that takes its partitions with entries of it (the Partition keeps the producer
        state)."""
        self.registry = ProducerStateRegistry(self.dir, self.now, expiration_ms=EXPIRATION_MS)
        self.leaders = LocalReplication.over(self.topics, producers=self.registry)

    def teardown(self) -> None:
        self.topics.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def log(self) -> Any:
        return self.topics.log(TOPIC, 0)

    def _values(self, count: int) -> list[bytes]:
        out = [b"v%d" % (self.values + i) for i in range(count)]
        self.values += count
        return out

    def _append(self, raw: bytearray, producer_id: int, transactional: bool) -> int:
        """Append through the registry's check; the batch's base offset."""
        view = RecordBatchView(raw)
        verdict = self.registry.check(TOPIC, 0, self.log, view)
        assert isinstance(verdict, Append), verdict
        result = self.log.append(raw, now_ms=self.clock)
        self.registry.record_append(
            TOPIC, 0, RecordBatchView(raw), result.base_offset, result.last_offset
        )
        for i, record in enumerate(view.records()):
            assert record.value is not None
            self.model.entries.append(
                Entry(result.base_offset + i, producer_id, transactional, None, record.value)
            )
        return int(result.base_offset)

    # ------------------------------------------------------------------ appends

    @rule(who=st.integers(0, PRODUCERS - 1), count=st.integers(1, 3))
    def transactional_batch(self, who: int, count: int) -> None:
        p = self.producers[who]
        raw = build_batch(
            [(None, v) for v in self._values(count)],
            producer_id=p.producer_id, producer_epoch=p.epoch, base_sequence=p.next_seq,
            base_timestamp=self.clock, is_transactional=True,
        )  # fmt: skip
        note(f"txn data from {p.producer_id} epoch {p.epoch} x{count}")
        offset = self._append(raw, p.producer_id, True)
        p.next_seq += count
        p.in_txn = True
        p.last_data_ms = self.clock
        p.written.append((offset, self.clock, False))

    @rule(count=st.integers(1, 3))
    def plain_batch(self, count: int) -> None:
        raw = build_batch([(None, v) for v in self._values(count)], base_timestamp=self.clock)
        note(f"plain x{count}")
        self._append(raw, -1, False)

    @rule(who=st.integers(0, PRODUCERS - 1), commit=st.booleans(), bump=st.booleans())
    def end_transaction(self, who: int, commit: bool, bump: bool) -> None:
        p = self.producers[who]
        # A fencing abort carries the bumped epoch; the producer then starts at 0.
        epoch = p.epoch + 1 if bump and not commit else p.epoch
        note(f"{'commit' if commit else 'abort'} {p.producer_id} epoch {epoch}")
        _, offset = append_txn_marker(
            self.topics, self.registry, Quiet(), Quiet(), TOPIC, 0,
            p.producer_id, epoch, commit, 0, self.clock, leaders=self.leaders,
        )  # fmt: skip
        self.model.entries.append(Entry(offset, p.producer_id, True, commit, b""))
        if epoch != p.epoch:
            p.epoch, p.next_seq, p.bumped_at = epoch, 0, offset
        p.in_txn = False
        p.last_marker_ms = self.clock
        p.written.append((offset, self.clock, True))

    def _fenced(self) -> list[Producer]:
        """Producers bumped by a marker who wrote nothing since, and not yet expired: the
        log start passing the marker (and all the rest of the producer) forgets nothing
        (KIP-360; a rebuild from the log does, see _forget_below_the_log_start)."""
        last = self.clock - EXPIRATION_MS
        return [
            p for p in self.producers
            if p.bumped_at is not None and p.next_seq == 0
            and max(p.last_data_ms, p.last_marker_ms) > last  # else it may be forgotten
        ]  # fmt: skip

    def _forget_below_the_log_start(self) -> None:
        """State rebuilt from the log alone (no snapshot, or one it may not use): a fencing
        marker below the log start is not seen, and nothing else of a producer that
        wrote nothing since is either."""
        for p in self.producers:
            if p.bumped_at is not None and p.bumped_at < self.model.log_start:
                p.bumped_at = None

    @invariant()
    def stale_markers_are_refused(self) -> None:
        """A WriteTxnMarkers retried from before a fencing abort: its marker, one epoch
        older than the partition's last one, is refused (the handler's check_marker)."""
        for p in self._fenced():
            code, _ = self.registry.check_marker(TOPIC, 0, self.log, p.producer_id, p.epoch - 1, 0)
            event("stale marker", code.name)
            assert p.bumped_at is not None
            event("fenced by a marker below the log start", str(p.bumped_at < self.model.log_start))
            assert code == ErrorCode.INVALID_PRODUCER_EPOCH, (p, code)

    @invariant()
    def a_fenced_epoch_cannot_write(self) -> None:
        """Sentence 8: while a producer fenced by a bumping marker wrote nothing since and
        has not expired (the log start passing the marker forgets nothing), a
        transactional batch at the epoch before it (a produce that crossed the fence) is
        refused INVALID_PRODUCER_EPOCH, data of its own here or not."""
        for p in self._fenced():  # bumped, silent since, not expired
            raw = build_batch(
                [(None, b"zombie")], producer_id=p.producer_id, producer_epoch=p.epoch - 1,
                base_sequence=0, base_timestamp=self.clock, is_transactional=True,
            )  # fmt: skip
            verdict = self.registry.check(TOPIC, 0, self.log, RecordBatchView(raw))
            event("zombie write", type(verdict).__name__)
            assert isinstance(verdict, Reject), (p, verdict)
            assert verdict.error_code == ErrorCode.INVALID_PRODUCER_EPOCH, (p, verdict)

    # ------------------------------------------------------------------ the log moves

    @precondition(lambda self: self.model.lso() > self.model.log_start)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        # Up to the LSO: see docs/transactions.md on retention inside an open transaction.
        cut = data.draw(st.integers(self.model.log_start + 1, self.model.lso()))
        note(f"delete records below {cut}")
        self.log.delete_records(cut)
        self.model.log_start = cut

    @precondition(lambda self: self.model.end > self.model.lso())
    @rule(data=st.data())
    def delete_records_past_the_lso(self, data: st.DataObject) -> None:
        """Retention or DeleteRecords into (or past) an open transaction (sentence 6)."""
        cut = data.draw(st.integers(self.model.lso() + 1, self.model.end))
        note(f"delete records below {cut}, past the LSO {self.model.lso()}")
        event("log start moved past the LSO")
        self.log.delete_records(cut)
        self.model.log_start = cut

    @rule(data=st.data())
    def cleaner_forgets_an_abort(self, data: st.DataObject) -> None:
        """Sentence 9: an aborted transaction whose records are gone (the log start moved
        up to its marker here; the cleaner's removal, for the list) is named to the
        partition by producer id and marker offset, and no fetch lists it any more."""
        listed = self.registry.aborted_between(TOPIC, 0, self.log, 0, self.log.log_end_offset)
        if not listed:
            return
        abort = data.draw(st.sampled_from(listed))
        if abort.last_offset > self.model.log_start:
            self.log.delete_records(abort.last_offset)  # its records go, the marker stays
            self.model.log_start = abort.last_offset
        note(f"cleaner forgets the abort of {abort.producer_id} at {abort.last_offset}")
        self.registry.forget_aborted(TOPIC, 0, self.log, [(abort.producer_id, abort.last_offset)])
        self.saved_snapshot = None  # forget_aborted deleted the snapshots on disk
        self.forgotten.add((abort.producer_id, abort.last_offset))

    @invariant()
    def forgotten_aborts_are_not_listed(self) -> None:
        listed = self.registry.aborted_between(TOPIC, 0, self.log, 0, self.log.log_end_offset)
        named = {(a.producer_id, a.last_offset) for a in listed}
        assert not named & self.forgotten, named & self.forgotten

    @rule(ms=st.sampled_from([60_000, 11 * 60_000, 25 * 60_000]))
    def time_passes(self, ms: int) -> None:
        """The clock moves; the registry sweeps expired producers at most every
        10 minutes, on its next check (the stale-marker probe below is one)."""
        self.clock += ms

    @invariant()
    def producers_in_a_transaction_are_remembered(self) -> None:
        """Sentence 7: a batch far ahead of an open transaction's producer's sequence
        is refused as out of order (a forgotten producer would be taken at any)."""
        model = self.model
        open_pids = {pid for pid, _, end, _ in model.transactions() if end is None}
        for p in self.producers:
            if p.producer_id not in open_pids or not any(
                e.producer_id == p.producer_id and e.commit is None and e.offset >= model.log_start
                for e in model.entries
            ):
                continue  # no open transaction, or all of it below the log start
            probe = build_batch(
                [(None, b"probe")], producer_id=p.producer_id, producer_epoch=p.epoch,
                base_sequence=p.next_seq + 7, base_timestamp=self.clock, is_transactional=True,
            )  # fmt: skip
            verdict = self.registry.check(TOPIC, 0, self.log, RecordBatchView(probe))
            event("open transaction probed", str(self.clock - p.last_data_ms >= EXPIRATION_MS))
            assert not isinstance(verdict, Append), (p, verdict)

    @precondition(lambda self: self.model.end > self.model.log_start)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """A follower cuts its log (leader change): the state is rebuilt from the log."""
        # Not the marker of a transaction that began below the log start: that would
        # reopen it, and a rebuild cannot see where it began (docs/transactions.md).
        start = self.model.log_start
        lowest = max(
            [start + 1]
            + [end + 1 for _, first, end, _ in self.model.transactions()
               if end is not None and first < start]
        )  # fmt: skip
        if lowest > self.model.end:
            return
        wanted = data.draw(st.integers(lowest, self.model.end))
        try:
            new_end = self.log.truncate_to(wanted)
        except OffsetOutOfRange:
            return  # the cut would remove the batch holding the log start: not allowed
        note(f"truncate to {wanted}: new end {new_end}")
        self.registry.discard_snapshot(TOPIC, 0, self.log)
        self.model.entries = [e for e in self.model.entries if e.offset < new_end]
        # A forgotten abort's marker cut away: that offset may hold another one later.
        self.forgotten = {f for f in self.forgotten if f[1] < new_end}
        self.last_lso = 0  # the LSO may go back on truncation, and only then
        self.saved_snapshot = None  # it may describe batches that are gone
        self._forget_below_the_log_start()
        # The producers go on from what the (new) log remembers of them.
        manager = self.registry.manager(TOPIC, 0, self.log)
        for p in self.producers:
            entry = manager.producers.get(p.producer_id)
            same_epoch = entry is not None and entry.epoch == p.epoch
            p.next_seq = entry.last_seq + 1 if entry is not None and same_epoch else 0
            if p.bumped_at is not None and p.bumped_at >= new_end:
                p.bumped_at = None  # the fencing marker is gone with the cut
            p.cut(new_end)

    @rule()
    def clean_restart(self) -> None:
        note("clean restart (snapshot)")
        self.registry.close()
        self._start_registry()

    def _delete_snapshots(self) -> None:
        for path in (self.dir / f"{TOPIC}-0").glob("*.snapshot"):
            path.unlink()

    @rule()
    def crash(self) -> None:
        note("crash: no snapshot, rebuild from the log")
        self._delete_snapshots()
        # The file is gone, so an older one cannot come back later: the broker keeps
        # the snapshot it loaded on disk, and only removes it for good (the cleaner, a
        # truncation). Restoring it after this crash made an open transaction the
        # rebuild had forgotten (its batches below the log start) reappear, and the
        # LSO go back, in a sequence no disk produces.
        self.saved_snapshot = None
        self._forget_below_the_log_start()
        self._start_registry()

    @rule()
    def remember_snapshot(self) -> None:
        self.registry.close()
        path = latest_snapshot(self.dir / f"{TOPIC}-0")
        assert path is not None
        self.saved_snapshot = (path.name, path.read_bytes())
        self._start_registry()

    @precondition(lambda self: self.saved_snapshot is not None)
    @rule()
    def crash_with_stale_snapshot(self) -> None:
        note("crash with an older snapshot on disk")
        assert self.saved_snapshot is not None
        self._delete_snapshots()  # the newer ones were never written
        name, data = self.saved_snapshot
        (self.dir / f"{TOPIC}-0" / name).write_bytes(data)
        self._forget_below_the_log_start()  # if that snapshot is below it, it is not used
        self._start_registry()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def lso_matches_and_never_goes_back(self) -> None:
        lso = self.registry.last_stable_offset(TOPIC, 0, self.log, self.log.log_end_offset)
        low, high = self.model.lso_bounds()
        assert low <= lso <= high, (low, lso, high)
        assert lso >= self.last_lso
        self.last_lso = lso

    @invariant()
    def aborted_list_matches(self) -> None:
        listed = self.registry.aborted_between(TOPIC, 0, self.log, 0, self.log.log_end_offset)
        # Entries whose records are all below the log start hide nothing (spec sentence 3).
        got = [a for a in listed if self.model.has_records(a.producer_id, 0, a.last_offset)]
        want = self.model.aborted()
        assert [(a.producer_id, a.last_offset) for a in got] == [(p, e) for p, _, e in want]
        start = self.model.log_start
        for a, (_, first, _) in zip(got, want, strict=True):
            if first >= start:
                assert a.first_offset == first
            else:  # began below the log start: a rebuild only sees what is left
                assert a.first_offset <= min(
                    (e.offset for e in self.model.entries
                     if e.producer_id == a.producer_id and start <= e.offset < a.last_offset),
                    default=a.last_offset,
                )  # fmt: skip

    @invariant()
    def read_committed_view_matches(self) -> None:
        log = self.log
        lso = self.registry.last_stable_offset(TOPIC, 0, log, log.log_end_offset)
        start = log.log_start_offset
        aborted = self.registry.aborted_between(TOPIC, 0, log, start, lso)
        seen: list[bytes] = []
        if start < lso:
            data = b"".join(r.read_bytes() for r in log.read(start, 1 << 24, lso))
            for batch in iter_batches(bytearray(data)):
                if batch.is_control:
                    continue
                hidden = batch.is_transactional and any(
                    a.producer_id == batch.producer_id
                    and a.first_offset <= batch.base_offset <= a.last_offset
                    for a in aborted
                )
                if hidden:
                    continue
                for record in batch.records():
                    offset = batch.offset_of(record)
                    if start <= offset < lso:
                        assert record.value is not None
                        seen.append(record.value)
        assert seen == self.model.committed_values(lso)


# tools/mutation.sh sets MUTATION_EXAMPLES to run fewer examples per mutant.
PartitionTxnMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MUTATION_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
)
test_partition_transactions = PartitionTxnMachine.TestCase
