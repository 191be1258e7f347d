"""A single node as a cluster of one, on the data path (issue 29).

The handlers read a partition's leadership from ``services.leaders`` whether the broker
runs alone or in a cluster: the replica manager in a cluster, :class:`LocalReplication`
alone. A node alone leads every partition it holds, in one term that never ends:
leader and ISR are this broker, the leader epoch is 0 (what its Metadata, ListOffsets
and OffsetForLeaderEpoch have always answered), and the high watermark is what its only
replica counts, by a cluster's leader's rule (``leader_synced``): its durable end with
``acks.all.fsync`` and eager syncs (the defaults), so that no consumer reads a record a
power cut then loses; its log end otherwise (page cache, as Kafka; docs/reliability.md).
The flusher syncs every appended record soon (its group commit), and a sync wakes the
partition's long polls (:meth:`LocalReplication.log_synced`). Its :class:`LocalView` is
the metadata of that cluster of one: this broker, its own controller, leading its own
topics.

The term is not ``replicated`` (``partition/append.py``'s ``Term``): a node alone keeps
the few things it does differently from a cluster's leader, unchanged by this slice —
a batch keeps the producer's partitionLeaderEpoch (no epoch cache entry), acks=-1 waits
for the fsync only, and Fetch checks no current leader epoch.

:class:`OwnLog` is the same cluster of one for a log outside the topic catalogue
that this broker writes as a coordinator (its own files alone, the share state).

:class:`LeadsNothing` is a clustered broker's replication before it joined and after it
left: it leads nothing, so every partition answers NOT_LEADER_OR_FOLLOWER and a write
waiting for the high watermark ends LEADERSHIP_LOST.

Sans-I/O: no trio.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, cast

import attrs

from trio_broker.partition.append import Replication, Term
from trio_broker.partition.partition import NOT_LED
from trio_broker.partition.read import Followers
from trio_broker.replication.leader import AckState, NotAReplica
from trio_broker.services.cluster_view import (
    BrokerInfo,
    ClusterView,
    MetadataView,
    PartitionInfo,
    TopicInfo,
    brokers_on,
)
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.storage.log_protocol import Log

if TYPE_CHECKING:
    from trio_broker.replication.leader import IsrProposal
    from trio_broker.services.topics import Topic, TopicManager

__all__ = [
    "LOCAL_LEADER_EPOCH",
    "BrokerReplication",
    "DataReplication",
    "LeadsNothing",
    "LocalReplication",
    "LocalTerm",
    "LocalView",
    "OwnLog",
]


class DataReplication(Followers, Protocol):
    """A partition's leadership as Produce, Fetch, ListOffsets and the rest of the data
    path read it: ``Services.leaders``, never None. In a cluster the replica manager
    (trio_broker/cluster/replica_manager.py); alone, a cluster of one
    (trio_broker/services/local_replication.py). Also the :class:`Followers` a
    replica's read reports its progress to (``partition/read.py``).
    """

    @property
    def view(self) -> MetadataView:
        """The brokers, the controller and every topic's partitions, as Metadata answers."""
        ...

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """Replicas, leader, leader epoch and ISR as the cluster has them."""
        ...

    def leader_term(self, topic: str, partition: int) -> Term | None:
        """This broker's term if it leads the partition now, else None."""
        ...

    @property
    def accepts_follower_fetches(self) -> bool:
        """Whether a Fetch with a replica id (from a principal allowed CLUSTER_ACTION) is
        a follower's: in a cluster; alone it is a consumer's."""
        ...

    def low_watermark(self, topic: str, partition: int) -> int | None:
        """The lowest log start offset over the partition's live replicas (DeleteRecords'
        low watermark), or None if this broker does not lead it."""
        ...

    async def wait_low_watermark(self, topic: str, partition: int, offset: int) -> int | None:
        """Wait until the low watermark reaches ``offset`` and return it; None if this
        broker stopped leading the partition meanwhile."""
        ...

    def leader_throttle_budget(self, topic: str, partition: int, replica: int) -> int | None:
        """Bytes ``replica`` may fetch from the partition now (leader.replication.
        throttled.rate, for the replicas this leader throttles: replication/throttle.py);
        None: not throttled."""
        ...

    def leader_throttle_used(self, nbytes: int) -> None:
        """A throttled fetch read ``nbytes``."""
        ...

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        """Wait until the high watermark passes ``last_offset`` (acks=all)."""
        ...

    def commit_state(self, topic: str, partition: int, last_offset: int) -> AckState:
        """:meth:`wait_committed` without waiting: WAITING until it would answer. What
        wakes its wait also notifies the partition (``Appends.notify``), so a polled
        acks=all answer watching the partition looks again then."""
        ...


class BrokerReplication(DataReplication, Protocol):
    """A broker's whole replication (``Broker.replication``): the data path's, and what
    its log cleaner asks."""

    def replica_high_watermark(self, topic: str, partition: int) -> int | None:
        """This replica's high watermark of a partition it leads or follows, else None:
        what is below it is committed and never truncated (the cleaner stops there)."""
        ...

    def log_synced(self, log: object) -> None:
        """The flusher synced ``log`` (``Flusher.on_synced``): the durable end of a
        partition it holds may have moved."""
        ...


#: The leader epoch of every partition of a node alone (Kafka's first epoch).
LOCAL_LEADER_EPOCH = 0


@attrs.frozen(slots=True)
class LocalTerm:
    """A node alone's term of one partition: it leads, alone in the ISR; the high
    watermark is what the replica counts of its log (read when asked: the log moves on
    under the term): its durable end when ``counts_synced_only`` (as a cluster's leader
    counts its own log), else its log end.

    A replica set of one under the same progress rules as a cluster's term
    (``replication/replica_rules.py``'s ``LeaderTerm``): its log is its progress (read
    from the log, nothing to record), and it has no follower, so a replica's fetch
    names no replica of it (``NotAReplica``: the rules record nothing)."""

    broker_id: int
    log: Log
    #: The high watermark is the durable end (what survives a power cut), not the log
    #: end: acks.all.fsync with every append synced at once (the broker's choice).
    counts_synced_only: bool = True

    @property
    def leader_epoch(self) -> int:
        return LOCAL_LEADER_EPOCH

    @property
    def replicas(self) -> tuple[int, ...]:
        return (self.broker_id,)

    @property
    def isr(self) -> frozenset[int]:
        return frozenset((self.broker_id,))

    @property
    def effective_min_insync_replicas(self) -> int:
        # min.insync.replicas capped at the replica count (Kafka's effectiveMinIsr): 1.
        return 1

    @property
    def high_watermark(self) -> int:
        log = self.log
        return log.durable_end_offset if self.counts_synced_only else log.log_end_offset

    @property
    def replicated(self) -> bool:
        return False

    def visible_high_watermark(self) -> int | None:
        # One term since the start: nothing from a predecessor to wait for (KIP-207).
        return self.high_watermark

    # The progress rules' side (replica_rules.LeaderTerm): the log is the state.

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def durable_end_offset(self) -> int:
        return self.log.durable_end_offset

    def leader_appended(self, log_end_offset: int) -> None:
        """Nothing to record: the log end is read from the log."""

    def leader_synced(self, durable_end_offset: int) -> bool:
        # Nothing to record: the high watermark is read from the log. Nor anyone to
        # tell here: the flusher's sync wakes the partition's waiters
        # (LocalReplication.log_synced).
        return False

    def follower_fetched(
        self, replica_id: int, fetch_offset: int, now_ms: int, *, may_join: bool = True
    ) -> tuple[bool, IsrProposal | None]:
        raise NotAReplica(f"broker {replica_id} is not a follower: {self.broker_id} is alone")

    def follower_log_start(self, replica_id: int, log_start_offset: int) -> bool:
        return False


class _LocalTopics(Mapping[str, TopicInfo]):
    """A node alone's topics as a cluster view lists them, read from its topic manager
    when asked (topics come and go under the view)."""

    def __init__(self, broker_id: int, topics: TopicManager) -> None:
        self._broker_id = broker_id
        self._topics = topics
        me = (broker_id,)
        self._led = PartitionInfo(me, broker_id, LOCAL_LEADER_EPOCH, me)
        #: name -> (the topic, its partition count, its entry): an entry is built once
        #: per topic and growth, not each time a heartbeat or Metadata lists the topics.
        self._entries: dict[str, tuple[object, int, TopicInfo]] = {}

    def __getitem__(self, name: str) -> TopicInfo:
        topic = self._topics.topics[name]
        count = len(topic.logs)
        cached = self._entries.get(name)
        if cached is not None and cached[0] is topic and cached[1] == count:
            return cached[2]
        if len(self._entries) > len(self._topics.topics):  # drop deleted topics' entries
            self._entries = {n: e for n, e in self._entries.items() if n in self._topics.topics}
        info = TopicInfo(topic.name, topic.topic_id, dict.fromkeys(range(count), self._led))
        self._entries[name] = (topic, count, info)
        return info

    def __contains__(self, name: object) -> bool:
        # Mapping's default would build a TopicInfo (one PartitionInfo per partition).
        return name in self._topics.topics

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._topics.topics))

    def __len__(self) -> int:
        return len(self._topics.topics)


class LocalView:
    """The metadata of a node alone: one live broker, its own controller, leading every
    partition of its topics at :data:`LOCAL_LEADER_EPOCH` with itself as the ISR.

    ``endpoints()``: every listener as (name, security protocol, host, port), advertised
    (``Broker.advertised_endpoints``; a port bound at start is known only then)."""

    def __init__(
        self,
        broker_id: int,
        rack: str | None,
        topics: TopicManager,
        endpoints: Callable[[], list[tuple[str, str, str, int]]],
    ) -> None:
        self.broker_id = self.controller_id = broker_id
        self._rack = rack
        self.topic_manager = topics
        self._endpoints = endpoints
        self.topics: Mapping[str, TopicInfo] = _LocalTopics(broker_id, topics)

    @property
    def brokers(self) -> Mapping[int, BrokerInfo]:
        listeners = tuple((name, host, port) for name, _, host, port in self._endpoints())
        _, host, port = listeners[0]
        return {self.broker_id: BrokerInfo(self.broker_id, host, port, self._rack, listeners)}

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        topic = self.topic_manager.by_id.get(topic_id)
        return None if topic is None else self.topics.get(topic.name)

    def brokers_on(self, listener: str | None) -> list[tuple[BrokerInfo, str, int]]:
        return brokers_on(self.brokers, listener)


class _NoFollowers:
    """What a replication without other replicas answers: no follower fetches, no
    partition metadata beyond this broker, nothing to throttle."""

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return None

    @property
    def accepts_follower_fetches(self) -> bool:
        """A Fetch naming a replica id is a consumer's, as it always was."""
        return False

    # A follower's read is never recorded here (no follower fetches): partition/read.py's
    # Followers, as a replication without followers answers it.

    @property
    def counts_synced_only(self) -> bool:
        return True

    def may_join(self, topic: str, partition: int, replica: int, term: Term) -> bool:
        return False

    def progressed(
        self, topic: str, partition: int, term: Term, moved: bool,
        proposal: IsrProposal | None,
    ) -> None:  # fmt: skip
        """Never called (no follower fetches here)."""

    def leader_throttle_budget(self, topic: str, partition: int, replica: int) -> int | None:
        return None

    def leader_throttle_used(self, nbytes: int) -> None:
        """Never called (nothing is throttled)."""


class LocalReplication(_NoFollowers):
    """The data path's replication of a node alone (module docstring).

    ``view``: the metadata of this cluster of one (:class:`LocalView`).
    ``producers``: the broker's producer state registry, whose entries the partitions
    it takes hold (a registry of its own, in memory, when none is given: a tool's).
    ``counts_synced_only``: whether the high watermark is the durable end
    (:class:`LocalTerm`; ``acks.all.fsync`` and no lazy log.flush.interval.*).
    ``on_partition_changed``: what wakes a partition's long polls (the broker's fetch
    purgatory), told when a sync moved a partition's durable end, and so its high
    watermark (:meth:`log_synced`).

    A node alone leads every partition it holds from the moment it opens its log: made
    over the topic manager, it takes every partition the catalogue loaded, and then
    each one the manager opens (a topic created, partitions added, a log moved to
    another log dir: ``TopicManager.on_partition_opened``) in a :class:`LocalTerm` of
    its log (``Topic.make_leader``). Its term of a partition is that Partition's."""

    def __init__(
        self,
        view: LocalView,
        *,
        producers: ProducerStateRegistry | None = None,
        counts_synced_only: bool = True,
        on_partition_changed: Callable[[str, int], None] | None = None,
    ) -> None:
        self.broker_id = view.broker_id
        self.view = view
        self._topics = view.topic_manager
        if producers is None:
            producers = ProducerStateRegistry(None, self._topics.now_ms)
        self.producers = producers
        self._counts_synced_only = counts_synced_only
        self.on_partition_changed = on_partition_changed
        #: id(log) -> the (topic, partition) of the term made on it, and the log (an id
        #: is reused once its log is gone): a sync of a log (:meth:`log_synced`) names
        #: the partition to wake. Every log this broker holds has a term here (taken
        #: when opened).
        self._partition_of_log: dict[int, tuple[tuple[str, int], Log]] = {}
        #: How many entries there may be before those of deleted logs are dropped
        #: (twice what was left last time: amortized, no walk per take).
        self._prune_at = 1024
        for topic in list(self._topics.topics.values()):  # the catalogue, loaded
            for index in range(len(topic.logs)):
                self.take(topic, index)
        self._topics.on_partition_opened = self.take

    @classmethod
    def over(
        cls, topics: TopicManager, broker_id: int = 0, *,
        producers: ProducerStateRegistry | None = None,
    ) -> LocalReplication:  # fmt: skip
        """A node alone's replication of ``topics`` without listeners: what a tool or a
        test that writes partitions without a broker leads them in."""
        return cls(LocalView(broker_id, None, topics, list), producers=producers)

    def take(self, topic: Topic, index: int) -> None:
        """Lead partition ``index`` of ``topic`` (its log just opened) in a term of its
        own log, with its entry of the producer state."""
        log = topic.logs[index]
        term = LocalTerm(self.broker_id, log, self._counts_synced_only)
        topic.make_leader(index, term, self.producers.entry(topic.name, index))
        if len(self._partition_of_log) >= self._prune_at:  # deleted topics' logs go
            self._partition_of_log = {
                id(held): ((t.name, i), held)
                for t in self._topics.topics.values()
                for i, held in enumerate(t.logs)
            }
            self._prune_at = max(1024, 2 * len(self._partition_of_log))
        self._partition_of_log[id(log)] = ((topic.name, index), log)

    def leader_term(self, topic: str, partition: int) -> LocalTerm | None:
        found = self._topics.topics.get(topic)
        led = None if found is None else found.partitions.get(partition)
        if led is None:
            return None
        term = led.term  # every term taken here is a LocalTerm (take); none is ever dropped
        return None if term is NOT_LED else cast(LocalTerm, term)

    @property
    def counts_synced_only(self) -> bool:
        return self._counts_synced_only

    def log_synced(self, log: object) -> None:
        """The flusher synced ``log``: its durable end moved, and with it (when it
        counts, ``counts_synced_only``) the high watermark of its partition, whose long
        polls look again. Kafka's single broker moves its HW on the append; ours moves
        it on the sync, so without this a consumer's long poll would wait out its
        ``max_wait_ms`` for a record appended while it waited."""
        found = self._partition_of_log.get(id(log))
        if found is None or self.on_partition_changed is None:
            return
        key, held = found
        if held is log:  # not an id another log had
            self.on_partition_changed(*key)

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        # The ISR is this broker: a write is committed once in its log.
        return AckState.DONE

    def commit_state(self, topic: str, partition: int, last_offset: int) -> AckState:
        return AckState.DONE

    def low_watermark(self, topic: str, partition: int) -> int | None:
        log = self._topics.log(topic, partition)
        return None if log is None else log.log_start_offset

    async def wait_low_watermark(self, topic: str, partition: int, offset: int) -> int | None:
        # The only replica: its own log start is the low watermark, already moved.
        return self.low_watermark(topic, partition)

    def replica_high_watermark(self, topic: str, partition: int) -> int | None:
        log = self._topics.log(topic, partition)
        if log is None:
            return None
        return LocalTerm(self.broker_id, log, self._counts_synced_only).high_watermark


class OwnLog:
    """The replication of one log this broker keeps for itself and replicates nowhere:
    a coordinator's file on a node alone (``__consumer_offsets-0``,
    ``__transaction_state-0``), the share-group state. A cluster of one leading that
    log in the local term, whatever partition it is written as: a write keeps its
    batch's epoch (the term is not ``replicated``) and counts once synced."""

    def __init__(self, broker_id: int, log: Log) -> None:
        self.broker_id = broker_id
        self.log = log
        #: Its one term (the log is fixed): a coordinator's write finds its partition's
        #: term unchanged (``partition.coordinator_partition``).
        self._term = LocalTerm(broker_id, log)

    def leader_term(self, topic: str, partition: int) -> LocalTerm:
        return self._term

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        return AckState.DONE


class LeadsNothing(_NoFollowers):
    """A clustered broker's data-path replication while it has no replica manager."""

    def log_synced(self, log: object) -> None:
        """Nothing it leads: nobody to wake."""

    def __init__(self, broker_id: int) -> None:
        self.view = ClusterView(broker_id)

    def leader_term(self, topic: str, partition: int) -> None:
        return None

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """Nothing is coming: a coordinator's partition answers NOT_COORDINATOR."""
        return False

    def replica_high_watermark(self, topic: str, partition: int) -> int | None:
        """Neither leads nor follows: nothing is known committed here."""
        return None

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        return AckState.LEADERSHIP_LOST

    def commit_state(self, topic: str, partition: int, last_offset: int) -> AckState:
        return AckState.LEADERSHIP_LOST

    def low_watermark(self, topic: str, partition: int) -> None:
        return None

    async def wait_low_watermark(self, topic: str, partition: int, offset: int) -> None:
        return None


if TYPE_CHECKING:  # mypy checks that both are the data path's replication
    _LOCAL: type[BrokerReplication] = LocalReplication
    _NOTHING: type[BrokerReplication] = LeadsNothing
    _OWN: type[Replication] = OwnLog
    _TERM: type[Term] = LocalTerm
