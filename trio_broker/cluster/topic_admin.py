"""The cluster's topic and config administration through ZooKeeper (issue 29).

:class:`ZooKeeperAdmin` is ``Services.admin`` in a cluster (services/topic_admin.py's
``TopicAdmin``; a node alone's is ``LocalAdmin``): the admin handlers hand it their
changes after their checks.

- A topic is created by writing its assignment (placed by
  ``replication/controller_rules.assign_replicas``, or as asked) and its configs; the
  controller gives its partitions leaders, every replica makes its log when the topic
  appears in its view, and the call waits for those leaders. Internal topics are made
  the same way on first use (``ensure_internal_topic``).
- A topic grows by a conditional update of its znode (CreatePartitions).
- A topic's configs are read and written conditionally on their znode's version, from
  any broker; every replica's config watch (the replica manager's) applies them.
- What only the controller does (elections, moves, deletions) is ``controller``, the
  controller's actions while this broker is the controller.

What it needs of the replica manager that owns it is :class:`AdminHost`.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import trio

from trio_broker.cluster.coordination import (
    BadVersion,
    Coordination,
    CoordinationError,
    NodeExists,
    NoNode,
)
from trio_broker.cluster.waiting import Watch
from trio_broker.cluster.zk_layout import (
    BROKER_DEFAULT_CONFIG,
    CoordinationDataError,
    TopicAssignment,
    group_config_path,
    topic_config_path,
    topic_path,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    InvalidReplicationFactor,
    assign_replicas,
)
from trio_broker.services.cluster_view import ClusterView
from trio_broker.services.topics import TopicError, TopicManager

if TYPE_CHECKING:
    from trio_broker.cluster.controller import ControllerActions
    from trio_broker.services.topic_admin import TopicAdmin

__all__ = ["AdminHost", "ZooKeeperAdmin", "decode_configs", "encode_configs"]

log = logging.getLogger(__name__)

#: How long CreateTopics waits for the controller to give every new partition a leader.
CREATE_WAIT_S = 15.0
#: Conditional writes of a topic's config znode tried before giving up (each retry
#: follows another broker's change of the same znode).
CONFIG_WRITE_ATTEMPTS = 20


class AdminHost(Protocol):
    """What the admin needs of the replica manager (cluster/replica_manager.py)."""

    view: ClusterView
    coord: Coordination
    topics: TopicManager
    #: The controller's actions while this broker is the controller, else None.
    controller: ControllerActions | None
    #: The cluster topics this broker holds a copy of.
    local_copies: set[str]

    def view_event(self) -> Watch:
        """Set at the next change of the view."""
        ...

    def apply_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Topic ``name``'s stored overrides: to this broker's copy and leader terms."""
        ...

    def apply_cluster_default_configs(self, configs: dict[str, str]) -> None:
        """The cluster-wide default of the dynamic broker configs, as ZooKeeper has it."""
        ...

    def background(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Start ``task`` in the manager's nursery; False if it is not running."""
        ...


class ZooKeeperAdmin:
    """A cluster's ``TopicAdmin`` (module docstring)."""

    def __init__(self, host: AdminHost) -> None:
        self._host = host
        #: Internal topics being made by ensure_internal_topic_soon.
        self._ensuring: set[str] = set()

    @property
    def view(self) -> ClusterView:
        return self._host.view

    @property
    def coord(self) -> Coordination:
        return self._host.coord

    @property
    def topics(self) -> TopicManager:
        return self._host.topics

    @property
    def controller(self) -> ControllerActions | None:
        return self._host.controller

    @property
    def applies_at_once(self) -> bool:
        """Admin changes go through ZooKeeper: the handlers answer from a Deferred."""
        return False

    @property
    def keeps_group_configs(self) -> bool:
        """In ZooKeeper (``/config/groups/<group>``, :meth:`update_group_configs`), where
        every broker's group config watch reads them (Kafka keeps them in its metadata
        log)."""
        return False

    async def update_group_configs(
        self, group_id: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """Store ``change(current)`` as the group's configs, conditionally on the znode's
        version (a concurrent change is never lost); an empty set is stored as such."""
        await self._change_configs(
            group_config_path(group_id), change, f"configs of group {group_id}"
        )

    def view_event(self) -> Watch:
        return self._host.view_event()

    def _has_leaders(self, name: str, partitions: int) -> bool:
        topic = self.view.topics.get(name)
        return (
            topic is not None
            and len(topic.partitions) == partitions
            and all(info.leader != NO_LEADER for info in topic.partitions.values())
        )

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        assignment: dict[int, list[int]] | None,
    ) -> uuid.UUID:
        """Write a topic's assignment and configs to ZooKeeper (the controller gives its
        partitions leaders) and wait, at most CREATE_WAIT_S, for those leaders; its id."""
        brokers = {b.broker_id: b.rack for b in self.view.brokers.values()}
        if assignment is None:
            try:
                replicas = assign_replicas(
                    partitions, replication_factor, brokers,
                    start_index=random.randrange(max(len(brokers), 1)),
                )  # fmt: skip
            except InvalidReplicationFactor as exc:
                raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR, str(exc)) from None
            assignment = dict(enumerate(replicas))
        for p, reps in assignment.items():
            unknown = [b for b in reps if b not in brokers]
            if not reps or len(set(reps)) != len(reps) or unknown:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {p}: replicas {reps} must be distinct live brokers",
                )
        topic = TopicAssignment(uuid.uuid4(), {p: tuple(r) for p, r in assignment.items()})
        # An existing topic's configs must stay: a broker whose view lags creates a topic
        # a Metadata request names (auto-creation, with no configs) that already exists.
        if await self.coord.get(topic_path(name)) is not None:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        try:
            await self.coord.create(topic_config_path(name), encode_configs(configs))
        except NodeExists:
            pass  # left by a creation that failed half-way; overwritten below
        await self.coord.set(topic_config_path(name), encode_configs(configs), -1)
        try:
            await self.coord.create(topic_path(name), topic.encode())
        except NodeExists:
            raise TopicError(
                ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            ) from None
        with trio.move_on_after(CREATE_WAIT_S):
            while not self._has_leaders(name, len(assignment)):
                await self.view_event().wait()
        return topic.topic_id

    async def ensure_internal_topic(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> bool:
        """Create internal topic ``name`` (``__consumer_offsets``, ``__transaction_state``)
        in the cluster unless it exists; True once every partition has a leader.

        As Kafka, the topic is made on first use (FindCoordinator) with its full
        replication factor: while fewer brokers are alive, TopicError
        COORDINATOR_NOT_AVAILABLE, and clients retry.
        """
        topic = self.view.topics.get(name)
        if topic is None:
            if len(self.view.brokers) < replication_factor:
                raise TopicError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"{name} needs {replication_factor} live brokers, "
                    f"{len(self.view.brokers)} are alive",
                )
            try:
                await self.create_topic(name, partitions, replication_factor, configs, None)
            except TopicError as exc:
                if exc.error_code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
            topic = self.view.topics.get(name)
            if topic is None:
                return False
        return self._has_leaders(name, len(topic.partitions))

    def ensure_internal_topic_soon(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> None:
        """:meth:`ensure_internal_topic` in the background, for a caller that cannot wait
        (FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile; clients retry)."""
        if name in self._ensuring:
            return

        async def ensure() -> None:
            try:
                await self.ensure_internal_topic(name, partitions, replication_factor, configs)
            except (TopicError, CoordinationError) as exc:  # e.g. too few live brokers yet
                log.info("internal topic %s not made yet: %s", name, exc)
            except Exception:  # a lookup asks again: never the manager's nursery's end
                log.exception("could not make internal topic %s", name)
            finally:
                self._ensuring.discard(name)

        if self._host.background(ensure):
            self._ensuring.add(name)

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None, validate_only: bool
    ) -> None:
        """Grow a cluster topic to ``total`` partitions: the new replica lists go into the
        topic's znode (a conditional update), the controller gives them leaders, and the
        replicas create their logs, as for a new topic. Waits for the leaders."""
        try:
            await self._grow_topic(name, total, assignment, validate_only)
        except (CoordinationError, CoordinationDataError) as exc:
            raise TopicError(ErrorCode.UNKNOWN_SERVER_ERROR, f"ZooKeeper: {exc}") from None
        if validate_only:
            return
        with trio.move_on_after(CREATE_WAIT_S):
            while not self._has_leaders(name, total):
                await self.view_event().wait()

    async def _grow_topic(
        self, name: str, total: int, assignment: list[list[int]] | None, validate_only: bool
    ) -> None:
        path = topic_path(name)
        while True:
            node = await self.coord.get(path)
            if node is None:
                raise TopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            current = TopicAssignment.decode(node.data, path)
            count = len(current.partitions)
            self.topics.check_partition_count(name, count, total)
            added = self._new_replicas(current, total, assignment)
            if validate_only:
                return
            partitions = {**current.partitions, **added}
            grown = TopicAssignment(current.topic_id, partitions, current.adding, current.removing)
            try:
                await self.coord.set(path, grown.encode(), node.version)
                return
            except BadVersion:
                continue  # a move or another growth came first: decide again

    def _new_replicas(
        self, current: TopicAssignment, total: int, assignment: list[list[int]] | None
    ) -> dict[int, tuple[int, ...]]:
        count = len(current.partitions)
        brokers = {b.broker_id: b.rack for b in self.view.brokers.values()}
        factor = len(current.target(0))
        if assignment is None:
            try:
                lists = assign_replicas(
                    total - count, factor, brokers,
                    start_index=random.randrange(max(len(brokers), 1)), first_partition=count,
                )  # fmt: skip
            except InvalidReplicationFactor as exc:
                raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR, str(exc)) from None
            return {count + i: tuple(r) for i, r in enumerate(lists)}
        if len(assignment) != total - count:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"adding {total - count} partition(s) needs as many assignments, got "
                f"{len(assignment)}",
            )
        for offset, replicas in enumerate(assignment):
            unknown = sorted(set(replicas) - set(brokers))
            if not replicas or len(set(replicas)) != len(replicas) or unknown:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {count + offset}: replicas {replicas} must be distinct live "
                    "brokers",
                )
            if len(replicas) != factor:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {count + offset}: {len(replicas)} replicas, the topic has {factor}",
                )
        return {count + i: tuple(r) for i, r in enumerate(assignment)}

    def topic_configs_stored(self, name: str, configs: dict[str, str]) -> None:
        """An AlterConfigs this broker took stored ``configs`` in ZooKeeper: its copy
        shows them at once. The config watch applies any later change (a read of an
        older value still in flight is followed by the watch this write fired)."""
        if name in self._host.local_copies:
            self._host.apply_topic_configs(name, configs)

    async def update_cluster_default_configs(
        self, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """The dynamic broker configs' cluster-wide default, stored in ZooKeeper as
        Kafka's entity-default znode, conditionally on its version (a concurrent change
        is decided again); every broker's config watch applies it, this one at once."""
        new = await self._change_configs(BROKER_DEFAULT_CONFIG, change, "broker default configs")
        if new is not None:
            self._host.apply_cluster_default_configs(new)

    async def read_topic_configs(self, name: str) -> dict[str, str]:
        """A cluster topic's config overrides as ZooKeeper holds them (DescribeConfigs on
        a broker without a copy). UNKNOWN_TOPIC_OR_PARTITION if the topic is gone."""
        configs: dict[str, str] = {}

        def keep(current: dict[str, str]) -> None:
            configs.update(current)

        await self.update_topic_configs(name, keep)
        return configs

    async def update_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> None:
        """Read topic ``name``'s config overrides from ZooKeeper and store
        ``change(current)`` in their place, unless it is None (nothing to write: a
        validation, a read). The write is conditional on the znode's version, so a
        concurrent change is never lost: ``change`` is then called again on the new
        value. ``change`` may raise to refuse (its exception propagates). Every
        replica's config watch applies the stored value (AlterConfigs on any broker)."""

        async def topic_exists() -> None:
            if await self.coord.get(topic_path(name)) is None:
                raise TopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )

        await self._change_configs(
            topic_config_path(name), change, f"configs of {name}", before=topic_exists
        )

    async def _change_configs(
        self,
        path: str,
        change: Callable[[dict[str, str]], dict[str, str] | None],
        what: str,
        *,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> dict[str, str] | None:
        """Store ``change(current)`` in the config znode at ``path``, conditionally on its
        version: a concurrent change is never lost, ``change`` is called again on the new
        value. Returns what was stored; None (and nothing written) when ``change`` gave
        None. ``before`` runs ahead of each read (it may raise to refuse)."""
        try:
            for _ in range(CONFIG_WRITE_ATTEMPTS):
                if before is not None:
                    await before()
                node = await self.coord.get(path)
                new = change(decode_configs(node.data) if node is not None else {})
                if new is None:
                    return None
                try:
                    if node is None:
                        await self.coord.create(path, encode_configs(new))
                    else:
                        await self.coord.set(path, encode_configs(new), node.version)
                except (BadVersion, NodeExists, NoNode):
                    continue  # changed meanwhile: decide again on the new value
                return new
        except CoordinationError as exc:
            raise TopicError(ErrorCode.UNKNOWN_SERVER_ERROR, f"ZooKeeper, {what}: {exc}") from None
        raise TopicError(ErrorCode.UNKNOWN_SERVER_ERROR, f"the {what} kept changing; try again")


def encode_configs(configs: dict[str, str]) -> bytes:
    """A topic's config znode (Kafka's layout)."""
    return json.dumps({"version": 1, "config": configs}, sort_keys=True).encode()


def decode_configs(raw: bytes) -> dict[str, str]:
    """A topic's overrides from its config znode ({} if unreadable)."""
    try:
        doc = json.loads(raw)
        return {str(k): str(v) for k, v in doc.get("config", {}).items()}
    except (ValueError, AttributeError):
        log.warning("ignoring unreadable topic configs")
        return {}


if TYPE_CHECKING:  # mypy checks that it is an admin
    _ADMIN: type[TopicAdmin] = ZooKeeperAdmin
