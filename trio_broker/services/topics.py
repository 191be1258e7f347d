"""The broker's topics and their partition logs (file or memory backed).

Topic metadata lives in the storage catalogue (file mode) or in a dict
(memory mode); each partition has one log. Kafka's naming rules for topics
apply here once, for every API that creates topics.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from trio_broker.partition.append import NotLeader
from trio_broker.partition.partition import (
    NOT_LED,
    Follows,
    Partition,
    PartitionProducers,
    take_partition,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.storage.broker_configs import BrokerConfigStore
from trio_broker.storage.catalogue import Catalogue, TopicInfo
from trio_broker.storage.catalogue import validate_topic_name as catalogue_rules
from trio_broker.storage.errors import InvalidConfigError, InvalidTopicError
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.log_dir_state import LogDirs
from trio_broker.storage.log_dirs import find_partition_dir, recover_moves
from trio_broker.storage.log_dirs import move_partition as move_partition_dir
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.memory import MemoryLog
from trio_broker.storage.topic_configs import check_topic_configs
from trio_broker.storage.topic_configs import log_config as topic_log_config

if TYPE_CHECKING:
    from trio_broker.partition.append import Term


class TopicError(KafkaError):
    """A topic operation Kafka refuses: ``TopicError(error_code, message)``."""


#: Internal topics whose directories the broker owns (committed group offsets,
#: transaction state, the share coordinator's share state).
RESERVED_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
#: Most partitions one topic may have (CreateTopics and CreatePartitions).
MAX_PARTITIONS = 10_000


def validate_topic_name(name: str) -> None:
    """Kafka's rules for a topic a client may create or name (storage/catalogue.py's),
    and no internal topic."""
    if name in RESERVED_TOPICS:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"{name} is an internal topic")
    try:
        catalogue_rules(name)
    except InvalidTopicError as exc:
        raise TopicError(exc.error_code, str(exc)) from None


@attrs.define
class Topic:
    info: TopicInfo
    logs: list[Log]  # one per partition
    #: This broker's :class:`Partition` of each partition it leads or follows (index ->
    #: it): made when the broker takes the partition (:meth:`make_leader`: a node alone
    #: when it opens the log, a cluster's replica manager when it becomes leader;
    #: :meth:`make_follower`: a cluster's replica manager when it becomes a follower),
    #: kept for the life of its log across roles (the same object takes a leader term,
    #: loses it, follows), dropped when the broker holds no role in it any more
    #: (:meth:`drop_partition`: the cluster moving the partition away, a log put in
    #: another's place) and with the topic (a deletion). :meth:`leading` and
    #: :meth:`replica` only look it up.
    partitions: dict[int, Partition] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def name(self) -> str:
        return self.info.name

    def _held(self, index: int, producers: PartitionProducers) -> Partition | None:
        """The :class:`Partition` held on partition ``index``'s current log (its
        producer state entry replaced by ``producers``), or None: none yet, or the one
        held is on a log put in another's place since (a log-dir move)."""
        held = self.partitions.get(index)
        if held is None or held.log is not self.logs[index]:
            return None
        held.producers = producers
        return held

    def make_leader(self, index: int, term: Term, producers: PartitionProducers) -> Partition:
        """This broker takes partition ``index`` (in range) to lead in ``term``, with its
        entry of the producer state: a caller of ``take_partition``
        (``partition/partition.py``), called by the replication when it takes the
        partition (``LocalReplication`` for a node alone, ``ReplicaManager._become_leader``
        in a cluster), never on a lookup. The :class:`Partition` it held on the same log,
        as leader or follower, stays, in ``term`` (Kafka's makeLeader on an existing
        Partition); a log put in another's place gets a new one."""
        held = self._held(index, producers)
        if held is None:
            held = take_partition(self.name, index, self.logs[index], producers, term)
            self.partitions[index] = held
        else:  # a new term of the same partition, or a follower promoted
            held.term, held.follows = term, None
        return held

    def make_follower(
        self, index: int, follows: Follows, producers: PartitionProducers
    ) -> Partition:
        """This broker takes partition ``index`` (in range) to follow ``follows.leader``
        in ``follows.leader_epoch`` (Kafka's makeFollower): the other caller of
        ``take_partition``, called by a cluster's replica manager when it becomes a
        follower. The :class:`Partition` it held on the same log stays, with no term
        (a leader demoted); a log put in another's place gets a new one. The replica
        fetcher writes and truncates the log through it (``Partition.append_as_follower``,
        ``truncate_to``, ``truncate_fully_and_start_at``)."""
        held = self._held(index, producers)
        if held is None:
            held = take_partition(self.name, index, self.logs[index], producers, NOT_LED, follows)
            self.partitions[index] = held
        else:
            held.term, held.follows = NOT_LED, follows
        return held

    def stop_leading(self, index: int) -> None:
        """This broker's term of partition ``index`` ended: its :class:`Partition` stays
        (a follower next, or without a role until the cluster names one) with no term,
        so that :meth:`leading` finds it led no more."""
        held = self.partitions.get(index)
        if held is not None:
            held.term = NOT_LED

    def leading(self, index: int) -> Partition:
        """Partition ``index`` as this broker leads it: the one lookup of a catalogue
        partition to write or read (``partition/partition.py``), called by the
        per-partition guard and by the marker writer. Raises
        :class:`~trio_broker.partition.append.NotLeader` when this broker has not taken it
        to lead (it leads elsewhere or nowhere: it follows, or holds no role)."""
        led = self.partitions.get(index)
        if led is None or led.term is NOT_LED:  # none, or a follower's
            raise NotLeader(f"not the leader of {self.name}-{index}")
        return led

    def replica(self, index: int) -> Partition | None:
        """Partition ``index`` as this broker holds it, led or followed (Kafka's
        ``getPartition``): the replica fetcher's lookup of the partition it copies
        into. None when this broker has taken no role in it on its current log."""
        held = self.partitions.get(index)
        if held is None or held.log is not self.logs[index]:
            return None
        return held

    def drop_partition(self, index: int) -> None:
        """This broker holds partition ``index`` no more as it was (the cluster moved it
        away, or its log was put in another's place): its :class:`Partition` goes, a
        later role here takes another."""
        self.partitions.pop(index, None)

    @property
    def topic_id(self) -> uuid.UUID:
        return self.info.topic_id


class TopicManager:
    """Creates, opens and deletes topics; finds a partition's log."""

    def __init__(
        self,
        data_dir: Path | None,
        defaults: LogConfig,
        now_ms: Any,
        log_dirs: Sequence[Path] = (),
    ) -> None:
        self.data_dir = data_dir
        #: Every log dir, absolute (log.dirs; the first is ``data_dir``, which alone holds
        #: the catalogue and the broker-wide files). Empty in memory mode.
        self.log_dirs: list[Path] = []
        if data_dir is not None:
            for d in (data_dir, *log_dirs):
                if Path(os.path.abspath(d)) not in self.log_dirs:
                    self.log_dirs.append(Path(os.path.abspath(d)))
            recover_moves(self.log_dirs)  # before the catalogue and any log looks
        #: Partitions per log dir (placement: the fewest first).
        self.dir_counts: dict[Path, int] = dict.fromkeys(self.log_dirs, 0)
        #: Whether each log dir is online, shared by the logs in it: a disk error in
        #: one takes the whole dir offline (storage/log_dir_state.py).
        self.dir_states = LogDirs(self.log_dirs)
        #: The log defaults of the broker's config file; dynamic broker configs go on top.
        self.static_defaults = defaults
        self.now_ms = now_ms
        self.catalogue = Catalogue(data_dir, self.log_dirs) if data_dir is not None else None
        self.broker_configs = BrokerConfigStore(data_dir)
        self.defaults = topic_log_config(self.broker_configs.effective(), defaults)
        self.topics: dict[str, Topic] = {}
        #: Called after the dynamic broker configs changed (the replica manager applies
        #: a new min.insync.replicas default to its leader terms).
        self.on_broker_configs_changed: Callable[[], None] = lambda: None
        #: Called with each log a topic deletion closes (the broker points it at
        #: Flusher.forget, so produces waiting on that log fail instead of hanging).
        self.on_log_closed: Callable[[Log], None] | None = None
        #: Called with (topic, partition) for each partition of a deleted topic (the
        #: long polls waiting on it answer).
        self.on_partition_deleted: Any = None
        #: Called with the id of each deleted topic, once its logs are closed (the share
        #: groups drop their state of it).
        self.on_topic_deleted: Callable[[uuid.UUID], None] | None = None
        #: Called with (topic, index) for each partition log put in place after this
        #: manager was made: a topic created, a partition added, a log moved to another
        #: log dir. The replication takes the partitions it leads there (a node alone
        #: all of them; a cluster's leader a moved log it leads): no lookup takes one.
        #: The catalogue's topics, opened here before anyone could be told, are taken
        #: by the replication when it is made over this manager.
        self.on_partition_opened: Callable[[Topic, int], None] | None = None
        self.by_id: dict[uuid.UUID, Topic] = {}
        if self.catalogue is not None:
            for info in self.catalogue.topics():
                self._open(info)

    def log_config(self, configs: dict[str, str]) -> LogConfig:
        """The log settings of a topic with ``configs`` (storage/topic_configs.py)."""
        return topic_log_config(configs, self.defaults)

    def _open_log(self, name: str, partition: int, config: LogConfig) -> Log:
        if self.data_dir is None:
            return MemoryLog(config)
        dir_name = f"{name}-{partition}"
        log_dir = find_partition_dir(self.log_dirs, dir_name)
        if log_dir is None:  # a new partition: an online dir (NoOnlineLogDir if none is)
            log_dir = self.dir_states.choose(self.dir_counts)
        log = PartitionLog.open(
            log_dir / dir_name, config, now_ms=self.now_ms,
            dir_state=self.dir_states.state(log_dir),
        )  # fmt: skip
        self.dir_counts[log_dir] += 1
        return log

    def log_dir_of(self, log: Log) -> Path | None:
        """The log dir ``log`` is in (None for a memory log)."""
        if not isinstance(log, PartitionLog):
            return None
        return Path(os.path.abspath(log.directory.parent))

    def move_partition(
        self, name: str, partition: int, log_dir: Path, *, step: Callable[[str], None] | None = None
    ) -> Log:
        """Move a partition's log into another of the broker's log dirs (storage/log_dirs.py).

        Blocking: the log is closed (flushed, clean-shutdown marker) for the copy and
        reopened from its new place, so no append can slip in between. The caller makes
        sure every append so far is durable first (no produce waits on the old log).
        """
        topic = self.topics[name]
        old = topic.logs[partition]
        source = self.log_dir_of(old)
        assert isinstance(old, PartitionLog) and source is not None
        if self.on_log_closed is not None:
            self.on_log_closed(old)
        old.close()
        try:
            move_partition_dir(old.directory, log_dir, step=step)
        finally:
            # Done or not, reopen the one copy: after an error midway, settle the move
            # first as a restart would (a failed copy leaves the source whole).
            recover_moves(self.log_dirs)
            where = find_partition_dir(self.log_dirs, f"{name}-{partition}") or source
            new = PartitionLog.open(
                where / f"{name}-{partition}", old.config, now_ms=self.now_ms,
                dir_state=self.dir_states.state(where),
            )  # fmt: skip
            logs = list(topic.logs)  # replaced, not changed: readers may hold the old list
            logs[partition] = new
            topic.logs = logs
            topic.drop_partition(partition)  # it held the closed log
            self.dir_counts[source] -= 1
            self.dir_counts[where] += 1
            self._opened(topic, range(partition, partition + 1))
        return new

    def _open(self, info: TopicInfo) -> Topic:
        config = self.log_config(info.configs)
        logs = [self._open_log(info.name, p, config) for p in range(info.partitions)]
        topic = Topic(info, logs)
        self.topics[info.name] = topic
        self.by_id[info.topic_id] = topic
        self._opened(topic, range(len(logs)))
        return topic

    def _opened(self, topic: Topic, indexes: range) -> None:
        """Tell :attr:`on_partition_opened` of the logs just put at ``indexes``."""
        if self.on_partition_opened is not None:
            for index in indexes:
                self.on_partition_opened(topic, index)

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def log(self, name: str, partition: int) -> Log | None:
        topic = self.topics.get(name)
        if topic is None or not 0 <= partition < len(topic.logs):
            return None
        return topic.logs[partition]

    def check_new(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        """Raise TopicError if the topic cannot be created as asked."""
        validate_topic_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if partitions <= 0 or partitions > MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"partitions must be in 1..{MAX_PARTITIONS}"
            )
        self.check_configs(configs)

    def check_configs(self, configs: dict[str, str]) -> None:
        """Raise TopicError(INVALID_CONFIG) unless a topic accepts ``configs`` whole."""
        try:
            check_topic_configs(configs)
        except InvalidConfigError as exc:
            raise TopicError(exc.error_code, str(exc)) from None

    def create(
        self,
        name: str,
        partitions: int,
        configs: dict[str, str] | None = None,
        *,
        topic_id: uuid.UUID | None = None,
        internal: bool = False,
    ) -> Topic:
        """``topic_id``: the cluster's id for a replicated topic (a new one if None).
        ``internal``: the cluster's own ``__consumer_offsets`` / ``__transaction_state``
        (services/internal_topics.py), which clients may not create."""
        configs = dict(configs or {})
        if internal and name in RESERVED_TOPICS and name not in self.topics:
            self.check_configs(configs)
        else:
            self.check_new(name, partitions, configs)
        self.check_room()
        if self.catalogue is not None:
            info = self.catalogue.create_topic(name, partitions, configs, topic_id=topic_id)
        else:
            info = TopicInfo(
                name=name, topic_id=topic_id or uuid.uuid4(), partitions=partitions,
                configs=configs,
            )  # fmt: skip
        return self._open(info)

    def check_room(self) -> None:
        """Raise TopicError(KAFKA_STORAGE_ERROR) when every log dir is offline: a new
        partition has nowhere to go (storage/log_dir_state.py)."""
        if self.log_dirs and not self.dir_states.online():
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                "every log dir is offline after a disk error: no partition can be created",
            )

    def check_new_partitions(self, name: str, total: int) -> Topic:
        """Raise TopicError unless topic ``name`` can grow to ``total`` partitions."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        self.check_partition_count(name, len(topic.logs), total)
        return topic

    @staticmethod
    def check_partition_count(name: str, current: int, total: int) -> None:
        """Kafka's rules for growing a topic of ``current`` partitions to ``total``."""
        if total == current:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"topic {name!r} already has {current} partition(s)"
            )
        if total < current:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {current} partition(s); {total} would not be an increase "
                "(partitions are never removed)",
            )
        if total > MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"a topic has at most {MAX_PARTITIONS} partitions"
            )

    def add_partitions(self, name: str, total: int) -> Topic:
        """Grow topic ``name`` to ``total`` partitions (CreatePartitions).

        File mode: the new partitions' logs are created (each directory made
        durable) before the catalogue records the new count, which commits the
        growth (``Catalogue.add_partitions``): a crash leaves the old count or
        the new one, and an error leaves the old count in the catalogue and here.
        The topic's log list is replaced, not extended, so a reader holding the
        old list never sees it change.
        """
        topic = self.check_new_partitions(name, total)
        self.check_room()
        config = self.log_config(topic.info.configs)
        opened: list[Log] = []

        def open_logs(added: range) -> None:
            for partition in added:
                opened.append(self._open_log(name, partition, config))

        try:
            if self.catalogue is not None:
                info = self.catalogue.add_partitions(name, total, prepare=open_logs)
            else:
                open_logs(range(len(topic.logs), total))
                info = attrs.evolve(topic.info, partitions=total)
        except BaseException:
            for log in opened:
                log.abort()  # empty, and maybe already discarded: nothing to flush
            raise
        grown = range(len(topic.logs), total)
        topic.logs = [*topic.logs, *opened]
        topic.info = info
        self._opened(topic, grown)
        return topic

    def set_configs(self, name: str, configs: dict[str, str]) -> Topic:
        """Replace a topic's config overrides (AlterConfigs): persist, then apply to its logs."""
        topic = self.topics[name]
        self.check_configs(configs)
        log_config = self.log_config(configs)
        if self.catalogue is not None:
            topic.info = self.catalogue.set_configs(name, configs)
        else:
            topic.info = attrs.evolve(topic.info, configs=dict(configs))
        for log in topic.logs:
            log.config = log_config
        return topic

    def set_broker_configs(self, level: str, configs: dict[str, str]) -> None:
        """Replace one level of dynamic broker configs: persist, then apply to every log
        (a topic's own configs still win over the new defaults)."""
        try:
            self.broker_configs.set(level, configs)
        except InvalidConfigError as exc:
            raise TopicError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        self.defaults = topic_log_config(self.broker_configs.effective(), self.static_defaults)
        for topic in self.topics.values():
            log_config = self.log_config(topic.info.configs)
            for log in topic.logs:
                log.config = log_config
        self.on_broker_configs_changed()

    def delete(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        self.by_id.pop(topic.topic_id, None)
        for index, log in enumerate(topic.logs):
            if self.on_log_closed is not None:
                self.on_log_closed(log)
            log.close()
            if (log_dir := self.log_dir_of(log)) is not None:
                self.dir_counts[log_dir] -= 1
            if self.on_partition_deleted is not None:
                self.on_partition_deleted(name, index)
        if self.catalogue is not None:
            self.catalogue.delete_topic(name)
        for log in topic.logs:
            if isinstance(log, PartitionLog):
                shutil.rmtree(log.directory, ignore_errors=True)
        if self.on_topic_deleted is not None:
            self.on_topic_deleted(topic.topic_id)

    def all_logs(self) -> list[Log]:
        return [log for topic in self.topics.values() for log in topic.logs]

    def key_of(self, log: Log) -> tuple[str, int] | None:
        """The (topic, partition) whose log ``log`` is (None: an internal topic's log, or
        one deleted or moved meanwhile). A walk over every partition: for the cleaner's
        calls, once per log it cleans, never per request."""
        for name, topic in self.topics.items():
            for index, candidate in enumerate(topic.logs):
                if candidate is log:
                    return name, index
        return None

    def close(self) -> None:
        for log in self.all_logs():
            log.close()
