"""Every broker's copy of the cluster's topics: assignments, leaders, ISRs, from ZooKeeper.

One loop: read ``/brokers/topics``, each topic's assignment and each partition's state,
with a watch on everything read; when any of them changes, read again. Simple, and
fine for the few hundred partitions of a test or small cluster (each change costs one
read per partition); a znode that does not parse is skipped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from trio_broker.cluster.coordination import Coordination, CoordinationError
from trio_broker.cluster.waiting import RETRY_S, Signal, Watch, wait_any
from trio_broker.cluster.zk_layout import (
    TOPICS,
    CoordinationDataError,
    PartitionState,
    TopicAssignment,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import NO_LEADER
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo

__all__ = ["follow_topics", "read_topics"]

log = logging.getLogger(__name__)


async def read_topics(
    coord: Coordination, *, into: Watch | None = None
) -> tuple[dict[str, TopicInfo], dict[tuple[str, int], int], list[Watch]]:
    """All topics as the view holds them, each partition state's znode version (-1 if
    missing), and the watches set while reading: one event for all of them (``into``, if
    given), as a change to any means reading again, and one event is cheaper to wait
    for than hundreds."""
    changed = Signal() if into is None else into
    names, _ = await coord.children_and_watch(TOPICS, into=changed)
    topics: dict[str, TopicInfo] = {}
    versions: dict[tuple[str, int], int] = {}
    for name in names:
        znode, _ = await coord.get_and_watch(topic_path(name), into=changed)
        if znode is None:
            continue
        try:
            assignment = TopicAssignment.decode(znode.data, f"topic {name}")
        except CoordinationDataError as exc:
            log.warning("ignoring topic %s: %s", name, exc)
            continue
        partitions = {}
        for partition, replicas in assignment.partitions.items():
            path = partition_state_path(name, partition)
            state_node, _ = await coord.get_and_watch(path, into=changed)
            moving = (
                assignment.adding.get(partition, ()),
                assignment.removing.get(partition, ()),
            )
            info = PartitionInfo(replicas, NO_LEADER, -1, (), *moving)
            versions[(name, partition)] = -1
            if state_node is not None:
                try:
                    state = PartitionState.decode(state_node.data, path)
                    info = PartitionInfo(
                        replicas,
                        state.leader,
                        state.leader_epoch,
                        state.isr,
                        *moving,
                        state_zxid=state_node.modified,
                    )
                    versions[(name, partition)] = state_node.version
                except CoordinationDataError as exc:
                    log.warning("ignoring %s: %s", path, exc)
            partitions[partition] = info
        topics[name] = TopicInfo(name, assignment.topic_id, partitions)
    return topics, versions, [changed]


async def follow_topics(
    coord: Coordination,
    view: ClusterView,
    on_change: Callable[[], None] = lambda: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``view.topics`` equal to ZooKeeper's, until cancelled; ``on_change`` after
    every update. Reports started after the first read."""
    first = True
    while True:
        lost = coord.session_lost()
        try:
            view.topics, _, watches = await read_topics(coord)
        except CoordinationError as exc:
            log.warning("reading topics: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        on_change()
        if first:
            first = False
            task_status.started()
        await wait_any(lost, *watches)
