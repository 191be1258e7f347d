"""The transaction coordinator against spec/txn_coordinator_model.py.

Two transactional ids, several producer instances each (a new instance of an
application takes the id over): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn commit/abort with current or stale epochs, the clock
passing transaction timeouts, and coordinator restarts that replay
``__transaction_state``. Ending a transaction is not atomic here: a partition may
refuse markers for a while (the transaction stays prepared until the coordinator's
recovery pass writes what is owed), and an EndTxn may stop with its markers appended
but not yet durable, other requests interleaving until they are. After every step:
the same answers as the model (P1-P4 of the spec: CONCURRENT_TRANSACTIONS while
pending or prepared, no transactional write into a prepared transaction), the same
table (state, producer id, epoch, partitions), the same markers in every partition
and the same group outcomes; epochs only grow; a restart gives back exactly the
table it had.

The coordinator is the broker's: a ``PartitionedTransactionCoordinator`` (one
``__transaction_state`` partition, as on a node alone) whose table is made and loaded
by ``load_pending`` when leadership comes. Its leadership changes: a new epoch of a
leadership held all along keeps the table, and the markers written from then on carry
the new epoch (every marker is checked to carry the coordinator epoch of the
leadership writing it); a leadership lost and won back answers NOT_COORDINATOR while
another broker leads, COORDINATOR_LOAD_IN_PROGRESS while elected and not loaded (or
about to be told), then gives back exactly the table it had.

The coordinator's async methods are driven without an event loop: the transaction
log is durable at once, and a marker's durability is awaited only by an EndTxn
drawn as slow, whose coroutine the machine holds until ``markers_become_durable``.
"""

from __future__ import annotations

import copy
import os
import sys
import types
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.protocol.records import (
    build_batch,
    build_control_batch,
    iter_batches,
    read_control_marker,
)
from trio_broker.replication.leader import LeaderPartition
from trio_broker.server.transaction_timers import TransactionTimers
from trio_broker.services.local_replication import OwnLog
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.memory import MemoryLog
from trio_broker.transactions.coordinator import MarkerSender, TransactionCoordinator
from trio_broker.transactions.log_format import encode_key, encode_value
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator
from trio_broker.transactions.state import EXHAUSTED_PRODUCER_EPOCH as EXHAUSTED_EPOCH
from trio_broker.transactions.state import TxnMetadata, TxnState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.txn_coordinator_model import ModelCoordinator, ModelTxn

_NO_TXN = ModelTxn(-1, -1)

IDS = ("app-a", "app-b")
#: An id only ``epoch_runs_out`` uses (its epoch starts near the top).
OLD_ID = "app-old"
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
GROUPS = ("g1", "g2")
#: What AddPartitionsToTxn/AddOffsetsToTxn rules draw: an id, one of its instances, the
#: partitions and maybe a group.
ADD_ARGUMENTS: dict[str, Any] = {
    "tid": st.sampled_from(IDS),
    "which": st.integers(0, 3),
    "partitions": st.sets(st.sampled_from(PARTITIONS), min_size=1),
    "group": st.none() | st.sampled_from(GROUPS),
}
MAX_TIMEOUT_MS = 10_000
#: transactional.id.expiration.ms here: two long ticks of an idle id.
EXPIRATION_MS = 7_000
_STATUS = {
    TxnState.EMPTY: "empty", TxnState.ONGOING: "ongoing",
    TxnState.PREPARE_COMMIT: "prepare_commit", TxnState.PREPARE_ABORT: "prepare_abort",
    TxnState.COMPLETE_COMMIT: "committed", TxnState.COMPLETE_ABORT: "aborted",
}  # fmt: skip


WAITING = object()


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never really waits (instant durability)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the coordinator waited on something")


class _Suspend:
    def __await__(self) -> Any:
        yield WAITING


class Instant:
    """Durable at once; with ``slow`` set, a partition's marker waits for the machine."""

    def __init__(self, txn_log: Any) -> None:
        self.txn_log = txn_log
        self.slow = False
        #: The transaction log's next sync fails (the machine's ``txn_log_write_fails``).
        self.txn_log_fails = False
        #: The transaction log's next sync waits for the machine (``timeout_pass_during_an_add``).
        self.txn_log_slow = False

    def mark_dirty(self, log: Any, messages: int = 1) -> None:
        pass

    async def wait_durable(self, log: Any, offset: int) -> None:
        if self.txn_log_fails and log is self.txn_log:
            self.txn_log_fails = False
            raise OSError("the transaction log's sync failed (the machine's fault)")
        if self.txn_log_slow and log is self.txn_log:
            self.txn_log_slow = False  # this write waits for the machine
            await _Suspend()
        if self.slow and log is not self.txn_log:
            self.slow = False  # the first marker's wait stands for the whole round
            await _Suspend()
        for key in [k for k in UNAWAITED if k[0] == id(log) and k[1] <= offset]:
            del UNAWAITED[key]

    def recover_soon(self, log: Any) -> None:
        pass


class Groups:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, int, int, bool]] = []

    async def complete_transaction(self, group: str, pid: int, epoch: int, committed: bool) -> None:
        self.outcomes.append((group, pid, epoch, committed))


#: Partitions that refuse markers for now (the machine's ``partition_refuses``).
REFUSING: set[tuple[str, int]] = set()
#: The leader epoch of this broker's leadership of ``__transaction_state``-0 now: every
#: marker must carry it as its coordinator epoch (partition leaders fence by it).
LEADER_EPOCH = [0]
#: Markers appended and not yet awaited durable: (id of the partition's log, offset) ->
#: producer id. A node alone's coordinator writes CompleteCommit/CompleteAbort only after
#: every marker of the transaction is durable (else a crash loses a marker it will never
#: write again). Cleared when the process dies (the machine's logs survive it whole).
UNAWAITED: dict[tuple[int, int], int] = {}


class TxnLogLeadership(OwnLog):
    """What the tables write through and the routing asks (``Leaders``): the one log,
    and whether this broker was just elected to lead it, its coordinator not told yet.

    Each election is a new term, as a cluster's replica manager makes one
    (``LeaderPartition``, a replica set of one here), which stamps its leader epoch on
    the coordinator's writes; none while another broker leads. ``epoch_starts``: where
    each term began in the log, and its epoch."""

    def __init__(self, log: Log) -> None:
        super().__init__(0, log)
        self.coming = False
        self.term: LeaderPartition | None = None
        self.epoch_starts: list[tuple[int, int]] = []

    def elect(self, leader_epoch: int) -> None:
        """A term begins (``ReplicaManager._become_leader``): the log begins its epoch."""
        end = self.log.log_end_offset
        self.log.begin_epoch(leader_epoch)
        self.term = LeaderPartition.become_leader(
            broker_id=0, leader_epoch=leader_epoch, replicas=(0,), isr=frozenset({0}),
            log_end_offset=end, high_watermark=end, now_ms=0,
        )  # fmt: skip
        self.epoch_starts.append((end, leader_epoch))

    def resign(self) -> None:
        self.term = None

    def leader_term(self, topic: str, partition: int) -> Any:
        return self.term

    def partition(self, topic: str, partition: int) -> None:
        return None

    def about_to_lead(self, topic: str, partition: int) -> bool:
        return self.coming


def append_marker(topics: Any, producers: Any, durability: Any, appends: Any, topic: str,
                  partition: int, producer_id: int, producer_epoch: int, committed: bool,
                  coordinator_epoch: int, now_ms: int) -> tuple[Any, int]:  # fmt: skip
    """Stand-in for services/txn_markers.append_txn_marker: a real control batch, or
    the error of a partition whose leader moved."""
    if (topic, partition) in REFUSING:
        raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition} moved")
    assert coordinator_epoch == LEADER_EPOCH[0], "a marker with another coordinator epoch"
    log = topics.log(topic, partition)
    batch = build_control_batch(producer_id, producer_epoch, committed=committed,
                                coordinator_epoch=coordinator_epoch, timestamp=now_ms)  # fmt: skip
    last_offset = log.append(batch, now_ms=now_ms).last_offset
    UNAWAITED[(id(log), last_offset)] = producer_id
    return log, last_offset


class TxnCoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.topics = TopicManager(None, LogConfig(), lambda: 0)
        self.topics.create("t", 2)
        self.topics.create("u", 1)
        self.txn_log = MemoryLog(LogConfig())
        self.durability = Instant(self.txn_log)
        self.leadership = TxnLogLeadership(self.txn_log)
        REFUSING.clear()
        UNAWAITED.clear()
        LEADER_EPOCH[0] = 0
        #: EndTxn calls whose markers are appended, not yet durable: id -> coroutine.
        self.in_flight: dict[str, Coroutine[Any, Any, Any]] = {}
        self.groups = Groups()
        self.next_id = 100
        self.coordinator = self._open()
        self.model = ModelCoordinator(MAX_TIMEOUT_MS, now_ms=self.now)
        #: Producer instances: transactional id -> the (id, epoch) each got.
        self.instances: dict[str, list[tuple[int, int]]] = {tid: [] for tid in IDS}
        self.epochs_seen: dict[tuple[str, int], int] = {}

    def teardown(self) -> None:
        for call in self.in_flight.values():
            call.close()
        REFUSING.clear()

    def _allocate(self) -> int:
        self.next_id += 1
        return self.next_id

    def _table(
        self, partition: int, leader_epoch: int, log: Log, replication: Any,
        send_markers: MarkerSender | None, /,
    ) -> TransactionCoordinator:  # fmt: skip
        """The broker's table factory (server/broker.py's ``_transaction_table``)."""
        return TransactionCoordinator(
            log, topics=self.topics, producers=None, durability=self.durability,
            appends=None, groups=self.groups, allocate_producer_id=self._allocate,
            write_marker=append_marker, now_ms=lambda: self.now, max_timeout_ms=MAX_TIMEOUT_MS,
            expiration_ms=EXPIRATION_MS, replication=replication, txn_partition=partition,
            coordinator_epoch=leader_epoch, send_markers=send_markers,
        )  # fmt: skip

    def _open(self) -> PartitionedTransactionCoordinator:
        """A process start: a fresh coordinator, elected and loaded (a node alone's
        ``OwnPartition`` elects it before clients come)."""
        coordinator = PartitionedTransactionCoordinator(1, self._table, self.leadership)
        self.leadership.elect(LEADER_EPOCH[0])  # a new life: a new term
        coordinator.elected(0, LEADER_EPOCH[0], self.txn_log)
        assert len(coordinator.load_pending()) == 1
        return coordinator

    def _instance(self, tid: str, which: int) -> tuple[int, int]:
        held = self.instances[tid]
        return held[which % len(held)] if held else (-1, -1)

    @rule(tid=st.sampled_from((*IDS, "")),
          timeout_ms=st.sampled_from([0, 2_000, 5_000, MAX_TIMEOUT_MS, 10_001]),
          which=st.none() | st.integers(0, 3))  # fmt: skip
    def init(self, tid: str, timeout_ms: int, which: int | None = None) -> None:
        """A new producer (-1/-1), or (``which``) one of the id's producers naming its
        id and epoch (KIP-360: I1), a fenced one's included."""
        expected_new_id = self.next_id + 1  # what a first init allocates
        pid, epoch = (-1, -1) if which is None or not tid else self._instance(tid, which)
        result = run(self.coordinator.init_producer_id(tid, pid, epoch, timeout_ms,
                                                       ErrorCode.PRODUCER_FENCED))  # fmt: skip
        error, got_pid, got_epoch = self.model.init(tid, timeout_ms, expected_new_id, pid, epoch)
        note(f"init {tid!r} ({pid}, {epoch}) {timeout_ms} -> {result}")
        # transaction.max.timeout.ms bounds the timeout inclusively (Kafka refuses only
        # a timeout above it, or none).
        assert result.error != ErrorCode.INVALID_TRANSACTION_TIMEOUT or not (
            0 < timeout_ms <= MAX_TIMEOUT_MS
        ), f"a transaction timeout of {timeout_ms} ms refused; the maximum is {MAX_TIMEOUT_MS}"
        assert (result.error, result.producer_id, result.producer_epoch) == (
            error, got_pid, got_epoch,
        )  # fmt: skip
        if error == ErrorCode.NONE:
            self.instances[tid].append((got_pid, got_epoch))

    @rule(**ADD_ARGUMENTS)
    def add(
        self, tid: str, which: int, partitions: set[tuple[str, int]], group: str | None
    ) -> None:
        pid, epoch = self._instance(tid, which)
        groups = set() if group is None else {group}
        txn = self.model.txns.get(tid)
        adds_nothing = (
            txn is not None
            and txn.status == "ongoing"
            and partitions <= txn.partitions
            and groups <= txn.groups
        )
        end = self.txn_log.log_end_offset
        error = run(self.coordinator.add_to_transaction(tid, pid, epoch, partitions, groups,
                                                        ErrorCode.PRODUCER_FENCED))  # fmt: skip
        note(f"add {tid} ({pid}, {epoch}) {sorted(partitions)} {groups} -> {error!r}")
        assert error == self.model.add(tid, pid, epoch, partitions, groups, self.now)
        if error == ErrorCode.NONE:
            # As Kafka's AddPartitionsToTxn: partitions and groups already in the open
            # transaction are answered at once, with no __transaction_state write;
            # anything new (or opening a transaction) is written before the answer.
            wrote = self.txn_log.log_end_offset != end
            assert wrote != adds_nothing, (
                f"adding {sorted(partitions)} {sorted(groups)} to {tid}'s transaction"
                f" ({'nothing new' if adds_nothing else 'something new'})"
                f" {'wrote' if wrote else 'wrote no'} __transaction_state record"
            )

    @rule(**ADD_ARGUMENTS)
    def txn_log_write_fails(
        self, tid: str, which: int, partitions: set[tuple[str, int]], group: str | None
    ) -> None:
        """AddPartitionsToTxn/AddOffsetsToTxn whose ``__transaction_state`` record is
        appended but never counts (its sync fails; a crash would lose it): the request
        answers NOT_COORDINATOR (the client looks the coordinator up and retries) and the
        table keeps the state it had, as the log that counts does. The record is then
        dropped, as a crash before its sync would (the replay sees only what counted)."""
        before = copy.deepcopy(self.model)
        end = self.txn_log.log_end_offset
        pid, epoch = self._instance(tid, which)
        groups = set() if group is None else {group}
        self.durability.txn_log_fails = True
        try:
            error = run(self.coordinator.add_to_transaction(
                tid, pid, epoch, partitions, groups, ErrorCode.PRODUCER_FENCED))  # fmt: skip
        finally:
            wrote = not self.durability.txn_log_fails
            self.durability.txn_log_fails = False
        expected = self.model.add(tid, pid, epoch, partitions, groups, self.now)
        note(f"add {tid} ({pid}, {epoch}) {sorted(partitions)} {groups}, its write fails"
             f" -> {error!r}")  # fmt: skip
        if not wrote:  # decided without a write: the model's answer
            assert error == expected, (error, expected)
            return
        event("a transaction log write failed")
        assert expected == ErrorCode.NONE, f"a write for a request the model refuses: {expected}"
        assert error == ErrorCode.NOT_COORDINATOR, f"a failed transaction log write: {error!r}"
        self.model = before
        self.txn_log.truncate_to(end)
        meta = self.coordinator.get(tid)
        txn = self.model.txns.get(tid)
        assert (
            meta is None
            or txn is None
            or (_STATUS[meta.state], meta.partitions, meta.groups)
            == (txn.status, frozenset(txn.partitions), frozenset(txn.groups))
        ), f"{tid}'s record did not count, yet the table says {meta}"

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3))
    def adds_while_the_clock_runs(self, tid: str, which: int) -> None:
        """A producer adds one partition or group every 500 ms (5 in all, past a 2 s
        timeout): the transaction times out counting from its first add, not its last."""
        for partition in PARTITIONS:
            self.add(tid, which, {partition}, None)
            self.time_passes(500)
        for group in GROUPS:
            self.add(tid, which, {PARTITIONS[0]}, group)
            self.time_passes(500)

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3), committed=st.booleans(),
          slow=st.booleans())  # fmt: skip
    def end(self, tid: str, which: int, committed: bool, slow: bool = False) -> None:
        pid, epoch = self._instance(tid, which)
        call = self.coordinator.end_transaction(tid, pid, epoch, committed,
                                                ErrorCode.PRODUCER_FENCED)  # fmt: skip
        self.durability.slow = slow
        try:
            call.send(None)
        except StopIteration as done:
            error = done.value
        else:  # waiting for its markers to be durable: answered later
            assert tid not in self.in_flight
            self.in_flight[tid] = call
            error = ErrorCode.NONE
            note(f"end {tid} ({pid}, {epoch}) commit={committed}: markers in flight")
        finally:
            self.durability.slow = False
        note(f"end {tid} ({pid}, {epoch}) commit={committed} -> {error!r}")
        assert error == self.model.end(tid, pid, epoch, committed, in_flight=tid in self.in_flight)
        assert (tid in self.in_flight) == self.model.txns.get(tid, _NO_TXN).pending

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def markers_become_durable(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.in_flight)))
        call = self.in_flight.pop(tid)
        try:
            call.send(None)
        except StopIteration as done:
            error = done.value
        else:
            raise AssertionError("the EndTxn waited twice")
        note(f"{tid}: markers durable -> {error!r}")
        assert error == ErrorCode.NONE
        self.model.markers_durable(tid)

    @rule(partition=st.sampled_from(PARTITIONS), refuses=st.booleans())
    def partition_refuses(self, partition: tuple[str, int], refuses: bool) -> None:
        """A partition's leader moves away (markers refused) or it accepts them again."""
        if refuses:
            REFUSING.add(partition)
            self.model.refusing.add(partition)
        else:
            REFUSING.discard(partition)
            self.model.refusing.discard(partition)

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3), committed=st.booleans(),
          timeout_ms=st.sampled_from([2_000, 5_000]))  # fmt: skip
    def end_stuck_then_requests(
        self, tid: str, which: int, committed: bool, timeout_ms: int
    ) -> None:
        """The last partition of an open transaction refuses its marker: the EndTxn
        leaves it prepared (earlier partitions marked), and every request of the id
        meets the prepared state (P1, P2) until the partition heals and recovery
        finishes it (P3)."""
        last = self._end_with_the_last_partition_refusing(tid, which, committed)
        if last is None:
            return
        event("end stuck", str(self.model.txns[tid].status))
        self.add(tid, which, {PARTITIONS[0]}, GROUPS[0])
        self.end(tid, which, committed)
        self.end(tid, which, not committed)
        self.transactional_write(tid, which, last)
        self.time_passes(5_001)
        self.init(tid, timeout_ms)
        self.partition_refuses(last, refuses=False)
        self.recovery_pass()

    def _end_with_the_last_partition_refusing(
        self, tid: str, which: int, committed: bool
    ) -> tuple[str, int] | None:
        """EndTxn of ``tid``'s open transaction while its last partition refuses its
        marker (it still refuses after); that partition, or None (no open transaction
        with partitions: nothing done)."""
        txn = self.model.txns.get(tid)
        if txn is None or txn.status != "ongoing" or not txn.partitions:
            return None
        last = max(txn.partitions)
        self.partition_refuses(last, refuses=True)
        self.end(tid, which, committed)
        return last

    @rule(tid=st.sampled_from(IDS), committed=st.booleans(), group=st.sampled_from(GROUPS))
    def ended_with_offsets_then_restart(self, tid: str, committed: bool, group: str) -> None:
        """The shape random steps seldom build: a transaction with a partition and a
        group (AddOffsetsToTxn) ends while the partition refuses its marker, so it stays
        prepared with its groups in ``__transaction_state``; the broker restarts (the
        table replayed from the log) and the recovery pass finishes it: its groups'
        offsets commit or abort with it (the group outcomes the model expects)."""
        self.init(tid, 5_000)
        newest = len(self.instances[tid]) - 1
        if newest < 0:
            return
        partition = PARTITIONS[-1]
        self.add(tid, newest, {partition}, group)
        self.partition_refuses(partition, refuses=True)
        self.end(tid, newest, committed)
        event("ended with offsets, then a restart", str(self.model.txns[tid].status))
        self.restart()
        self.partition_refuses(partition, refuses=False)
        self.recovery_pass()

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3), committed=st.booleans())
    def timers_retry_an_unfinished_end(self, tid: str, which: int, committed: bool) -> None:
        """The broker's timers (server/transaction_timers.py) over a stuck end: the last
        partition refuses its marker, so the EndTxn leaves the transaction prepared and
        the timers' first recovery fails too; the partition heals, and the timers' next
        round (transaction.abort.timed.out.transaction.cleanup.interval.ms on, a mock
        clock) must finish it (P3), as the machine's ``recovery_pass`` would."""
        last = self._end_with_the_last_partition_refusing(tid, which, committed)
        if last is None:
            return
        if self.model.txns[tid].status not in ("prepare_commit", "prepare_abort"):
            self.partition_refuses(last, refuses=False)
            return
        config = types.SimpleNamespace(
            transaction_abort_timed_out_transaction_cleanup_interval_ms=1_000,
            transaction_remove_expired_transaction_cleanup_interval_ms=3_600_000,
        )
        timers = TransactionTimers(self.coordinator, config)
        order = [meta.transactional_id for meta in self.coordinator.all()]

        async def one_round() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(timers._timers)
                await trio.testing.wait_all_tasks_blocked()  # its first recovery: refused
                REFUSING.clear()  # every partition takes markers again
                self.model.refusing.clear()
                # The next round comes a mock second on; a few rounds' deadline.
                with trio.move_on_after(5):
                    while self._unfinished(tid):  # noqa: ASYNC110 - the table is plain data, no event to wait on
                        await trio.sleep(0.1)
                nursery.cancel_scope.cancel()

        trio.run(one_round, clock=trio.testing.MockClock(autojump_threshold=0))
        event("the timers retried an unfinished end")
        self.model.expire_timed_out(self.now)
        self.model.recover(order)
        meta = self.coordinator.get(tid)
        assert meta is not None and not self._unfinished(tid), (
            f"{tid} is still {meta and _STATUS[meta.state]} after the timers' rounds of 5 s"
            " with its partitions healed"
        )

    def _unfinished(self, tid: str) -> bool:
        meta = self.coordinator.get(tid)
        return meta is not None and meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @rule()
    def recovery_pass(self) -> None:
        """The shell's timer: finish prepared transactions (P3)."""
        order = [meta.transactional_id for meta in self.coordinator.all()]
        run(self.coordinator.recover())
        self.model.recover(order)

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3), partition=st.sampled_from(PARTITIONS))
    def transactional_write(self, tid: str, which: int, partition: tuple[str, int]) -> None:
        """Produce's question (P2): may this producer write into its transaction here?"""
        pid, epoch = self._instance(tid, which)
        if pid < 0:
            return
        got = self.coordinator.partition_in_transaction(pid, epoch, *partition)
        assert got == self.model.write_allowed(tid, pid, epoch, partition)

    @rule(tid=st.sampled_from(IDS), by_timeout=st.booleans())
    def fenced_producer_names_its_epoch(self, tid: str, by_timeout: bool) -> None:
        """I1 by design: a producer opens a transaction, is fenced (a new producer's
        InitProducerId, or the timeout), then asks InitProducerId with its own, fenced
        id and epoch, before the new producer's retry bumps the epoch again."""
        self.init(tid, 2_000)
        newest = len(self.instances[tid]) - 1
        if newest < 0:
            return
        self.add(tid, newest, {PARTITIONS[0]}, None)
        if by_timeout:
            self.time_passes(2_001)
        else:
            self.init(tid, 2_000)
        self.init(tid, 2_000, which=newest)

    @rule(tid=st.sampled_from(IDS))
    def retried_bump_meets_open_transaction(self, tid: str) -> None:
        """I1 by design, the retry's side: a producer bumps its own epoch (KIP-360) and
        opens a transaction with the new one; then the bump's retry (the pair it
        replaced) arrives. A retry only while no transaction is open: now it is fenced,
        never handed the epoch a transaction is using."""
        self.init(tid, 2_000)
        first = len(self.instances[tid]) - 1
        if first < 0:
            return
        self.init(tid, 2_000, which=first)
        bumped = len(self.instances[tid]) - 1
        if bumped == first:
            return  # the bump was refused (a transaction in the way): nothing to retry
        self.add(tid, bumped, {PARTITIONS[0]}, None)
        self.init(tid, 2_000, which=first)

    @precondition(lambda self: OLD_ID not in self.model.txns)
    @rule(epoch=st.sampled_from([EXHAUSTED_EPOCH - 2, EXHAUSTED_EPOCH - 1]),
          fence_first=st.booleans())  # fmt: skip
    def epoch_runs_out(self, epoch: int, fence_first: bool) -> None:
        """I2 by design: an id written long ago, its epoch near Short.MaxValue - 1 (no
        run bumps 32k times), is loaded by a restart; new producers take it over until
        its epoch runs out and it gets a new producer id. With ``fence_first`` a
        transaction is open when the epoch reaches the limit, and the fence bumps past it."""
        meta = TxnMetadata(OLD_ID, self._allocate(), producer_epoch=epoch, timeout_ms=2_000,
                           last_update_ms=self.now)  # fmt: skip
        batch = build_batch([(encode_key(OLD_ID), encode_value(meta))], base_timestamp=self.now)
        # Written by this leadership's term (its epoch on the record), as a coordinator would.
        self.txn_log.append(batch, now_ms=self.now, leader_epoch=LEADER_EPOCH[0])
        for call in self.in_flight.values():
            call.close()  # the restart that loads it
        self.in_flight.clear()
        self.model.restart()
        self.coordinator = self._open()
        self.model.txns[OLD_ID] = ModelTxn(meta.producer_id, epoch, timeout_ms=2_000,
                                           updated_ms=self.now)  # fmt: skip
        self.instances[OLD_ID] = [(meta.producer_id, epoch)]
        for _ in range(EXHAUSTED_EPOCH - epoch):
            self.init(OLD_ID, 2_000)
        if fence_first:
            self.add(OLD_ID, -1, {PARTITIONS[0]}, None)
            self.init(OLD_ID, 2_000)  # fenced: the epoch goes past the limit
        self.init(OLD_ID, 2_000)
        event("epoch ran out", str(self.model.txns[OLD_ID].epoch))

    @rule(tid=st.sampled_from(IDS), which=st.integers(0, 3), partition=st.sampled_from(PARTITIONS))
    def timeout_pass_during_an_add(self, tid: str, which: int, partition: tuple[str, int]) -> None:
        """An open transaction past its timeout while its AddPartitionsToTxn write is on
        its way (appended, its sync not yet done): the timeout pass leaves it alone, as
        Kafka's ``abortTimedOutTransactions`` skips an id with a pending transition; the
        write then lands, and a later pass aborts the transaction. A pass that aborted
        it meanwhile would be overwritten by the landing write: the fenced epoch's
        transaction back open, its abort markers written."""
        txn = self.model.txns.get(tid)
        pid, epoch = self._instance(tid, which)
        if (
            txn is None
            or txn.status != "ongoing"
            or txn.pending
            or partition in txn.partitions
            or (pid, epoch) != (txn.producer_id, txn.epoch)
        ):
            return
        call = self.coordinator.add_to_transaction(tid, pid, epoch, {partition}, set(),
                                                   ErrorCode.PRODUCER_FENCED)  # fmt: skip
        self.durability.txn_log_slow = True
        try:
            call.send(None)
        except StopIteration as done:
            raise AssertionError(f"adding {partition} to {tid}'s transaction wrote nothing: "
                                 f"{done.value!r}") from None  # fmt: skip
        finally:
            self.durability.txn_log_slow = False
        event("a timeout pass during an add's write")
        before = self.coordinator.get(tid)
        assert before is not None
        txn.pending = True  # the model's pending transition (its timeout pass skips it)
        past = txn.started_ms + txn.timeout_ms + 1
        note(f"add {tid} ({pid}, {epoch}) {partition}: its write in flight; the clock to {past}")
        self.time_passes(max(1, past - self.now))
        meta = self.coordinator.get(tid)
        assert (
            meta is not None
            and meta.state == TxnState.ONGOING
            and meta.producer_epoch == before.producer_epoch
        ), (
            f"the timeout pass took {tid} while its AddPartitionsToTxn write was in flight:"
            f" the table says {meta}"
        )
        # Kafka's pendingTransitionInProgress: while the id's write is on its way, its
        # producer's EndTxn (either outcome), AddPartitionsToTxn and InitProducerId are
        # answered CONCURRENT_TRANSACTIONS at once and change nothing; the client retries
        # once the write has landed.
        fenced = ErrorCode.PRODUCER_FENCED
        requests = {
            "EndTxn commit": lambda: self.coordinator.end_transaction(tid, pid, epoch, True, fenced),
            "EndTxn abort": lambda: self.coordinator.end_transaction(tid, pid, epoch, False, fenced),
            "AddPartitionsToTxn": lambda: self.coordinator.add_to_transaction(
                tid, pid, epoch, {partition}, set(), fenced),
            "InitProducerId": lambda: self.coordinator.init_producer_id(
                tid, pid, epoch, 2_000, fenced),
        }  # fmt: skip
        for name, request in requests.items():
            answer = run(request())
            answer = getattr(answer, "error", answer)
            assert answer == ErrorCode.CONCURRENT_TRANSACTIONS, (
                f"{name} of {tid} while its AddPartitionsToTxn write was in flight answered"
                f" {answer!r}; a pending transition answers CONCURRENT_TRANSACTIONS"
            )
            assert self.coordinator.get(tid) == meta and self.coordinator.is_pending(tid)
        txn.pending = False
        try:
            call.send(None)
        except StopIteration as done:
            error = done.value
        else:
            call.close()
            raise AssertionError("the add waited again")
        note(f"add {tid} ({pid}, {epoch}) {partition} landed -> {error!r}")
        assert error == self.model.add(tid, pid, epoch, {partition}, set(), self.now)

    @rule(ms=st.sampled_from([500, 2_001, 5_001]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.model.now_ms = self.now
        run(self.coordinator.abort_timed_out())
        self.model.expire_timed_out(self.now)
        run(self.coordinator.expire_ids())
        self.model.expire_ids(EXPIRATION_MS)
        for key in [k for k in self.epochs_seen if k[0] not in self.model.txns]:
            del self.epochs_seen[key]  # forgotten: its next producer id starts at epoch 0

    @rule()
    def restart(self) -> None:
        for call in self.in_flight.values():
            call.close()  # the process died with the round in flight
        self.in_flight.clear()
        UNAWAITED.clear()
        self.model.restart()
        before = sorted(self.coordinator.all(), key=lambda meta: meta.transactional_id)
        self.coordinator = self._open()
        after = sorted(self.coordinator.all(), key=lambda meta: meta.transactional_id)
        assert after == before, f"a restart replayed the table as {after}; it was {before}"

    @rule()
    def leader_epoch_bumps(self) -> None:
        """A new epoch of the leadership this broker held all along (an ISR change):
        the table stays, rounds in flight go on, markers carry the new epoch."""
        before = self.coordinator.all()
        LEADER_EPOCH[0] += 1
        self.leadership.elect(LEADER_EPOCH[0])
        self.coordinator.elected(0, LEADER_EPOCH[0], self.txn_log)
        assert not self.coordinator.loading, "a current table reloaded"
        assert self.coordinator.all() == before

    @rule(tid=st.sampled_from(IDS), about_to_lead=st.booleans(), lost_loading=st.booleans())
    def leadership_lost_and_won_back(
        self, tid: str, about_to_lead: bool, lost_loading: bool
    ) -> None:
        """Another broker leads the partition for a while (writing nothing), then this
        one is elected again: its rounds in flight are lost with the leadership.
        ``lost_loading``: the leadership is lost again before the table loads, and won
        back later: nothing loads while another broker leads (Kafka's
        removeTransactionsForTxnTopicPartition drops a pending load)."""
        for call in self.in_flight.values():
            call.close()  # the writes of a resigned table fail NOT_COORDINATOR
        self.in_flight.clear()
        UNAWAITED.clear()
        self.model.restart()
        before = sorted(self.coordinator.all(), key=lambda meta: meta.transactional_id)
        self.leadership.resign()
        self.coordinator.resigned(0)
        self.leadership.coming = about_to_lead
        away = (
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if about_to_lead else ErrorCode.NOT_COORDINATOR
        )
        self._answers_only(tid, away)
        self.leadership.coming = False
        LEADER_EPOCH[0] += 1
        self.leadership.elect(LEADER_EPOCH[0])
        self.coordinator.elected(0, LEADER_EPOCH[0], self.txn_log)
        self._answers_only(tid, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if lost_loading:
            self.leadership.resign()
            self.coordinator.resigned(0)
            loaded = self.coordinator.load_pending()
            assert loaded == [], (
                f"a partition resigned before its table loaded was loaded: {len(loaded)} table"
            )
            self._answers_only(tid, ErrorCode.NOT_COORDINATOR)
            LEADER_EPOCH[0] += 1
            self.leadership.elect(LEADER_EPOCH[0])
            self.coordinator.elected(0, LEADER_EPOCH[0], self.txn_log)
        assert len(self.coordinator.load_pending()) == 1
        after = sorted(self.coordinator.all(), key=lambda meta: meta.transactional_id)
        assert after == before

    def _answers_only(self, tid: str, error: ErrorCode) -> None:
        """Every request for ``tid`` answers ``error`` and changes nothing."""
        pid, epoch = self._instance(tid, 0)
        fenced = ErrorCode.PRODUCER_FENCED
        init = run(self.coordinator.init_producer_id(tid, pid, epoch, 2_000, fenced))
        assert init.error == error
        add = self.coordinator.add_to_transaction(tid, pid, epoch, [PARTITIONS[0]], [], fenced)
        assert run(add) == error
        assert run(self.coordinator.end_transaction(tid, pid, epoch, True, fenced)) == error
        assert self.coordinator.verify_partition(tid, pid, epoch, PARTITIONS[0]) == error
        assert self.coordinator.get(tid) is None and not self.coordinator.is_pending(tid)
        assert self.coordinator.all() == []

    @precondition(lambda self: any(self.instances.values()))
    @invariant()
    def same_table(self) -> None:
        for tid, txn in self.model.txns.items():
            meta = self.coordinator.get(tid)
            assert meta is not None
            assert (_STATUS[meta.state], meta.producer_id, meta.producer_epoch) == (
                txn.status, txn.producer_id, txn.epoch,
            )  # fmt: skip
            assert meta.partitions == frozenset(txn.partitions)
            assert self.coordinator.is_pending(tid) == txn.pending
            assert meta.groups == frozenset(txn.groups)
            # KIP-890: a produce's partition is verified in the transaction only while
            # the transaction is Ongoing with that partition added; one being ended
            # (Prepare*) or over (Complete*, its partitions still listed) refuses it.
            for partition in txn.partitions:
                got = self.coordinator.verify_partition(tid, txn.producer_id, txn.epoch, partition)
                assert (got == ErrorCode.NONE) == (txn.status == "ongoing"), (
                    f"verifying {partition} in {tid}'s transaction, {txn.status}, "
                    f"answered {got.name}: KIP-890 verifies only an Ongoing one"
                )
                # ... and only for the producer that holds the id now: another producer
                # id is one the coordinator does not map to it, a fenced epoch never.
                other = self.coordinator.verify_partition(
                    tid, txn.producer_id + 1, txn.epoch, partition
                )
                assert other == ErrorCode.INVALID_PRODUCER_ID_MAPPING, (
                    f"verifying {partition} in {tid}'s transaction (producer id"
                    f" {txn.producer_id}) for producer id {txn.producer_id + 1} answered"
                    f" {other.name}, not INVALID_PRODUCER_ID_MAPPING"
                )
                if txn.epoch > 0:
                    old = self.coordinator.verify_partition(
                        tid, txn.producer_id, txn.epoch - 1, partition
                    )
                    assert old != ErrorCode.NONE, (
                        f"{partition} verified in {tid}'s transaction for the fenced epoch"
                        f" {txn.epoch - 1} (the transaction's is {txn.epoch})"
                    )
            # Epochs never go back (for one producer id: I2's new id starts at 0).
            key = (tid, meta.producer_id)
            assert meta.producer_epoch >= self.epochs_seen.get(key, -1)
            self.epochs_seen[key] = meta.producer_epoch

    @invariant()
    def complete_only_once_its_markers_are_durable(self) -> None:
        """A transaction is CompleteCommit/CompleteAbort only once every marker it
        appended was awaited durable."""
        for meta in self.coordinator.all():
            if meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                owed = sorted(k[1] for k, pid in UNAWAITED.items() if pid == meta.producer_id)
                assert not owed, (
                    f"{meta.transactional_id} is {meta.state.name} with its markers at "
                    f"{owed} not awaited durable"
                )

    @invariant()
    def txn_log_records_carry_their_terms_epochs(self) -> None:
        """Every ``__transaction_state`` record carries the leader epoch of the term
        that wrote it (a term per election, ``TxnLogLeadership``): a coordinator's
        partition takes each new term (``partition.coordinator_partition``), or its
        writes after a leadership won back claim the old epoch, and a follower's
        truncation by OffsetForLeaderEpoch reads the log wrong."""
        starts = self.leadership.epoch_starts
        for region in self.txn_log.read(0, 1 << 30, self.txn_log.log_end_offset):
            for batch in iter_batches(region.read_bytes()):
                epochs = [epoch for start, epoch in starts if start <= batch.base_offset]
                assert batch.partition_leader_epoch == epochs[-1], (
                    f"the __transaction_state record at {batch.base_offset} carries leader"
                    f" epoch {batch.partition_leader_epoch}; the term that wrote it leads in"
                    f" epoch {epochs[-1]} (terms began at {starts})"
                )

    @invariant()
    def same_markers_and_groups(self) -> None:
        for topic, partition in PARTITIONS:
            log = self.topics.log(topic, partition)
            assert log is not None
            written = [
                (batch.producer_id, batch.producer_epoch, read_control_marker(batch).committed)
                for region in log.read(0, 1 << 20, log.log_end_offset)
                for batch in iter_batches(region.read_bytes())
            ]
            assert written == self.model.markers.get((topic, partition), [])
        assert self.groups.outcomes == self.model.group_outcomes


#: pytest-timeout's guard against a hang, not a budget: the machine is 4 s of CPU but
#: 100-180 s of wall time on the loaded machine, and the fourteenth round's scoring run
#: stopped it at the 300 s default while it shrank a failure the planted slip made.
pytestmark = pytest.mark.timeout(1200)
TestTxnCoordinator = TxnCoordinatorMachine.TestCase
# tools/mutation.sh sets MUTATION_EXAMPLES to run fewer examples per mutant.
TestTxnCoordinator.settings = settings(
    max_examples=int(os.environ.get("MUTATION_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
)


def test_transactions_timing_out_together_abort_oldest_first_then_by_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found with a random seed: app-b and app-a start at the same time and time out
    in the same tick, app-b's record written first. The coordinator aborted in table
    order (the id written longest ago first), so ("t", 0) got app-b's marker before
    app-a's; now the order is start time, then transactional id, in both."""
    monkeypatch.setitem(globals(), "note", lambda _: None)  # outside Hypothesis
    machine = TxnCoordinatorMachine()
    machine.init(tid="app-a", timeout_ms=2_000)
    machine.init(tid="app-b", timeout_ms=2_000)
    machine.add(tid="app-b", which=0, partitions={("t", 0)}, group=None)
    machine.add(tid="app-a", which=0, partitions={("t", 0)}, group=None)
    machine.time_passes(ms=2_001)
    machine.same_markers_and_groups()
    machine.same_table()
