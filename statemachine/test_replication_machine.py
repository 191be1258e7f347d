"""One partition, three replicas, a controller: trio_broker.replication under faults.

A seeded, in-memory cluster: the leader's view (``LeaderPartition``), each replica's
leader-epoch cache, the follower truncation rounds (``plan_truncation``), the follower's
HW rule (``replication.follower``) and the controller's decisions
(``replication.controller_rules``: who leads after a loss, a return, a preferred-leader
election) are the real code; the logs, the network and the coordination service are
plain Python. The controller stores the ISR with a leader-epoch condition, as ZooKeeper
did for Kafka's controller.

A follower's fetch is two steps, as on a network: the leader handles the request (and
counts the follower's fetch offset towards its HW and ISR at once), the answer travels,
and then it arrives, is lost, or is dropped because the follower moved on (a new leader
epoch, or a crash in between). Anything may happen between the two: the leader may
crash, lose power, be deposed, or take more writes. The fetcher's decisions are
``replication.fetcher_rules``' (the ones ``cluster/replica_fetcher.py`` makes): sync
before fetching on, take an answer or drop it as stale, what its error means. A consumer
reads from the leader up to the fetch handler's bound (``partition.read.readable_end``).

Faults: kill -9 (the page cache survives), power cuts (the unsynced tail is lost), a
follower's power cut with a restart inside its session (it stays in the ISR: only what
it synced before fetching on may have counted), and a leader cut off from the
coordination service while still serving (a zombie). The sentences of
spec/replication_model.py are checked after every step, RF=3, min.insync.replicas=2.

Log starts move as in the broker: DeleteRecords on a broker that believes it leads (up
to its term's HW, the handler's bound), retention through ``segments_to_delete`` with
the replica's own HW, and a follower's following its leader's
(``fetcher_rules.follower_log_start``; a follower below the leader's log start is
emptied and starts there, ``out_of_range_reset``). No replica's log start passes its HW.
The model's HW is checkpointed with the log; the broker's is not (a restarted replica
starts at HW 0, below a log start it kept), which this machine does not follow.

A quarter of the examples run with unclean.leader.election.enable: with no ISR member
alive, the controller elects any live replica (sentence 13). What such an election
loses (the acknowledged, consumed and shown records the new leader lacks) is dropped
from the checks at that election; every other sentence is checked as in a clean run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import pytest
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_broker.partition.read import Isolation, readable_end
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    ElectionType,
    LeaderAndIsr,
    after_broker_loss,
    after_broker_return,
    preferred_leader_move,
    requested_election,
)
from trio_broker.replication.fetcher_rules import (
    AnswerAction,
    FetchPosition,
    ResetKind,
    answer_action,
    answer_applies,
    follower_log_start,
    out_of_range_reset,
    sync_before_fetch,
)
from trio_broker.replication.follower import (
    high_watermark_after_fetch,
    high_watermark_after_truncation,
)
from trio_broker.replication.leader import AckState, LeaderPartition
from trio_broker.replication.truncation import plan_truncation
from trio_broker.storage.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache
from trio_broker.storage.segment import segments_to_delete

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spec.replication_model import (
    CatchUp,
    Record,
    acked_writes_missing,
    common_prefix,
    consumed_records_missing,
    disagreements_below_hw,
    epoch_end_offset,
    isr_members_short_of_hw,
)

BROKERS = (1, 2, 3)
MIN_INSYNC = 2
LAG_MAX_MS = 100
#: Records per segment for the retention rule.
RETENTION_SEGMENT = 2


@attrs.define
class Replica:
    broker_id: int
    log: list[Record] = attrs.field(factory=list)
    durable: int = 0  # records below this survive a power cut
    cache: LeaderEpochCache = attrs.field(factory=LeaderEpochCache)
    high_watermark: int = 0  # checkpointed with the log: never above ``durable``
    alive: bool = True
    leading: LeaderPartition | None = None  # this broker's own idea of its term
    needs_truncation: bool = False  # follower that has not yet agreed with its leader
    #: The HW this replica has shown: its HW may only go back when a cut shortens the log.
    shown_high_watermark: int = 0
    #: Where the log starts (DeleteRecords, retention, or the leader's, followed); on
    #: disk at once. The records below it stay in ``log`` for the checks, unreadable.
    log_start: int = 0

    #: Epochs this broker began leading, at the log end of that moment: for the model.
    announced: dict[int, int] = attrs.field(factory=dict)

    def append(self, record: Record) -> None:
        self._drop_announced_from(len(self.log), keep=record.epoch)
        self.cache.assign(record.epoch, len(self.log))
        self.log.append(record)

    def announce(self, epoch: int) -> None:
        self._drop_announced_from(len(self.log), keep=epoch)
        self.cache.assign(epoch, len(self.log))
        self.announced[epoch] = len(self.log)

    def _drop_announced_from(self, offset: int, keep: int) -> None:
        """An epoch begun here and never written in is overwritten by what comes next."""
        for epoch, start in list(self.announced.items()):
            if start >= offset and epoch != keep:
                del self.announced[epoch]

    def truncate(self, end_offset: int) -> None:
        if end_offset >= len(self.log):
            return  # as Kafka: nothing to cut, the epoch cache stays as it is
        del self.log[end_offset:]
        # Below the log start (only after an unclean election): the log is emptied and
        # starts at the cut, as Kafka's truncateFullyAndStartAt.
        self.log_start = min(self.log_start, end_offset)
        self.cache.truncate_from_end(end_offset)
        self.announced = {e: o for e, o in self.announced.items() if o < end_offset}
        self.durable = min(self.durable, end_offset)
        self.high_watermark = high_watermark_after_truncation(self.high_watermark, end_offset)
        self.shown_high_watermark = min(self.shown_high_watermark, end_offset)


@attrs.define
class Controller:
    """ZooKeeper's partition state: leader, leader epoch, ISR, conditional updates."""

    leader: int | None
    leader_epoch: int
    isr: frozenset[int]

    def as_rules(self) -> LeaderAndIsr:
        leader = NO_LEADER if self.leader is None else self.leader
        return LeaderAndIsr(leader, self.leader_epoch, tuple(sorted(self.isr)))

    def store(self, state: LeaderAndIsr) -> None:
        self.leader = None if state.leader == NO_LEADER else state.leader
        self.leader_epoch = state.leader_epoch
        self.isr = frozenset(state.isr)


@attrs.frozen
class FetchAnswer:
    """A leader's answer to a follower's fetch, on its way back."""

    sent: FetchPosition
    records: tuple[Record, ...]
    high_watermark: int
    error_code: int = ErrorCode.NONE
    log_start: int = 0  # the leader's, as every fetch answer tells it


@attrs.define
class PendingAck:
    offset: int
    record: Record
    broker: int  # the leader it was appended to


class ReplicationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0
        self.replicas = {b: Replica(b) for b in BROKERS}
        self.controller = Controller(leader=1, leader_epoch=0, isr=frozenset(BROKERS))
        self.acked: dict[int, Record] = {}
        self.pending: list[PendingAck] = []
        self.writers: dict[int, set[int]] = {}  # leader epoch -> brokers that wrote in it
        self.visible_hw = 0  # the highest HW any client has been shown
        self.counter = 0
        self.in_flight: dict[int, FetchAnswer] = {}  # follower -> its one answer in flight
        #: follower -> (leader, leader epoch) it fetches from
        self.following: dict[int, tuple[int, int]] = {}
        #: (leader, epoch) -> follower -> sentence 12's catch-up bookkeeping
        self.catch_up: dict[tuple[int, int], dict[int, CatchUp]] = {}
        #: offset -> (record, HW told) as a consumer of the leaders first received it
        self.consumed: dict[int, tuple[Record, int]] = {}
        self.unclean = False  # the topic's unclean.leader.election.enable
        self.unclean_elections = 0
        #: (leader, epoch) -> the leader's log end when the term began (its epoch's start)
        self.term_starts: dict[tuple[int, int], int] = {}
        #: (leader, epoch) -> follower -> the log start its last fetch in the term told
        self.reported_starts: dict[tuple[int, int], dict[int, int]] = {}
        self._start_term(1)
        for broker in BROKERS:
            if broker != 1:
                self._follow(broker)

    @initialize(unclean=st.sampled_from((False, False, False, True)))
    def topic_config(self, unclean: bool) -> None:
        self.unclean = unclean
        if unclean:
            event("unclean.leader.election.enable")

    # -- the cluster's moves -------------------------------------------------------

    def _start_term(self, broker: int) -> None:
        replica = self.replicas[broker]
        c = self.controller
        replica.leading = LeaderPartition.become_leader(
            broker_id=broker,
            leader_epoch=c.leader_epoch,
            replicas=BROKERS,
            isr=c.isr,
            log_end_offset=len(replica.log),
            high_watermark=replica.high_watermark,
            now_ms=self.now_ms,
            min_insync_replicas=MIN_INSYNC,
            replica_lag_time_max_ms=LAG_MAX_MS,
        )
        # Kafka's leader starts its epoch at its log end (a power cut already cut it).
        replica.durable = len(replica.log)
        replica.announce(c.leader_epoch)
        replica.needs_truncation = False
        self.catch_up[(broker, c.leader_epoch)] = {
            b: CatchUp(self.now_ms, previous_fetch_ms=self.now_ms) for b in BROKERS if b != broker
        }
        self.term_starts[(broker, c.leader_epoch)] = len(replica.log)
        self.reported_starts[(broker, c.leader_epoch)] = {}
        note(f"broker {broker} leads epoch {c.leader_epoch}, ISR {sorted(c.isr)}")

    def _live(self) -> frozenset[int]:
        return frozenset(b for b in BROKERS if self.replicas[b].alive)

    def _apply(self, state: LeaderAndIsr | None, *, skip: int | None = None) -> None:
        """Store the controller's decision and send LeaderAndIsr to the replicas
        (``skip``: a zombie that does not hear it)."""
        if state is None:
            return
        c = self.controller
        assert state.leader_epoch > c.leader_epoch, "the controller reused a leader epoch"
        assert state.leader == NO_LEADER or state.leader in state.isr, "leader outside the ISR"
        if state.leader != NO_LEADER and state.leader not in c.isr:
            # Only when no ISR member is alive to the controller (a zombie is lost to it).
            alive_isr = [b for b in c.isr if self.replicas[b].alive and b != skip]
            assert not alive_isr, f"unclean election with {alive_isr} alive in the ISR"
            self._unclean_election(state.leader)
        c.store(state)
        note(f"controller: epoch {c.leader_epoch}, leader {c.leader}, ISR {sorted(c.isr)}")
        if c.leader is not None:
            self._start_term(c.leader)
        for broker in BROKERS:
            if broker != c.leader and broker != skip and self.replicas[broker].alive:
                if self.replicas[broker].leading is not None:
                    self._fail_acks(lambda ack, b=broker: ack.broker == b)
                self._follow(broker)

    def _unclean_election(self, leader: int) -> None:
        """Sentence 13: ``leader`` was out of sync. What it lacks is lost (Kafka's trade):
        the acknowledged and consumed records it does not hold at their offsets leave the
        checks, and the HW shown may go back to its own; nothing else is relaxed."""
        assert self.unclean, f"broker {leader} elected from outside the ISR"
        log = self.replicas[leader].log

        def held(offset: int, record: Record) -> bool:
            return offset < len(log) and log[offset] == record

        self.acked = {o: r for o, r in self.acked.items() if held(o, r)}
        self.consumed = {o: (r, t) for o, (r, t) in self.consumed.items() if held(o, r)}
        self.visible_hw = min(self.visible_hw, self.replicas[leader].high_watermark)
        # The others (down, or a zombie) may hold below their HW what it lacks: sentence
        # 2 holds for them again once they have truncated against it.
        for broker, replica in self.replicas.items():
            if broker != leader:
                replica.needs_truncation = True
        self.unclean_elections += 1
        note(f"unclean election of broker {leader}")
        event("an unclean election")

    def _follow(self, broker: int) -> None:
        replica = self.replicas[broker]
        replica.leading = None
        replica.needs_truncation = True
        c = self.controller
        if c.leader is not None:
            self.following[broker] = (c.leader, c.leader_epoch)
        else:
            self.following.pop(broker, None)

    def _fail_acks(self, which: object) -> None:
        self.pending = [ack for ack in self.pending if not which(ack)]  # type: ignore[operator]

    def _leader(self) -> Replica | None:
        c = self.controller
        if c.leader is None or not self.replicas[c.leader].alive:
            return None
        return self.replicas[c.leader]

    def _complete_acks(self) -> None:
        still = []
        for ack in self.pending:
            term = self.replicas[ack.broker].leading
            if term is None:
                continue  # that broker stopped leading: the producer gets an error
            state = term.ack_state(ack.offset)
            if state is AckState.WAITING:
                still.append(ack)
            elif state is AckState.DONE:
                # Issue 31: acks=all is answered only with min.insync.replicas in the ISR.
                assert len(term.isr) >= MIN_INSYNC, f"acked with ISR {sorted(term.isr)}"
                note(f"acked offset {ack.offset} {ack.record}")
                event("a write was acknowledged")
                self.acked[ack.offset] = ack.record
        self.pending = still

    def _show_hw(self) -> None:
        """What a consumer of the current leader sees. A zombie may still show an older
        HW (a stale read, as in Kafka) until it learns it was deposed."""
        leader = self._leader()
        if leader is None or leader.leading is None:
            return
        shown = leader.leading.visible_high_watermark()
        if shown is not None:
            assert shown >= self.visible_hw, (
                f"broker {leader.broker_id} shows HW {shown} after {self.visible_hw}"
            )
            self.visible_hw = shown

    # -- rules ---------------------------------------------------------------------

    @rule(to_zombie=st.booleans())
    def produce(self, to_zombie: bool) -> None:
        """A producer sends one acks=all record to a broker that believes it leads."""
        leaders = [r for r in self.replicas.values() if r.alive and r.leading is not None]
        is_current = [r.broker_id == self.controller.leader for r in leaders]
        leaders = [
            r for r, current in zip(leaders, is_current, strict=True) if current != to_zombie
        ]
        if not leaders:
            return
        replica = leaders[0]
        term = replica.leading
        assert term is not None
        accepted = term.can_accept_acks_all()
        # Issue 31: an acks=all write is refused (and not appended) iff the ISR the leader
        # knows is smaller than min.insync.replicas.
        assert accepted == (len(term.isr) >= MIN_INSYNC), (sorted(term.isr), accepted)
        if not accepted:
            note(f"broker {replica.broker_id}: NOT_ENOUGH_REPLICAS")
            event("NOT_ENOUGH_REPLICAS")
            return
        self.counter += 1
        record = Record(term.leader_epoch, f"v{self.counter}")
        offset = len(replica.log)
        replica.append(record)
        term.leader_appended(len(replica.log))
        self.writers.setdefault(term.leader_epoch, set()).add(replica.broker_id)
        self.pending.append(PendingAck(offset, record, replica.broker_id))
        note(f"broker {replica.broker_id} appends {record} at {offset}")

    @rule()
    def leader_syncs(self) -> None:
        for replica in self.replicas.values():
            if replica.alive and replica.leading is not None:
                replica.durable = len(replica.log)
                replica.leading.leader_synced(replica.durable)
                self.every_isr_member_counted_holds_the_log_below_the_hw()
                replica.high_watermark = replica.leading.high_watermark
        self._complete_acks()

    @rule(broker=st.sampled_from(BROKERS), max_records=st.integers(1, 3))
    def follower_sends_fetch(self, broker: int, max_records: int) -> None:
        """The leader handles a follower's fetch request; the answer is on its way."""
        follower, leader = self.replicas[broker], self._leader()
        if leader is None or leader is follower or not follower.alive:
            return
        if follower.needs_truncation or follower.leading is not None:
            return  # a zombie believes it leads: it does not fetch
        if broker in self.in_flight:
            return  # one fetch at a time per fetcher
        term = leader.leading
        assert term is not None
        if sync_before_fetch(True, follower.durable, len(follower.log)):
            follower.durable = len(follower.log)
        fetch_offset = len(follower.log)
        if fetch_offset < leader.log_start:
            # Below what the leader keeps: OFFSET_OUT_OF_RANGE, nothing counted.
            self.in_flight[broker] = FetchAnswer(
                sent=FetchPosition(leader.broker_id, term.leader_epoch, fetch_offset),
                records=(),
                high_watermark=term.high_watermark,
                error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                log_start=leader.log_start,
            )
            return
        self.catch_up[(leader.broker_id, term.leader_epoch)][broker].fetched(
            fetch_offset, len(leader.log), self.now_ms
        )
        joining = broker not in term.maximal_isr
        _, proposal = term.follower_fetched(broker, fetch_offset, self.now_ms)
        # Its log start goes with the fetch (as record_follower_fetch tells the term).
        term.follower_log_start(broker, follower.log_start)
        self.reported_starts[(leader.broker_id, term.leader_epoch)][broker] = follower.log_start
        if joining and proposal is not None and broker in proposal.isr:
            # KAFKA-7128: a follower joins only once it holds everything before the
            # leader's epoch began; below that, the HW (which may lag a new leader's log
            # end) could count records of an older epoch it never copied.
            epoch_start = self.term_starts[(leader.broker_id, term.leader_epoch)]
            assert fetch_offset >= epoch_start, (
                f"broker {broker} joins the ISR at {fetch_offset}, before the epoch's "
                f"start {epoch_start}"
            )
            event("a follower joined the ISR")
        leader.high_watermark = term.high_watermark
        # The sentence holds at every instant, also before the answer reaches the follower.
        self.every_isr_member_counted_holds_the_log_below_the_hw()
        self.in_flight[broker] = FetchAnswer(
            sent=FetchPosition(leader.broker_id, term.leader_epoch, fetch_offset),
            records=tuple(leader.log[fetch_offset : fetch_offset + max_records]),
            high_watermark=term.high_watermark,
            log_start=leader.log_start,
        )
        if proposal is not None:
            note(f"broker {leader.broker_id} proposes ISR {sorted(proposal.isr)}")
        self._complete_acks()

    @rule(broker=st.sampled_from(BROKERS), lost=st.booleans())
    def fetch_answer_arrives(self, broker: int, lost: bool) -> None:
        """The answer reaches the follower (or the network loses it). The follower takes
        it only if it still fetches from that leader epoch at that offset, as Kafka's
        fetcher drops answers for a partition whose fetch state changed."""
        answer = self.in_flight.pop(broker, None)
        follower = self.replicas[broker]
        if answer is None or lost:
            return
        now = None
        fetching_from = self.following.get(broker)
        if (
            follower.alive
            and follower.leading is None
            and not follower.needs_truncation
            and fetching_from is not None
        ):
            now = FetchPosition(*fetching_from, len(follower.log))
        # Sentence 10, both ways: an answer is taken exactly when the follower still fetches
        # from the leader and epoch it asked, at the offset it asked (Kafka's fetcher drops
        # it when the partition's fetch state changed, and only then).
        still_asked = now is not None and (now.leader, now.leader_epoch, now.fetch_offset) == (
            answer.sent.leader,
            answer.sent.leader_epoch,
            answer.sent.fetch_offset,
        )
        if not answer_applies(answer.sent, now):
            assert not still_asked, (
                f"broker {broker} dropped the answer to its current fetch {answer.sent}"
            )
            event("a stale fetch answer was dropped")
            return
        assert still_asked, f"broker {broker} took an answer to {answer.sent}, fetching at {now}"
        action = answer_action(answer.error_code)
        start_before = follower.log_start
        if action is AnswerAction.RESET:
            # The fetcher asks where the leader's log starts now (ListOffsets).
            leader = self._leader()
            leader_start = answer.log_start if leader is None else leader.log_start
            reset = out_of_range_reset(len(follower.log), leader_start)
            if reset.kind is ResetKind.TRUNCATE or leader is None:
                follower.needs_truncation = True
            else:
                self._start_at(follower, leader, reset.offset)
        if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # Below the leader's log start: it agrees with the leader again, or starts over.
            assert follower.needs_truncation or follower.log_start != start_before, (
                f"broker {broker} kept fetching at {answer.sent.fetch_offset} after "
                "OFFSET_OUT_OF_RANGE"
            )
        if action is not AnswerAction.APPEND:
            # An answer to the current fetch without an error is appended: else nothing
            # would ever replicate, which no safety invariant notices.
            assert answer.error_code != ErrorCode.NONE, (
                f"broker {broker} did not append the answer to its fetch at "
                f"{answer.sent.fetch_offset}"
            )
            return
        for record in answer.records:
            follower.append(record)  # in page cache: synced before the next fetch
        follower.high_watermark = high_watermark_after_fetch(
            follower.high_watermark, answer.high_watermark, len(follower.log)
        )
        start = follower_log_start(follower.log_start, answer.log_start, follower.high_watermark)
        if start is not None:
            follower.log_start = start  # DeleteRecords here: on disk at once
            event("a follower's log start followed its leader's")

    def _start_at(self, follower: Replica, leader: Replica, offset: int) -> None:
        """A follower whose log ends below the leader's log start is emptied and starts
        there (``truncate_fully_and_start_at``). The model keeps the leader's records
        below the new start in its list (unreadable, as deleted ones), so that the
        checks below the HW compare like with like."""
        follower.log, follower.announced = [], {}
        follower.cache = LeaderEpochCache()
        for record in leader.log[:offset]:
            follower.append(record)
        follower.durable = follower.high_watermark = follower.log_start = offset
        note(f"broker {follower.broker_id} emptied, starts at {offset}")
        event("a follower below the leader's log start started over")

    def follower_fetches(self, broker: int, max_records: int) -> None:
        """A fetch and its answer back to back (a quiet network)."""
        self.follower_sends_fetch(broker, max_records)
        self.fetch_answer_arrives(broker, lost=False)

    @rule(broker=st.sampled_from(BROKERS))
    def follower_truncates(self, broker: int) -> None:
        follower, leader = self.replicas[broker], self._leader()
        if leader is None or leader is follower or not follower.alive:
            return
        if not follower.needs_truncation or follower.leading is not None:
            return
        before = list(follower.log)
        epoch = follower.cache.latest_epoch
        # KIP-101/279: the HW is the fallback only when there is no epoch to agree on (the
        # follower has none, or the leader knows no end for the one asked).
        fell_back_to_hw = epoch == UNDEFINED_EPOCH
        for _round in range(len(BROKERS) * 10):
            answer = leader.cache.end_offset_for(epoch, len(leader.log))
            if epoch != UNDEFINED_EPOCH and answer[1] == UNDEFINED_OFFSET:
                fell_back_to_hw = True
            step = plan_truncation(
                follower.cache, len(follower.log), follower.high_watermark, *answer
            )
            # Sentence 5; after an unclean election a follower's HW may count records the
            # leader lacks, and only those may go (sentence 13).
            floor = follower.high_watermark
            if self.unclean_elections:
                floor = min(floor, common_prefix(before, leader.log))
            assert step.truncate_to >= floor, (
                f"broker {broker} would cut below its HW: {step} HW {follower.high_watermark}"
            )
            follower.truncate(step.truncate_to)
            if step.done:
                break
            epoch = step.next_epoch
        else:
            raise AssertionError("truncation did not converge")
        assert follower.log == leader.log[: len(follower.log)], "not a prefix of the leader's"
        assert len(follower.log) <= common_prefix(before, leader.log)
        # Agreeing on epochs cuts exactly the divergent tail: what the follower shares with
        # the leader stays (cutting it to the HW instead is KIP-101's data loss, when this
        # follower leads next before fetching it back).
        assert fell_back_to_hw or len(follower.log) == common_prefix(before, leader.log), (
            f"broker {broker} truncated {len(before)} -> {len(follower.log)}, below what it "
            f"shares with the leader ({common_prefix(before, leader.log)} records)"
        )
        follower.needs_truncation = False
        note(f"broker {broker} truncated {len(before)} -> {len(follower.log)}")
        if len(follower.log) < len(before):
            event("a follower cut a divergent tail")

    @rule()
    def replication_round(self) -> None:
        """A quiet moment: every follower catches up and the leader syncs (makes progress
        likely among the faults)."""
        for broker in BROKERS:
            self.follower_truncates(broker)
            self.follower_fetches(broker, max_records=100)
            self.follower_fetches(broker, max_records=100)
        self.leader_syncs()

    @rule(broker=st.sampled_from(BROKERS))
    def follower_power_cut_back_within_session(self, broker: int) -> None:
        """A follower loses power and is back before ZooKeeper expires its session: to
        the controller and its leader it never left (still in the ISR), but its log
        is cut to what it synced, and it truncates against its leader again."""
        replica = self.replicas[broker]
        if not replica.alive or replica.leading is not None or broker == self.controller.leader:
            return
        self.in_flight.pop(broker, None)
        replica.truncate(replica.durable)
        replica.needs_truncation = True
        note(f"broker {broker} loses power and is back within its session")

    @rule()
    def consumer_fetches(self) -> None:
        """A consumer reads the log of the broker that leads, up to the fetch handler's
        bound for consumers."""
        leader = self._leader()
        if leader is None or leader.leading is None:
            return
        shown = leader.leading.visible_high_watermark()
        if shown is None:
            return
        end = readable_end(Isolation.HIGH_WATERMARK, len(leader.log), shown, shown)
        for offset in range(min(end, len(leader.log))):
            self.consumed.setdefault(offset, (leader.log[offset], shown))

    @rule(
        ms=st.integers(1, 3 * LAG_MAX_MS),
        at_lag=st.none() | st.sampled_from([-1, 0, 1]),
    )
    def time_passes(self, ms: int, at_lag: int | None = None) -> None:
        """``at_lag``: move the clock to where the first ISR follower has lagged exactly
        ``replica.lag.time.max.ms`` (or one ms either side) instead, so that sentence 12's
        boundary is met, not only passed."""
        if at_lag is not None:
            boundaries = [
                self.catch_up[(r.broker_id, r.leading.leader_epoch)][b].last_caught_up_ms
                + LAG_MAX_MS + at_lag
                for r in self.replicas.values()
                if r.alive and r.leading is not None
                for b in r.leading.isr
                if b != r.broker_id
            ]  # fmt: skip
            ahead = [t for t in boundaries if t > self.now_ms]
            if ahead:
                ms = min(ahead) - self.now_ms
                event("the clock meets a follower's lag boundary")
        self.now_ms += ms
        for replica in self.replicas.values():
            if replica.alive and replica.leading is not None:
                term = replica.leading
                quiet = term.pending is None
                proposal = term.check_lagging(self.now_ms)
                if quiet:  # sentence 12: exactly the lagging followers are proposed out
                    progress = self.catch_up[(replica.broker_id, term.leader_epoch)]
                    lagging = {
                        b for b in term.isr
                        if b != replica.broker_id and progress[b].lagging(self.now_ms, LAG_MAX_MS)
                    }  # fmt: skip
                    kept = term.isr if proposal is None else proposal.isr
                    assert kept == term.isr - lagging, (sorted(kept), sorted(lagging))
                if proposal is not None:
                    note(f"broker {replica.broker_id} proposes ISR {sorted(proposal.isr)}")

    @rule()
    def controller_stores_isr(self) -> None:
        """Each pending ISR change reaches ZooKeeper: stored only if its epoch is current."""
        c = self.controller
        for replica in self.replicas.values():
            term = replica.leading
            if not replica.alive or term is None or term.pending is None:
                continue
            proposal = term.pending
            if replica.broker_id == c.leader and proposal.leader_epoch == c.leader_epoch:
                c.isr = proposal.isr
                term.isr_stored(proposal)
                replica.high_watermark = term.high_watermark
                note(f"stored ISR {sorted(c.isr)}")
            else:  # a zombie: the conditional update fails and it steps down
                term.isr_refused()
                note(f"broker {replica.broker_id}: ISR update refused, it follows now")
                event("a zombie leader stepped down")
                self._fail_acks(lambda ack, b=replica.broker_id: ack.broker == b)
                self._follow(replica.broker_id)
        self._complete_acks()

    @rule(broker=st.sampled_from(BROKERS), power_cut=st.booleans())
    def crash(self, broker: int, power_cut: bool) -> None:
        replica = self.replicas[broker]
        if not replica.alive:
            return
        replica.alive = False
        replica.leading = None
        self.in_flight.pop(broker, None)  # its connections are gone
        self._fail_acks(lambda ack: ack.broker == broker)
        if power_cut:
            # The log start is on disk: what is lost below it was deleted anyway, and the
            # log ends at least there (Kafka empties a log whose end falls below it).
            replica.truncate(max(replica.durable, replica.log_start))
            replica.durable = len(replica.log)
        note(f"broker {broker} {'loses power' if power_cut else 'is killed'}")
        c = self.controller
        self._apply(
            after_broker_loss(c.as_rules(), BROKERS, broker, self._live(), unclean=self.unclean)
        )
        # Sentence 9: the controller takes a lost broker out of the ISR at once (unless
        # it is the last member), so that acks=all do not wait for it.
        assert broker not in c.isr or c.isr == {broker}, f"lost broker {broker} in ISR {c.isr}"

    @rule(broker=st.sampled_from(BROKERS))
    def restart(self, broker: int) -> None:
        replica = self.replicas[broker]
        if replica.alive:
            return
        replica.alive = True
        note(f"broker {broker} restarts")
        c = self.controller
        state = after_broker_return(c.as_rules(), BROKERS, broker, self._live())
        if state is None and self.unclean and c.leader is None:
            # Kafka's offline-partition election runs on a broker's return too; the
            # unclean choice is requested_election's (any live replica, ISR first).
            elected = requested_election(c.as_rules(), BROKERS, self._live(), ElectionType.UNCLEAN)
            state = elected if isinstance(elected, LeaderAndIsr) else None
        if state is None:
            self._follow(broker)
        else:
            self._apply(state)

    @rule(fraction=st.floats(0, 1), to_zombie=st.booleans())
    def delete_records(self, fraction: float, to_zombie: bool) -> None:
        """DeleteRecords on a broker that believes it leads: up to its term's HW at most
        (handlers/delete_records.py answers OFFSET_OUT_OF_RANGE above it)."""
        leaders = [r for r in self.replicas.values() if r.alive and r.leading is not None]
        leaders.sort(key=lambda r: (r.broker_id == self.controller.leader) == to_zombie)
        if not leaders:
            return
        replica = leaders[0]
        assert replica.leading is not None
        bound = replica.leading.high_watermark
        if bound <= replica.log_start:
            return
        replica.log_start += round(fraction * (bound - replica.log_start))
        note(f"broker {replica.broker_id}: DeleteRecords, log start {replica.log_start}")
        event("DeleteRecords moved a log start")

    @rule(broker=st.sampled_from(BROKERS), keep=st.integers(0, 6))
    def retention(self, broker: int, keep: int) -> None:
        """A retention pass (``storage.segment.segments_to_delete``, as the broker's
        retention loop calls it with the replica's own HW): two-record segments of one
        byte a record, retention.bytes ``keep``."""
        replica = self.replicas[broker]
        if not replica.alive or len(replica.log) <= RETENTION_SEGMENT:
            return
        ends = list(range(RETENTION_SEGMENT, len(replica.log), RETENTION_SEGMENT))
        ends.append(len(replica.log))
        sizes = [end - start for start, end in zip([0, *ends], ends, strict=False)]
        count = segments_to_delete(
            sizes, ends, [0] * len(ends), log_start_offset=replica.log_start,
            now_ms=self.now_ms, retention_ms=None, retention_bytes=keep,
            high_watermark=replica.high_watermark,
        )  # fmt: skip
        if count and ends[count - 1] > replica.log_start:
            replica.log_start = ends[count - 1]
            note(f"broker {broker}: retention, log start {replica.log_start}")

    @rule()
    def preferred_leader_election(self) -> None:
        """Leadership goes back to the preferred replica if it is alive and in sync."""
        c = self.controller
        self._apply(preferred_leader_move(c.as_rules(), BROKERS, self._live()))

    @precondition(lambda self: self.controller.leader is not None)
    @rule()
    def leader_cut_off_from_zookeeper(self) -> None:
        """The leader's session expires; it keeps serving as a zombie until it learns."""
        c = self.controller
        old = c.leader
        assert old is not None
        # To the controller this is the loss of ``old``.
        state = after_broker_loss(
            c.as_rules(), BROKERS, old, self._live() - {old}, unclean=self.unclean
        )
        if state is None or state.leader == NO_LEADER:
            return  # no one else could lead: not the case this rule is for
        note(f"broker {old} is cut off from the coordination service")
        self._apply(state, skip=old)  # it still believes it leads

    @rule()
    def zombie_notices_its_session_expired(self) -> None:
        for replica in self.replicas.values():
            if replica.leading is not None and replica.broker_id != self.controller.leader:
                note(f"broker {replica.broker_id} learns its session expired and follows")
                self._fail_acks(lambda ack, b=replica.broker_id: ack.broker == b)
                self._follow(replica.broker_id)

    # -- shapes built by design (issue 31: what random steps rarely reach) ----------

    def _settled(self) -> bool:
        """Catch everyone up and store the ISR changes; True if then every broker is
        alive, in the ISR, following the one leader, with no answer in flight."""
        c = self.controller
        if c.leader is None or not all(r.alive for r in self.replicas.values()):
            return False
        self.zombie_notices_its_session_expired()
        self.replication_round()
        self.controller_stores_isr()
        self.replication_round()
        return (
            c.isr == frozenset(BROKERS)
            and not self.in_flight
            and all(
                r.leading is None and not r.needs_truncation
                for b, r in self.replicas.items()
                if b != c.leader
            )
        )

    @rule(broker=st.sampled_from(BROKERS))
    def follower_one_fetch_behind(self, broker: int) -> None:
        """A follower reaches the leader's end as of its previous fetch, never the current
        one (a write arrived in between): it counts as caught up at that previous fetch,
        so it leaves the ISR once that is replica.lag.time.max.ms ago (sentence 12)."""
        if not self._settled() or broker == self.controller.leader:
            return
        self.follower_fetches(broker, 3)  # caught up now
        self.produce(to_zombie=False)
        self.time_passes(LAG_MAX_MS * 6 // 10)
        self.follower_sends_fetch(broker, 3)  # at the previous end, not the current one
        self.fetch_answer_arrives(broker, lost=True)
        event("a follower one fetch behind")
        self.time_passes(LAG_MAX_MS * 6 // 10)

    def _cut_off_and_notice(self) -> None:
        self.leader_cut_off_from_zookeeper()
        self.zombie_notices_its_session_expired()

    @rule(writes=st.integers(1, 2))
    def quick_leader_changes(self, writes: int) -> None:
        """KIP-279's shape: three leader changes with writes in two epochs, followers
        left untruncated in between, so that a follower's divergent tail holds an epoch
        the new leader never had and the leader answers with an older one (truncation
        needs a second round). Leader X begins a fresh epoch; X writes, only L fetches;
        X is cut off, Y (first in the election order) leads and writes at the same
        offsets; Y is cut off, L leads; Y truncates against L."""
        if not self._settled():
            return
        self._cut_off_and_notice()  # X leads a fresh epoch: nothing written in it yet
        if not self._settled():
            return
        x = self.controller.leader
        assert x is not None
        y, last = (b for b in BROKERS if b != x)  # y is elected first when x is lost
        for _ in range(writes):
            self.produce(to_zombie=False)
        self.follower_fetches(last, max_records=100)
        self._cut_off_and_notice()
        if self.controller.leader != y:
            return
        for _ in range(writes):
            self.produce(to_zombie=False)
        self._cut_off_and_notice()
        if self.controller.leader != last:
            return
        event("three quick leader changes")
        self.replication_round()  # y truncates (two rounds) and fetches from last

    def _one_follower_left_behind(self, writes: int) -> int | None:
        """A follower stops fetching until the leader drops it from the ISR; the leader
        then takes ``writes`` writes that the other follower copies and the leader syncs.
        The follower left behind, or None if it stayed in the ISR."""
        c = self.controller
        lagging = BROKERS[-1] if c.leader != BROKERS[-1] else BROKERS[0]
        other = next(b for b in BROKERS if b not in (c.leader, lagging))
        for _ in range(2):  # the other follower keeps up, ``lagging`` does not fetch
            self.time_passes(LAG_MAX_MS // 2 + 1)
            self.follower_fetches(other, max_records=100)
        self.controller_stores_isr()
        if lagging in c.isr:
            return None
        for _ in range(writes):
            self.produce(to_zombie=False)
        self.follower_fetches(other, max_records=100)
        self.follower_fetches(other, max_records=100)
        self.leader_syncs()
        return lagging

    @rule(within_session=st.booleans(), writes=st.integers(1, 2))
    def lagging_follower_loses_power(self, within_session: bool, writes: int) -> None:
        """A follower outside the ISR fetches records the HW already covers, takes that
        HW with them, and loses power before its next fetch syncs them: its HW must come
        back down with the cut (only outside the ISR can the HW pass what it synced)."""
        if not self._settled():
            return
        lagging = self._one_follower_left_behind(writes)
        if lagging is None:
            return
        self.follower_fetches(lagging, max_records=100)
        replica = self.replicas[lagging]
        if replica.high_watermark <= replica.durable:
            return
        event("a follower outside the ISR took an HW above what it synced")
        if within_session:
            self.follower_power_cut_back_within_session(lagging)
        else:
            self.crash(lagging, power_cut=True)

    @rule(writes=st.integers(1, 2))
    def answer_outlives_two_leader_changes(self, writes: int) -> None:
        """A fetch answer travels while its leader loses the partition, truncates and
        leads again (a later epoch, a shorter log): from the same broker, it is stale.
        The preferred replica leads and writes; follower F asks and its answer waits; the
        leader is cut off, Y leads and writes at the same offsets; the old leader
        truncates, rejoins the ISR, leads again by a preferred election, and F's answer
        arrives only after F truncated for that epoch."""
        if self.controller.leader != BROKERS[0] or not self._settled():
            return
        first = BROKERS[0]
        y, f = BROKERS[1], BROKERS[2]
        for _ in range(writes):
            self.produce(to_zombie=False)
        self.follower_sends_fetch(f, max_records=100)  # its answer holds the new writes
        if f not in self.in_flight or not self.in_flight[f].records:
            return
        self._cut_off_and_notice()
        if self.controller.leader != y:
            return
        for _ in range(writes):
            self.produce(to_zombie=False)
        self.follower_truncates(first)
        self.follower_fetches(first, max_records=100)
        self.controller_stores_isr()
        self.preferred_leader_election()
        if self.controller.leader != first:
            return
        event("a fetch answer outlived two leader changes")
        self.follower_truncates(f)
        self.fetch_answer_arrives(f, lost=False)
        self.replication_round()

    @precondition(lambda self: self.unclean)  # not drawn at all in a clean run
    @rule(writes=st.integers(1, 2), power_cut=st.booleans())
    def unclean_failover(self, writes: int, power_cut: bool) -> None:
        """Sentence 13 by design: a follower falls out of the ISR, the others take writes
        and die, it is elected uncleanly; they return and must converge to its log."""
        if not self._settled():
            return
        lagging = self._one_follower_left_behind(writes)
        if lagging is None:
            return
        self.consumer_fetches()
        in_sync = [b for b in BROKERS if b != lagging]
        for broker in in_sync:
            self.crash(broker, power_cut=power_cut)
        if self.controller.leader != lagging:
            return
        for broker in in_sync:
            self.restart(broker)
        if not (self._settled() or self._settled()):  # the ISR grows one member a store
            return
        leader = self.replicas[lagging]
        for broker, replica in self.replicas.items():
            assert replica.log == leader.log, f"broker {broker} did not converge"
        event("converged after an unclean election")

    # -- the sentences of spec/replication_model.py --------------------------------

    @invariant()
    def acked_writes_are_on_every_isr_member(self) -> None:
        logs = {b: self.replicas[b].log for b in self.controller.isr}
        problems = acked_writes_missing(self.acked, logs)
        assert not problems, problems

    @invariant()
    def every_isr_member_counted_holds_the_log_below_the_hw(self) -> None:
        for replica in self.replicas.values():
            term = replica.leading
            if replica.alive and term is not None:
                logs = {b: self.replicas[b].log for b in term.maximal_isr}
                problems = isr_members_short_of_hw(replica.log, term.high_watermark, logs)
                assert not problems, problems

    @invariant()
    def replicas_agree_below_their_high_watermarks(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        others = {
            b: (r.log, r.high_watermark)
            for b, r in self.replicas.items()
            if r is not leader and not r.needs_truncation
        }
        problems = disagreements_below_hw(leader.log, others)
        assert not problems, problems

    @invariant()
    def visible_high_watermark_never_goes_back(self) -> None:
        self._show_hw()

    @invariant()
    def every_high_watermark_is_within_its_log(self) -> None:
        """Issue 31: a replica's HW never counts records it does not hold; and its log
        start never passes its HW: what it deletes (DeleteRecords, retention, its
        leader's log start followed) is committed here."""
        for replica in self.replicas.values():
            assert replica.log_start <= replica.high_watermark <= len(replica.log), (
                f"broker {replica.broker_id}: log start {replica.log_start}, HW "
                f"{replica.high_watermark}, log end {len(replica.log)}"
            )

    @invariant()
    def no_high_watermark_goes_back_but_by_a_cut(self) -> None:
        """A replica's HW (a follower's too: it serves consumers and bounds its cleaner)
        never goes back, except where a truncation or power cut shortened its log."""
        for replica in self.replicas.values():
            assert replica.high_watermark >= replica.shown_high_watermark, (
                f"broker {replica.broker_id}: HW {replica.high_watermark} after "
                f"{replica.shown_high_watermark}"
            )
            replica.shown_high_watermark = replica.high_watermark

    @invariant()
    def consumed_records_stay(self) -> None:
        """Sentence 11: what a consumer was given is in the (current) leader's log."""
        leader = self._leader()
        if leader is not None:
            got = [(o, record, told) for o, (record, told) in self.consumed.items()]
            problems = consumed_records_missing(got, leader.log)
            assert not problems, problems

    @invariant()
    def low_watermark_counts_every_live_replica(self) -> None:
        """DeleteRecords' low watermark (Kafka's lowWatermarkIfLeader): the lowest log
        start over the leader and every follower on a live broker, in the ISR or not, as
        its last fetch in this term told (-1 before one); a dead broker's is left out."""
        live = self._live()
        for replica in self.replicas.values():
            term = replica.leading
            if not replica.alive or term is None:
                continue
            told = self.reported_starts.get((replica.broker_id, term.leader_epoch), {})
            followers = [told.get(b, -1) for b in BROKERS if b != replica.broker_id and b in live]
            expected = min([replica.log_start, *followers])
            got = term.low_watermark(replica.log_start, live)
            assert got == expected, (
                f"broker {replica.broker_id}: low watermark {got}, expected {expected} "
                f"(told {told}, live {sorted(live)}, ISR {sorted(term.isr)})"
            )

    @invariant()
    def one_writer_per_epoch(self) -> None:
        for epoch, brokers in self.writers.items():
            assert len(brokers) <= 1, f"epoch {epoch} written by {sorted(brokers)}"

    @invariant()
    def epoch_caches_answer_like_a_scan_of_the_log(self) -> None:
        for replica in self.replicas.values():
            epochs = [record.epoch for record in replica.log]
            top = self.controller.leader_epoch + 1
            for requested in range(-1, top + 1):
                expected = epoch_end_offset(epochs, replica.announced, requested)
                got = replica.cache.end_offset_for(requested, len(replica.log))
                assert got == expected, (replica.broker_id, requested, got, expected)


# Cheap steps (no I/O): many more examples than the profile's default, and more
# under HYPOTHESIS_PROFILE=thorough. The profile's deadline (and the run's seed) carry over.
#: pytest-timeout's guard against a hang (the machine is pure: nothing in it waits),
#: not a budget: 1000 examples take 20 s of CPU, and 244-264 s of wall time beside a CPU
#: hog on the loaded machine, near the 300 s default that stopped it in the eleventh
#: round's scoring run (364 s), which counted that stop as a catch.
pytestmark = pytest.mark.timeout(1200)
# tools/mutation.sh sets MUTATION_EXAMPLES to run fewer examples per mutant.
ReplicationMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MUTATION_EXAMPLES", "0"))
    or max(1000, settings().max_examples),
    stateful_step_count=50,
)
TestReplication = ReplicationMachine.TestCase
