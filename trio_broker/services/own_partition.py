"""A node alone's internal partition: a cluster of one for a coordinator (issue 29).

As Kafka's single broker is a replica set of one, a node alone has a coordinator topic
(``__consumer_offsets``, ``__transaction_state``) of one partition, led by this broker
from its start to its end. It is kept outside the topic catalogue, in
``<data_dir>/<topic>-0`` (every data dir written before stays valid), or a ``MemoryLog``
with ``--storage memory``. :class:`OwnPartition` is that partition's replica manager:
run as a broker service right after its coordinator's, it opens the log, elects the
coordinator through the same entry a cluster's replica manager calls (``elected``, a
``LeadershipListener``), then reports started once the coordinator's table is loaded,
so that clients see the coordinator only after. Writes go through it as through a
cluster's leadership: the log's ``OwnLog`` (the term is this broker's, the high
watermark the durable end, a write counts once synced). The coordinators ask it, as they
ask a cluster's replica manager, who leads the partition (this broker) and whether a
leadership is on its way (never: it was there from the start).

Clients see the partition as Kafka's single broker shows its internal topics
(:meth:`OwnPartition.as_topic`): Metadata lists the topic with ``is_internal`` true once
it holds a record (Kafka makes the topic on first use), and Fetch, ListOffsets and
OffsetForLeaderEpoch read it as any partition this broker leads (a consumer may read
``__consumer_offsets``: Kafka's ``OffsetsMessageFormatter`` does). Writes stay the
coordinator's: Produce refuses an internal topic (handlers/produce.py).

Sans-I/O: no trio. Opening the log is a file operation the shell runs off the event
loop (``run_off_loop``), and the shell's task status is told when the table is loaded.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from trio_broker.partition.partition import coordinator_partition
from trio_broker.replication.leader import AckState
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.local_replication import LOCAL_LEADER_EPOCH, LocalTerm, OwnLog
from trio_broker.services.topics import Topic
from trio_broker.storage.catalogue import TopicInfo
from trio_broker.storage.log_protocol import Log

if TYPE_CHECKING:
    from trio_broker.partition.append import Replication

__all__ = ["OwnPartition"]

#: A node alone's coordinator topics have one partition: every group, every
#: transactional id is in it.
OWN_PARTITIONS = 1
#: The namespace of a node alone's internal topic ids: the id is derived from the name,
#: so that it stays the same across restarts (no catalogue entry keeps it), as a
#: cluster's stays in ZooKeeper.
_INTERNAL_TOPIC_IDS = uuid.UUID("5f0c4a52-7a5e-4c55-9d2e-1b1c1f0a3e10")


def internal_topic_id(topic: str) -> uuid.UUID:
    return uuid.uuid5(_INTERNAL_TOPIC_IDS, topic)


class Started(Protocol):
    """The shell's task status (``trio.TaskStatus[None]``)."""

    def started(self) -> None: ...


class Elects(Protocol):
    """The coordinator this leadership elects (``LeadershipListener.elected``)."""

    def __call__(self, partition: int, leader_epoch: int, log: Log, /) -> None: ...


class OwnPartition:
    """The leadership of a node alone's partition 0 of ``topic`` (module docstring)."""

    def __init__(
        self,
        topic: str,
        broker_id: int,
        open_log: Callable[[], Log],
        *,
        run_off_loop: Callable[[Callable[[], Log]], Awaitable[Log]],
    ) -> None:
        self.topic = topic
        self.broker_id = broker_id
        self._open_log = open_log
        self._run_off_loop = run_off_loop
        #: Set by the wiring once the coordinator is made: who this leadership elects
        #: and how it learns that the table is loaded (False: it could not be).
        self.elect: Elects | None = None
        self.wait_loaded: Callable[[], Awaitable[bool]] | None = None
        self._own: OwnLog | None = None
        me = (broker_id,)
        self._info = PartitionInfo(me, broker_id, LOCAL_LEADER_EPOCH, me)
        self.topic_id = internal_topic_id(topic)
        #: The partition as clients read it (:meth:`as_topic`), made once it is led.
        self._topic: Topic | None = None

    @property
    def log(self) -> Log | None:
        return None if self._own is None else self._own.log

    async def run(self, task_status: Started) -> None:
        """Open the log, elect the coordinator, and report started once it is loaded;
        nothing is left to do after that (the leadership never moves)."""
        wait_loaded = self.wait_loaded
        assert wait_loaded is not None, "set by the wiring"
        self.lead(await self._run_off_loop(self._open_log))
        if not await wait_loaded():
            # A broker alone without its coordinator's table is not started.
            raise RuntimeError(f"could not load {self.topic}-0 (see the log)")
        task_status.started()

    def lead(self, log: Log) -> None:
        """Lead the opened log from now on: the coordinator is elected (its table loads)."""
        assert self.elect is not None, "set by the wiring"
        self._own = OwnLog(self.broker_id, log)
        self.elect(0, LOCAL_LEADER_EPOCH, log)

    def close(self) -> None:
        if self._own is not None:
            self._own.log.close()
            self._own = None
            self._topic = None

    def as_topic(self) -> Topic | None:
        """The topic of one partition clients read, led here (the coordinator's own
        :class:`~trio_broker.partition.partition.Partition` of the log, in this broker's
        term); None before the log is open or after it is closed."""
        own = self._own
        if own is None:
            return None
        if self._topic is None or self._topic.logs[0] is not own.log:
            info = TopicInfo(
                name=self.topic, topic_id=self.topic_id, partitions=OWN_PARTITIONS,
                configs={"cleanup.policy": "compact"},
            )  # fmt: skip
            led = coordinator_partition(self, self.topic, 0, own.log)
            self._topic = Topic(info, [own.log], {0: led})
        return self._topic

    def listed(self) -> bool:
        """Whether Metadata lists the topic: Kafka makes an internal topic on its first
        use, so a coordinator's partition that never held a record is not there yet."""
        own = self._own
        return own is not None and own.log.log_end_offset > 0

    # What a coordinator asks its partitions' leadership (a cluster's replica manager).

    def _mine(self, topic: str, partition: int) -> bool:
        return topic == self.topic and partition == 0

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return self._info if self._mine(topic, partition) else None

    def about_to_lead(self, topic: str, partition: int) -> bool:
        """Led from the start: nothing is on its way."""
        return False

    def leader_term(self, topic: str, partition: int) -> LocalTerm | None:
        own = self._own
        return own.leader_term(topic, partition) if own and self._mine(topic, partition) else None

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        # The ISR is this broker: a write is committed once in its log.
        return AckState.DONE


if TYPE_CHECKING:  # mypy checks that the coordinators can write through it
    _OWN: type[Replication] = OwnPartition
