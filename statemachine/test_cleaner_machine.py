"""Log compaction (trio_broker/storage/cleaner.py) of a real log against what Kafka promises.

The storage machine writes the checkpoint a cleaning pass ends with, but runs no pass:
no model called the cleaner's planning (``plan_for``/``plan_cleaning``) or its filtering
(``build_offset_map``, ``filter_batch``, the batches kept whole). This machine writes
keyed records, tombstones and keyless ones into a real compacted ``PartitionLog`` (plain
writes and idempotent producers' batches, whose last batch in the log the cleaner keeps
whole), rolls segments, lets time pass and runs the broker's own cleaner task's turn
(server/log_cleaner.py's ``LogCleaner.clean_once``: the idle roll, ``plan_for`` at the
time with its own passes' tombstone horizons, then ``clean_log``), and checks Kafka's
compaction guarantees against the records it wrote:

1. every record read back was written, at its offset, with its key and value; a record
   without a key is never removed;
2. the latest record of every key stays, at its offset, and no older record of the key
   is read after it, unless that latest is a tombstone past its delete horizon: then
   the key may be gone altogether, never back to an older value (a tombstone goes only
   when nothing older of its key is kept: the pinned keys of batches kept whole);
3. the cleaner rewrites only what is durable: its checkpoint (the end of what it
   rewrote) never passes the log's durable end (a cleaned copy of unsynced records
   would make them durable out of order, and a power cut lose what it replaced);
4. ``max.compaction.lag.ms`` (KIP-354): once every closed segment is older than
   ``min.compaction.lag.ms`` and the oldest record of the dirty part (past the
   cleaner's checkpoint, in a closed segment) is older than ``max.compaction.lag.ms``,
   a pass is due whatever ``min.cleanable.dirty.ratio`` says;
5. ``cleanup.policy=compact,delete`` (the topic's configs, read as the broker reads
   them: ``storage/topic_configs.log_config``): a retention pass deletes by time as a
   delete-only topic does, every sealed segment once all its records are older than
   ``retention.ms``; ``compact`` alone: a retention pass deletes nothing by age, nor
   by size whatever ``retention.bytes`` says (the topic's configs draw one, or none);
6. the cleaner task runs a pass only when one is due: the log's dirty ratio reaches
   ``min.cleanable.dirty.ratio``, ``max.compaction.lag.ms`` forces it, or the delete
   horizon of a tombstone its own last pass kept has passed (KIP-534). A task that never
   cleaned the log (a restart, a new log) knows no horizon, and the tombstones' horizons
   a pass stamps count from that pass: a first pass is no reason of its own. The
   machine asks ``plan_for`` with the horizon it tracks from the task's results (checked
   on turns with no idle roll, which changes the log before the plan).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trio_broker.protocol.records import Record, build_batch, iter_batches
from trio_broker.server.log_cleaner import LogCleaner
from trio_broker.storage.cleaner import clean_log, plan_for
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.swap import read_cleaner_checkpoint
from trio_broker.storage.topic_configs import log_config

T0 = 1_700_000_000_000
#: tmpfs where there is one: every pass and flush fsyncs, and what is under test is the
#: rules, not the disk (the storage machine checks durability).
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
DELETE_RETENTION_MS = 1000
#: retention.ms of the topic: with cleanup.policy=compact,delete, segments older than
#: this go by retention too (compact alone: never by age).
RETENTION_MS = 3000
#: The steps of a pass's swap (storage/swap.py), each a point where the broker may die.
CLEANER_STEPS = (
    "cleaned-written", "checkpoint-written", "swap-committed", "old-deleted",
    "swap-renamed", "indexes-written",
)  # fmt: skip
KEYS = (b"a", b"b", b"c")
#: At most this many records written when ``a_merging_pass_dies_at_its_commit_point`` runs.
YOUNG_LOG_RECORDS = 6
#: -1: a plain write; otherwise an idempotent producer (epoch 0).
PRODUCERS = (-1, -1, 7, 8)
#: The producer of ``tombstone_over_a_kept_batch`` (no other rule writes as it).
PINNING_PRODUCER = 9


@attrs.frozen
class Written:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class CleanerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="cleaner-machine.", dir=SCRATCH))
        self.now_ms = T0
        self.log: PartitionLog | None = None
        self.config = LogConfig()
        self.written: dict[int, Written] = {}
        self.sequences: dict[int, int] = {}
        self.unique = 0
        #: The earliest delete horizon the last pass reported (the broker's
        #: ``_horizons``): a pass is due once it has passed.
        self.horizon: int | None = None
        #: Nothing written or rolled since the last flush: every sealed segment is
        #: synced, so rule 4 may demand a pass over all of them.
        self.all_synced = True

    @initialize(
        segment_bytes=st.sampled_from((300, 500, 900)),
        dirty_ratio=st.sampled_from((0.5, 0.9, 1.0)),
        min_lag=st.sampled_from((0, 0, 400)),
        max_lag=st.sampled_from((2000, 5000)),
        policy=st.sampled_from(("compact", "compact", "compact,delete")),
        retention_bytes=st.sampled_from((-1, 600)),
    )
    def open_log(
        self,
        segment_bytes: int,
        dirty_ratio: float,
        min_lag: int,
        max_lag: int,
        policy: str,
        retention_bytes: int,
    ) -> None:
        # The topic's configs, as CreateTopics or AlterConfigs leave them.
        self.policy = policy
        self.config = log_config(
            {
                "cleanup.policy": policy, "segment.bytes": str(segment_bytes),
                "retention.ms": str(RETENTION_MS), "retention.bytes": str(retention_bytes),
                "delete.retention.ms": str(DELETE_RETENTION_MS),
                "min.cleanable.dirty.ratio": str(dirty_ratio),
                "min.compaction.lag.ms": str(min_lag), "max.compaction.lag.ms": str(max_lag),
            },
            LogConfig(index_interval_bytes=64),
        )  # fmt: skip
        note(f"{self.config}")
        self.log = PartitionLog.open(self.directory, self.config, now_ms=lambda: self.now_ms)
        self.cleaner = self._broker_cleaner()

    def _broker_cleaner(self) -> LogCleaner:
        """The broker's cleaner task over this one log, on the machine's clock (a restart
        makes a new one: it knows no delete horizon of the logs it finds)."""
        return LogCleaner(
            lambda: [] if self.log is None else [self.log], lambda: self.now_ms,
            backoff_ms=0, io_max_bytes_per_second=float("inf"),
        )  # fmt: skip

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ writes and time

    @rule(
        records=st.lists(
            st.tuples(
                st.sampled_from((*KEYS, None, b"")),  # b"": a key written once
                st.sampled_from((b"x", b"y" * 40, None)),
            ),
            min_size=1,
            max_size=3,
        ),
        producer=st.sampled_from(PRODUCERS),
    )
    def write(self, records: list[tuple[bytes | None, bytes | None]], producer: int) -> None:
        assert self.log is not None
        batch_records = []
        for delta, (key, value) in enumerate(records):
            if key == b"":
                self.unique += 1
                key = b"u%d" % self.unique
            if key is None and value is None:
                value = b"z"  # a tombstone needs a key
            batch_records.append(Record(delta, 0, key, value))
        sequence = -1
        if producer >= 0:
            sequence = self.sequences.get(producer, 0)
            self.sequences[producer] = sequence + len(records)
        batch = build_batch(
            batch_records, producer_id=producer, producer_epoch=0 if producer >= 0 else -1,
            base_sequence=sequence, base_timestamp=self.now_ms,
        )  # fmt: skip
        result = self.log.append(batch, now_ms=self.now_ms)
        self.all_synced = False  # the append may have rolled (a sealed, unsynced segment)
        for record in batch_records:
            offset = result.base_offset + record.offset_delta
            self.written[offset] = Written(offset, record.key, record.value, self.now_ms)
        note(f"{producer} wrote {[(r.key, r.value) for r in batch_records]} at {self.now_ms}")

    @rule()
    def roll(self) -> None:
        assert self.log is not None
        self.log.roll(self.now_ms)
        self.all_synced = False

    @rule()
    def flush(self) -> None:
        """Group commit's flush (an acks=all produce, the flush interval)."""
        assert self.log is not None
        self.log.flush()
        self.all_synced = True

    @rule(ms=st.sampled_from((1, 50, 500, DELETE_RETENTION_MS + 1, 2500, 6000)))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms

    # ------------------------------------------------------------------ the cleaner

    def _overdue_record(self, active: int | None = None) -> Written | None:
        """Rule 4: the oldest dirty record when a pass must be due, else None (``active``:
        the active segment's base offset, by default the log's)."""
        assert self.log is not None
        if not self.all_synced:
            return None  # an unsynced sealed segment ends what may be cleaned
        if active is None:
            active = self.log.segment_base_offsets()[-1]
        first_dirty = read_cleaner_checkpoint(self.log.directory)
        closed = [w for offset, w in self.written.items() if offset < active]
        if any(self.now_ms - w.timestamp < self.config.min_compaction_lag_ms for w in closed):
            return None
        dirty = [w for w in closed if w.offset >= first_dirty]
        if not dirty:
            return None
        oldest = min(dirty, key=lambda w: w.timestamp)
        if self.now_ms - oldest.timestamp > self.config.max_compaction_lag_ms:
            return oldest
        return None

    @rule()
    def cleaner_pass(self) -> None:
        """One turn of the broker's cleaner task (server/log_cleaner.py's ``clean_once``):
        it rolls an active segment idle past ``min(segment.ms, max.compaction.lag.ms)``
        (and flushes it), plans with the tombstone horizon its last pass reported, and
        runs the pass."""
        assert self.log is not None
        active = self.log.active_segment()
        first = active.first_batch_timestamp
        idle_ms = self.now_ms - first if first is not None else 0
        rolls = active.size > 0 and idle_ms > min(
            self.config.segment_ms, self.config.max_compaction_lag_ms
        )
        if rolls:
            self.all_synced = True  # the roll's flush: every sealed segment is synced
        overdue = self._overdue_record(self.log.log_end_offset if rolls else None)
        tombstones_due = self.horizon is not None and self.now_ms >= self.horizon
        due = None if rolls else plan_for(self.log, self.now_ms, tombstones_due=tombstones_due)
        result = trio.run(self.cleaner.clean_once)
        assert rolls or result is None or due is not None, (  # 6
            f"a pass at {self.now_ms} that was not due (dirty ratio below"
            f" {self.config.min_cleanable_dirty_ratio}, nothing past max.compaction.lag.ms,"
            f" the task's last horizon {self.horizon}): {result}"
        )
        self._forget_below_start()  # a pass ends with a retention pass (compact,delete)
        rolled = self.log.active_segment() is not active
        assert rolled == rolls, (
            f"the cleaner {'rolled' if rolled else 'kept'} an active segment idle for"
            f" {idle_ms} ms (segment.ms {self.config.segment_ms}, max.compaction.lag.ms"
            f" {self.config.max_compaction_lag_ms})"
        )
        assert overdue is None or result is not None, (
            f"no pass at {self.now_ms} though the dirty record {overdue} is older than"
            f" max.compaction.lag.ms {self.config.max_compaction_lag_ms}"
        )
        if result is None:
            return
        self.horizon = result.next_horizon
        checkpoint = read_cleaner_checkpoint(self.log.directory)
        assert checkpoint <= self.log.durable_end_offset, (
            f"the cleaner rewrote up to {checkpoint}, past the durable end"
            f" {self.log.durable_end_offset}: a power cut loses what its copy claims"
        )
        note(f"pass at {self.now_ms}: {result}")

    @rule()
    def dirty_segments_of_two_ages(self) -> None:
        """Rule 4's shape: a cleaned log, then a dirty segment older than
        ``max.compaction.lag.ms`` and a newer one behind it (a log that keeps taking
        writes), the newer one past ``min.compaction.lag.ms``; then the cleaner looks."""
        assert self.log is not None
        self.cleaner_pass()
        self.write([(b"", b"x")], -1)
        self.log.roll(self.now_ms)
        self.flush()
        self.now_ms += self.config.max_compaction_lag_ms + 1
        self.write([(b"", b"x")], -1)
        self.log.roll(self.now_ms)
        self.flush()
        self.now_ms += self.config.min_compaction_lag_ms + 1
        self.cleaner_pass()

    # On a young log only: the restart reads from every offset (quadratic in the log),
    # and the built segments then lead the log, where the merged group starts with them.
    @precondition(lambda self: len(self.written) <= YOUNG_LOG_RECORDS)
    @rule()
    def a_merging_pass_dies_at_its_commit_point(self) -> None:
        """The recovery's shape that random steps seldom build: a pass merges small
        segments into one named after the first, whose first records it drops (so the
        first segment's old index positions no longer match), and the broker dies at the
        swap's commit point, with the old segments' files still there; recovery must
        finish the swap so that a read from every offset finds it."""
        assert self.log is not None
        self.log.roll(self.now_ms)
        for key in (b"m", b"m", b"", b"", b"", b""):
            self.write([(key, b"y" * 40)], -1)
            if key == b"" and self.log.active_segment().size > 0 and self.unique % 4 == 1:
                self.log.roll(self.now_ms)  # the first segment ends after its unique key
        self.log.roll(self.now_ms)
        self.flush()
        self.now_ms += self.config.max_compaction_lag_ms + 1
        self.broker_dies_mid_pass("swap-committed")

    @rule(key=st.sampled_from(KEYS))
    def tombstone_over_a_kept_batch(self, key: bytes) -> None:
        """Rule 2's shape: a producer's last batch (kept whole) holds a value of ``key``,
        a later tombstone deletes it; passes stamp the tombstone's horizon, then run
        past it."""
        assert self.log is not None
        self.write([(key, b"old")], PINNING_PRODUCER)
        self.write([(key, None)], -1)
        self.log.roll(self.now_ms)
        self.flush()
        self.now_ms += self.config.max_compaction_lag_ms + 1
        self.cleaner_pass()
        self.now_ms += DELETE_RETENTION_MS + 1
        self.cleaner_pass()

    @rule()
    def retention_pass(self) -> None:
        """The broker's retention task over the log (a node alone: all is committed).
        Rule 5: with the delete policy, once every record is older than retention.ms,
        no sealed segment is left; with compact alone, the pass deletes no segment."""
        assert self.log is not None
        before = self.log.segment_base_offsets()
        all_expired = all(self.now_ms - w.timestamp > RETENTION_MS for w in self.written.values())
        self.log.apply_retention(self.now_ms)
        after = self.log.segment_base_offsets()
        if "delete" not in self.policy.split(","):
            assert after == before, (
                f"cleanup.policy={self.policy}: retention deleted segments {before[:-1]} by"
                f" age or size (retention.bytes {self.config.retention_bytes})"
            )
        elif all_expired:
            assert len(after) == 1, (
                f"cleanup.policy={self.policy}: segments {after[:-1]} older than retention.ms"
                f" {RETENTION_MS} at {self.now_ms} were kept"
            )
            event("retention emptied a compact,delete log", len(before) > 1)
        self._forget_below_start()

    @rule()
    def segments_outlive_retention(self) -> None:
        """Rule 5's shape, which random steps seldom build: a sealed segment, then
        retention.ms and one more, then the retention pass."""
        assert self.log is not None
        self.write([(b"", b"x")], -1)
        self.log.roll(self.now_ms)
        self.flush()
        self.now_ms += RETENTION_MS + 1
        self.retention_pass()

    def _forget_below_start(self) -> None:
        """What retention deleted is no longer promised (rules 1 and 2 read the rest)."""
        assert self.log is not None
        start = self.log.log_start_offset
        self.written = {o: w for o, w in self.written.items() if o >= start}

    # ------------------------------------------------------------------ the guarantees

    @rule(at=st.sampled_from(CLEANER_STEPS))
    def broker_dies_mid_pass(self, at: str) -> None:
        """The broker dies during a pass, just after one of the swap's steps
        (storage/swap.py), and restarts: recovery drops a half-written copy or finishes
        a committed swap. Then every read from an offset, which finds its place through
        the reopened segments' indexes, returns what a read of the whole log does from
        there."""
        assert self.log is not None
        due = self.horizon is not None and self.now_ms >= self.horizon
        plan = plan_for(self.log, self.now_ms, tombstones_due=due)
        if plan is None and self.log.active_segment().size > 0:
            self.roll()  # rolled and flushed: the active segment's records may be cleaned
            self.flush()
            plan = plan_for(self.log, self.now_ms, tombstones_due=due)

        class Died(Exception):
            pass

        def dies(step: str) -> None:
            if step == at:
                raise Died

        if plan is not None:
            try:
                result = clean_log(self.log, self.now_ms, plan=plan, after_step=dies)
            except Died:
                event(f"the broker died after {at}")
            else:
                if result is not None:
                    self.horizon = result.next_horizon
        self.log.abort()  # no clean-shutdown marker
        self.log = PartitionLog.open(self.directory, self.config, now_ms=lambda: self.now_ms)
        self.cleaner, self.horizon = self._broker_cleaner(), None
        whole = self._read_back()
        for offset in sorted(self.written):
            if offset < self.log.log_start_offset:
                continue
            rows = self._read_back(offset)
            assert rows == [row for row in whole if row[0] >= rows[0][0]] if rows else True
            assert (
                not rows
                or rows[0][0] <= offset
                or not any(offset <= row[0] < rows[0][0] for row in whole)
            ), f"a read from {offset} starts at {rows[0][0]}"
            assert {row[0] for row in whole if row[0] >= offset} <= {row[0] for row in rows}

    def _read_back(self, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
        assert self.log is not None
        rows = []
        end = self.log.log_end_offset
        first = self.log.log_start_offset if start is None else start
        for region in self.log.read(first, 1 << 30, end):
            for batch in iter_batches(region.read_bytes()):
                for record in batch.records():
                    rows.append((batch.offset_of(record), record.key, record.value))
        return rows

    @invariant()
    def compaction_keeps_what_kafka_promises(self) -> None:
        if self.log is None:
            return
        rows = self._read_back()
        read = {offset for offset, _, _ in rows}
        for offset, key, value in rows:  # rule 1
            written = self.written.get(offset)
            assert written is not None and (written.key, written.value) == (key, value), (
                f"offset {offset} reads ({key!r}, {value!r}), written {written}"
            )
        for offset, written in self.written.items():
            if written.key is None:
                assert offset in read, f"the keyless record at {offset} was removed"
        latest: dict[bytes, Written] = {}
        for offset in sorted(self.written):
            written = self.written[offset]
            if written.key is not None:
                latest[written.key] = written
        last_read: dict[bytes, int] = {}
        for offset, key, _ in rows:
            if key is not None:
                last_read[key] = offset
        for key, newest in latest.items():  # rule 2
            if newest.value is not None:
                assert last_read.get(key) == newest.offset, (
                    f"key {key!r}: the latest record is at {newest.offset}, the last one read"
                    f" at {last_read.get(key)}"
                )
            else:
                assert last_read.get(key) in (None, newest.offset), (
                    f"key {key!r}: its tombstone at {newest.offset} went but the older record"
                    f" at {last_read.get(key)} is still read: the deleted value came back"
                )


#: pytest-timeout's guard against a hang, not a budget: planted slips at load 15-18
#: were stopped by the 300 s default while the failure shrank (the sixteenth round).
pytestmark = pytest.mark.timeout(1200)
TestCleanerMachine = CleanerMachine.TestCase
TestCleanerMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
