"""One seeded run: three brokers, a producer, a fault schedule, the invariants.

Everything runs in one ``trio.run`` under ``MockClock(autojump_threshold=0)``: virtual
time jumps to the next timer whenever every task waits, so 40 s of cluster life take a
fraction of a second. Determinism: Trio's scheduler is seeded (as pytest-trio does under
Hypothesis), worker threads are replaced by inline calls, the module-level ``random``
is seeded, and the network's latencies come from the run's own ``random.Random``. The
same seed gives the same run, event for event (``SimResult.trace``).

Phases: start the cluster and create topic ``sim`` (2 partitions, RF=3,
``min.insync.replicas=2``); produce acks=all while the schedule's faults happen; heal
everything, restart what is down, wait for every replica to catch up; check.

Invariants (checked every ``CHECK_EVERY_S`` and at the end):

1. **no acknowledged write is lost**: at the end, every acknowledged value is in the
   current leader's log below its HW, at the offset the acknowledgement named;
2. **the HW never goes backwards**: the HW shown by the leader that ZooKeeper names
   (in the epoch it names) never falls below one shown before; and the HW of one
   broker's leader terms, which its Fetch answers show, never falls below what an
   earlier term of the same broker life reached, nor the HW that broker keeps as a
   follower afterwards;
3. **one leader per epoch**: no two brokers ever hold a leader term for the same
   partition and leader epoch;
4. **replicas agree below the HW**: a batch below a replica's HW (a leader's HW, a
   follower's copy of it) is the same bytes on every replica and at every check;
5. **liveness**: once the faults healed, the cluster settles (every replica in sync)
   within SETTLE_LIMIT_S, and then acknowledges an acks=all write to each partition;
6. **consumers see only what is committed** (spec/replication_model.py, sentence 11):
   two consumers, one plain and one read_committed, long-poll the partitions' leaders
   throughout (one Fetch per leader for all the partitions it leads, as Kafka clients); every record one is given is below the HW (read_committed: the LSO)
   told in the same answer, and at the end is in the leader's log below its HW at the
   same offset; once the cluster settled, both reach every partition's HW. An answer's
   LSO is never above its HW (Kafka's LSO is bounded by the HW).
7. **acks=all waits for min.insync.replicas** (sentence 8): when an acknowledgement
   arrives, at least ``min.insync.replicas`` replicas hold its records at the offsets it
   named. A broker that crashed or started since the request was sent counts as holding
   them (a power cut may take a follower's unsynced copy after the commit), as do
   offsets DeleteRecords removed.
8. **a replica's HW lies within its log** (sentence 7): every leader's and follower's
   HW is at least its log start and at most its log end.
9. **epoch caches agree with the logs** (sentence 6): in every replica's leader epoch
   cache, the entry covering a batch's base offset names the epoch the batch was
   written in (its partitionLeaderEpoch).
10. **refused writes are not appended**: a write answered NOT_ENOUGH_REPLICAS (Kafka
   refuses it before the append) is in no replica's log, when the answer arrives and at
   the end. Other errors may come after the append (NOT_ENOUGH_REPLICAS_AFTER_APPEND,
   REQUEST_TIMED_OUT, and NOT_LEADER_OR_FOLLOWER for a leadership lost while waiting),
   so they promise nothing.
11. **a follower never truncates below its HW** (sentence 5): every cut a follower makes
   after a leader change (``Partition.truncate_to``) ends at or above the HW it holds
   then; with clean elections the new leader holds everything committed.

The ``stale_fetch_answer`` fault (sim/faults.py) holds a leader's answers to one
follower until the partition's leader epoch moved on, so that the follower's fetcher
receives an answer from before the change (sentence 10: it must drop it).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

import attrs
import trio
import trio.testing

from sim import timers as wakes
from sim.bugs import PLANTED_BUGS
from sim.client import Ack, Consumer, Producer
from sim.cluster import (
    SESSION_TIMEOUT_MS,
    SimBroker,
    SimCluster,
    inline_call_observers,
    run_inline,
    virtual_clock,
)
from sim.faults import Fault, make_schedule
from sim.network import Network
from trio_broker.cluster.coordination import MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.cluster.zk_layout import PartitionState, partition_state_path
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.storage.memory import MemoryLog

__all__ = ["SimResult", "simulate"]

TOPIC = "sim"
PARTITIONS = 2
BROKER_IDS = [1, 2, 3]
#: The faults of a schedule come within this many seconds (drawn per seed): from two
#: session timeouts, where every fault overlaps others and the cluster's reactions to
#: them, to five, with quieter stretches between. Denser schedules catch the planted
#: bugs more often per schedule, and much more often per CPU-minute, than the 12 s
#: spans this began with (docs/cluster.md, "Speed").
FAULT_SPAN_S = (2.0, 5.0)
FAULTS = 6
CHECK_EVERY_S = 0.1
SETTLE_LIMIT_S = 60.0
#: Once settled, each partition must acknowledge a write within this long.
AFTER_HEAL_WRITE_S = 10.0
#: How long crash_leader_on_truncation waits for a truncation before it lapses.
ARMED_FOR_S = 4.0

Key = tuple[str, int]
#: Produce errors Kafka gives only before it appends (invariant 10).
REFUSED_BEFORE_APPEND = frozenset({ErrorCode.NOT_ENOUGH_REPLICAS})


@attrs.define
class SimResult:
    seed: int
    schedule: list[Fault]
    violations: list[str] = attrs.field(factory=list)
    acked: int = 0
    sent: int = 0
    #: Records the consumer was given.
    consumed: int = 0
    #: The consumers' Fetch requests, by the number of partitions each carried.
    consumer_fetch_sizes: dict[int, int] = attrs.field(factory=dict)
    settled: bool = False
    virtual_s: float = 0.0
    trace: list[str] = attrs.field(factory=list)
    #: The seconds within which the schedule's faults come.
    span_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


class Invariants:
    def __init__(self, zk: MemoryZooKeeper, brokers: list[SimBroker], result: SimResult) -> None:
        self.zk, self.brokers, self.result = zk, brokers, result
        self.epoch_leader: dict[tuple[Key, int], int] = {}
        self.max_shown_hw: dict[Key, int] = {}
        #: Per (broker, life, partition): the highest HW its leader terms reached.
        self.life_hw: dict[tuple[int, int, Key], int] = {}
        self.committed: dict[Key, dict[int, tuple[int, bytes]]] = {}
        #: Per partition: the offset below which DeleteRecords removed the records.
        self.deleted_below: dict[Key, int] = {}
        #: min.insync.replicas as configured, capped at the replica count (Kafka's
        #: effectiveMinIsr); not the leader's own idea of it, which is part of what 7 checks.
        self.min_insync = min(brokers[0].config().min_insync_replicas, len(brokers))
        self.seen: set[str] = set()
        #: Writes refused before the append: (partition, values, error), for 10.
        self.refusals: list[tuple[Key, tuple[bytes, ...], ErrorCode]] = []
        self.start = trio.current_time()
        #: Decoded partition states by znode path: (version, state), decoded once.
        self._states: dict[str, tuple[int, PartitionState]] = {}

    def violation(self, text: str) -> None:
        if text not in self.seen:  # each once, with the time it was first seen
            self.seen.add(text)
            self.result.violations.append(f"t={trio.current_time() - self.start:.3f} {text}")

    def zk_state(self, key: Key) -> PartitionState | None:
        path = partition_state_path(*key)
        node = self.zk.nodes.get(path)
        if node is None:
            return None
        cached = self._states.get(path)
        if cached is None or cached[0] != node.version:
            cached = self._states[path] = (node.version, PartitionState.decode(node.data))
        return cached[1]

    def check(self) -> None:
        for sim in self.brokers:
            broker = sim.broker
            manager = _manager(broker)
            if manager is None:
                continue
            for key, term in manager.terms.items():
                # 3. one leader per (partition, epoch)
                holder = self.epoch_leader.setdefault((key, term.leader_epoch), sim.broker_id)
                if holder != sim.broker_id:
                    self.violation(
                        f"{key}: brokers {holder} and {sim.broker_id} both lead epoch "
                        f"{term.leader_epoch}"
                    )
                # 2. the HW shown by ZooKeeper's leader, in its epoch, never goes back
                state = self.zk_state(key)
                if (
                    state is not None
                    and state.leader == sim.broker_id
                    and state.leader_epoch == term.leader_epoch
                ):
                    shown = term.visible_high_watermark()
                    if shown is not None:
                        before = self.max_shown_hw.get(key, 0)
                        if shown < before:
                            self.violation(
                                f"{key}: HW went back from {before} to {shown} "
                                f"(broker {sim.broker_id}, epoch {term.leader_epoch})"
                            )
                        self.max_shown_hw[key] = max(before, shown)
                # 2b. nor does the HW one broker's Fetch answers show across its terms
                life = (sim.broker_id, sim.lives, key)
                before = self.life_hw.get(life, 0)
                if term.high_watermark < before:
                    self.violation(
                        f"{key}: broker {sim.broker_id}'s HW went back from {before} to "
                        f"{term.high_watermark} in its term of epoch {term.leader_epoch}"
                    )
                self.life_hw[life] = max(before, term.high_watermark)
                self._replica(key, broker, term.high_watermark, sim.broker_id, "leader")
            for key, role in manager.following.items():
                # 2c. a leader turned follower keeps the HW its terms reached (it is the
                # log's, as in Kafka): a truncation that falls back to it cuts no lower.
                reached = self.life_hw.get((sim.broker_id, sim.lives, key), 0)
                if role.high_watermark < reached:
                    self.violation(
                        f"{key}: broker {sim.broker_id} follows with HW {role.high_watermark}"
                        f" below the {reached} its own terms reached"
                    )
                self._replica(key, broker, role.high_watermark, sim.broker_id, "follower")

    def _replica(self, key: Key, broker: Any, hw: int, broker_id: int, role: str) -> None:
        """Invariants 4, 8 and 9 on one replica's log, as it stands at this check."""
        log_ = broker.topics.log(*key)
        if log_ is None:
            return
        self._agree(key, log_, hw, broker_id)
        self._within_log(key, log_, hw, broker_id, role)
        self._epochs_match(key, log_, broker_id)

    def _within_log(self, key: Key, log_: Any, hw: int, broker_id: int, role: str) -> None:
        """8. a replica's HW counts only records it holds, and its log start never passes
        its HW (spec sentence 7; Kafka keeps log start <= HW <= log end)."""
        start, end = log_.log_start_offset, log_.log_end_offset
        if not start <= hw <= end:
            self.violation(
                f"{key}: broker {broker_id} ({role}) has HW {hw} outside its log [{start}, {end}]"
            )

    def _epochs_match(self, key: Key, log_: Any, broker_id: int) -> None:
        """9. the leader epoch cache agrees with the log (sentence 6): the entry that
        covers each batch's base offset names the epoch the batch was written in, so an
        OffsetForLeaderEpoch answer is where that epoch's records end."""
        entries = log_.epoch_cache.entries
        starts = [entry.start_offset for entry in entries]
        log_start = log_.log_start_offset
        for base, last, data in log_.batches():
            if last < log_start:
                continue  # deleted (DeleteRecords), though still stored; the cache starts later
            first = max(base, log_start)
            written_in = int.from_bytes(data[12:16], "big", signed=True)  # partitionLeaderEpoch
            at = bisect.bisect_right(starts, first) - 1
            cached = entries[at].epoch if at >= 0 else None
            if cached != written_in:
                self.violation(
                    f"{key}: broker {broker_id}'s epoch cache has epoch {cached} at offset "
                    f"{first}, whose batch was written in epoch {written_in}"
                )
                return

    def _agree(self, key: Key, log_: Any, hw: int, broker_id: int) -> None:
        """4. batches below this replica's HW match what every replica had there."""
        seen = self.committed.setdefault(key, {})
        for base, last, data in log_.batches():
            if last >= hw:
                break
            before = seen.setdefault(base, (last, data))
            if before != (last, data):
                self.violation(
                    f"{key}: broker {broker_id} holds a different batch at offset {base} "
                    "below its HW"
                )

    def acknowledged(self, ack: Ack) -> None:
        """7. an acks=all acknowledgement arrives only while min.insync.replicas replicas
        hold its records (Kafka answers NOT_ENOUGH_REPLICAS_AFTER_APPEND otherwise)."""
        key = (TOPIC, ack.partition)
        wanted = {ack.base_offset + i: value for i, value in enumerate(ack.values)}
        first, last = ack.base_offset, ack.base_offset + len(ack.values) - 1
        holders: list[int] = []
        for sim in self.brokers:
            if sim.broker is None or sim.changed_at >= ack.sent_at:
                holders.append(sim.broker_id)  # crashed or started since: cannot tell
                continue
            log_ = sim.broker.topics.log(*key)
            held = {} if log_ is None else _log_values(log_, first, last)
            # Offsets below the log start were removed by DeleteRecords: held.
            if log_ is not None and all(
                o < log_.log_start_offset or held.get(o) == v for o, v in wanted.items()
            ):
                holders.append(sim.broker_id)
        if len(holders) < self.min_insync:
            self.violation(
                f"{key}: broker {ack.leader} acknowledged offsets {first}-{last} "
                f"(acks=all) held by broker(s) {holders} only; min.insync.replicas is "
                f"{self.min_insync}"
            )

    def truncated(self, fn: Callable[..., Any], args: tuple[object, ...]) -> None:
        """11. (an inline call observer) a follower's cut ends at or above its HW."""
        if getattr(fn, "__name__", "") != "truncate_to" or not args:
            return
        offset = args[0]
        assert isinstance(offset, int)
        owner = getattr(fn, "__self__", None)
        cut_log = getattr(owner, "log", owner)
        for sim in self.brokers:
            manager = _manager(sim.broker)
            if manager is None or sim.broker is None:
                continue
            for key, role in manager.following.items():
                if sim.broker.topics.log(*key) is cut_log and offset < role.high_watermark:
                    self.violation(
                        f"{key}: broker {sim.broker_id} cut its log to {offset}, below its "
                        f"HW {role.high_watermark}"
                    )

    def refused(self, partition: int, values: tuple[bytes, ...], error: ErrorCode) -> None:
        """10. a write refused before the append is in no replica's log."""
        if error not in REFUSED_BEFORE_APPEND:
            return
        key = (TOPIC, partition)
        self.refusals.append((key, values, error))
        self._nowhere(key, values, error)

    def _nowhere(self, key: Key, values: tuple[bytes, ...], error: ErrorCode) -> None:
        wanted = set(values)
        for sim in self.brokers:
            log_ = None if sim.broker is None else sim.broker.topics.log(*key)
            if log_ is None:
                continue
            found = [(o, v) for o, v in _log_values(log_).items() if v in wanted]
            if found:
                offset, value = found[0]
                self.violation(
                    f"{key}: {value!r}, refused with {error.name}, is in broker "
                    f"{sim.broker_id}'s log at offset {offset}"
                )
                return

    def shown_above_high_watermark(self, consumer: Consumer) -> None:
        """6a. a record given at or above the HW (read_committed: LSO) of its answer, or
        an answer whose LSO lies above its HW."""
        kind = "read_committed consumer" if consumer.isolation_level else "consumer"
        for got in consumer.above_high_watermark:
            self.violation(
                f"{(TOPIC, got.partition)}: broker {got.leader} gave a {kind} offset "
                f"{got.offset} with HW {got.high_watermark}, bound {got.bound}"
            )
        for partition, leader, stable, hw in consumer.stable_above_high_watermark:
            self.violation(
                f"{(TOPIC, partition)}: broker {leader} answered a {kind}'s Fetch with "
                f"last stable offset {stable} above its HW {hw}"
            )

    def final(self, producer: Producer, consumers: list[Consumer]) -> None:
        """1. every acknowledged write is in the leader's log below its HW; 6b. so is
        every record a consumer was given, at the offset it was given at; 10. no refused
        write is in any log."""
        for key, values, error in self.refusals:
            self._nowhere(key, values, error)
        for partition in range(PARTITIONS):
            key = (TOPIC, partition)
            state = self.zk_state(key)
            leader = None
            if state is not None and state.leader > 0:
                leader = self.brokers[state.leader - 1].broker
            term = None if leader is None else leader.replication.leader_term(*key)
            if state is None or leader is None or term is None:
                self.violation(f"{key}: no live leader at the end")
                continue
            log_ = leader.topics.log(*key)
            assert log_ is not None
            found: dict[bytes, int] = {}
            assert isinstance(log_, MemoryLog)  # the simulated brokers keep their logs in memory
            for base, last, data in log_.batches():
                if last >= term.high_watermark:
                    break
                for offset, value in _values(base, data):
                    found.setdefault(value, offset)
            received = [got for consumer in consumers for got in consumer.received]
            gone = self.deleted_below.get(key, 0)  # DeleteRecords removed these
            for got in received:
                if got.offset < gone:
                    continue
                if got.partition == partition and found.get(got.value) != got.offset:
                    where = found.get(got.value)
                    self.violation(
                        f"{key}: a consumer was given {got.value!r} at offset {got.offset} "
                        f"(broker {got.leader}, HW {got.high_watermark}); it is "
                        f"{'at ' + str(where) if where is not None else 'gone'} "
                        f"(leader {state.leader}, HW {term.high_watermark})"
                    )
            for ack in producer.acks:
                if ack.partition != partition:
                    continue
                for i, value in enumerate(ack.values):
                    if ack.base_offset + i < gone:
                        continue
                    if found.get(value) != ack.base_offset + i:
                        self.violation(
                            f"{key}: acknowledged {value!r} at offset {ack.base_offset + i} "
                            f"is {'at ' + str(found[value]) if value in found else 'lost'} "
                            f"(leader {state.leader}, HW {term.high_watermark})"
                        )


async def _write_after_heal(producer: Producer, partition: int) -> bool:
    acked = len(producer.acks)
    with trio.move_on_after(AFTER_HEAL_WRITE_S):
        while not any(ack.partition == partition for ack in producer.acks[acked:]):
            await producer.produce_once(partition)
        return True
    return False


async def _consumer_catches_up(consumer: Consumer, sims: list[SimBroker], inv: Invariants) -> bool:
    def caught_up() -> bool:
        for partition in range(PARTITIONS):
            key = (TOPIC, partition)
            state = inv.zk_state(key)
            leader = None if state is None or state.leader < 1 else sims[state.leader - 1].broker
            term = None if leader is None else leader.replication.leader_term(*key)
            if term is None or consumer.positions.get(partition, 0) < term.high_watermark:
                return False
        return True

    with trio.move_on_after(AFTER_HEAL_WRITE_S):
        while not caught_up():  # noqa: ASYNC110 - polling plain data
            await trio.sleep(0.05)
        return True
    return False


def _manager(broker: Any) -> ReplicaManager | None:
    """A broker's replica manager while it is in the cluster (its terms and followed
    partitions), else None: stopped, not joined yet, or left."""
    replication = None if broker is None else broker.replication
    return replication if isinstance(replication, ReplicaManager) else None


def _values(base: int, data: bytes) -> list[tuple[int, bytes]]:
    from trio_broker.protocol.records import parse_header

    view = parse_header(data)
    return [(base + r.offset_delta, bytes(r.value or b"")) for r in view.records()]


def _log_values(log_: Any, first: int = 0, last: float = float("inf")) -> dict[int, bytes]:
    """Offset -> value of the records ``log_`` stores in the batches that overlap
    ``first``..``last`` (every batch by default)."""
    found: dict[int, bytes] = {}
    for base, batch_last, data in log_.batches():
        if batch_last < first:
            continue
        if base > last:
            break
        found.update(_values(base, data))
    return found


def _settled(brokers: list[SimBroker], inv: Invariants) -> bool:
    """Every partition led, with all three in its ISR, every replica at the leader's end."""
    for partition in range(PARTITIONS):
        key = (TOPIC, partition)
        state = inv.zk_state(key)
        if state is None or state.leader < 0 or len(state.isr) != len(brokers):
            return False
        leader = brokers[state.leader - 1].broker
        if leader is None:
            return False
        term = leader.replication.leader_term(*key)
        leader_log = leader.topics.log(*key)
        if term is None or leader_log is None or term.leader_epoch != state.leader_epoch:
            return False
        if term.high_watermark != leader_log.log_end_offset:
            return False
        for sim in brokers:
            other = sim.broker
            log_ = None if other is None else other.topics.log(*key)
            if log_ is None or log_.log_end_offset != leader_log.log_end_offset:
                return False
    return True


async def _apply_fault(
    fault: Fault, brokers: dict[str, SimBroker], network: Network, nursery: trio.Nursery,
    trace: Callable[[str], None], inv: Invariants,
) -> None:  # fmt: skip
    if fault.kind == "crash_leader_on_truncation":
        key = (TOPIC, int(fault.a[1:]))
        truncated = trio.Event()

        def observe(fn: Callable[..., Any], args: tuple[object, ...]) -> None:
            # The fetcher truncates through the follower's Partition, which holds the log.
            owner = getattr(fn, "__self__", 0)
            if getattr(fn, "__name__", "") == "truncate_to" and any(
                s.broker is not None and s.broker.topics.log(*key) is getattr(owner, "log", owner)
                for s in brokers.values()
            ):
                truncated.set()

        inline_call_observers.append(observe)
        try:
            with trio.move_on_after(ARMED_FOR_S):
                await truncated.wait()
        finally:
            inline_call_observers.remove(observe)
        if not truncated.is_set():
            return  # no follower truncated meanwhile: the fault lapses
        trace(f"{fault}: a follower of {key} truncated")
        fault = attrs.evolve(fault, kind="crash_leader")
    if fault.kind == "stale_fetch_answer":
        await _stale_fetch_answer(fault, brokers, network, nursery, trace, inv)
        return
    if fault.kind == "delete_records":
        _delete_records(fault, brokers, trace, inv)
        return
    if fault.kind == "crash_leader":
        state = inv.zk_state((TOPIC, int(fault.a[1:])))
        if state is None or state.leader < 0:
            return
        fault = attrs.evolve(fault, kind="crash", a=f"b{state.leader}")
    sim = brokers[fault.a]
    if fault.kind in ("crash", "power_cut"):
        if not sim.up:
            return
        trace(str(fault))
        await sim.crash(power_cut=fault.kind == "power_cut")
        await wakes.sleep(SESSION_TIMEOUT_MS / 1000)
        sim.session_expires()
        await wakes.sleep(fault.duration)
        await sim.start(nursery)
        trace(f"restarted {fault.a}")
    elif fault.kind in ("partition", "slow", "lossy"):
        trace(str(fault))
        link = frozenset((fault.a, fault.b))
        if fault.kind == "partition":
            network.partition(fault.a, fault.b)
        elif fault.kind == "slow":
            network.slow[link] = 0.01 + 0.29 * (fault.duration / (4 * SESSION_TIMEOUT_MS / 1000))
        else:
            network.lossy.add(link)
        await wakes.sleep(fault.duration)
        if fault.kind == "partition":
            network.heal(fault.a, fault.b)
        network.slow.pop(link, None)
        network.lossy.discard(link)
        trace(f"healed {fault.a}-{fault.b}")
    elif fault.kind == "isolate":
        trace(str(fault))
        others = [n for n in [*brokers, "client"] if n != fault.a]
        for other in others:
            network.partition(fault.a, other)
        await wakes.sleep(fault.duration)
        for other in others:
            network.heal(fault.a, other)
        trace(f"healed {fault.a}")
    elif fault.kind == "reset":
        trace(str(fault))
        network.reset_between(fault.a, fault.b)
    elif fault.kind == "zk_cut":
        coord = sim.coord
        if coord is None or coord.cut_off or not sim.up:
            return
        trace(str(fault))
        coord.cut_off = True
        cut_at = trio.current_time()
        with trio.move_on_after(fault.duration):
            await wakes.sleep(SESSION_TIMEOUT_MS / 1000)
            coord.server_expires()
            trace(f"{fault.a}'s session expired")
        await wakes.sleep_until(cut_at + fault.duration)
        coord.reconnect()
        trace(f"{fault.a} reaches ZooKeeper again")


def _delete_records(
    fault: Fault, brokers: dict[str, SimBroker], trace: Callable[[str], None], inv: Invariants
) -> None:
    """DeleteRecords up to the HW on the leader's log, as the handler does."""
    key = (TOPIC, int(fault.a[1:]))
    state = inv.zk_state(key)
    sim = None if state is None or state.leader < 0 else brokers.get(f"b{state.leader}")
    broker = None if sim is None else sim.broker
    term = None if broker is None else broker.replication.leader_term(*key)
    log_ = None if broker is None else broker.topics.log(*key)
    if term is None or log_ is None or term.high_watermark <= log_.log_start_offset:
        return
    log_.delete_records(term.high_watermark)
    inv.deleted_below[key] = max(inv.deleted_below.get(key, 0), log_.log_start_offset)
    trace(
        f"{fault}: broker {state.leader if state else -1}'s log starts at {log_.log_start_offset}"
    )


async def _stale_fetch_answer(
    fault: Fault, brokers: dict[str, SimBroker], network: Network, nursery: trio.Nursery,
    trace: Callable[[str], None], inv: Invariants,
) -> None:  # fmt: skip
    """Hold the leader's bytes to one follower, move the partition's leader epoch on (a
    new leader, or the same one in a new epoch), and release them: when ZooKeeper has
    the new epoch (the answer races the follower's learning of it) or, when the fault's
    start is an odd millisecond, once the follower knows it."""
    key = (TOPIC, int(fault.a[1:]))
    state = inv.zk_state(key)
    if state is None or state.leader < 0:
        return
    leader = brokers[f"b{state.leader}"]
    followers = sorted(b for b in state.isr if b != state.leader)
    coord = leader.coord
    if not followers or not leader.up or coord is None or coord.cut_off:
        return
    follower = brokers[f"b{followers[int(fault.at * 1000) % len(followers)]}"]
    third = [s for s in brokers.values() if s not in (leader, follower)]
    if fault.b == "epoch" and not (third and third[0].up and third[0].broker_id in state.isr):
        return  # no ISR member to lose whose loss bumps the epoch
    trace(f"{fault}: holding {leader.node} -> {follower.node} at epoch {state.leader_epoch}")
    network.hold(leader.node, follower.node)
    started = trio.current_time()
    if fault.b == "leader":
        coord.cut_off = True
    else:
        await third[0].crash(power_cut=False)

    wait_for_follower = int(fault.at * 1000) % 2 == 1

    def follower_knows() -> bool:
        now = inv.zk_state(key)
        manager = _manager(follower.broker)
        if now is None or manager is None or now.leader_epoch <= state.leader_epoch:
            return False
        if not wait_for_follower:
            return True
        term, role = manager.terms.get(key), manager.following.get(key)
        known = term.leader_epoch if term is not None else role.leader_epoch if role else -1
        return known >= now.leader_epoch

    with trio.move_on_after(fault.duration):
        await wakes.sleep(SESSION_TIMEOUT_MS / 1000)
        if fault.b == "leader":
            coord.server_expires()
        else:
            third[0].session_expires()
        while not follower_knows():  # noqa: ASYNC110 - polling plain data
            await trio.sleep(0.001)
        trace(f"{key}: epoch moved on; releasing {leader.node} -> {follower.node}")
    network.release(leader.node, follower.node)
    await wakes.sleep_until(started + fault.duration)
    if fault.b == "leader":
        coord.reconnect()
        trace(f"{leader.node} reaches ZooKeeper again")
    elif not third[0].up:
        await third[0].start(nursery)
        trace(f"restarted {third[0].node}")


def simulate(
    seed: int,
    *,
    faults: int = FAULTS,
    span_s: float | None = None,
    bug: str | None = None,
    schedule: list[Fault] | None = None,
) -> SimResult:
    """Run one seeded simulation to the end; the result lists any invariant violations.

    ``bug`` names one of sim/bugs.py's planted bugs, patched in for this run;
    ``schedule`` replaces the seed's own (a scenario written by hand); ``span_s``
    replaces the seed's own span (drawn from FAULT_SPAN_S)."""
    rng = random.Random(seed)
    if span_s is None:
        span_s = round(rng.uniform(*FAULT_SPAN_S), 3)
    drawn = make_schedule(rng, span_s, faults)
    result = SimResult(seed, drawn if schedule is None else schedule, span_s=span_s)
    clock = virtual_clock()
    planted = PLANTED_BUGS[bug]() if bug is not None else contextlib.nullcontext()
    with _deterministic(seed), planted:
        trio.run(_main, rng, result, span_s, clock=clock)
    return result


async def _main(rng: random.Random, result: SimResult, span_s: float) -> None:
    cluster = SimCluster(BROKER_IDS, rng)
    zk, network, sims, start = cluster.zk, cluster.network, cluster.sims, cluster.started_at

    def trace(text: str) -> None:
        result.trace.append(f"{trio.current_time() - start:9.3f} {text}")

    inv = Invariants(zk, sims, result)
    producer = Producer(network, TOPIC, BROKER_IDS)
    producer.on_ack = inv.acknowledged
    producer.on_refusal = inv.refused
    consumer = Consumer(network, TOPIC, BROKER_IDS)
    committed_reader = Consumer(network, TOPIC, BROKER_IDS, isolation_level=1)
    consumers = [consumer, committed_reader]
    inline_call_observers.append(inv.truncated)
    try:
        await _run(cluster, inv, producer, consumers, result, span_s, trace)
    finally:
        inline_call_observers.remove(inv.truncated)


async def _run(
    cluster: SimCluster, inv: Invariants, producer: Producer, consumers: list[Consumer],
    result: SimResult, span_s: float, trace: Callable[[str], None],
) -> None:  # fmt: skip
    network, sims, start = cluster.network, cluster.sims, cluster.started_at
    by_node = {s.node: s for s in sims}
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        assignment = {p: [BROKER_IDS[(p + i) % 3] for i in range(3)] for p in range(PARTITIONS)}
        await first.admin.create_topic(TOPIC, PARTITIONS, 3, {}, assignment)
        trace("topic created")

        async def checker() -> None:
            while True:
                inv.check()
                for c in consumers:
                    inv.shown_above_high_watermark(c)
                await wakes.sleep(CHECK_EVERY_S)

        nursery.start_soon(checker)
        faulty_from = trio.current_time()
        until = faulty_from + span_s + SESSION_TIMEOUT_MS / 1000
        async with trio.open_nursery() as work:
            for partition in range(PARTITIONS):
                work.start_soon(producer.run, partition, until)
            # Until the final checks: they must also see the writes after the heal.
            for c in consumers:
                nursery.start_soon(c.run, list(range(PARTITIONS)), float("inf"))

            async def run_fault(fault: Fault) -> None:
                await wakes.sleep_until(faulty_from + fault.at)
                await _apply_fault(fault, by_node, network, nursery, trace, inv)

            for fault in result.schedule:
                work.start_soon(run_fault, fault)
        trace(f"faults over; {len(producer.acks)} acknowledged")
        # Heal: the network, and any broker still down (their faults restarted them).
        network.heal_all()
        with trio.move_on_after(SETTLE_LIMIT_S):
            while not _settled(sims, inv):  # noqa: ASYNC110 - polling plain data
                await trio.sleep(0.1)
            result.settled = True
        if not result.settled:
            inv.violation("the cluster did not settle within 60 s after the faults healed")
        else:
            # 5. a healed cluster takes writes: one more acks=all write per partition.
            for partition in range(PARTITIONS):
                if not await _write_after_heal(producer, partition):
                    inv.violation(
                        f"{(TOPIC, partition)}: no write acknowledged within "
                        f"{AFTER_HEAL_WRITE_S:.0f} s of a settled cluster"
                    )
            # 6c. and its consumers reach every partition's HW.
            for c in consumers:
                if not await _consumer_catches_up(c, sims, inv):
                    inv.violation(
                        f"the consumer (isolation {c.isolation_level}) did not reach the HW "
                        f"within {AFTER_HEAL_WRITE_S:.0f} s of a settled cluster "
                        f"(at {c.positions})"
                    )
        inv.check()
        for c in consumers:
            c.stopped = True
            inv.shown_above_high_watermark(c)
        inv.final(producer, consumers)
        result.acked = sum(len(a.values) for a in producer.acks)
        result.sent = producer.sent
        result.consumed = sum(len(c.received) for c in consumers)
        for c in consumers:
            for size, count in c.fetch_sizes.items():
                result.consumer_fetch_sizes[size] = result.consumer_fetch_sizes.get(size, 0) + count
        result.virtual_s = trio.current_time() - start
        trace(f"end: {result.acked} values acknowledged, settled={result.settled}")
        await producer.close()
        for c in consumers:
            await c.close()
        nursery.cancel_scope.cancel()


class _SchedulerRandom(random.Random):
    """Trio's scheduler shuffles every batch of runnable tasks under deterministic
    scheduling; most batches of a run hold one task, whose shuffle draws nothing. The
    same draws as ``random.Random``, without the call for those."""

    def shuffle(self, x: Any) -> None:
        if len(x) > 1:
            super().shuffle(x)


class _deterministic:
    """Seed Trio's scheduler and ``random``; run worker-thread calls inline."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.saved: list[Any] = []

    def __enter__(self) -> None:
        import trio._core._run as trio_run

        self.saved = [
            trio_run._ALLOW_DETERMINISTIC_SCHEDULING,
            trio_run._r,
            random.getstate(),
            trio.to_thread.run_sync,
            logging.getLogger("trio_broker").level,
        ]
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
        trio_run._r = _SchedulerRandom(self.seed)
        random.seed(self.seed)
        trio.to_thread.run_sync = run_inline  # type: ignore[assignment]
        logging.getLogger("trio_broker").setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        import trio._core._run as trio_run

        allow, scheduler_random, random_state, run_sync, level = self.saved
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = allow  # type: ignore[misc]
        trio_run._r = scheduler_random
        random.setstate(random_state)
        trio.to_thread.run_sync = run_sync
        logging.getLogger("trio_broker").setLevel(level)
