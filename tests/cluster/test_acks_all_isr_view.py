"""A leader refuses acks=all by the ISR its Metadata shows, before it has applied it.

When a follower's broker goes, the controller stores a smaller ISR in a new leader epoch.
The leader's watch puts it in the cluster view at once (Metadata answers from the view),
and the replica manager starts the new term a moment later (after a flush and the new
epoch's start in worker threads, slow under load). In between, the old term still held
three in-sync replicas: a client that saw ISR [leader] in Metadata and produced with
acks=all had its write appended and then refused NOT_ENOUGH_REPLICAS_AFTER_APPEND (error
20; found as a CI flake of test_min_insync_replicas_refuses_acks_all_below_it) instead of
NOT_ENOUGH_REPLICAS before the append (error 19), with nothing appended.

Here a real in-process broker serves Produce over a socket with a real replica manager
leading the partition; the view changes as the watch would change it, and the replica
manager's apply loop is not running, so the old term stays: the gap, held open.
"""

from __future__ import annotations

from pathlib import Path

import trio

from tests.e2e.conftest import RawConnection
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.config import BrokerConfig
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo

TOPIC = "isr"


async def test_acks_all_is_refused_by_the_isr_metadata_shows_before_the_new_term(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(
            Broker(BrokerConfig(port=0, data_dir=tmp_path, storage="memory")).run
        )
        manager = ReplicaManager(
            ClusterView(1), MemoryCoordination(MemoryZooKeeper()), broker.topics,
            min_insync_replicas=2, replica_lag_time_max_ms=30_000, now_ms=broker.now_ms,
            durability=broker.durability,
        )  # fmt: skip
        topic = broker.topics.create(TOPIC, 1)
        assert topic.topic_id is not None
        all_three = PartitionInfo((1, 2, 3), 1, 3, (1, 2, 3))
        manager.view.topics[TOPIC] = TopicInfo(TOPIC, topic.topic_id, {0: all_three})
        await manager._become_leader(TOPIC, 0, all_three)
        broker.replication = manager
        port = broker.bound[0][1]

        def produce(value: bytes) -> int:
            with RawConnection(port, timeout=20) as conn:
                return int(conn.produce(TOPIC, build_batch([(None, value)]), acks=-1).error_code)

        # The controller took brokers 2 and 3 out (epoch 4); the watch delivered it.
        manager.view.topics[TOPIC] = TopicInfo(
            TOPIC, topic.topic_id, {0: PartitionInfo((1, 2, 3), 1, 4, (1,))}
        )
        manager.view_changed()
        assert manager.terms[(TOPIC, 0)].leader_epoch == 3  # the new term has not started
        error = await trio.to_thread.run_sync(produce, b"refused")
        assert error == ErrorCode.NOT_ENOUGH_REPLICAS, error
        log = broker.topics.log(TOPIC, 0)
        assert log is not None and log.log_end_offset == 0, "the refused write was appended"
        nursery.cancel_scope.cancel()
