"""A broker tells its controller which of its replicas a failed log dir took offline.

Kafka's rule in ZooKeeper mode: a broker whose log dir fails stops its fetchers for the
dir's partitions and writes a ``/log_dir_event_notification/log_dir_event_<seq>``
znode naming itself; the controller then treats each replica there like a replica of a
dead broker, per partition (out of the ISR, a new leader from the rest of it if it
led). Kafka's controller learns which replicas failed by asking the broker
(LeaderAndIsr answered with KAFKA_STORAGE_ERROR); ours reads cluster state from
ZooKeeper only, so the broker also keeps that answer there:
``/brokers/offline_replicas/<id>`` (``zk_layout.OfflineReplicas``), ephemeral, present
while it has offline replicas. The controller reads it on every round and watches it
(cluster/controller.py, ``read_offline_replicas``); the notification wakes it too, and
it deletes the notification as Kafka's does.

:func:`publish_offline_replicas` reconciles, as the controller does: whenever a dir goes
offline or comes back (``LogDirs.listen``), the session is lost or its znode changes, it
compares the znode with the replicas offline now and rewrites it if they differ. When
the dir comes back whole (the flusher's probe, server/flusher.py) the znode goes, and
the controller lets the replicas return as a returning broker's: followers that catch
up and rejoin the ISR by the leader's rule, or a leader again where the partition had
no other in-sync replica.
"""

from __future__ import annotations

import logging

import trio

from trio_broker.cluster.coordination import Coordination, CoordinationError, NodeExists, NoNode
from trio_broker.cluster.waiting import RETRY_S, Signal, wait_any
from trio_broker.cluster.zk_layout import (
    LOG_DIR_EVENT_PREFIX,
    LogDirEvent,
    OfflineReplicas,
    offline_replicas_path,
)
from trio_broker.services.topics import TopicManager

__all__ = ["offline_replicas", "publish_offline_replicas"]

log = logging.getLogger(__name__)


def offline_replicas(broker_id: int, topics: TopicManager) -> OfflineReplicas:
    """This broker's offline log dirs and every partition whose log is in one of them."""
    offline = frozenset(
        (name, index)
        for name, topic in list(topics.topics.items())
        for index, log_ in enumerate(topic.logs)
        if log_.offline
    )
    dirs = tuple(str(path) for path in topics.dir_states.offline())
    return OfflineReplicas(broker_id, dirs, offline)


async def publish_offline_replicas(
    coord: Coordination, broker_id: int, topics: TopicManager
) -> None:
    """Keep ``/brokers/offline_replicas/<broker_id>`` equal to this broker's offline
    replicas, and notify the controller of each new failure, until cancelled."""
    token = trio.lowlevel.current_trio_token()
    wake = [Signal()]

    def dirs_changed() -> None:
        # Any thread (a log's disk error is seen where its I/O ran): hand it over.
        try:
            token.run_sync_soon(lambda: wake[0].set())
        except trio.RunFinishedError:
            pass

    stop_listening = topics.dir_states.listen(dirs_changed)
    path = offline_replicas_path(broker_id)
    #: What the last notification announced: a new one only for partitions beyond it.
    announced: frozenset[tuple[str, int]] = frozenset()
    try:
        while True:
            changed = wake[0] = Signal()  # before reading: a change meanwhile wakes it
            lost = coord.session_lost()
            try:
                current = offline_replicas(broker_id, topics)
                node, _ = await coord.get_and_watch(path, into=changed)
                if current.partitions:
                    wanted = current.encode()
                    if node is None:
                        await _create(coord, path, wanted)
                    elif not await coord.owned_by_this_session(path):
                        # A previous life's, which goes with its session: ours instead.
                        await _delete(coord, path)
                        await _create(coord, path, wanted)
                    elif node.data != wanted:
                        # In place: a gap between a delete and a create would show the
                        # controller these replicas online for a round.
                        await coord.set(path, wanted, node.version)
                    if node is None or node.data != wanted:
                        log.warning("told the controller: %d replica(s) in offline log dir(s) "
                                    "%s", len(current.partitions), ", ".join(current.log_dirs))  # fmt: skip
                    if not current.partitions <= announced:
                        await coord.create_sequential(
                            LOG_DIR_EVENT_PREFIX, LogDirEvent(broker_id).encode()
                        )
                    announced = current.partitions
                else:
                    announced = frozenset()
                    if node is not None:
                        await _delete(coord, path)
                        log.warning("told the controller: no replica offline any more")
            except CoordinationError as exc:
                log.warning("offline replicas: %s", exc)
                await trio.sleep(RETRY_S)
                continue
            await wait_any(changed, lost)
    finally:
        stop_listening()


async def _create(coord: Coordination, path: str, data: bytes) -> None:
    """The znode, ephemeral in this session, holding ``data``."""
    try:
        await coord.create(path, data, ephemeral=True)
    except NodeExists:
        # Our own create whose reply was lost is fine; another's: the next pass sees it.
        if not await coord.owned_by_this_session(path):
            raise CoordinationError(f"{path}: made by another session meanwhile") from None


async def _delete(coord: Coordination, path: str) -> None:
    try:
        await coord.delete(path)
    except NoNode:
        pass
