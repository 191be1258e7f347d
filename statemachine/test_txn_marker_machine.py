"""A cluster's transaction markers (``cluster/txn_marker_channel.py``) while leadership
moves, brokers die and return, topics are deleted and a newer coordinator fences.

The real ``TxnMarkerChannel.send`` runs its loop (``marker_targets``, ``route_markers``,
the coordinator check each round, the retry back-off and the attempt's deadline, the
WriteTxnMarkers request and the reading of its answer) against a cluster the machine
keeps: the cluster view it reads, the ``__transaction_state`` term it checks, and the
other brokers' answers (a peer client per broker that answers as that broker would, or
fails to connect while it is down). The partitions this broker (0) leads are written
through the same stand-in (``write_marker_as_leader`` is the seam: what a leader does
with a marker is the partition machines' business). Time is a Trio mock clock that jumps
when every task waits, so the 30-s deadline costs nothing.

The world changes while a send runs: each round's coordinator check and each request
first apply the next scripted disruption (a leadership move or a partition left without
a leader, a broker dying or returning, a topic deleted, a newer producer epoch written, a
newer coordinator's marker, this broker losing the coordinator's partition).

Kafka's rules (its TransactionMarkerChannelManager), checked after every send:

1. a send that returns has a marker of the right outcome, producer id and epoch and
   coordinator epoch on every partition of the transaction and on the
   ``__consumer_offsets`` partition of each of its groups, written by the broker that
   led it then, unless the partition's topic is gone or it answered that a newer
   producer epoch ended the transaction there; a partition without a leader is waited
   for, never skipped;
2. markers go only to those partitions;
3. an answer that a newer coordinator wrote, or this broker no longer leading the
   transaction's ``__transaction_state`` partition in the markers' epoch, ends the send
   with NOT_COORDINATOR (and a send that returns saw neither);
4. a send that gives up at its deadline (COORDINATOR_NOT_AVAILABLE) left a partition that
   still exists without a live leader; one whose every remaining partition has a live
   leader at the end does not give up.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio
import trio.lowlevel
import trio.testing
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from trio_broker.cluster import txn_marker_channel
from trio_broker.cluster.broker_client import BrokerConnectionError
from trio_broker.cluster.txn_marker_channel import TxnMarkerChannel
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import NO_LEADER
from trio_broker.services.cluster_view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, partition_for
from trio_broker.transactions.coordinator import CoordinatorUnavailable
from trio_broker.transactions.state import TopicPartition, TxnMetadata, TxnState

ME = 0
BROKERS = (0, 1, 2)
OFFSETS_PARTITIONS = 3
TXN_PARTITION = 0
DATA = {"a": 3, "b": 2}
PARTITIONS = sorted(
    [(t, p) for t, n in DATA.items() for p in range(n)]
    + [(CONSUMER_OFFSETS, p) for p in range(OFFSETS_PARTITIONS)]
)
DATA_PARTITIONS = [tp for tp in PARTITIONS if tp[0] in DATA]
GROUPS = ("g0", "g1", "g2", "g3")
LEADERS = st.sampled_from((*BROKERS, NO_LEADER))

DISRUPTIONS = st.one_of(
    st.tuples(st.just("move"), st.sampled_from(PARTITIONS), LEADERS),
    st.tuples(st.just("die"), st.sampled_from(BROKERS[1:])),
    st.tuples(st.just("return"), st.sampled_from(BROKERS[1:])),
    st.tuples(st.just("delete"), st.sampled_from(sorted(DATA))),
    st.tuples(st.just("newer_epoch"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("fenced"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("resign")),
    st.tuples(st.just("new_epoch")),
)


@attrs.frozen
class Marker:
    partition: TopicPartition
    by: int
    committed: bool
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


@attrs.frozen
class Term:
    leader_epoch: int


class Cluster:
    """What the channel sees (the view, its term) and how each broker answers."""

    def __init__(self) -> None:
        self.leaders: dict[TopicPartition, int] = {tp: BROKERS[i % 3] for i, tp in
                                                   enumerate(PARTITIONS)}  # fmt: skip
        self.alive: set[int] = set(BROKERS)
        self.deleted: set[str] = set()
        self.newer_epoch: set[TopicPartition] = set()
        #: Partitions that answered INVALID_PRODUCER_EPOCH in this send.
        self.ended_by_newer_epoch: set[TopicPartition] = set()
        self.fenced: set[TopicPartition] = set()
        self.coordinator_epoch = 5
        self.resigned = False
        self.script: list[tuple[Any, ...]] = []
        self.markers: list[Marker] = []
        #: What happened in this send: a fencing answer given, a resignation applied.
        self.fencing_answered = False
        #: A round's check found this broker no longer leading the coordinator's
        #: partition in the markers' epoch (a change during a request shows at the
        #: next round).
        self.resignation_seen = False
        self.markers_epoch = self.coordinator_epoch
        self.view = ClusterView(ME)
        self.refresh_view()

    def refresh_view(self) -> None:
        self.view.brokers = {b: BrokerInfo(b, "127.0.0.1", 19000 + b) for b in self.alive}
        topics = {}
        for topic in {t for t, _ in PARTITIONS} - self.deleted:
            partitions = {
                p: PartitionInfo(BROKERS, leader, 1, BROKERS)
                for (t, p), leader in self.leaders.items()
                if t == topic
            }
            topics[topic] = TopicInfo(topic, uuid.uuid5(uuid.NAMESPACE_URL, topic), partitions)
        self.view.topics = topics

    def disrupt(self) -> None:
        """The next scripted change, if any (a round's check and each request call it)."""
        if not self.script:
            return
        change = self.script.pop(0)
        note(f"  during the send: {change}")
        kind = change[0]
        if kind == "move":
            self.leaders[change[1]] = change[2]
        elif kind == "die":
            self.alive.discard(change[1])
        elif kind == "return":
            self.alive.add(change[1])
        elif kind == "delete":
            self.deleted.add(change[1])
        elif kind == "newer_epoch":
            self.newer_epoch.add(change[1])
        elif kind == "fenced":
            self.fenced.add(change[1])
        elif kind == "resign":
            self.resigned = True
        elif kind == "new_epoch":  # still leading, in a new leader epoch
            self.coordinator_epoch += 1
        self.refresh_view()

    # -- what the channel calls --------------------------------------------------------

    def leader_term(self, topic: str, partition: int) -> Term | None:
        assert (topic, partition) == ("__transaction_state", TXN_PARTITION)
        self.disrupt()
        if self.resigned or self.coordinator_epoch != self.markers_epoch:
            self.resignation_seen = True
        return None if self.resigned else Term(self.coordinator_epoch)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return None  # KIP-890's verification is not driven here

    def answer(
        self, broker: int, tp: TopicPartition, producer_id: int, producer_epoch: int,
        committed: bool, coordinator_epoch: int,
    ) -> ErrorCode:  # fmt: skip
        """What ``broker`` answers for one partition's marker (writing it if it leads)."""
        if tp[0] in self.deleted:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.leaders[tp] != broker:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if tp in self.fenced:
            self.fencing_answered = True
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        if tp in self.newer_epoch:
            self.ended_by_newer_epoch.add(tp)
            return ErrorCode.INVALID_PRODUCER_EPOCH
        self.markers.append(
            Marker(tp, broker, committed, producer_id, producer_epoch, coordinator_epoch)
        )
        return ErrorCode.NONE


class PeerClient:
    """Another broker's inter-broker connection: WriteTxnMarkers answered as it would."""

    def __init__(self, cluster: Cluster, broker: int) -> None:
        self.cluster = cluster
        self.broker = broker

    async def call(self, api_key: int, version: int, request: Any, timeout_s: float) -> Any:
        assert api_key == m.ApiKey.WRITE_TXN_MARKERS
        self.cluster.disrupt()
        if self.broker not in self.cluster.alive:
            raise BrokerConnectionError(f"broker {self.broker} is down")
        await trio.lowlevel.checkpoint()
        Response = m.WriteTxnMarkersResponse
        markers = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                parts = [
                    Response.WritableTxnMarkerResult.WritableTxnMarkerTopicResult
                    .WritableTxnMarkerPartitionResult(
                        partition_index=p,
                        error_code=self.cluster.answer(
                            self.broker, (topic.name, p), marker.producer_id,
                            marker.producer_epoch, marker.transaction_result,
                            marker.coordinator_epoch,
                        ),
                    )
                    for p in topic.partition_indexes
                ]  # fmt: skip
                topics.append(
                    Response.WritableTxnMarkerResult.WritableTxnMarkerTopicResult(
                        name=topic.name, partitions=parts
                    )
                )
            markers.append(
                Response.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=topics)
            )
        return Response(markers=markers)


class Peers:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def client(self, broker: int) -> tuple[PeerClient, trio.Lock] | None:
        if broker not in self.cluster.view.brokers:
            return None
        return PeerClient(self.cluster, broker), trio.Lock()

    def forget(self, broker: int) -> None:
        pass

    async def close(self) -> None:
        pass


@contextmanager
def local_writes(cluster: Cluster) -> Iterator[None]:
    """The markers this broker writes as leader go to the same stand-in."""

    async def write_here(
        services: Any, topic: str, partition: int, producer_id: int, producer_epoch: int,
        committed: bool, coordinator_epoch: int, now_ms: int,
    ) -> ErrorCode:  # fmt: skip
        cluster.disrupt()
        await trio.lowlevel.checkpoint()
        return cluster.answer(ME, (topic, partition), producer_id, producer_epoch, committed,
                              coordinator_epoch)  # fmt: skip

    real = txn_marker_channel.write_marker_as_leader
    txn_marker_channel.write_marker_as_leader = write_here
    try:
        yield
    finally:
        txn_marker_channel.write_marker_as_leader = real


class Broker:
    def now_ms(self) -> int:
        return 0


class TxnMarkerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster()
        self.producer_id = 1000
        self.sends = 0

    @rule(
        partitions=st.sets(st.sampled_from(DATA_PARTITIONS), min_size=1, max_size=4),
        groups=st.sets(st.sampled_from(GROUPS), max_size=2),
        committed=st.booleans(),
        script=st.lists(DISRUPTIONS, max_size=6),
    )
    def a_transaction_ends(
        self, partitions: set[TopicPartition], groups: set[str], committed: bool,
        script: list[tuple[Any, ...]],
    ) -> None:  # fmt: skip
        cluster = self.cluster
        partitions = {tp for tp in partitions if tp[0] not in cluster.deleted}
        self.producer_id += 1
        prepared = TxnMetadata(
            f"txn-{self.sends}", self.producer_id, producer_epoch=3,
            state=TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT,
            partitions=frozenset(partitions), groups=frozenset(groups),
        )  # fmt: skip
        self.sends += 1
        targets = set(partitions) | {
            (CONSUMER_OFFSETS, partition_for(g, OFFSETS_PARTITIONS)) for g in groups
        }
        note(f"send {sorted(targets)} committed={committed}; leaders {cluster.leaders}, "
             f"alive {sorted(cluster.alive)}; script {script}")  # fmt: skip
        cluster.script = list(script)
        cluster.markers = []
        cluster.fencing_answered = False
        cluster.resigned = False
        cluster.resignation_seen = False
        cluster.newer_epoch = set()
        cluster.ended_by_newer_epoch = set()
        cluster.fenced = set()
        channel = TxnMarkerChannel(Broker(), cluster, offsets_partitions=OFFSETS_PARTITIONS)
        channel._peers = Peers(cluster)  # type: ignore[assignment]
        epoch = cluster.markers_epoch = cluster.coordinator_epoch

        async def send() -> CoordinatorUnavailable | None:
            try:
                await channel.send(prepared, committed, epoch, TXN_PARTITION)
            except CoordinatorUnavailable as exc:
                return exc
            return None

        with local_writes(cluster):
            failure = trio.run(send, clock=trio.testing.MockClock(autojump_threshold=0))
        note(f"  -> {failure!r}; markers {cluster.markers}")

        for marker in cluster.markers:  # 2, and what a written marker carries
            assert marker.partition in targets, f"a marker on {marker.partition}: {targets}"
            assert (marker.committed, marker.producer_id, marker.producer_epoch,
                    marker.coordinator_epoch) == (committed, prepared.producer_id, 3, epoch), (
                marker
            )  # fmt: skip
        written = {marker.partition for marker in cluster.markers}
        existing = {tp for tp in targets if tp[0] not in cluster.deleted}
        if failure is None:  # 1 and 3
            event("the send returned")
            assert not cluster.resignation_seen, "returned though its check found it resigned"
            assert not cluster.fencing_answered, "returned though a newer coordinator fenced"
            missing = existing - written - cluster.ended_by_newer_epoch
            assert not missing, f"returned with no marker on {sorted(missing)}"
            return
        code = failure.error_code
        if cluster.resignation_seen or cluster.fencing_answered:  # 3: at once
            assert code == ErrorCode.NOT_COORDINATOR, failure
        if code == ErrorCode.NOT_COORDINATOR:  # 3
            event("NOT_COORDINATOR")
            assert cluster.resignation_seen or cluster.fencing_answered, failure
            return
        event("gave up at the deadline")  # 4
        assert code == ErrorCode.COORDINATOR_NOT_AVAILABLE, failure
        stuck = {
            tp for tp in existing - written - cluster.ended_by_newer_epoch
            if cluster.leaders[tp] == NO_LEADER or cluster.leaders[tp] not in cluster.alive
        }  # fmt: skip
        assert stuck, f"gave up with every remaining partition led by a live broker: {failure}"

    @rule(tp=st.sampled_from(PARTITIONS), leader=LEADERS)
    def leadership_moves(self, tp: TopicPartition, leader: int) -> None:
        self.cluster.leaders[tp] = leader
        self.cluster.refresh_view()

    @rule(broker=st.sampled_from(BROKERS[1:]))
    def broker_returns(self, broker: int) -> None:
        self.cluster.alive.add(broker)
        self.cluster.refresh_view()

    @rule()
    def every_partition_led_again(self) -> None:
        """The controller catches up: each partition led by a live broker."""
        live = sorted(self.cluster.alive)
        for i, tp in enumerate(PARTITIONS):
            if self.cluster.leaders[tp] not in self.cluster.alive:
                self.cluster.leaders[tp] = live[i % len(live)]
        self.cluster.refresh_view()

    @rule()
    def coordinator_epoch_bumps(self) -> None:
        self.cluster.coordinator_epoch += 1


TestTxnMarkerMachine = TxnMarkerMachine.TestCase
TestTxnMarkerMachine.settings = settings(max_examples=60, stateful_step_count=12, deadline=None)
