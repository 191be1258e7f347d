"""The controller's duties, run by the broker that holds ``/controller``.

Reconciliation rather than event handling: whenever the broker list, a topic or a
partition state changes, the controller compares every partition's state with the live
brokers and writes what the rules of ``replication/controller_rules.py`` say it should
be. Running it twice changes nothing, so watch events may be merged or repeated.

Every write is conditional twice over: on the partition state's znode version (a
leader's concurrent ISR change wins or loses cleanly) and on ``/controller_epoch``'s
version (a deposed controller, still running, cannot overwrite its successor).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import attrs
import trio

from trio_broker.cluster.coordination import (
    BadVersion,
    Coordination,
    CoordinationError,
    NodeExists,
    NoNode,
)
from trio_broker.cluster.topics_watch import read_topics
from trio_broker.cluster.waiting import RETRY_S, Signal, Watch, wait_any
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    LOG_DIR_EVENTS,
    OFFLINE_REPLICAS,
    CoordinationDataError,
    LogDirEvent,
    OfflineReplicas,
    PartitionState,
    TopicAssignment,
    decode_controller_epoch,
    offline_replicas_path,
    partition_state_path,
    topic_config_path,
    topic_path,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    ElectionRefused,
    ElectionType,
    LeaderAndIsr,
    Reassignment,
    after_broker_loss,
    after_broker_return,
    after_leader_restart,
    after_replicas_offline,
    elect_leader,
    leave_replicas,
    preferred_leader_move,
    reassign,
    reassignment_done,
    requested_election,
)
from trio_broker.services.cluster_view import ClusterView, PartitionInfo

__all__ = [
    "ControllerActions",
    "NotController",
    "Rebalance",
    "decide",
    "imbalanced_moves",
    "offline_in",
    "read_offline_replicas",
    "restarted_leader",
    "run_controller",
]

log = logging.getLogger(__name__)


class NotController(CoordinationError):
    """``/controller_epoch`` moved on: another broker is the controller now."""


def decide(
    info: PartitionInfo,
    live: frozenset[int],
    *,
    offline: frozenset[int] = frozenset(),
    unclean: bool = False,
    leader_restarted: bool = False,
) -> LeaderAndIsr | None:
    """What a partition's state should become, or None if it is right as it is.

    ``offline``: live brokers whose replica of this partition is in a failed log dir
    (their :class:`OfflineReplicas`): they neither lead nor stay in sync, as if lost for
    this partition alone. ``leader_restarted``: the leader's registration is newer than
    the state (see :func:`restarted_leader`)."""
    replicas = info.replicas
    usable = live - offline
    if info.leader_epoch < 0:  # no state yet: a new partition
        in_sync = tuple(r for r in replicas if r in usable)
        if not in_sync:
            # Kafka's controller leaves a new partition without a state while none of
            # its replicas is alive, and gives it its live replicas once one returns
            # (whichever comes back first leads). Writing every replica as the ISR now
            # would let the next round's loss rule keep only the last one, so that only
            # that broker's return brought the partition online.
            return None
        return LeaderAndIsr(elect_leader(replicas, in_sync, usable), 0, in_sync)
    state = LeaderAndIsr(info.leader, info.leader_epoch, info.isr)
    if leader_restarted and info.leader in live:
        state = after_leader_restart(state)
    for gone in [b for b in (info.leader, *info.isr) if b != NO_LEADER and b not in live]:
        state = after_broker_loss(state, replicas, gone, usable, unclean=unclean) or state
    if offline:
        state = after_replicas_offline(state, replicas, offline, live, unclean=unclean) or state
    if state.leader == NO_LEADER:
        for back in state.isr:
            if back in usable:
                state = after_broker_return(state, replicas, back, usable) or state
                break
    return None if state == LeaderAndIsr(info.leader, info.leader_epoch, info.isr) else state


def restarted_leader(info: PartitionInfo, registered: dict[int, int]) -> bool:
    """Was the state written before its leader's registration was made? Then the broker
    it names is a new life of the one that led (it restarted, or its session expired,
    before this controller saw its registration go). ``registered``: each live broker's
    registration zxid. Unknown zxids (0) say no."""
    made = registered.get(info.leader, 0)
    return 0 < info.state_zxid < made


@attrs.frozen
class Rebalance:
    """Moving leadership back to preferred replicas (auto.leader.rebalance.enable)."""

    #: leader.imbalance.check.interval.seconds: how often the controller looks.
    interval_s: float = 300.0
    #: leader.imbalance.per.broker.percentage: a broker's share of the partitions it
    #: prefers to lead but does not that triggers moving them back.
    percentage: int = 10


def imbalanced_moves(
    partitions: dict[tuple[str, int], PartitionInfo],
    live: frozenset[int],
    percentage: int,
    offline: Mapping[tuple[str, int], frozenset[int]] | None = None,
) -> dict[tuple[str, int], LeaderAndIsr]:
    """Kafka's rule: per preferred broker, if more than ``percentage`` % of the partitions
    it should lead are led by others, move back those where it is alive and in sync
    (and its replica not in a failed log dir: ``offline``, per partition)."""
    by_preferred: dict[int, list[tuple[str, int]]] = {}
    for key, info in partitions.items():
        if info.replicas:
            by_preferred.setdefault(info.replicas[0], []).append(key)
    moves: dict[tuple[str, int], LeaderAndIsr] = {}
    for keys in by_preferred.values():
        elsewhere = [k for k in keys if partitions[k].leader != partitions[k].replicas[0]]
        if len(elsewhere) * 100 <= percentage * len(keys):
            continue
        for key in elsewhere:
            info = partitions[key]
            state = LeaderAndIsr(info.leader, info.leader_epoch, info.isr)
            usable = live - (offline or {}).get(key, frozenset())
            moved = preferred_leader_move(state, info.replicas, usable)
            if moved is not None:
                moves[key] = moved
    return moves


#: A partition's outcome in an administrator's request: an error code and a message.
Outcome = tuple[ErrorCode, str | None]

_REFUSALS = {
    ElectionRefused.NOT_NEEDED: ErrorCode.ELECTION_NOT_NEEDED,
    ElectionRefused.PREFERRED_NOT_AVAILABLE: ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
    ElectionRefused.NO_ELIGIBLE_LEADER: ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
}
#: How long an admin request waits for this broker's view to show what it wrote.
_VIEW_WAIT_S = 5.0
#: Conditional writes lost to a concurrent ISR change before a request gives up.
_WRITE_ATTEMPTS = 5


class ControllerActions:
    """What administrators' requests ask of the controller, while this broker is it.

    Handed to the replica manager by :func:`run_controller` (and taken back when it
    stops), so that the ElectLeaders handler on this broker reaches the controller in
    process; other brokers answer NOT_CONTROLLER and clients ask the controller that
    Metadata names. Writes are fenced by the controller epoch like the reconciler's.
    """

    def __init__(self, coord: Coordination, view: ClusterView, fence: tuple[str, int]) -> None:
        self.coord, self.view, self.fence = coord, view, fence
        #: Each broker's replicas in failed log dirs, as the last reconciliation round
        #: read them: elections requested meanwhile pass them over too.
        self.offline: dict[int, frozenset[tuple[str, int]]] = {}
        #: Held by a reconciliation round and by a topic deletion: half-deleted, a
        #: topic's partitions would look new to the reconciler, which would recreate them.
        self.lock = trio.Lock()

    async def delete_topic(self, name: str) -> Outcome:
        """DeleteTopics: the topic's config and its whole tree go from ZooKeeper; every
        broker that held a replica deletes its copy when its view loses the topic."""
        try:
            async with self.lock:
                if await self.coord.get(topic_path(name)) is None:
                    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                await _check_fence(self.coord, self.fence)
                await _delete_tree(self.coord, topic_path(name))
                await _delete_tree(self.coord, topic_config_path(name))
        except NotController as exc:
            return ErrorCode.NOT_CONTROLLER, str(exc)
        except CoordinationError as exc:
            return ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)
        log.info("topic %s deleted", name)
        with trio.move_on_after(_VIEW_WAIT_S):
            while name in self.view.topics:  # noqa: ASYNC110 - the view is plain data
                await trio.sleep(0.01)
        return ErrorCode.NONE, None

    async def elect_leaders(
        self, election_type: ElectionType, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], Outcome]:
        """Run the elections; each partition's outcome (NONE once the new state is in
        ZooKeeper, where every replica's watch picks it up)."""
        outcomes: dict[tuple[str, int], Outcome] = {}
        for topic, partition in partitions:
            try:
                outcomes[(topic, partition)] = await self._elect(election_type, topic, partition)
            except NotController as exc:
                outcomes[(topic, partition)] = (ErrorCode.NOT_CONTROLLER, str(exc))
            except (CoordinationError, CoordinationDataError) as exc:
                outcomes[(topic, partition)] = (ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
        return outcomes

    async def _elect(self, election_type: ElectionType, topic: str, partition: int) -> Outcome:
        info = self.view.topics.get(topic)
        replicas = (
            info.partitions[partition].replicas if info and partition in info.partitions else None
        )
        if replicas is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist"
        path = partition_state_path(topic, partition)
        for _ in range(_WRITE_ATTEMPTS):
            node = await self.coord.get(path)
            if node is None:
                return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, f"{path} is not written yet"
            current = PartitionState.decode(node.data, path).leader_and_isr
            live = frozenset(self.view.brokers) - offline_in(self.offline, topic, partition)
            target = requested_election(current, replicas, live, election_type)
            if isinstance(target, ElectionRefused):
                return _REFUSALS[target], None
            state = PartitionState.of(target, self.view.controller_epoch)
            try:
                await self.coord.set_fenced(path, state.encode(), node.version, self.fence)
            except BadVersion:
                await _check_fence(self.coord, self.fence)
                continue  # a leader's ISR change came first: decide again on what it wrote
            log.info("%s: %s election: leader %d epoch %d ISR %s", path, election_type.name,
                     target.leader, target.leader_epoch, list(target.isr))  # fmt: skip
            return ErrorCode.NONE, None
        return ErrorCode.REQUEST_TIMED_OUT, f"{path} kept changing under the election"

    async def alter_reassignments(
        self, moves: dict[tuple[str, int], list[int] | None]
    ) -> dict[tuple[str, int], Outcome]:
        """Start (or replace, or with None cancel) partition reassignments (KIP-455).

        Each one is written to the topic's znode (replicas = target + leaving, with
        ``adding_replicas``/``removing_replicas``), then the partition's leader epoch is
        bumped so that its leader starts a term that knows the joining replicas. The
        reconciler finishes the move once they are in sync (:func:`_finish_move`).
        """
        outcomes: dict[tuple[str, int], Outcome] = {}
        for (topic, partition), target in moves.items():
            try:
                outcome = await self._alter(topic, partition, target)
            except NotController as exc:
                outcome = (ErrorCode.NOT_CONTROLLER, str(exc))
            except (CoordinationError, CoordinationDataError) as exc:
                outcome = (ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
            outcomes[(topic, partition)] = outcome
        return outcomes

    async def _alter(self, topic: str, partition: int, target: list[int] | None) -> Outcome:
        info = self.view.topics.get(topic)
        current = info.partitions.get(partition) if info is not None else None
        if current is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist"
        moving = _moving(current)
        if target is None:
            if not (moving.adding or moving.removing):
                return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, f"{topic}-{partition} is not moving"
        elif not target or len(set(target)) != len(target):
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"replicas {target}: empty or repeated"
        elif unknown := sorted(set(target) - set(self.view.brokers)):
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"brokers {unknown} are not registered"
        after = reassign(moving, target)
        await _write_assignment(self.coord, self.fence, topic, partition, after)
        # The leader's next term knows the new replica set. Every current replica is
        # still one (``reassign``: those outside the target leave at the move's end), so
        # the ISR stays; a leader that is down hands over to a live in-sync replica.
        path = partition_state_path(topic, partition)
        for _ in range(_WRITE_ATTEMPTS):
            node = await self.coord.get(path)
            if node is None:
                break  # a new partition: the reconciler writes its first state
            state = PartitionState.decode(node.data, path).leader_and_isr
            live = frozenset(self.view.brokers)
            new = leave_replicas(state, after.replicas, live)
            if new is None:
                new = LeaderAndIsr(state.leader, state.leader_epoch + 1, state.isr)
            encoded = PartitionState.of(new, self.view.controller_epoch).encode()
            try:
                await self.coord.set_fenced(path, encoded, node.version, self.fence)
                break
            except BadVersion:
                await _check_fence(self.coord, self.fence)
        log.info("%s-%d: reassigning to %s (adding %s, removing %s)", topic, partition,
                 list(after.target), list(after.adding), list(after.removing))  # fmt: skip
        # Answer once this broker's view shows it, so that a ListPartitionReassignments
        # right after lists it (the watch brings it within milliseconds).
        with trio.move_on_after(_VIEW_WAIT_S):
            while (self._partition(topic, partition) or current).replicas != after.replicas:  # noqa: ASYNC110 - the view is plain data, no event to wait on
                await trio.sleep(0.01)
        return ErrorCode.NONE, None

    def _partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.view.topics.get(topic)
        return info.partitions.get(partition) if info is not None else None


async def run_controller(
    coord: Coordination,
    view: ClusterView,
    *,
    unclean: bool = False,
    rebalance: Rebalance | None = None,
    on_active: Callable[[ControllerActions | None], None] = lambda _: None,
) -> None:
    """Reconcile until cancelled; raises :class:`NotController` once deposed.

    With ``rebalance``, every ``interval_s`` leadership also moves back to preferred
    replicas where a broker's imbalance exceeds the percentage.
    """
    epoch_node = await coord.get(CONTROLLER_EPOCH)
    if epoch_node is None or decode_controller_epoch(epoch_node.data) != view.controller_epoch:
        raise NotController("the controller epoch moved on before the first write")
    fence = (CONTROLLER_EPOCH, epoch_node.version)
    actions = ControllerActions(coord, view, fence)
    on_active(actions)
    try:
        await _reconcile(coord, view, fence, unclean, rebalance, actions)
    finally:
        on_active(None)


async def _reconcile(
    coord: Coordination,
    view: ClusterView,
    fence: tuple[str, int],
    unclean: bool,
    rebalance: Rebalance | None,
    actions: ControllerActions,
) -> None:
    next_rebalance = trio.current_time() + (rebalance.interval_s if rebalance else 0)
    while True:
        lost = coord.session_lost()
        try:
            async with actions.lock:  # not while a topic is half deleted
                # The broker list's watch, every topic's, the log dir events' and each
                # broker's offline replicas'.
                changed = Signal()
                brokers, _ = await coord.children_and_watch(BROKER_IDS, into=changed)
                live = frozenset(int(b) for b in brokers if b.isdigit())
                registered = await _registrations(coord, live)
                events, _ = await coord.children_and_watch(LOG_DIR_EVENTS, into=changed)
                offline = await read_offline_replicas(coord, live, into=changed)
                actions.offline = offline
                topics, versions, _ = await read_topics(coord, into=changed)
                targets: dict[tuple[str, int], LeaderAndIsr] = {}
                for topic in topics.values():
                    for partition, info in topic.partitions.items():
                        target = decide(info, live, unclean=unclean,
                                        offline=offline_in(offline, topic.name, partition),
                                        leader_restarted=restarted_leader(info, registered))  # fmt: skip
                        if target is not None:
                            targets[(topic.name, partition)] = target
                if rebalance is not None and trio.current_time() >= next_rebalance:
                    next_rebalance = trio.current_time() + rebalance.interval_s
                    settled = {
                        (t.name, p): info
                        for t in topics.values()
                        for p, info in t.partitions.items()
                        if (t.name, p) not in targets and info.leader_epoch >= 0
                    }
                    offline_of = {key: offline_in(offline, *key) for key in settled}
                    targets.update(
                        imbalanced_moves(settled, live, rebalance.percentage, offline_of)
                    )
                for (name, partition), target in targets.items():
                    state = PartitionState.of(target, view.controller_epoch)
                    path = partition_state_path(name, partition)
                    await _write(coord, path, state, versions[(name, partition)], fence)
                    log.info("%s: leader %d epoch %d ISR %s", path, target.leader,
                             target.leader_epoch, list(target.isr))  # fmt: skip
                for topic in topics.values():
                    for partition, info in topic.partitions.items():
                        if (topic.name, partition) not in targets:
                            version = versions[(topic.name, partition)]
                            usable = live - offline_in(offline, topic.name, partition)
                            await _finish_move(coord, view, fence, usable, topic.name,
                                               partition, info, version)  # fmt: skip
                await _clear_log_dir_events(coord, events)
        except NotController:
            raise
        except CoordinationError as exc:
            log.warning("controller: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        with trio.move_on_at(next_rebalance if rebalance is not None else float("inf")):
            await wait_any(lost, changed)


async def _registrations(coord: Coordination, live: frozenset[int]) -> dict[int, int]:
    """Each live broker's registration zxid (a broker gone since the listing is left out:
    the broker list's watch brings the next round)."""
    registered = {}
    for broker in sorted(live):
        znode = await coord.get(f"{BROKER_IDS}/{broker}")
        if znode is not None:
            registered[broker] = znode.created
    return registered


def offline_in(
    offline: Mapping[int, frozenset[tuple[str, int]]], topic: str, partition: int
) -> frozenset[int]:
    """The brokers whose replica of ``topic``-``partition`` is in a failed log dir."""
    key = (topic, partition)
    return frozenset(b for b, partitions in offline.items() if key in partitions)


async def read_offline_replicas(
    coord: Coordination, live: frozenset[int], *, into: Watch | None = None
) -> dict[int, frozenset[tuple[str, int]]]:
    """Each live broker's replicas in failed log dirs (its ``OfflineReplicas`` znode,
    written by the broker: cluster/log_dir_events.py), watched into ``into``. A broker
    not live is left out: all its replicas are lost anyway. An unreadable znode counts
    as none (logged)."""
    names, _ = await coord.children_and_watch(OFFLINE_REPLICAS, into=into)
    offline: dict[int, frozenset[tuple[str, int]]] = {}
    for name in names:
        if not name.isdigit() or int(name) not in live:
            continue
        broker = int(name)
        node, _ = await coord.get_and_watch(offline_replicas_path(broker), into=into)
        if node is None:
            continue
        try:
            partitions = OfflineReplicas.decode(broker, node.data).partitions
        except CoordinationDataError as exc:
            log.warning("ignoring %s: %s", offline_replicas_path(broker), exc)
            continue
        if partitions:
            offline[broker] = partitions
    return offline


async def _clear_log_dir_events(coord: Coordination, events: list[str]) -> None:
    """Delete the log dir event notifications this round acted on, as Kafka's controller
    does (what failed is in the brokers' offline replicas, read above)."""
    for name in events:
        path = f"{LOG_DIR_EVENTS}/{name}"
        node = await coord.get(path)
        if node is not None:
            try:
                event = LogDirEvent.decode(node.data, path)
                log.info("broker %d reported a failed log dir (%s)", event.broker_id, name)
            except CoordinationDataError as exc:
                log.warning("ignoring %s: %s", path, exc)
        try:
            await coord.delete(path)
        except NoNode:
            pass


def _moving(info: PartitionInfo) -> Reassignment:
    return Reassignment(info.replicas, info.adding_replicas, info.removing_replicas)


async def _finish_move(
    coord: Coordination,
    view: ClusterView,
    fence: tuple[str, int],
    live: frozenset[int],
    topic: str,
    partition: int,
    info: PartitionInfo,
    version: int,
) -> None:
    """The end of a reassignment whose joining replicas are all in sync: the leaving
    ones leave the ISR (leadership moves if the leader leaves), then the assignment
    keeps the target replicas only. In this order, as Kafka's controller does, so
    that a round interrupted between the two writes just does the second one next."""
    moving = _moving(info)
    state = LeaderAndIsr(info.leader, info.leader_epoch, info.isr)
    if version < 0 or not reassignment_done(state, moving):
        return
    target = moving.target
    after = leave_replicas(state, target, live)
    if after is None and (state.leader not in target or state.leader not in live):
        # No target replica can lead yet (a dead leader among them included: ending the
        # move now would keep the leaving replicas in the ISR): wait for one.
        return
    path = partition_state_path(topic, partition)
    if after is not None:
        await coord.set_fenced(path, PartitionState.of(after, view.controller_epoch).encode(),
                               version, fence)  # fmt: skip
    await _write_assignment(coord, fence, topic, partition, Reassignment(target))
    log.info("%s-%d: reassignment done, replicas %s", topic, partition, list(target))


async def _write_assignment(
    coord: Coordination, fence: tuple[str, int], topic: str, partition: int, moving: Reassignment
) -> None:
    """One partition's replicas (and adding/removing lists) in the topic's znode."""
    path = topic_path(topic)
    while True:
        node = await coord.get(path)
        if node is None:
            raise NoNode(path)
        current = TopicAssignment.decode(node.data, path)
        partitions = {**current.partitions, partition: moving.replicas}
        adding = {**current.adding, partition: moving.adding}
        removing = {**current.removing, partition: moving.removing}
        updated = TopicAssignment(current.topic_id, partitions, adding, removing)
        try:
            await coord.set_fenced(path, updated.encode(), node.version, fence)
            return
        except BadVersion:
            await _check_fence(coord, fence)  # another partition's move, or a new one


async def _delete_tree(coord: Coordination, path: str) -> None:
    """Delete ``path`` and everything below it (gone already: nothing to do)."""
    children, _ = await coord.children_and_watch(path)
    for child in children:
        await _delete_tree(coord, f"{path}/{child}")
    try:
        await coord.delete(path)
    except NoNode:
        pass


async def _write(
    coord: Coordination, path: str, state: PartitionState, version: int, fence: tuple[str, int]
) -> None:
    try:
        if version < 0:
            # A new partition: create its state, then fence the creation after the fact
            # (ZooKeeper cannot check and create in our API): a deposed controller's
            # create is the same decision its successor would make for a new partition.
            await coord.create(path, state.encode())
            await _check_fence(coord, fence)
        else:
            await coord.set_fenced(path, state.encode(), version, fence)
    except (NodeExists, BadVersion, NoNode):
        await _check_fence(coord, fence)  # lost a race: read again on the next round


async def _check_fence(coord: Coordination, fence: tuple[str, int]) -> None:
    node = await coord.get(fence[0])
    if node is None or node.version != fence[1]:
        raise NotController(f"{fence[0]} moved on: this broker is no longer the controller")
