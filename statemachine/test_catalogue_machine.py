"""The topic catalogue (storage/catalogue.py) with the partition logs beside it, under
deletes that crash, restarts and recreated names.

The catalogue is the commit point of a topic's creation, growth and deletion; the
partition directories (in any of the broker's log dirs) follow it. A delete writes the
catalogue first and then renames the topic's directories away, so a crash in between
leaves the directories of a topic the catalogue no longer has. Kafka's promise, which
this machine states after every step:

1. a topic that is created (again) under a name starts empty: every partition's log
   opens with nothing in it, whatever a deleted topic of that name left behind, in
   whichever log dir;
2. the catalogue, reopened after a restart, holds exactly the topics created and not
   deleted, with their ids and partition counts;
3. growing a topic (CreatePartitions) gives the new partitions empty logs, and the old
   ones keep their records.

The machine writes through real ``PartitionLog`` s (one batch of records per write) and
counts, per partition, how many records the current topic of that name has; a read
after each step must find exactly those.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.storage.catalogue import Catalogue
from trio_broker.storage.log import LogConfig, PartitionLog

NAMES = ("orders", "audit")
CONFIG = LogConfig(file_delete_delay_ms=0)


class Crash(Exception):
    """The broker dies at this point of a step."""


class CatalogueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="catalogue-machine."))
        self.log_dirs = [self.root / "data", self.root / "data2"]
        self.catalogue = self._open()
        #: The model: name -> (topic id, records per partition).
        self.topics: dict[str, tuple[uuid.UUID, list[int]]] = {}
        self.clock = 1_000_000

    def _open(self) -> Catalogue:
        return Catalogue(self.log_dirs[0], self.log_dirs[1:])

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _partition_dir(self, name: str, partition: int) -> Path:
        """Where the partition's log is: where it already is, else the log dir the broker
        would give it (alternating here, so that both dirs hold partitions)."""
        for log_dir in self.log_dirs:
            path = log_dir / f"{name}-{partition}"
            if path.is_dir():
                return path
        return self.log_dirs[partition % len(self.log_dirs)] / f"{name}-{partition}"

    def _records(self, name: str, partition: int) -> int:
        log = PartitionLog.open(self._partition_dir(name, partition), CONFIG, now_ms=self.now)
        try:
            end = log.log_end_offset
            count = 0
            for region in log.read(log.log_start_offset, 1 << 30, end):
                for batch in iter_batches(region.read_bytes()):
                    count += sum(1 for _ in batch.records())
            return count
        finally:
            log.close()

    def now(self) -> int:
        return self.clock

    # ------------------------------------------------------------------ rules

    @rule(name=st.sampled_from(NAMES), partitions=st.integers(1, 3))
    def create_topic(self, name: str, partitions: int) -> None:
        if name in self.topics:
            return
        info = self.catalogue.create_topic(name, partitions)
        self.topics[name] = (info.topic_id, [0] * partitions)
        for partition in range(partitions):  # the broker opens each log at creation
            got = self._records(name, partition)
            assert got == 0, (
                f"the new topic {name} reads {got} records in partition {partition}: "
                "a deleted topic's data came back"
            )
        note(f"created {name} ({partitions} partitions)")

    @rule(name=st.sampled_from(NAMES), partition=st.integers(0, 2), count=st.integers(1, 3))
    def write(self, name: str, partition: int, count: int) -> None:
        known = self.topics.get(name)
        if known is None or partition >= len(known[1]):
            return
        self.clock += 1
        log = PartitionLog.open(self._partition_dir(name, partition), CONFIG, now_ms=self.now)
        try:
            batch = build_batch([(None, b"v%d" % i) for i in range(count)], base_timestamp=1)
            log.append(batch, now_ms=self.clock)
            log.flush()
        finally:
            log.close()
        known[1][partition] += count

    @rule(name=st.sampled_from(NAMES), more=st.integers(1, 2))
    def add_partitions(self, name: str, more: int) -> None:
        known = self.topics.get(name)
        if known is None:
            return
        total = len(known[1]) + more
        self.catalogue.add_partitions(name, total)
        known[1].extend([0] * more)

    @rule(name=st.sampled_from(NAMES), crash=st.booleans())
    def delete_topic(self, name: str, crash: bool) -> None:
        """DeleteTopics; with ``crash``, the broker dies after the catalogue write and
        before the directories go (then restarts)."""
        if name not in self.topics:
            return
        if crash:

            def dies(*_args: object) -> None:
                raise Crash

            self.catalogue._discard_dirs = dies  # type: ignore[method-assign, assignment]
            try:
                self.catalogue.delete_topic(name)
            except Crash:
                event("a delete crashed before its directories went")
            del self.topics[name]
            self.restart()
        else:
            self.catalogue.delete_topic(name)
            del self.topics[name]

    @rule(name=st.sampled_from(NAMES), partitions=st.integers(1, 3))
    def delete_crashes_and_the_name_is_reused(self, name: str, partitions: int) -> None:
        """Rule 1's shape: a topic with records, its delete crashed, a topic of its name
        created after the restart."""
        self.create_topic(name, 2)
        self.write(name, 0, 1)
        self.write(name, 1, 2)
        self.delete_topic(name, crash=True)
        self.create_topic(name, partitions)

    @rule()
    def restart(self) -> None:
        self.catalogue = self._open()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def the_catalogue_is_the_model(self) -> None:
        got = {t.name: (t.topic_id, t.partitions) for t in self.catalogue.topics()}
        want = {name: (topic_id, len(counts)) for name, (topic_id, counts) in self.topics.items()}
        assert got == want

    @precondition(lambda self: bool(self.topics))
    @invariant()
    def every_partition_holds_what_its_topic_wrote(self) -> None:
        for name, (_, counts) in self.topics.items():
            for partition, want in enumerate(counts):
                got = self._records(name, partition)
                assert got == want, f"{name}-{partition} reads {got} records, {want} written"


TestCatalogueMachine = CatalogueMachine.TestCase
TestCatalogueMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
