"""Topic and config administration through one controller interface (issue 29).

The admin handlers (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
IncrementalAlterConfigs, DescribeConfigs, ElectLeaders, the partition reassignments)
check a request and hand the change to ``Services.admin``, a :class:`TopicAdmin`,
never None, as Kafka's request handlers hand theirs to the controller:

- in a cluster, the replica manager's ``ZooKeeperAdmin`` (trio_broker/cluster/
  topic_admin.py): topics and configs are written to ZooKeeper, and what only the
  controller does (elections, moves, deletions) goes to the controller's broker
  (others: NOT_CONTROLLER);
- alone, :class:`LocalAdmin`: a cluster of one, its own controller, which applies each
  change to the local catalogue at once and answers with the codes a cluster would;
- a clustered broker before it joined or after it left, :class:`NotInCluster`: it
  controls nothing and changes nothing.

``applies_at_once`` tells the handler whether a change is done when the call returns
(answer at once, on the handler task) or goes through ZooKeeper (answer from a
``Deferred``, which waits off the handler task).

Sans-I/O: no trio.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import ElectionType
from trio_broker.services.cluster_view import ClusterView, MetadataView
from trio_broker.services.topics import TopicError
from trio_broker.storage.broker_configs import CLUSTER_DEFAULT
from trio_broker.storage.errors import LogError, StorageError

if TYPE_CHECKING:
    from trio_broker.services.local_replication import LocalView
    from trio_broker.services.topics import TopicManager

__all__ = ["Controller", "LocalAdmin", "NotInCluster", "Outcome", "TopicAdmin"]

#: A partition's (or topic's) answer: error code and message.
Outcome = tuple[ErrorCode, str | None]


class Controller(Protocol):
    """What only the controller does (cluster/controller.py's ControllerActions; a node
    alone is its own controller)."""

    async def elect_leaders(
        self, election_type: ElectionType, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], Outcome]:
        """ElectLeaders: each partition's error code and message."""
        ...

    async def alter_reassignments(
        self, moves: dict[tuple[str, int], list[int] | None]
    ) -> dict[tuple[str, int], Outcome]:
        """AlterPartitionReassignments: target replicas (None: cancel) per partition."""
        ...

    async def delete_topic(self, name: str) -> Outcome:
        """DeleteTopics: the topic goes from the cluster."""
        ...


class TopicAdmin(Protocol):
    """Where the admin handlers send a change: ``Services.admin`` (module docstring).

    Every call raises :class:`TopicError` to refuse, with the error code the client
    gets."""

    @property
    def view(self) -> MetadataView:
        """The brokers and topics the request is checked against."""
        ...

    @property
    def controller(self) -> Controller | None:
        """The controller's requests while this broker is the controller, else None
        (NOT_CONTROLLER)."""
        ...

    @property
    def applies_at_once(self) -> bool:
        """True: a change is applied when the call returns (a node alone); False: it
        goes through ZooKeeper, so the handler answers from a Deferred."""
        ...

    @property
    def keeps_group_configs(self) -> bool:
        """Whether group configs (GROUP resources) are this broker's own: a node alone
        keeps them in its data dir; in a cluster they go through
        :meth:`update_group_configs` (ZooKeeper), where every broker reads them."""
        ...

    async def update_group_configs(
        self, group_id: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """A group's configs where every broker sees them: store ``change(current)``
        unless it is None, as :meth:`update_topic_configs` (a cluster only)."""
        ...

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        assignment: dict[int, list[int]] | None,
    ) -> uuid.UUID:
        """Create a topic (placed here, or as ``assignment`` says: replicas by
        partition) and wait until its partitions have leaders; its id."""
        ...

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None, validate_only: bool
    ) -> None:
        """Grow a topic to ``total`` partitions (``assignment``: the new ones' replicas);
        waits for the new leaders. ``validate_only``: check, change nothing."""
        ...

    async def read_topic_configs(self, name: str) -> dict[str, str]:
        """A topic's config overrides as the controller stores them."""
        ...

    async def update_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """Store ``change(current overrides)`` unless it is None; ``change`` may raise
        to refuse (its exception propagates) and is called again after a concurrent
        change."""
        ...

    def topic_configs_stored(self, name: str, configs: dict[str, str]) -> None:
        """``configs`` were stored as topic ``name``'s overrides: this broker's copy
        shows them at once (a cluster's config watch would, a moment later)."""
        ...

    async def update_cluster_default_configs(
        self, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """The dynamic broker configs' cluster-wide default (the BROKER resource ""):
        store ``change(current)`` unless it is None, as :meth:`update_topic_configs`; in
        a cluster every broker applies it, this one at once."""
        ...

    def ensure_internal_topic_soon(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        """Make internal topic ``name`` (``__consumer_offsets``, ``__transaction_state``)
        in the background unless it exists, for FindCoordinator, which answers
        COORDINATOR_NOT_AVAILABLE meanwhile (clients ask again)."""
        ...


def _topic_error(exc: LogError | OSError, doing: str) -> TopicError:
    """A catalogue's refusal or a disk error as the TopicError the client gets."""
    if isinstance(exc, LogError):
        return TopicError(exc.error_code, str(exc))
    return TopicError(StorageError.error_code, f"cannot {doing}: {exc}")


class LocalAdmin:
    """A node alone's admin: a cluster of one broker, its own controller, which changes
    the local catalogue (``TopicManager``) at once."""

    def __init__(self, view: LocalView) -> None:
        self.view = view
        self._topics: TopicManager = view.topic_manager
        self._broker_id = view.broker_id

    @property
    def controller(self) -> LocalAdmin:
        return self

    @property
    def applies_at_once(self) -> bool:
        return True

    @property
    def keeps_group_configs(self) -> bool:
        return True

    def _check_replicas(self, where: str, replicas: list[int]) -> None:
        """A manual assignment on a cluster of one: the replicas are exactly this broker."""
        node = self._broker_id
        if replicas == [node]:
            return
        unknown = sorted(set(replicas) - {node})
        if not replicas:
            reason = "no replicas"
        elif unknown:
            reason = f"unknown broker(s) {unknown}"
        else:
            reason = f"broker {node} listed {len(replicas)} times"
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{where}: {reason}; the replicas must be [{node}], the only broker",
        )

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        assignment: dict[int, list[int]] | None,
    ) -> uuid.UUID:
        # The handler checked the placement against this view: one live broker.
        self._topics.check_new(name, partitions, configs)
        try:
            return self._topics.create(name, partitions, configs).topic_id
        except (LogError, OSError) as exc:  # the catalogue refused, or the disk failed
            raise _topic_error(exc, "create the topic") from None

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None, validate_only: bool
    ) -> None:
        current = len(self._topics.check_new_partitions(name, total).logs)
        if assignment is not None:
            added = total - current
            if len(assignment) != added:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"adding {added} partition(s) needs {added} assignment(s), "
                    f"got {len(assignment)}",
                )
            for offset, replicas in enumerate(assignment):
                self._check_replicas(f"partition {current + offset}", replicas)
        if validate_only:
            return
        try:
            self._topics.add_partitions(name, total)
        except (LogError, OSError) as exc:
            raise _topic_error(exc, "add partitions") from None

    async def read_topic_configs(self, name: str) -> dict[str, str]:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        return dict(topic.info.configs)

    async def update_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        new = change(await self.read_topic_configs(name))
        if new is None:
            return
        try:
            self._topics.set_configs(name, new)
        except (LogError, OSError) as exc:
            raise _topic_error(exc, "store configs") from None

    def topic_configs_stored(self, name: str, configs: dict[str, str]) -> None:
        """Nothing to do: :meth:`update_topic_configs` applied them to the logs."""

    async def update_cluster_default_configs(
        self, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        new = change(self._topics.broker_configs.get(CLUSTER_DEFAULT))
        if new is None:
            return
        try:
            self._topics.set_broker_configs(CLUSTER_DEFAULT, new)
        except OSError as exc:
            raise _topic_error(exc, "store broker configs") from None

    async def update_group_configs(
        self, group_id: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """Never called: a node alone keeps its group configs itself
        (``keeps_group_configs``; handlers/alter_configs.py)."""
        raise TopicError(ErrorCode.INVALID_REQUEST, "group configs are kept by this broker")

    # A node alone keeps its coordinators' state in private files, not in internal
    # topics (services/topics.py RESERVED_TOPICS): there is none to make.

    def ensure_internal_topic_soon(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        """Nothing to make (above)."""

    # The controller of a cluster of one.

    def _exists(self, topic: str, partition: int) -> bool:
        return self._topics.log(topic, partition) is not None

    async def elect_leaders(
        self, election_type: ElectionType, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], Outcome]:
        """This broker leads every partition already: no election is ever needed."""
        return {
            (topic, partition): (ErrorCode.ELECTION_NOT_NEEDED, None)
            if self._exists(topic, partition)
            else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist")
            for topic, partition in partitions
        }

    async def alter_reassignments(
        self, moves: dict[tuple[str, int], list[int] | None]
    ) -> dict[tuple[str, int], Outcome]:
        """Nowhere to move to: only this broker is a valid target (nothing to do)."""
        outcomes: dict[tuple[str, int], Outcome] = {}
        for (topic, partition), target in moves.items():
            if not self._exists(topic, partition):
                outcomes[topic, partition] = (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic}-{partition} does not exist",
                )
            elif target is None:
                outcomes[topic, partition] = (
                    ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                    f"{topic}-{partition} is not moving",
                )
            elif target != [self._broker_id]:
                outcomes[topic, partition] = (
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"broker {self._broker_id} is the only broker",
                )
            else:
                outcomes[topic, partition] = (ErrorCode.NONE, None)
        return outcomes

    async def delete_topic(self, name: str) -> Outcome:
        """The topic's logs are closed and its directories removed at once."""
        try:
            self._topics.delete(name)
        except TopicError as exc:
            return exc.error_code, str(exc)
        except (LogError, OSError) as exc:
            error = _topic_error(exc, "delete the topic")
            return error.error_code, str(error)
        return ErrorCode.NONE, None


class NotInCluster:
    """A clustered broker's admin before it joined and after it left: it sees no
    brokers or topics, is not the controller and changes nothing."""

    def __init__(self, broker_id: int) -> None:
        self.view = ClusterView(broker_id)

    @property
    def controller(self) -> None:
        return None

    @property
    def applies_at_once(self) -> bool:
        return True  # every call refuses at once

    @property
    def keeps_group_configs(self) -> bool:
        return False

    @staticmethod
    def _refuse() -> TopicError:
        return TopicError(ErrorCode.NOT_CONTROLLER, "this broker is not in the cluster")

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        assignment: dict[int, list[int]] | None,
    ) -> uuid.UUID:
        raise self._refuse()

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None, validate_only: bool
    ) -> None:
        raise self._refuse()

    async def read_topic_configs(self, name: str) -> dict[str, str]:
        raise self._refuse()

    async def update_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        raise self._refuse()

    def topic_configs_stored(self, name: str, configs: dict[str, str]) -> None:
        """Never called (nothing is stored)."""

    async def update_cluster_default_configs(
        self, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        raise self._refuse()

    async def update_group_configs(
        self, group_id: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        raise self._refuse()

    def ensure_internal_topic_soon(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        """Nothing is made out of the cluster: FindCoordinator answers
        COORDINATOR_NOT_AVAILABLE and the client asks again."""


if TYPE_CHECKING:  # mypy checks that each is an admin, and a node alone its own controller
    _LOCAL: type[TopicAdmin] = LocalAdmin
    _LOCAL_CONTROLLER: type[Controller] = LocalAdmin
    _NOT_IN_CLUSTER: type[TopicAdmin] = NotInCluster
