"""Executable specification of a single-node broker, as seen by a client over the wire.

The whole broker in rules a reader can hold next to Kafka's documentation. Each rule
names the Kafka behaviour it models; finer rules live in the per-concern models and
are imported, not restated:

* ``spec.producer_model`` - the idempotent-producer sentences (epoch, 5-batch window),
* ``spec.storage_model.read`` - which whole batches a fetch returns (KIP-74),
* ``spec.group_model`` sentence 13 - when an offset commit is accepted.

Topics
 T1. CreateTopics creates a topic with ``num_partitions`` empty partitions and the
     config overrides given (DescribeConfigs shows them as DYNAMIC_TOPIC_CONFIG); a name
     in use is TOPIC_ALREADY_EXISTS (36); fewer than one partition is INVALID_PARTITIONS
     (37). (Kafka ``AdminManager.createTopics``.)
 T2. A request for a topic or partition that does not exist is answered per partition
     with UNKNOWN_TOPIC_OR_PARTITION (3), and changes nothing.
 T3. CreatePartitions grows a topic to ``count`` partitions: the old ones keep their
     logs, the new ones start empty at offset 0. An unknown topic is
     UNKNOWN_TOPIC_OR_PARTITION (3); a count that is not larger is INVALID_PARTITIONS
     (37); either changes nothing. (Kafka ``ReplicationControlManager.createPartitions``.)
     The count is durable like the topic itself (L7).

Partition log
 L1. A partition's log is a sequence of batches with contiguous offsets starting at the
     log start offset (0 here: nothing deletes records in this model).
 L2. An accepted batch of n records gets base offset = the log end offset, which then
     grows by n. On one node every in-sync replica is the leader, so the high watermark
     equals the log end offset once the append returns (Kafka ``Partition.appendRecordsToLeader``
     with ISR = {leader}); the Produce answer carries the base offset.
 L3. Fetch at offset o: OFFSET_OUT_OF_RANGE (1) unless log start <= o <= high watermark;
     else the whole batches chosen by ``storage_model.read`` (a batch that starts before
     o is returned whole, as Kafka does, and the client skips the early records), with
     the high watermark and log start offset. Compressed batches come back as written.
 L4. ListOffsets: timestamp -1 (LATEST) answers the high watermark, -2 (EARLIEST) the log
     start offset (Kafka ``ListOffsetsRequest.LATEST_TIMESTAMP`` / ``EARLIEST_TIMESTAMP``).
 L5. Durability: after a clean shutdown every accepted batch survives, and is durable
     from then on (a clean shutdown flushes every log). After a crash (kill -9) the log
     is a prefix of what was accepted that contains at least every batch acknowledged
     with acks=-1 (all) and everything already durable; batches acknowledged with
     acks=1 may be lost, but only from the tail (the "recover" rule of
     ``storage_model``).
 L6. acks=0: no response at all; the append is visible to the next request on the same
     connection (requests of one connection are handled in order). Kafka closes the
     connection when an acks=0 produce fails, so the client refreshes its metadata
     (``KafkaApis.handleProduceRequest``); trio-broker does the same. The machine sends
     acks=0 only to partitions that exist, so the model need not cover the close.
 L7. Power cut (only what was fsynced survives, ``tests/faultfs``): the same bounds as a
     crash (L5) for each partition's log, ending at a batch boundary; the batches that
     remain are the accepted ones, byte for byte. What a cut leaves is durable from
     then on. A request in flight at the cut (never answered) may or may not have taken
     effect: a batch appended whole at the log end, a topic created with its configs,
     an offset committed; the model adopts what the broker shows. Everything else the
     broker answered survives: topics and their configs (T1), committed offsets (C3),
     the cluster id.

Idempotent producers
 P1. InitProducerId without a transactional id hands out a producer id never handed out
     before by this broker (across restarts: ids come from persisted blocks), epoch 0.
 P2. Every Produce of a batch with a producer id is judged by ``producer_model.verdict``:
     append, duplicate (answered with the original batch's base offset, no error,
     nothing appended), or refused with its error (nothing appended).
 P3. Producer state survives a clean restart (snapshot + log replay), so duplicates
     are still recognised afterwards.

Committed offsets
 C1. OffsetCommit with generation -1 from a simple consumer (a group with no members)
     stores (offset, metadata) per existing partition (``group_model`` sentence 13);
     partitions that do not exist get UNKNOWN_TOPIC_OR_PARTITION.
 C2. OffsetFetch answers the last stored offset, or -1 for a partition never committed.
 C3. Committed offsets are durable: they survive a clean restart and a crash once the
     commit was answered (Kafka writes them to ``__consumer_offsets`` with acks=all).

Consumer groups (this node coordinates every group)
 G1. JoinGroup, SyncGroup, Heartbeat, LeaveGroup and a member's OffsetCommit are judged
     by ``group_model.GroupModel`` (sentences 1-13), one per group id the coordinator
     knows. The model's clock stands still: every timeout used is far longer than a test.
 G2. A group id the coordinator does not know answers UNKNOWN_MEMBER_ID to a JoinGroup
     with a member id, a SyncGroup, a Heartbeat and a LeaveGroup, and ILLEGAL_GENERATION
     to an OffsetCommit with a generation >= 0 (Kafka's ``GroupCoordinator`` does the
     same); a JoinGroup without a member id or a commit with generation -1 creates it
     (Empty).
 G3. An OffsetCommit answers a partition's error first (T2), then the group's (G1, G2);
     only a commit with neither stores the offset.
 G4. Group membership is durable as Kafka's: a generation is stored when the leader's
     SyncGroup brings its assignment, and the group is Stable (the SyncGroups answered)
     once that write counts -- here it always does (sentences 8, 8a); a group is stored
     without members when it becomes Empty (a LeaveGroup that empties it is answered
     once stored). After a restart or a crash the coordinator knows the stored groups,
     each as ``GroupModel.restore`` (sentence 14) makes its last stored state, and the
     other groups with committed offsets, Empty at generation 0. Offsets stay (C3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from spec.group_model import GroupModel
from spec.producer_model import Appended, ModelPartition
from spec.storage_model import read
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.group import JoinResult, SyncResult

LATEST = -1
EARLIEST = -2
#: G1: the group model's clock. Sessions and rebalance timeouts are minutes long and the
#: initial rebalance delay is 0, so nothing but a join phase's end is ever due.
GROUP_NOW = 0


@dataclass(frozen=True)
class Batch:
    """An accepted batch as the model remembers it."""

    base_offset: int
    values: tuple[bytes, ...]
    size: int  # bytes on the wire, for the fetch size rule
    acks: int  # the acks it was acknowledged with (L5); 0 for a batch never answered (L7)

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.values) - 1


@dataclass
class PartitionModel:
    batches: list[Batch] = field(default_factory=list)
    producers: ModelPartition = field(default_factory=ModelPartition)
    log_start_offset: int = 0  # L1
    #: L5, L7: every offset below this survives any crash or power cut.
    durable_end: int = 0

    @property
    def high_watermark(self) -> int:  # L2: HW == log end offset on one node
        return self.batches[-1].last_offset + 1 if self.batches else self.log_start_offset


@dataclass(frozen=True)
class ProduceAnswer:
    error: ErrorCode
    base_offset: int


@dataclass(frozen=True)
class FetchAnswer:
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    batches: tuple[Batch, ...]


@dataclass
class BrokerModel:
    topics: dict[str, list[PartitionModel]] = field(default_factory=dict)
    #: T1: each topic's config overrides, as given at creation.
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], tuple[int, str | None]] = field(default_factory=dict)
    producer_ids: set[int] = field(default_factory=set)
    #: G1, G2: the groups the coordinator knows, by id.
    groups: dict[str, GroupModel] = field(default_factory=dict)
    #: G4: each group's last stored state (a copy), by id.
    stored_groups: dict[str, GroupModel] = field(default_factory=dict)

    # ------------------------------------------------------------------ topics

    def create_topic(
        self, name: str, partitions: int, configs: dict[str, str] | None = None
    ) -> ErrorCode:
        if name in self.topics:  # T1
            return ErrorCode.TOPIC_ALREADY_EXISTS
        if partitions < 1:
            return ErrorCode.INVALID_PARTITIONS
        self.topics[name] = [PartitionModel() for _ in range(partitions)]
        self.configs[name] = dict(configs or {})
        return ErrorCode.NONE

    def create_partitions(self, name: str, count: int) -> ErrorCode:
        parts = self.topics.get(name)
        if parts is None:  # T3
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if count <= len(parts):
            return ErrorCode.INVALID_PARTITIONS
        parts.extend(PartitionModel() for _ in range(count - len(parts)))
        return ErrorCode.NONE

    def partition(self, topic: str, index: int) -> PartitionModel | None:
        parts = self.topics.get(topic)
        if parts is None or not 0 <= index < len(parts):
            return None  # T2
        return parts[index]

    # ------------------------------------------------------------------ produce

    def produce(
        self,
        topic: str,
        index: int,
        values: tuple[bytes, ...],
        size: int,
        acks: int,
        producer: tuple[int, int, int] = (-1, -1, -1),
    ) -> ProduceAnswer:
        """One batch to one partition; ``producer`` is (producer id, epoch, base sequence)."""
        part = self.partition(topic, index)
        if part is None:
            return ProduceAnswer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)  # T2
        pid, epoch, first_seq = producer
        last_seq = first_seq + len(values) - 1 if pid != -1 else -1
        verdict, detail = part.producers.verdict(pid, epoch, first_seq, last_seq)  # P2
        if verdict == "reject":
            assert isinstance(detail, ErrorCode)
            return ProduceAnswer(detail, -1)
        if verdict == "duplicate":
            assert isinstance(detail, Appended)
            return ProduceAnswer(ErrorCode.NONE, detail.first_offset)
        batch = Batch(part.high_watermark, values, size, acks)  # L2
        part.batches.append(batch)
        part.producers.appended(
            pid, Appended(epoch, first_seq, last_seq, batch.base_offset, batch.last_offset)
        )
        return ProduceAnswer(ErrorCode.NONE, batch.base_offset)

    # ------------------------------------------------------------------ reads

    def fetch(self, topic: str, index: int, offset: int, max_bytes: int) -> FetchAnswer:
        part = self.partition(topic, index)
        if part is None:
            return FetchAnswer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, ())  # T2
        hw, start = part.high_watermark, part.log_start_offset
        if not start <= offset <= hw:  # L3
            return FetchAnswer(ErrorCode.OFFSET_OUT_OF_RANGE, hw, start, ())
        shape = [(b.base_offset, b.last_offset, b.size) for b in part.batches]
        chosen = read(shape, offset, max_bytes, hw, min_one=True)
        return FetchAnswer(ErrorCode.NONE, hw, start, tuple(part.batches[i] for i in chosen))

    def list_offset(self, topic: str, index: int, timestamp: int) -> tuple[ErrorCode, int]:
        part = self.partition(topic, index)
        if part is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1  # T2
        if timestamp == LATEST:  # L4
            return ErrorCode.NONE, part.high_watermark
        assert timestamp == EARLIEST, "the model answers only LATEST and EARLIEST"
        return ErrorCode.NONE, part.log_start_offset

    # ------------------------------------------------------------------ producer ids

    def producer_id_granted(self, producer_id: int, epoch: int) -> bool:
        """P1: a fresh id at epoch 0; returns whether the grant obeys the rule."""
        fresh = producer_id >= 0 and producer_id not in self.producer_ids and epoch == 0
        self.producer_ids.add(producer_id)
        return fresh

    # ------------------------------------------------------------------ offsets

    def commit(
        self,
        group: str,
        topic: str,
        index: int,
        offset: int,
        metadata: str | None,
        member_id: str = "",
        generation: int = -1,
    ) -> ErrorCode:
        """One partition of an OffsetCommit; generation -1 and no member: a simple consumer."""
        group_error = self._commit_allowed(group, member_id, generation)
        if self.partition(topic, index) is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # C1 / T2, G3
        if group_error != ErrorCode.NONE:
            return group_error  # G3
        self.committed[(group, topic, index)] = (offset, metadata)  # C1
        return ErrorCode.NONE

    def _commit_allowed(self, group: str, member_id: str, generation: int) -> ErrorCode:
        model = self.groups.get(group)
        if model is None:
            if generation >= 0:
                return ErrorCode.ILLEGAL_GENERATION  # G2
            model = self.groups[group] = new_group()
        return model.commit(member_id, None, generation, GROUP_NOW)  # G1: sentence 13

    def fetch_committed(self, group: str, topic: str, index: int) -> int:
        return self.committed.get((group, topic, index), (-1, None))[0]  # C2

    # ------------------------------------------------------------------ groups

    def join_group(
        self,
        group: str,
        member_id: str,
        new_id: str,
        protocols: tuple[tuple[str, bytes], ...],
        session_ms: int,
        rebalance_ms: int,
    ) -> JoinResult | None:
        """G1, G2: JoinGroup (v4+, no group instance id). ``new_id`` is the member id the
        broker chose, if it chose one (ids are random). None: the request stays parked."""
        model = self.groups.get(group)
        if model is None:
            if member_id:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)  # G2
            model = self.groups[group] = new_group()
        before = model.state
        waiter = object()
        result, replies = model.join(
            member_id, None, session_ms, rebalance_ms, "consumer", protocols, GROUP_NOW,
            new_id, waiter, client=("spec", "127.0.0.1"),
        )  # fmt: skip
        replies += model.advance(GROUP_NOW)  # the initial delay (0) ends the join phase
        self._remember(group, before)
        if result is None:
            result = next((r for w, r in replies if w is waiter), None)
        assert result is None or isinstance(result, JoinResult)
        return result

    def sync_group(
        self, group: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> SyncResult | None:
        """G1, G2: SyncGroup; None: the request stays parked."""
        model = self.groups.get(group)
        if model is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)  # G2
        waiter = object()
        before = model.state
        result, replies = model.sync(member_id, None, generation, assignments, GROUP_NOW, waiter)
        if model.writing is not None:  # G4: the write of the assignment counts
            replies += model.stored(generation, ErrorCode.NONE, GROUP_NOW)
        self._remember(group, before)
        if result is None:
            result = next((r for w, r in replies if w is waiter), None)
        assert result is None or isinstance(result, SyncResult)
        return result

    def heartbeat(self, group: str, member_id: str, generation: int) -> ErrorCode:
        model = self.groups.get(group)
        if model is None:
            return ErrorCode.UNKNOWN_MEMBER_ID  # G2
        return model.heartbeat(member_id, None, generation, GROUP_NOW)  # G1

    def leave_group(self, group: str, member_id: str) -> ErrorCode:
        model = self.groups.get(group)
        if model is None:
            return ErrorCode.UNKNOWN_MEMBER_ID  # G2
        before = model.state
        error, _replies = model.leave(member_id, None, GROUP_NOW)  # G1
        self._remember(group, before)
        return error

    def describe_group(self, group: str) -> tuple[str, list[tuple[str, bytes]]]:
        """The group's state name and (member id, assignment) in join order; Dead if unknown."""
        model = self.groups.get(group)
        if model is None:
            return "Dead", []
        return model.state, [(m.mid, m.assignment) for m in model.members.values()]

    # ------------------------------------------------------------------ lifecycle

    def _remember(self, group: str, before: str) -> None:
        """G4: store the group when a step made it Stable or Empty."""
        model = self.groups.get(group)
        if model is None or model.state == before:
            return
        if model.state == "Stable" or (model.state == "Empty" and before != "Empty"):
            self.stored_groups[group] = copy.deepcopy(model)

    def _forget_memberships(self) -> None:
        """G4: stored groups come back as stored; others with offsets are Empty."""
        with_offsets = {group for group, _topic, _index in self.committed}
        self.groups = {group: new_group() for group in sorted(with_offsets)}
        for group, stored in self.stored_groups.items():
            restored = self.groups[group] = copy.deepcopy(stored)
            restored.restore(GROUP_NOW)

    def restart_clean(self) -> None:
        """L5, P3, C3: a clean restart keeps everything a client stored, durably; G4: not
        groups."""
        self._forget_memberships()
        for parts in self.topics.values():
            for part in parts:
                part.durable_end = part.high_watermark

    def restarted_after_crash(self) -> None:
        """G4 after a kill -9 (the logs are handled per partition by :meth:`crashed`)."""
        self._forget_memberships()

    def crash_bounds(self, topic: str, index: int) -> tuple[int, int]:
        """L5, L7: the log end offsets a crash or a power cut may leave: (every acks=all
        batch and everything durable before, everything)."""
        part = self.topics[topic][index]
        acks_all = [b.last_offset + 1 for b in part.batches if b.acks == -1]
        return max([part.log_start_offset, part.durable_end, *acks_all]), part.high_watermark

    def crashed(self, topic: str, index: int, log_end_offset: int) -> None:
        """L5: the log after a crash is the prefix that ends at ``log_end_offset``.

        Producer state forgets the lost batches with them (Kafka rebuilds it from the
        recovered log), so their sequences may be written again.
        """
        part = self.topics[topic][index]
        low, high = self.crash_bounds(topic, index)
        assert low <= log_end_offset <= high
        part.batches = [b for b in part.batches if b.last_offset < log_end_offset]
        history = part.producers.history
        for pid in list(history):
            history[pid] = [a for a in history[pid] if a.last_offset < log_end_offset]
            if not history[pid]:
                del history[pid]

    def power_cut(self, topic: str, index: int, log_end_offset: int) -> None:
        """L7: the log after a power cut is the prefix that ends at ``log_end_offset`` (as
        after a crash), and all of it is durable now."""
        self.crashed(topic, index, log_end_offset)
        self.topics[topic][index].durable_end = log_end_offset


def new_group() -> GroupModel:
    """G1: the broker under test runs with group.initial.rebalance.delay.ms = 0."""
    return GroupModel(delay=0)
