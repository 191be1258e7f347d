"""A share partition's leader and its share coordinator in a cluster, in process (no
ZooKeeper, no sockets): the replica manager's terms and view are fed directly, as
tests/unit/groups/test_groups_cluster.py does for the group coordinator.

The leader reads a share partition's state when it first serves it in a leader epoch
and writes what moved, stamped with that epoch (handlers/share_persist.py); here the
key's ``__share_group_state`` partition is led by this broker too, so the reads and
writes are local calls through the coordinators' append path.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from tests.clustered_broker import ME, ClusteredBroker, Term
from trio_broker.config import BrokerConfig
from trio_broker.groups.share_coordinator import PartitionedShareCoordinator
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey, ShareSnapshot, StateBatch
from trio_broker.handlers.base import ClientInfo, RequestContext
from trio_broker.handlers.share_persist import ensure_loaded, persist
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.services.cluster_view import BrokerInfo, PartitionInfo, TopicInfo
from trio_broker.state.share_partition import RecordState
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

STATE_PARTITIONS = 1  # every key in state partition 0
GROUP = "workers"
CONFIG = BrokerConfig(
    storage="memory", zookeeper_connect="127.0.0.1:1/unused", node_id=ME,
    share_coordinator_state_topic_num_partitions=STATE_PARTITIONS,
)  # fmt: skip


def make_broker() -> ClusteredBroker:
    broker = ClusteredBroker(CONFIG)
    broker.share_coordinator = PartitionedShareCoordinator(STATE_PARTITIONS, broker.replication)
    return broker


async def start(nursery: trio.Nursery) -> tuple[ClusteredBroker, Any, RequestContext]:
    """A broker leading data partition t-0 (epoch 3) and __share_group_state-0 (epoch 0)."""
    broker = make_broker()
    await nursery.start(broker.flusher.run)
    topic = broker.topics.create("t", 1)
    view = broker.replication.view
    view.brokers[ME] = BrokerInfo(ME, "127.0.0.1", 9092)
    view.topics[SHARE_GROUP_STATE] = TopicInfo(
        SHARE_GROUP_STATE, uuid.uuid4(), {0: PartitionInfo((ME,), ME, 0, (ME,))}
    )
    broker.replication.terms[("t", 0)] = Term(3)
    broker.replication.terms[(SHARE_GROUP_STATE, 0)] = Term(0)
    broker.share_coordinator.elected(0, 0, MemoryLog(LogConfig()))
    broker.share_coordinator.load_pending()
    header = RequestHeader(m.ApiKey.SHARE_FETCH, 1, 1, "leader")
    ctx = RequestContext(header=header, services=broker, client=ClientInfo(1, "127.0.0.1", 1))  # type: ignore[arg-type]
    return broker, topic.topic_id, ctx


async def test_the_leader_writes_what_moved_and_keeps_its_share_partition_across_epochs() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx = await start(nursery)
        shares, table = broker.shares, broker.share_coordinator.tables[0]
        key = ShareKey(GROUP, topic_id, 0)
        # Nothing stored: the leader makes the share partition itself (here at 0).
        assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {}
        held = shares.ensure_partition(GROUP, topic_id, 0, 0)
        held.acquire("m1", 6, 6, ctx.now_ms())
        assert held.acknowledge("m1", 0, 1, [1], ctx.now_ms()) is ErrorCode.NONE
        assert await persist(ctx, GROUP, only={(topic_id, 0)}) is ErrorCode.NONE
        stored = table.store.snapshots[key]
        assert (stored.start_offset, stored.leader_epoch) == (2, 3)
        assert stored.batches == (StateBatch(2, 5, RecordState.AVAILABLE, 1),)

        # A new leader epoch of the same leader (a reassignment): the coordinator holds
        # its own last write, so the share partition stays, with what m1 holds.
        broker.replication.terms[("t", 0)] = Term(4)
        assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {}
        assert shares.partition(GROUP, topic_id, 0) is held
        assert held.acknowledge("m1", 2, 5, [1], ctx.now_ms()) is ErrorCode.NONE
        assert await persist(ctx, GROUP, only={(topic_id, 0)}) is ErrorCode.NONE
        assert table.store.snapshots[key].start_offset == 6

        # Another leader wrote since (epoch 5): this broker, leading again in epoch 6,
        # takes the stored state, not its own.
        other = ShareSnapshot(6, (StateBatch(6, 7, RecordState.AVAILABLE, 2),))
        assert table.check_write(key, 5, 0) is ErrorCode.NONE
        entry = table.entry_for(key, other, 5, ctx.now_ms())
        table.appended([entry])
        # Until then, the deposed epoch-4 leader's writes are fenced.
        held.skip_to(7)
        assert await persist(ctx, GROUP, only={(topic_id, 0)}) is ErrorCode.FENCED_LEADER_EPOCH
        broker.replication.terms[("t", 0)] = Term(6)
        assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {}
        restored = shares.partition(GROUP, topic_id, 0)
        assert restored is not held and restored is not None
        assert restored.start_offset == 6
        assert restored.records[6].delivery_count == 2
        nursery.cancel_scope.cancel()


async def test_a_partition_led_elsewhere_or_without_a_state_leader_is_not_read() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id, ctx = await start(nursery)
        # Not the data partition's leader: nothing read, the fetch answers why itself.
        del broker.replication.terms[("t", 0)]
        assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {}
        assert not broker.shares.loaded
        # The leader, but no state partition leader known: ask again later.
        broker.replication.terms[("t", 0)] = Term(3)
        del broker.replication.view.topics[SHARE_GROUP_STATE]
        assert await ensure_loaded(ctx, GROUP, {(topic_id, 0)}) == {
            (topic_id, 0): ErrorCode.COORDINATOR_NOT_AVAILABLE
        }
        # ... and the state topic is made, as Kafka's share coordinator's.
        [(name, count, rf, configs)] = broker.replication.created
        assert (name, count, rf) == (SHARE_GROUP_STATE, STATE_PARTITIONS, 3)
        assert configs["cleanup.policy"] == "compact"
        nursery.cancel_scope.cancel()
