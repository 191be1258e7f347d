"""A share partition is assigned only once its share state is durably initialized
(KIP-932; Kafka's group coordinator assigns a share group's *initialized* partitions
only, and keeps those it is initializing apart: ShareGroupStatePartitionMetadata's
InitializingTopics).

In process, no sockets: one broker is the group's coordinator (it leads
``__consumer_offsets-0``), the data partition's leader and the share coordinator (it
leads ``__share_group_state-0``); the replica manager's terms and view are fed
directly, as in tests/unit/groups/test_groups_cluster.py. The ShareGroupHeartbeat
handler runs as a request would run it.
"""

from __future__ import annotations

import uuid

import attrs
import trio
import trio.testing

from tests.clustered_broker import ME, ClusteredBroker, Term
from trio_broker.config import BrokerConfig
from trio_broker.groups import GroupCoordinator
from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.groups.share_coordinator import PartitionedShareCoordinator
from trio_broker.groups.share_records import StoredShareGroup, StoredTopic
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey
from trio_broker.handlers.base import ClientInfo, RequestContext
from trio_broker.handlers.share_group_heartbeat import handle_share_group_heartbeat
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.protocol.records import build_batch
from trio_broker.services.cluster_view import BrokerInfo, PartitionInfo, TopicInfo
from trio_broker.services.internal_topics import CONSUMER_OFFSETS
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

GROUP, MEMBER, TOPIC = "workers", "m1", "t"
CONFIG = BrokerConfig(
    storage="memory", zookeeper_connect="127.0.0.1:1/unused", node_id=ME,
    offsets_topic_num_partitions=1, share_coordinator_state_topic_num_partitions=1,
    group_initial_rebalance_delay_ms=0,
)  # fmt: skip


def make_broker() -> ClusteredBroker:
    broker = ClusteredBroker(CONFIG)
    broker.share_coordinator = PartitionedShareCoordinator(1, broker.replication)
    return broker


async def start(
    nursery: trio.Nursery, offsets_log: MemoryLog | None = None
) -> tuple[ClusteredBroker, uuid.UUID]:
    """The broker, leading t-0 (three records in it), __consumer_offsets-0 (loaded from
    ``offsets_log``) and __share_group_state-0, whose table is not loaded: the share
    coordinator answers COORDINATOR_LOAD_IN_PROGRESS until the test loads it."""
    broker = make_broker()
    await nursery.start(broker.flusher.run)
    topic = broker.topics.create(TOPIC, 1)
    log = broker.topics.log(TOPIC, 0)
    assert log is not None
    log.append(build_batch([(None, b"r%d" % i) for i in range(3)]), now_ms=0)
    view = broker.replication.view
    view.brokers[ME] = BrokerInfo(ME, "127.0.0.1", 9092)
    for name, topic_id in ((TOPIC, topic.topic_id), (SHARE_GROUP_STATE, uuid.uuid4())):
        view.topics[name] = TopicInfo(name, topic_id, {0: PartitionInfo((ME,), ME, 0, (ME,))})
        broker.replication.terms[name, 0] = Term(0)
    broker.share_coordinator.elected(0, 0, MemoryLog(LogConfig()))
    coordinator = broker.groups = GroupCoordinator(
        broker, offsets_partitions=1, leaders=lambda: broker.replication
    )
    await nursery.start(coordinator.run)
    broker.replication.terms[CONSUMER_OFFSETS, 0] = Term(0)
    coordinator.elected(0, 0, offsets_log or MemoryLog())
    await coordinator.led[0].loaded.wait()
    return broker, topic.topic_id


async def heartbeat(broker: ClusteredBroker, epoch: int) -> m.ShareGroupHeartbeatResponse:
    header = RequestHeader(m.ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1, "client")
    ctx = RequestContext(header=header, services=broker, client=ClientInfo(1, "127.0.0.1", 1))  # type: ignore[arg-type]
    request = m.ShareGroupHeartbeatRequest(
        group_id=GROUP, member_id=MEMBER, member_epoch=epoch,
        subscribed_topic_names=[TOPIC] if epoch == 0 else None,
    )  # fmt: skip
    answer = await handle_share_group_heartbeat(ctx, request)
    assert answer.error_code == ErrorCode.NONE, answer
    return answer


def assigned(answer: m.ShareGroupHeartbeatResponse) -> list[tuple[uuid.UUID, list[int]]]:
    if answer.assignment is None:
        return []
    return [(t.topic_id, list(t.partitions)) for t in answer.assignment.topic_partitions]


def stored_state(broker: ClusteredBroker, topic_id: uuid.UUID) -> int | None:
    """The start offset the share coordinator holds for the group's t-0 (None: none)."""
    table = broker.share_coordinator.tables.get(0)
    snapshot = None if table is None else table.store.snapshots.get(ShareKey(GROUP, topic_id, 0))
    return None if snapshot is None else snapshot.start_offset


async def test_a_partition_whose_share_state_is_not_written_is_not_assigned() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id = await start(nursery)
        # The share coordinator cannot read the partition's state yet: the member joins
        # without it (the bug: it was handed t-0, whose start was never made durable).
        joined = await heartbeat(broker, 0)
        assert assigned(joined) == []
        assert stored_state(broker, topic_id) is None
        records = broker.groups.share_group(GROUP)
        assert records is not None
        assert (records.initialized, records.initializing) == ({}, {})
        # The failed initialization is not left recorded as under way: the next
        # heartbeat tries again, succeeds, and the member gets t-0 in its answer, at a
        # new epoch, once its start (the log end when it was first tried: 3) is stored.
        broker.share_coordinator.load_pending()
        later = await heartbeat(broker, joined.member_epoch)
        assert assigned(later) == [(topic_id, [0])]
        assert later.member_epoch > joined.member_epoch
        assert stored_state(broker, topic_id) == 3
        records = broker.groups.share_group(GROUP)
        assert records is not None
        assert records.initialized == {topic_id: StoredTopic(TOPIC, frozenset({0}))}
        assert records.initializing == {}
        # Nothing left to do: the next heartbeat keeps the epoch and the assignment.
        again = await heartbeat(broker, later.member_epoch)
        assert again.member_epoch == later.member_epoch
        nursery.cancel_scope.cancel()


async def test_a_partition_left_initializing_by_a_restart_is_initialized_again_later(
    mock_clock: trio.testing.MockClock,
) -> None:
    offsets_log = MemoryLog()
    async with trio.open_nursery() as nursery:
        broker, topic_id = await start(nursery, offsets_log)
        # A coordinator recorded t-0 as initializing and stopped before it knew the
        # outcome; the partition is led anew (here by this broker, from the same log).
        left = StoredShareGroup(initializing={topic_id: StoredTopic(TOPIC, frozenset({0}))})
        write = broker.groups.store_share_group(GROUP, left)
        assert write is not None
        await broker.groups.wait_offsets_durable(write)
        broker.groups.resigned(0)
        # group.share.initialize.retry.interval.ms, here 7 s (Kafka's default: 30 s).
        broker.shares = ShareGroups(ShareGroupsConfig(initialize_retry_interval_ms=7_000))
        broker.replication.terms[CONSUMER_OFFSETS, 0] = Term(1)
        broker.groups.elected(0, 1, offsets_log)
        await broker.groups.led[0].loaded.wait()
        assert broker.groups.share_group(GROUP) == left
        broker.share_coordinator.load_pending()
        # Left to the initialization under way for the retry interval, as Kafka leaves it ...
        joined = await heartbeat(broker, 0)
        assert assigned(joined) == []
        mock_clock.jump(6.999)
        still = await heartbeat(broker, joined.member_epoch)
        assert assigned(still) == []
        assert stored_state(broker, topic_id) is None
        # ... then tried again by a heartbeat, and assigned once it succeeded.
        mock_clock.jump(0.001)
        later = await heartbeat(broker, still.member_epoch)
        assert assigned(later) == [(topic_id, [0])]
        assert stored_state(broker, topic_id) == 3
        records = broker.groups.share_group(GROUP)
        assert records is not None
        assert (set(records.initialized), records.initializing) == ({topic_id}, {})
        nursery.cancel_scope.cancel()


@attrs.define
class OtherLeader:
    """The data partition's leader, another broker, as the share coordinator's channel
    reaches it: ListOffsets answers its log start and high watermark, or an error."""

    bounds: tuple[ErrorCode, int, int]
    asked: list[tuple[int, str, int]] = attrs.field(factory=list)

    async def partition_offsets(
        self, leader: int, topic: str, partition: int
    ) -> tuple[ErrorCode, int, int]:
        await trio.lowlevel.checkpoint()
        self.asked.append((leader, topic, partition))
        return self.bounds


async def test_a_partition_led_elsewhere_is_initialized_at_its_share_coordinator() -> None:
    async with trio.open_nursery() as nursery:
        broker, topic_id = await start(nursery)
        broker.share_coordinator.load_pending()
        # Broker 2 leads t-0 now; this one coordinates the group and the share state.
        del broker.replication.terms[TOPIC, 0]
        broker.replication.view.topics[TOPIC].partitions[0] = PartitionInfo((2,), 2, 1, (2,))
        leader = OtherLeader((ErrorCode.LEADER_NOT_AVAILABLE, -1, -1))
        broker.share_coordinator.remote = leader  # type: ignore[assignment]
        # Its leader cannot be asked where the partition ends: not initialized, not
        # assigned (before, it was assigned with nothing written).
        joined = await heartbeat(broker, 0)
        assert assigned(joined) == []
        assert leader.asked == [(2, TOPIC, 0)]
        assert stored_state(broker, topic_id) is None
        records = broker.groups.share_group(GROUP)
        assert records is not None and (records.initialized, records.initializing) == ({}, {})
        # Asked again at the next heartbeat: written at its high watermark (the group
        # starts at the latest offset), in state epoch 1, and assigned.
        leader.bounds = (ErrorCode.NONE, 1, 7)
        later = await heartbeat(broker, joined.member_epoch)
        assert assigned(later) == [(topic_id, [0])]
        assert stored_state(broker, topic_id) == 7
        table = broker.share_coordinator.tables[0]
        assert table.store.snapshots[ShareKey(GROUP, topic_id, 0)].state_epoch == 1
        nursery.cancel_scope.cancel()
