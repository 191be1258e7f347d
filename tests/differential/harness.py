"""Differential harness: the same request sequence to Apache Kafka and to trio-broker.

A :class:`Session` holds one blocking raw connection (our own codec) to each broker and
runs :class:`Op` values against both, in the same order. Each op turns the two responses
into a *normalised* form -- plain tuples of error codes, offsets, high watermarks, log
start offsets and the records returned -- leaving out what legitimately differs between
two brokers: producer and topic ids (each broker's producer id is mapped to the logical
producer that asked for it), timestamps chosen by the broker, throttle times, error
messages. Two normalised answers that are not equal are a :class:`Difference`.

Record batches are built with ``trio_broker.protocol.records.build_batch`` with fixed
timestamps, so that ListOffsets by timestamp has one right answer on both brokers.

Idempotent producers are modelled once here (:class:`ProducerModel`): the next sequence
and the last batches sent, advanced by *Kafka's* answer -- Kafka is the reference; after a
difference the two brokers' states may have diverged and the caller should stop the
sequence (the test fails on the first one anyway).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.conftest import ConnectionClosed, RawConnection
from trio_broker.protocol import messages as m
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.records import build_batch, iter_batches

#: Versions both brokers speak (Kafka 4 dropped the oldest ones, KIP-896).
PRODUCE_V = 9
FETCH_V = 12  # the last version that names topics (13+ use topic ids)
LIST_OFFSETS_V = 7  # has MAX_TIMESTAMP (-3)
METADATA_V = 12
CREATE_TOPICS_V = 7
DELETE_TOPICS_V = 5
INIT_PRODUCER_ID_V = 4
FETCH_BY_ID_V = 13  # the first version that names topics by id
METADATA_BY_ID_V = 12  # topics named by id (name null): KIP-516
OFFSET_FOR_LEADER_EPOCH_V = 4
FIND_COORDINATOR_V = 4
JOIN_GROUP_V = 9
SYNC_GROUP_V = 5
HEARTBEAT_V = 4
LEAVE_GROUP_V = 5
OFFSET_COMMIT_V = 8
OFFSET_FETCH_V = 8
#: Group members' timeouts: a session outlives any sequence; a rebalance that waits for a
#: member that does not rejoin ends soon (and removes it), on both brokers alike.
SESSION_TIMEOUT_MS = 60_000
REBALANCE_TIMEOUT_MS = 500
#: How far from a group timer's deadline an op must be sent for the two brokers'
#: answers to be comparable (each one's clock starts when it completed the rebalance,
#: apart by their own latencies, which load stretches).
TIMER_MARGIN_S = 0.3
#: How long a high watermark read after an acks=0 produce must stay put to count as
#: settled (Produce.run): well above a group commit's fsync on a loaded machine.
SETTLE_S = 0.2
#: Where a record batch (v2) holds its last offset delta: base offset (8), length (4),
#: partition leader epoch (4), magic (1), CRC (4), attributes (2).
LAST_OFFSET_DELTA_AT = 23
#: A topic id neither broker gave out.
UNKNOWN_TOPIC_ID = uuid.UUID("6b1f9a0e-0000-4000-8000-00000000d1ff")
CODECS = {"none": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
          "lz4": Compression.LZ4, "zstd": Compression.ZSTD}  # fmt: skip

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
#: Batch timestamps: a fixed base plus the op's position, never "now".
BASE_TIMESTAMP = 1_700_000_000_000
WAIT_S = 15.0
#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR.
RETRIABLE_COORDINATOR = (14, 15, 16)
_SIZE = struct.Struct(">i")

Normalised = Any  # tuples/ints/strings: anything comparable with == and printable


@dataclass
class Difference:
    kind: str  # the op's kind, e.g. "produce-idempotent"
    op: str  # the op, printed
    kafka: Normalised
    trio: Normalised
    #: A group op sent within TIMER_MARGIN_S of a group timer's deadline (the sync
    #: timeout of the generation the last rebalance made): one broker may have fired it
    #: and the other not yet, so the answers say nothing about either (load decides).
    near_a_timer: bool = False

    def __str__(self) -> str:
        return f"{self.kind}: {self.op}\n  kafka: {self.kafka!r}\n  trio:  {self.trio!r}"


class Broker:
    """One side of the comparison: a name, a port and a reconnecting raw connection."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self._conn: RawConnection | None = None
        #: This broker's producer id per logical producer, and the reverse map.
        self.producer_ids: dict[int, tuple[int, int]] = {}
        self.logical_of: dict[int, int] = {}
        #: Group member ids per logical member, and the generation this broker last gave.
        self.member_ids: dict[int, str] = {}
        self.generation = -1
        #: Logical members of the last JoinGroup answer that made this broker's member leader.
        self.join_members: list[int] = []
        #: The group coordinator answered as loaded once (Session._wait_coordinator_loaded).
        self.coordinator_ready = False
        self.requests = 0

    @property
    def conn(self) -> RawConnection:
        if self._conn is None:
            self._conn = RawConnection(self.port)
        return self._conn

    def reset_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, api_key: int, version: int, body: Any) -> Any:
        self.requests += 1
        return self.conn.request(api_key, version, body)

    def close(self) -> None:
        self.reset_connection()


# --------------------------------------------------------------------------- ops


@dataclass(frozen=True)
class Op:
    """One step of a sequence; ``run`` returns the normalised answer of one broker."""

    kind: str = field(init=False, default="op")

    def prepare(self, session: Session) -> Any:
        """What both brokers must get alike (a batch, its sequence), made once per op."""
        return None

    def run(self, session: Session, broker: Broker) -> Normalised:
        raise NotImplementedError

    def after(self, session: Session, kafka_answer: Normalised) -> None:
        """Advance the session's model from Kafka's answer (the reference)."""

    def converge(
        self, session: Session, kafka_answer: Normalised, trio_answer: Normalised
    ) -> Normalised:
        """trio-broker's answer again, where the two may differ for a while only (timing,
        not semantics): by default the answer as it came."""
        return trio_answer


@dataclass(frozen=True)
class CreateTopic(Op):
    topic: str
    partitions: int
    kind: str = field(init=False, default="create-topics")

    def run(self, session: Session, broker: Broker) -> Normalised:
        C = m.CreateTopicsRequest.CreatableTopic
        body = m.CreateTopicsRequest(
            topics=[C(name=session.name(self.topic), num_partitions=self.partitions,
                      replication_factor=1, assignments=[], configs=[])],
            timeout_ms=10_000, validate_only=False,
        )  # fmt: skip
        (result,) = broker.request(m.ApiKey.CREATE_TOPICS, CREATE_TOPICS_V, body).topics
        if result.error_code == 0:
            session.wait_for_leaders(broker, session.name(self.topic), result.num_partitions)
        return ("error", result.error_code, "partitions", result.num_partitions)


@dataclass(frozen=True)
class DeleteTopic(Op):
    topic: str
    kind: str = field(init=False, default="delete-topics")

    def run(self, session: Session, broker: Broker) -> Normalised:
        name = session.name(self.topic)
        body = m.DeleteTopicsRequest(topic_names=[name], timeout_ms=10_000)
        (result,) = broker.request(m.ApiKey.DELETE_TOPICS, DELETE_TOPICS_V, body).responses
        if result.error_code == 0:
            session.wait_until_gone(broker, name)
        return ("error", result.error_code)

    def after(self, session: Session, kafka_answer: Normalised) -> None:
        session.forget_topic(self.topic)


@dataclass(frozen=True)
class Metadata(Op):
    topic: str
    kind: str = field(init=False, default="metadata")

    def run(self, session: Session, broker: Broker) -> Normalised:
        body = m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(name=session.name(self.topic))],
            allow_auto_topic_creation=True,  # off on both brokers: must not create it
        )
        (topic,) = broker.request(m.ApiKey.METADATA, METADATA_V, body).topics
        partitions = sorted((p.partition_index, p.error_code) for p in topic.partitions)
        return ("error", topic.error_code, "partitions", tuple(partitions))


@dataclass(frozen=True)
class Produce(Op):
    """A plain (non-idempotent) batch of ``records`` records, compressed with ``codec``.

    With acks=0 no answer comes; the normalised answer is then what a ListOffsets (LATEST)
    on the same connection finds after it, once it stops moving -- or that the broker
    closed the connection, which is how Kafka reports an acks=0 produce it refused.
    LATEST is the high watermark: Kafka's single node moves it at the append (its log
    end), trio-broker's at the append's fsync (a node alone's HW is its durable end,
    docs/reliability.md), which the group commit does moments later, so the first
    answer may still be below the record.
    """

    topic: str
    partition: int
    records: int
    acks: int
    kind: str = field(init=False, default="produce")
    codec: str = "none"

    def prepare(self, session: Session) -> bytes:
        return session.batch(self.records, CODECS[self.codec])

    def run(self, session: Session, broker: Broker) -> Normalised:
        batch = session.current_plan
        if self.acks == 0:
            session.produce(broker, self.topic, self.partition, 0, batch)
            name = session.name(self.topic)
            error, offset, _ = session.list_offset(broker, name, self.partition, LATEST)
            deadline = time.monotonic() + WAIT_S
            while error == 0 and time.monotonic() < deadline:
                time.sleep(SETTLE_S)  # poll step: the HW may move at the record's sync
                again = session.list_offset(broker, name, self.partition, LATEST)
                if again[:2] == (error, offset):
                    break
                error, offset, _ = again
            return ("acks=0 then latest", "error", error, "offset", offset)
        part = session.produce(broker, self.topic, self.partition, self.acks, batch)
        return ("error", part.error_code, "base_offset", part.base_offset,
                "log_start", part.log_start_offset)  # fmt: skip

    def converge(
        self, session: Session, kafka_answer: Normalised, trio_answer: Normalised
    ) -> Normalised:
        """After acks=0, trio-broker's LATEST may stay below Kafka's for longer than
        SETTLE_S on a loaded machine: its HW moves at the append's fsync. Read it again
        until it reaches Kafka's, with the harness's deadline: one that never does (a
        record lost), or passes it, is still a difference."""
        if self.acks != 0 or kafka_answer[:3] != trio_answer[:3] or kafka_answer[2] != 0:
            return trio_answer
        name = session.name(self.topic)
        wanted = kafka_answer[4]
        latest = trio_answer
        deadline = time.monotonic() + WAIT_S
        while latest[4] < wanted and time.monotonic() < deadline:
            time.sleep(SETTLE_S)  # poll step: the HW moves at the record's sync
            error, offset, _ = session.list_offset(session.trio, name, self.partition, LATEST)
            latest = ("acks=0 then latest", "error", error, "offset", offset)
            if error != 0:
                break
        return latest


@dataclass(frozen=True)
class InitProducer(Op):
    """InitProducerId for logical producer ``producer``: a new id, or (bump) the next epoch."""

    producer: int
    bump: bool
    kind: str = field(init=False, default="init-producer-id")

    def run(self, session: Session, broker: Broker) -> Normalised:
        known = broker.producer_ids.get(self.producer)
        pid, epoch = known if (self.bump and known) else (-1, -1)
        body = m.InitProducerIdRequest(
            transactional_id=None, transaction_timeout_ms=60_000,
            producer_id=pid, producer_epoch=epoch,
        )  # fmt: skip
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = broker.request(m.ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_V, body)
            # A coordinator still loading (Kafka just after start) is timing, not semantics.
            if answer.error_code not in RETRIABLE_COORDINATOR or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if answer.error_code == 0:
            broker.producer_ids[self.producer] = (answer.producer_id, answer.producer_epoch)
            broker.logical_of[answer.producer_id] = self.producer
        same_id = known is not None and known[0] == answer.producer_id
        return ("error", answer.error_code, "epoch", answer.producer_epoch, "same_id", same_id)

    def after(self, session: Session, kafka_answer: Normalised) -> None:
        if kafka_answer[1] == 0:
            session.producer(self.producer).restart()


#: How an idempotent batch's sequence and epoch relate to the producer's state.
NEXT, DUPLICATE, GAP = "next", "duplicate", "gap"
#: LOCAL_BUMP: epoch + 1 at sequence 0, what the Java client does itself (KIP-360) when an
#: idempotent producer must reset its sequences; STALE_EPOCH: epoch - 1 after that.
LOCAL_BUMP, STALE_EPOCH = "local-bump", "stale-epoch"


@dataclass(frozen=True)
class IdempotentProduce(Op):
    """A batch from logical producer ``producer`` to partition 0 of ``topic``.

    ``mode``: NEXT (the expected sequence), DUPLICATE (the ``back``-th last batch sent
    again: its sequence, records and timestamp, compressed with this op's ``codec``), GAP
    (``back`` sequences skipped), LOCAL_BUMP, STALE_EPOCH. The sequence model is shared
    (advanced by Kafka's answers); the epoch is each broker's own.
    """

    producer: int
    topic: str
    records: int
    acks: int
    mode: str
    back: int = 1
    kind: str = field(init=False, default="produce-idempotent")
    codec: str = "none"

    def prepare(self, session: Session) -> tuple[int, int, int, int] | None:
        """(epoch delta, base sequence, records, timestamp) of the batch, from the model."""
        if any(self.producer not in b.producer_ids for b in (session.kafka, session.trio)):
            return None
        if self.mode == STALE_EPOCH and any(
            b.producer_ids[self.producer][1] == 0 for b in (session.kafka, session.trio)
        ):
            return None  # no earlier epoch to send
        model = session.producer(self.producer)
        key = session.name(self.topic)
        sent = model.sent.get(key, [])
        if self.mode == DUPLICATE:  # nothing sent yet: nothing to repeat
            return sent[-min(self.back, len(sent))] if sent else None
        if self.mode == LOCAL_BUMP:
            return 1, 0, self.records, session.next_timestamp()
        seq = model.next_sequence.get(key, 0)
        if self.mode == GAP:
            seq += self.back
        delta = -1 if self.mode == STALE_EPOCH else 0
        return delta, seq, self.records, session.next_timestamp()

    def run(self, session: Session, broker: Broker) -> Normalised:
        plan = session.current_plan
        if plan is None:
            return ("skipped",)
        delta, seq, count, ts = plan
        pid, epoch = broker.producer_ids[self.producer]
        batch = build_batch(
            [(b"k%d" % (seq + i), b"v%d" % (seq + i)) for i in range(count)],
            producer_id=pid, producer_epoch=epoch + delta, base_sequence=seq, base_timestamp=ts,
            compression=CODECS[self.codec],
        )  # fmt: skip
        part = session.produce(broker, self.topic, 0, self.acks, bytes(batch))
        if part.error_code == 0 and self.mode == LOCAL_BUMP:
            broker.producer_ids[self.producer] = (pid, epoch + 1)
        return ("error", part.error_code, "base_offset", part.base_offset,
                "log_start", part.log_start_offset)  # fmt: skip

    def after(self, session: Session, kafka_answer: Normalised) -> None:
        plan = session.current_plan
        if plan is None or kafka_answer[1] != 0 or self.mode == DUPLICATE:
            return  # refused, or a retried batch (not a new one)
        # Accepted: NEXT, LOCAL_BUMP, or a GAP that was the producer's first batch on the
        # partition (Kafka takes any sequence from a producer it has no state for there).
        model = session.producer(self.producer)
        key = session.name(self.topic)
        if self.mode == LOCAL_BUMP:
            model.restart()
        _, seq, count, ts = plan
        model.next_sequence[key] = seq + count
        model.sent.setdefault(key, []).append((0, seq, count, ts))
        del model.sent[key][:-5]


@dataclass(frozen=True)
class Fetch(Op):
    """Fetch partition ``partition`` at an offset relative to the log: ``where`` is one of
    "zero", "hw", "hw+1", "beyond" (HW + 1000), "negative", "middle" (HW // 2)."""

    topic: str
    partition: int
    where: str
    kind: str = field(init=False, default="fetch")
    #: "name" (Fetch v12), "id" (v13: the broker's own id of the topic) or "unknown-id".
    by: str = "name"

    def run(self, session: Session, broker: Broker) -> Normalised:
        name = session.name(self.topic)
        offset = session.resolve_offset(broker, name, self.partition, self.where)
        P = m.FetchRequest.FetchTopic.FetchPartition
        partitions = [P(partition=self.partition, fetch_offset=offset, current_leader_epoch=-1,
                        log_start_offset=-1, partition_max_bytes=1 << 20)]  # fmt: skip
        if self.by == "name":
            version, topic_request = (
                FETCH_V,
                m.FetchRequest.FetchTopic(topic=name, partitions=partitions),
            )
        else:
            topic_id = session.topic_id(broker, self.topic) if self.by == "id" else UNKNOWN_TOPIC_ID
            version = FETCH_BY_ID_V
            topic_request = m.FetchRequest.FetchTopic(topic_id=topic_id, partitions=partitions)
        body = m.FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1, topics=[topic_request],
            forgotten_topics_data=[], rack_id="",
        )  # fmt: skip
        answer = broker.request(m.ApiKey.FETCH, version, body)
        (topic,) = answer.responses
        (part,) = topic.partitions
        batches = []
        for batch in iter_batches(bytes(part.records or b"")):
            pid = batch.producer_id
            producer = broker.logical_of.get(pid, "?") if pid >= 0 else None
            records = tuple((batch.offset_of(r), r.key, r.value) for r in batch.records())
            batches.append((batch.base_offset, batch.last_offset, producer,
                            batch.producer_epoch, batch.base_sequence,
                            batch.max_timestamp, batch.compression.name, records))  # fmt: skip
        return ("error", part.error_code, "hw", part.high_watermark,
                "lso", part.last_stable_offset, "log_start", part.log_start_offset,
                "batches", tuple(batches))  # fmt: skip


#: SessionFetch's actions (KIP-227).
OPEN, NEXT_FETCH, STALE_SESSION_EPOCH, UNKNOWN_SESSION, FORGET, CLOSE = (
    "open", "next", "stale-epoch", "unknown-session", "forget", "close",
)  # fmt: skip
#: The session's partitions: the prologue's topics ("b" has two partitions).
SESSION_PARTITIONS = (("a", 0), ("b", 0), ("b", 1))
#: A session id neither broker handed out (ids are random, 1 is as unlikely as any).
#: Not 2**31 - 1: Kafka 4.4 answers that one UNKNOWN_SERVER_ERROR (it picks a cache shard
#: by the id, and that id's shard does not exist).
NO_SUCH_SESSION = 1


@dataclass(frozen=True)
class SessionFetch(Op):
    """A fetch session (KIP-227, Fetch v12) on the prologue's partitions, each broker
    with its own session id: ``open`` (a full fetch, epoch 0, closing the one before),
    ``next`` (incremental, nothing changed: only partitions with news come back),
    ``forget`` (incremental, forgets b-1), ``stale-epoch`` (incremental, epoch + 5),
    ``unknown-session`` and ``close`` (epoch -1: a sessionless answer). Session ids are
    compared only as "one was given" (0 or not); fetch offsets stay 0, so a partition
    with records is news every time."""

    action: str
    kind: str = field(init=False, default="fetch-session")

    @property
    def mode(self) -> str:
        return self.action

    def run(self, session: Session, broker: Broker) -> Normalised:
        FT = m.FetchRequest.FetchTopic
        session_id, epoch = session.fetch_sessions.get(broker.name, (0, -1))
        topics: dict[str, list[Any]] = {}
        forgotten: list[Any] = []
        if self.action in (OPEN, CLOSE):
            epoch = 0 if self.action == OPEN else -1
            for topic, partition in SESSION_PARTITIONS:
                topics.setdefault(session.name(topic), []).append(FT.FetchPartition(
                    partition=partition, fetch_offset=0, current_leader_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20))  # fmt: skip
        elif self.action == STALE_SESSION_EPOCH:
            epoch += 5
        elif self.action == UNKNOWN_SESSION:
            session_id, epoch = NO_SUCH_SESSION, 1
        elif self.action == FORGET:
            forgotten = [m.FetchRequest.ForgottenTopic(topic=session.name("b"), partitions=[1])]
        if self.action not in (OPEN, CLOSE) and session_id == 0:
            return ("no session",)  # nothing to continue on either broker (Kafka's answer too)
        body = m.FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=session_id, session_epoch=epoch,
            topics=[FT(topic=name, partitions=parts) for name, parts in topics.items()],
            forgotten_topics_data=forgotten, rack_id="",
        )  # fmt: skip
        answer = broker.request(m.ApiKey.FETCH, FETCH_V, body)
        if answer.error_code == 0:
            if answer.session_id == 0:
                session.fetch_sessions.pop(broker.name, None)
            elif self.action == OPEN:
                session.fetch_sessions[broker.name] = (answer.session_id, 1)
            else:
                session.fetch_sessions[broker.name] = (session_id, epoch + 1)
        parts = sorted(
            (t.topic.removeprefix(session.prefix + "-"), p.partition_index, p.error_code,
             p.high_watermark, p.last_stable_offset, p.log_start_offset,
             len(bytes(p.records or b"")) > 0)
            for t in answer.responses
            for p in t.partitions
        )  # fmt: skip
        return ("error", answer.error_code, "session", answer.session_id != 0,
                "partitions", tuple(parts))  # fmt: skip


@dataclass(frozen=True)
class ListOffsets(Op):
    """ListOffsets for a partition: EARLIEST, LATEST, MAX_TIMESTAMP, or ``timestamp`` >= 0
    (an offset into the timestamps this session used: BASE_TIMESTAMP + ``timestamp``)."""

    topic: str
    partition: int
    timestamp: int
    kind: str = field(init=False, default="list-offsets")

    def run(self, session: Session, broker: Broker) -> Normalised:
        ts = self.timestamp if self.timestamp < 0 else BASE_TIMESTAMP + self.timestamp
        error, offset, timestamp = session.list_offset(
            broker, session.name(self.topic), self.partition, ts
        )
        return ("error", error, "offset", offset, "timestamp", timestamp)


@dataclass(frozen=True)
class MetadataById(Op):
    """Metadata v12 naming the topic by id: the broker's own id of it, or an unknown one."""

    topic: str
    known: bool
    kind: str = field(init=False, default="metadata-by-id")

    def run(self, session: Session, broker: Broker) -> Normalised:
        topic_id = session.topic_id(broker, self.topic) if self.known else UNKNOWN_TOPIC_ID
        body = m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(topic_id=topic_id, name=None)],
            allow_auto_topic_creation=False,
        )
        (topic,) = broker.request(m.ApiKey.METADATA, METADATA_BY_ID_V, body).topics
        partitions = sorted((p.partition_index, p.error_code) for p in topic.partitions)
        return ("error", topic.error_code, "name", session.topic_of(topic.name),
                "same_id", topic.topic_id == topic_id, "partitions", tuple(partitions))  # fmt: skip


@dataclass(frozen=True)
class OffsetForLeaderEpoch(Op):
    """OffsetForLeaderEpoch v4 as a consumer sends it after a leader change (KIP-320)."""

    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int
    kind: str = field(init=False, default="offset-for-leader-epoch")

    def run(self, session: Session, broker: Broker) -> Normalised:
        T = m.OffsetForLeaderEpochRequest.OffsetForLeaderTopic
        body = m.OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=[T(topic=session.name(self.topic), partitions=[T.OffsetForLeaderPartition(
                partition=self.partition, current_leader_epoch=self.current_leader_epoch,
                leader_epoch=self.leader_epoch)])],
        )  # fmt: skip
        answer = broker.request(m.ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_V, body)
        (topic,) = answer.topics
        (part,) = topic.partitions
        return ("error", part.error_code, "leader_epoch", part.leader_epoch,
                "end_offset", part.end_offset)  # fmt: skip


@dataclass(frozen=True)
class Pause(Op):
    """Nothing sent for ``seconds`` (both brokers at once): longer than the rebalance
    timeout, so a member that joined and did not sync, or a rebalance that waits for a
    member, times out in between -- the group timers' semantics, compared afterwards."""

    seconds: float
    kind: str = field(init=False, default="pause")

    def run(self, session: Session, broker: Broker) -> Normalised:
        time.sleep(self.seconds)
        return ("paused",)


#: Group actions of :class:`GroupOp`.
JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH_OFFSETS = (
    "join", "sync", "heartbeat", "leave", "commit", "fetch-offsets"
)  # fmt: skip
#: MEMBER_ID_REQUIRED: a JoinGroup v4+ without a member id gets one and must join again.
MEMBER_ID_REQUIRED = 79
UNKNOWN_MEMBER_ID = 25


@dataclass(frozen=True)
class GroupOp(Op):
    """One classic-protocol group call by logical member ``member`` of the session's group.

    Each broker's member ids and generation are its own (:class:`Broker`), mapped to
    logical members in the answers. ``join`` without a member id does KIP-394's two steps
    (MEMBER_ID_REQUIRED, then the join with that id) and reports both error codes. A
    member that joins a stable group makes the others rejoin: with one connection they
    cannot, so the join waits out REBALANCE_TIMEOUT_MS and the others leave the group --
    on both brokers. ``commit`` and ``fetch-offsets`` use partition 0 of topic "a";
    ``stale`` sends the generation before the current one (and a made-up member id for a
    member that never joined).
    """

    action: str
    member: int
    offset: int = 0
    stale: bool = False
    kind: str = field(init=False, default="group")

    @property
    def mode(self) -> str:
        return self.action + ("/stale" if self.stale else "")

    def _identity(self, broker: Broker) -> tuple[str, int]:
        member_id = broker.member_ids.get(self.member, f"never-joined-{self.member}")
        return member_id, broker.generation - 1 if self.stale else broker.generation

    def run(self, session: Session, broker: Broker) -> Normalised:
        group = session.name("g")
        found = session.find_coordinator(broker, group)
        if found != 0:
            return ("coordinator", found)
        member_id, generation = self._identity(broker)
        if self.action == JOIN:
            return self._join(session, broker, group)
        if self.action == SYNC:
            leader = broker.join_members and broker.member_ids.get(self.member) == member_id
            A = m.SyncGroupRequest.SyncGroupRequestAssignment
            assignments = [
                A(member_id=broker.member_ids[logical], assignment=b"to-%d" % logical)
                for logical in broker.join_members if logical in broker.member_ids
            ] if leader else []  # fmt: skip
            body = m.SyncGroupRequest(
                group_id=group, generation_id=generation, member_id=member_id,
                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                assignments=assignments,
            )  # fmt: skip
            sync = broker.request(m.ApiKey.SYNC_GROUP, SYNC_GROUP_V, body)
            return ("error", sync.error_code, "assignment", bytes(sync.assignment or b""))
        if self.action == HEARTBEAT:
            body = m.HeartbeatRequest(group_id=group, generation_id=generation,
                                      member_id=member_id, group_instance_id=None)  # fmt: skip
            return ("error", broker.request(m.ApiKey.HEARTBEAT, HEARTBEAT_V, body).error_code)
        if self.action == LEAVE:
            body = m.LeaveGroupRequest(group_id=group, members=[
                m.LeaveGroupRequest.MemberIdentity(member_id=member_id, group_instance_id=None)
            ])  # fmt: skip
            left = broker.request(m.ApiKey.LEAVE_GROUP, LEAVE_GROUP_V, body)
            if left.error_code == 0 and all(r.error_code == 0 for r in left.members):
                broker.member_ids.pop(self.member, None)
            return ("error", left.error_code, "members", tuple(r.error_code for r in left.members))
        if self.action == COMMIT:
            T = m.OffsetCommitRequest.OffsetCommitRequestTopic
            body = m.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=None, retention_time_ms=-1,
                topics=[T(name=session.name("a"), partitions=[T.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=self.offset, committed_leader_epoch=-1,
                    committed_metadata="m")])],
            )  # fmt: skip
            committed = broker.request(m.ApiKey.OFFSET_COMMIT, OFFSET_COMMIT_V, body)
            return ("errors", tuple(p.error_code for t in committed.topics for p in t.partitions))
        if self.action == FETCH_OFFSETS:
            G = m.OffsetFetchRequest.OffsetFetchRequestGroup
            body = m.OffsetFetchRequest(require_stable=False, groups=[G(
                group_id=group, member_id=None, member_epoch=-1, topics=[G.OffsetFetchRequestTopics(
                    name=session.name("a"), partition_indexes=[0])])])  # fmt: skip
            (result,) = broker.request(m.ApiKey.OFFSET_FETCH, OFFSET_FETCH_V, body).groups
            parts = tuple((p.partition_index, p.committed_offset, p.metadata, p.error_code)
                          for t in result.topics for p in t.partitions)  # fmt: skip
            return ("error", result.error_code, "partitions", parts)
        raise ValueError(self.action)

    def _join(self, session: Session, broker: Broker, group: str) -> Normalised:
        P = m.JoinGroupRequest.JoinGroupRequestProtocol

        def join(member_id: str) -> Any:
            body = m.JoinGroupRequest(
                group_id=group, session_timeout_ms=SESSION_TIMEOUT_MS,
                rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, member_id=member_id,
                group_instance_id=None, protocol_type="consumer",
                protocols=[P(name="range", metadata=b"m%d" % self.member)], reason=None,
            )  # fmt: skip
            return broker.request(m.ApiKey.JOIN_GROUP, JOIN_GROUP_V, body)

        codes = []
        answer = join(broker.member_ids.get(self.member, ""))
        codes.append(answer.error_code)
        if answer.error_code == MEMBER_ID_REQUIRED:
            broker.member_ids[self.member] = answer.member_id
            answer = join(answer.member_id)
            codes.append(answer.error_code)
        if answer.error_code == UNKNOWN_MEMBER_ID:
            broker.member_ids.pop(self.member, None)  # a client then joins afresh
        if answer.error_code != 0:
            return ("errors", tuple(codes))
        logical = {v: k for k, v in broker.member_ids.items()}
        broker.generation = answer.generation_id
        # Members the rebalance dropped are gone: their ids are no longer theirs.
        broker.join_members = sorted(logical.get(j.member_id, -1) for j in answer.members)
        leader = logical.get(answer.leader, "other")
        metadata = tuple(sorted(bytes(j.metadata) for j in answer.members))
        return ("errors", tuple(codes), "generation", answer.generation_id,
                "protocol", answer.protocol_name, "leader", leader,
                "members", tuple(broker.join_members), "metadata", metadata)  # fmt: skip


#: Outcome classes of malformed input.
DISCONNECT, NO_ANSWER = "disconnect", "no answer"


@dataclass(frozen=True)
class Malformed(Op):
    """Raw bytes on a fresh connection, compared by outcome class.

    ``what``: "api-versions-v99" (ApiVersions at a version nobody has: Kafka answers
    UNSUPPORTED_VERSION in a v0 body), "metadata-v99" (another API at an unknown
    version), "absurd-length" (a size prefix of 2 GiB - 1), "negative-length",
    "unknown-api-key" (key 9999).
    """

    what: str
    kind: str = field(init=False, default="malformed")

    def frame(self) -> bytes:
        def request(api_key: int, version: int) -> bytes:
            client_id = b"diff"
            # Header v2 (these versions would be flexible): client id, then no tagged fields.
            body = struct.pack(">hhih", api_key, version, 7, len(client_id)) + client_id + b"\0"
            return _SIZE.pack(len(body)) + body

        if self.what == "api-versions-v99":
            return request(m.ApiKey.API_VERSIONS, 99)
        if self.what == "metadata-v99":
            return request(m.ApiKey.METADATA, 99)
        if self.what == "unknown-api-key":
            return request(9999, 0)
        if self.what == "absurd-length":
            return _SIZE.pack(0x7FFF_FFFF) + b"\0" * 16
        if self.what == "negative-length":
            return _SIZE.pack(-5) + b"\0" * 16
        raise ValueError(self.what)

    def run(self, session: Session, broker: Broker) -> Normalised:
        broker.requests += 1
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5.0) as sock:
            sock.sendall(self.frame())
            return _outcome(sock)


def _outcome(sock: socket.socket) -> Normalised:
    """What a broker did with the bytes: an error code in the answer, or a disconnect."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) >= 4 and len(data) >= 4 + _SIZE.unpack_from(data)[0]:
                break
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        if not data:
            return (NO_ANSWER,)
    if not data:
        return (DISCONNECT,)
    if len(data) >= 10:
        # ApiVersions v0 response: correlation id, then error_code.
        (error_code,) = struct.unpack_from(">h", data, 8)
        return ("answer", "error", error_code)
    return ("answer", "short", len(data))


# --------------------------------------------------------------------------- session


@dataclass
class ProducerModel:
    next_sequence: dict[str, int] = field(default_factory=dict)
    #: The last five batches accepted, per topic: (0, base sequence, records, timestamp).
    sent: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)

    def restart(self) -> None:
        """A new producer id or epoch: every partition's sequence starts at 0 again."""
        self.next_sequence.clear()
        self.sent.clear()


class Session:
    """One op sequence against both brokers; topic names are private to the session."""

    def __init__(self, kafka: Broker, trio: Broker, prefix: str) -> None:
        self.kafka = kafka
        self.trio = trio
        self.prefix = prefix
        self._producers: dict[int, ProducerModel] = {}
        self._timestamp = 0
        self.current_plan: Any = None
        #: Kafka's and trio-broker's normalised answers to the last op.
        self.last_answers: tuple[Normalised, Normalised] = ((), ())
        self.ops = 0
        #: Per broker name: the fetch session's id and next epoch (SessionFetch).
        self.fetch_sessions: dict[str, tuple[int, int]] = {}
        #: The group's generation as Kafka last answered a JoinGroup, and when the join
        #: that made it was sent and answered (its sync timer starts in between).
        self._generation: object = None
        self._generation_made: tuple[float, float] | None = None
        for broker in (kafka, trio):
            broker.producer_ids.clear()
            broker.logical_of.clear()
            broker.member_ids.clear()
            broker.generation = -1
            broker.join_members = []

    # -- helpers the ops use -------------------------------------------------

    def name(self, topic: str) -> str:
        return f"{self.prefix}-{topic}"

    def producer(self, index: int) -> ProducerModel:
        return self._producers.setdefault(index, ProducerModel())

    def forget_topic(self, topic: str) -> None:
        for model in self._producers.values():
            model.next_sequence.pop(self.name(topic), None)
            model.sent.pop(self.name(topic), None)

    def next_timestamp(self) -> int:
        self._timestamp += 10
        return BASE_TIMESTAMP + self._timestamp

    def batch(self, records: int, codec: Compression = Compression.NONE) -> bytes:
        ts = self.next_timestamp()
        return bytes(build_batch([(b"k%d" % i, b"v%d" % i) for i in range(records)],
                                 base_timestamp=ts, compression=codec))  # fmt: skip

    def produce(self, broker: Broker, topic: str, partition: int, acks: int, batch: bytes) -> Any:
        """The partition's answer; None for acks=0 (sent, no answer to wait for)."""
        Topic = m.ProduceRequest.TopicProduceData
        body = m.ProduceRequest(
            transactional_id=None, acks=acks, timeout_ms=10_000,
            topic_data=[Topic(name=self.name(topic), partition_data=[
                Topic.PartitionProduceData(index=partition, records=batch)])],
        )  # fmt: skip
        if acks == 0:
            broker.requests += 1
            broker.conn.send_request(m.ApiKey.PRODUCE, PRODUCE_V, body)
            return None
        (topic_response,) = broker.request(m.ApiKey.PRODUCE, PRODUCE_V, body).responses
        answer = topic_response.partition_responses[0]
        if acks == 1 and answer.error_code == 0 and answer.base_offset >= 0:
            # acks=1 is answered at the append. Kafka's single node moves its high
            # watermark then, trio-broker's node alone at the append's fsync, a moment
            # later (its HW is its durable end: docs/compatibility.md). Reads after this
            # compare once the HW covers the batch: when, is timing, not semantics.
            (last_offset_delta,) = struct.unpack_from(">i", batch, LAST_OFFSET_DELTA_AT)
            end = answer.base_offset + last_offset_delta + 1
            name = self.name(topic)
            self._wait(f"the high watermark of {name}-{partition} past {end - 1}", broker,
                       lambda: self.list_offset(broker, name, partition, LATEST)[1] >= end)  # fmt: skip
        return answer

    def topic_id(self, broker: Broker, topic: str) -> uuid.UUID:
        """The broker's id of the session's ``topic``; :data:`UNKNOWN_TOPIC_ID` if none."""
        answer = self._metadata(broker, self.name(topic))
        return answer.topic_id if answer.error_code == 0 else UNKNOWN_TOPIC_ID

    def topic_of(self, name: str | None) -> str | None:
        """A topic name as the session's short name (prefix stripped)."""
        prefix = self.prefix + "-"
        return name[len(prefix) :] if name and name.startswith(prefix) else name

    def find_coordinator(self, broker: Broker, group: str) -> int:
        """FindCoordinator until the coordinator is loaded (Kafka creates its offsets topic
        on the first ask: timing, not semantics); the last error code."""
        body = m.FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = broker.request(m.ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_V, body)
            (coordinator,) = answer.coordinators
            if coordinator.error_code not in RETRIABLE_COORDINATOR or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if coordinator.error_code == 0 and not broker.coordinator_ready:
            self._wait_coordinator_loaded(broker)
        return int(coordinator.error_code)

    def _wait_coordinator_loaded(self, broker: Broker) -> None:
        """Once per broker: a fresh Kafka names its coordinator before it has loaded the
        offsets partition, and meanwhile answers group calls with NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS or even a Heartbeat's 0 for a member it does not know.
        Wait until an OffsetFetch for a group of its own (no side effect) is answered
        without error twice in a row."""
        G = m.OffsetFetchRequest.OffsetFetchRequestGroup
        body = m.OffsetFetchRequest(require_stable=False, groups=[G(
            group_id=f"{self.prefix}-ready", member_id=None, member_epoch=-1, topics=None)])  # fmt: skip
        answers_as_loaded = [0]  # in a row

        def loaded() -> bool:
            answer = broker.request(m.ApiKey.OFFSET_FETCH, OFFSET_FETCH_V, body)
            ok = answer.groups[0].error_code == 0
            answers_as_loaded[0] = answers_as_loaded[0] + 1 if ok else 0
            return answers_as_loaded[0] >= 2

        self._wait("group coordinator loaded", broker, loaded)
        broker.coordinator_ready = True

    def _metadata(self, broker: Broker, name: str) -> Any:
        body = m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(name=name)],
            allow_auto_topic_creation=False,
        )
        (topic,) = broker.request(m.ApiKey.METADATA, METADATA_V, body).topics
        return topic

    def _wait(self, what: str, broker: Broker, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{broker.name}: {what} not within {WAIT_S}s")
            time.sleep(0.05)

    def wait_for_leaders(self, broker: Broker, name: str, partitions: int) -> None:
        def ready() -> bool:
            topic = self._metadata(broker, name)
            return (
                topic.error_code == 0
                and len(topic.partitions) == partitions
                and all(p.error_code == 0 and p.leader_id >= 0 for p in topic.partitions)
            )

        self._wait(f"leaders of {name}", broker, ready)

        # Kafka's metadata can name a leader a moment before the partition serves.
        def serving(partition: int) -> Callable[[], bool]:
            return lambda: self.list_offset(broker, name, partition, LATEST)[0] == 0

        for partition in range(partitions):
            self._wait(f"{name}-{partition} serving", broker, serving(partition))

    def list_offset(
        self, broker: Broker, name: str, partition: int, ts: int
    ) -> tuple[int, int, int]:
        """(error code, offset, timestamp) of a ListOffsets for one partition."""
        LP = m.ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
        body = m.ListOffsetsRequest(
            replica_id=-1, isolation_level=0,
            topics=[m.ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=[
                LP(partition_index=partition, current_leader_epoch=-1, timestamp=ts)])],
        )  # fmt: skip
        (topic,) = broker.request(m.ApiKey.LIST_OFFSETS, LIST_OFFSETS_V, body).topics
        (part,) = topic.partitions
        return part.error_code, part.offset, part.timestamp

    def wait_until_gone(self, broker: Broker, name: str) -> None:
        self._wait(f"deletion of {name}", broker,
                   lambda: self._metadata(broker, name).error_code != 0)  # fmt: skip

    def resolve_offset(self, broker: Broker, name: str, partition: int, where: str) -> int:
        """Edge offsets from *Kafka's* high watermark, so both brokers get the same one."""
        if where == "zero":
            return 0
        if where == "negative":
            return -1
        hw = self._kafka_hw
        return {"hw": hw, "hw+1": hw + 1, "beyond": hw + 1000, "middle": hw // 2}[where]

    _kafka_hw = 0

    def _list_latest(self, broker: Broker, op: Fetch) -> int:
        error, offset, _ = self.list_offset(broker, self.name(op.topic), op.partition, LATEST)
        return offset if error == 0 else 0

    # -- the comparison ------------------------------------------------------

    def run(self, op: Op) -> Difference | None:
        """``op`` against Kafka and trio-broker at once; a Difference if the answers differ.

        At once (Kafka's side in a thread), so that an op that waits -- a JoinGroup that
        waits out a rebalance -- costs its time once, and each broker sees the same
        intervals between ops: a broker's timers (a group's sync timeout) do not run on
        while the other broker answers.
        """
        self.ops += 1
        sent_at = time.monotonic()
        self.current_plan = op.prepare(self)
        if isinstance(op, Fetch):
            self._kafka_hw = self._list_latest(self.kafka, op)

        def answer(broker: Broker) -> Normalised:
            try:
                return op.run(self, broker)
            except ConnectionClosed:
                broker.reset_connection()
                # "EOF" or "connection reset": how the close reached us, not what it means.
                return ("connection closed",)

        if self.kafka is self.trio:  # one broker on both sides (tests/differential regressions)
            answers = [answer(self.kafka), answer(self.trio)]
        else:
            with ThreadPoolExecutor(max_workers=1) as pool:
                kafka_side = pool.submit(answer, self.kafka)
                trio_answer = answer(self.trio)
                answers = [kafka_side.result(), trio_answer]
        if answers[0] != answers[1]:
            answers[1] = op.converge(self, answers[0], answers[1])
        op.after(self, answers[0])
        self.last_answers = (answers[0], answers[1])
        near = isinstance(op, GroupOp) and self._near_a_group_timer(sent_at)
        if isinstance(op, GroupOp) and op.action == JOIN:
            self._note_generation(answers[0], sent_at)
        if answers[0] != answers[1]:
            return Difference(op.kind, repr(op), answers[0], answers[1], near_a_timer=near)
        return None

    def _note_generation(self, kafka_answer: Normalised, sent_at: float) -> None:
        """A JoinGroup that made a new generation starts its sync timer (members that
        do not SyncGroup within the rebalance timeout leave); one answered with the
        generation there already (a member rejoining with the same metadata while the
        group completes its rebalance) does not restart it."""
        if "generation" not in kafka_answer:
            return
        generation = kafka_answer[kafka_answer.index("generation") + 1]
        if generation != self._generation:
            self._generation = generation
            self._generation_made = (sent_at, time.monotonic())

    def _near_a_group_timer(self, sent_at: float) -> bool:
        """Whether an op sent at ``sent_at`` reaches the brokers near the deadline of
        the current generation's sync timer (started between the join's request and
        its answer)."""
        if self._generation_made is None:
            return False
        timeout_s = REBALANCE_TIMEOUT_MS / 1000
        start, end = self._generation_made
        return start + timeout_s - TIMER_MARGIN_S < sent_at < end + timeout_s + TIMER_MARGIN_S
