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

Sans-I/O: no trio. Opening the log is a file operation the shell runs off the event
loop (``run_off_loop``), and the shell's task status is told when the table is loaded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from trio_broker.replication.leader import AckState
from trio_broker.services.cluster_view import PartitionInfo
from trio_broker.services.local_replication import LOCAL_LEADER_EPOCH, LocalTerm, OwnLog
from trio_broker.storage.log_protocol import Log

if TYPE_CHECKING:
    from trio_broker.partition.append import Replication

__all__ = ["OwnPartition"]

#: A node alone's coordinator topics have one partition: every group, every
#: transactional id is in it.
OWN_PARTITIONS = 1


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
