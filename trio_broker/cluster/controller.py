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
from trio_broker.cluster.waiting import RETRY_S, wait_any
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    PartitionState,
    decode_controller_epoch,
    partition_state_path,
)
from trio_broker.replication.controller_rules import (
    NO_LEADER,
    LeaderAndIsr,
    after_broker_loss,
    after_broker_return,
    elect_leader,
    preferred_leader_move,
)
from trio_broker.services.cluster_view import ClusterView, PartitionInfo

__all__ = ["NotController", "Rebalance", "decide", "imbalanced_moves", "run_controller"]

log = logging.getLogger(__name__)


class NotController(CoordinationError):
    """``/controller_epoch`` moved on: another broker is the controller now."""


def decide(
    info: PartitionInfo, live: frozenset[int], *, unclean: bool = False
) -> LeaderAndIsr | None:
    """What a partition's state should become, or None if it is right as it is."""
    replicas = info.replicas
    if info.leader_epoch < 0:  # no state yet: a new partition
        in_sync = tuple(r for r in replicas if r in live) or replicas
        return LeaderAndIsr(elect_leader(replicas, in_sync, live), 0, in_sync)
    state = LeaderAndIsr(info.leader, info.leader_epoch, info.isr)
    for gone in [b for b in (info.leader, *info.isr) if b != NO_LEADER and b not in live]:
        state = after_broker_loss(state, replicas, gone, live, unclean=unclean) or state
    if state.leader == NO_LEADER:
        for back in state.isr:
            if back in live:
                state = after_broker_return(state, replicas, back, live) or state
                break
    return None if state == LeaderAndIsr(info.leader, info.leader_epoch, info.isr) else state


@attrs.frozen
class Rebalance:
    """Moving leadership back to preferred replicas (auto.leader.rebalance.enable)."""

    #: leader.imbalance.check.interval.seconds: how often the controller looks.
    interval_s: float = 300.0
    #: leader.imbalance.per.broker.percentage: a broker's share of the partitions it
    #: prefers to lead but does not that triggers moving them back.
    percentage: int = 10


def imbalanced_moves(
    partitions: dict[tuple[str, int], PartitionInfo], live: frozenset[int], percentage: int
) -> dict[tuple[str, int], LeaderAndIsr]:
    """Kafka's rule: per preferred broker, if more than ``percentage`` % of the partitions
    it should lead are led by others, move back those where it is alive and in sync."""
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
            moved = preferred_leader_move(state, info.replicas, live)
            if moved is not None:
                moves[key] = moved
    return moves


async def run_controller(
    coord: Coordination,
    view: ClusterView,
    *,
    unclean: bool = False,
    rebalance: Rebalance | None = None,
) -> None:
    """Reconcile until cancelled; raises :class:`NotController` once deposed.

    With ``rebalance``, every ``interval_s`` leadership also moves back to preferred
    replicas where a broker's imbalance exceeds the percentage.
    """
    epoch_node = await coord.get(CONTROLLER_EPOCH)
    if epoch_node is None or decode_controller_epoch(epoch_node.data) != view.controller_epoch:
        raise NotController("the controller epoch moved on before the first write")
    fence = (CONTROLLER_EPOCH, epoch_node.version)
    next_rebalance = trio.current_time() + (rebalance.interval_s if rebalance else 0)
    while True:
        lost = coord.session_lost()
        try:
            brokers, brokers_changed = await coord.children_and_watch(BROKER_IDS)
            live = frozenset(int(b) for b in brokers if b.isdigit())
            topics, versions, watches = await read_topics(coord)
            targets: dict[tuple[str, int], LeaderAndIsr] = {}
            for topic in topics.values():
                for partition, info in topic.partitions.items():
                    target = decide(info, live, unclean=unclean)
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
                targets.update(imbalanced_moves(settled, live, rebalance.percentage))
            for (name, partition), target in targets.items():
                state = PartitionState.of(target, view.controller_epoch)
                path = partition_state_path(name, partition)
                await _write(coord, path, state, versions[(name, partition)], fence)
                log.info("%s: leader %d epoch %d ISR %s", path, target.leader,
                         target.leader_epoch, list(target.isr))  # fmt: skip
        except NotController:
            raise
        except CoordinationError as exc:
            log.warning("controller: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        with trio.move_on_at(next_rebalance if rebalance is not None else float("inf")):
            await wait_any(lost, brokers_changed, *watches)


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
