"""Share groups when their coordinator is another broker, in process (no ZooKeeper): the
replica manager's leadership calls are fed directly, as in test_groups_cluster.py.

A broker that does not coordinate a share group leaves it alone in DeleteGroups
(NOT_COORDINATOR, as for the other groups), though it knows the group as a leader of
its share partitions; and a broker that stops leading a ``__consumer_offsets``
partition drops its share groups' membership, so a later load of the partition brings
them back from their records, with the members stored there: a member goes on
heartbeating with the epoch it holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import attrs
import trio

from tests.unit.groups.test_groups_cluster import context, group_in, lead, start
from trio_broker.groups.offsets_store import (
    SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION,
    OffsetsStore,
    ShareGroupRecord,
)
from trio_broker.groups.share_coordinator import PartitionedShareCoordinator
from trio_broker.groups.share_records import StoredShareGroup, records_of
from trio_broker.handlers.groups import handle_delete_groups
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_group import ShareGroup, ShareHeartbeat, ShareHeartbeatResult
from trio_broker.storage.memory import MemoryLog


async def test_delete_groups_leaves_a_share_group_coordinated_elsewhere() -> None:
    elsewhere = group_in(1, "share")
    topic_id = uuid.uuid4()
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 0, 0, MemoryLog())
        await coordinator.led[0].loaded.wait()
        # Known here as the leader of one of its share partitions knows it.
        broker.shares.ensure_partition(elsewhere, topic_id, 0, 0)
        broker.shares.recall_groups([elsewhere])
        deleted = await handle_delete_groups(
            context(broker, m.ApiKey.DELETE_GROUPS, 2),
            m.DeleteGroupsRequest(groups_names=[elsewhere]),
        )
        assert isinstance(deleted, m.DeleteGroupsResponse)
        assert [(r.group_id, r.error_code) for r in deleted.results] == [
            (elsewhere, ErrorCode.NOT_COORDINATOR)
        ]
        assert elsewhere in broker.shares.groups
        assert broker.shares.partition(elsewhere, topic_id, 0) is not None
        nursery.cancel_scope.cancel()


async def test_resigning_drops_the_share_groups_membership() -> None:
    mine, other = group_in(2, "share"), group_in(3, "share")
    topic_id = uuid.uuid4()
    log = MemoryLog()
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        shares = broker.shares
        # As the broker wires them (server/broker.py).
        coordinator.on_partition_resigned = lambda partition: shares.unload_groups(
            lambda group_id: coordinator.partition_of(group_id) == partition
        )
        coordinator.on_share_groups_loaded = lambda stored: shares.recall_groups(
            stored, {g: s.epoch for g, s in stored.items()}
        )
        lead(broker, coordinator, 2, 0, log)
        await coordinator.led[2].loaded.wait()
        joined = shares.heartbeat(
            mine, ShareHeartbeat("m1", 0, None, ("t",)), {}, lambda *_: 0, broker.now_ms()
        )
        assert joined.error is ErrorCode.NONE
        epoch = shares.groups[mine].group_epoch
        write = coordinator.store_share_group(mine, StoredShareGroup(epoch=epoch))
        assert write is not None
        await coordinator.wait_offsets_durable(write)
        shares.ensure_partition(mine, topic_id, 0, 0)  # a share partition led here
        shares.recall_groups([other])  # a group of a partition led elsewhere stays

        coordinator.resigned(2)
        assert mine not in shares.groups and other in shares.groups
        assert shares.partition(mine, topic_id, 0) is not None

        # Led here again: the group is back from its records, empty, at its epoch.
        lead(broker, coordinator, 2, 1, log)
        await coordinator.led[2].loaded.wait()
        group = shares.group(mine, broker.now_ms())
        assert group is not None
        assert group.members == {} and group.group_epoch == epoch
        nursery.cancel_scope.cancel()


async def test_a_member_goes_on_with_its_epoch_after_the_group_is_loaded_again() -> None:
    """A member's join and a second member's join are written as a heartbeat writes
    them; the partition is resigned (membership gone here) and led again: the load
    brings both members back, and the first heartbeats with the epoch it was given (no
    rejoin, no new group epoch), gets its next epoch, and leaves; led once more, the
    group has the one member left."""
    mine = group_in(2, "share")
    log = MemoryLog()
    metadata = {"t": (uuid.uuid4(), 2)}
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        shares = broker.shares
        # As the broker wires them (server/broker.py).
        coordinator.on_partition_resigned = lambda partition: shares.unload_groups(
            lambda group_id: coordinator.partition_of(group_id) == partition
        )

        def loaded(stored: Mapping[str, StoredShareGroup]) -> None:
            shares.recall_groups(stored, {g: s.epoch for g, s in stored.items()})
            shares.restore_members(stored, broker.now_ms())

        coordinator.on_share_groups_loaded = loaded

        async def heartbeat(member: str, epoch: int) -> ShareHeartbeatResult:
            result = shares.heartbeat(
                mine, ShareHeartbeat(member, epoch, None, ("t",)), metadata,
                lambda *_: 0, broker.now_ms(),
            )  # fmt: skip
            group = shares.groups[mine]
            known = coordinator.share_group(mine) or StoredShareGroup()
            write = coordinator.store_share_group(mine, known.with_membership(group))
            if write is not None:
                await coordinator.wait_offsets_durable(write)
            return result

        async def lead_again(epoch: int) -> None:
            coordinator.resigned(2)
            assert mine not in shares.groups
            lead(broker, coordinator, 2, epoch, log)
            await coordinator.led[2].loaded.wait()

        lead(broker, coordinator, 2, 0, log)
        await coordinator.led[2].loaded.wait()
        first = await heartbeat("m1", 0)
        second = await heartbeat("m2", 0)
        assert second.member_epoch == first.member_epoch + 1
        await lead_again(1)

        group = shares.groups[mine]
        assert set(group.members) == {"m1", "m2"}
        assert group.group_epoch == second.member_epoch
        assert group.members["m1"].member_epoch == first.member_epoch
        again = await heartbeat("m1", first.member_epoch)
        assert again.error is ErrorCode.NONE
        # Moved to the target it had before the load, at the group's epoch: no new one.
        assert again.member_epoch == second.member_epoch == shares.groups[mine].group_epoch
        assert again.assignment == {("t", 0)} and second.assignment == {("t", 1)}
        assert (await heartbeat("m1", -1)).error is ErrorCode.NONE
        await lead_again(2)

        group = shares.groups[mine]
        assert set(group.members) == {"m2"}
        assert group.members["m2"].member_epoch == second.member_epoch
        nursery.cancel_scope.cancel()


async def test_a_members_unreadable_records_are_tombstoned_with_the_groups_next_write() -> None:
    """A member whose records the load cannot read is left out (it rejoins), and the
    group's next write tombstones those records, so they do not stay in the log."""
    mine = group_in(2, "share")
    group = ShareGroup(mine)
    for member in ("m1", "m2"):
        group.heartbeat(ShareHeartbeat(member, 0, None, ("t",)), {"t": 2}, 0)
    previous = OffsetsStore(MemoryLog(), 2)
    damaged = ShareGroupRecord(SHARE_GROUP_CURRENT_MEMBER_KEY_VERSION, mine, b"\0\1", "m2")
    records = [*records_of(mine, StoredShareGroup().with_membership(group)), damaged]
    previous.apply(previous.append(records, 0))
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        lead(broker, coordinator, 2, 0, previous.log)
        await coordinator.led[2].loaded.wait()
        known = coordinator.share_group(mine)
        assert known is not None and set(known.members) == {"m1"}
        write = coordinator.store_share_group(mine, attrs.evolve(known, epoch=known.epoch + 1))
        assert write is not None
        await coordinator.wait_offsets_durable(write)
        store = coordinator.led[2].store
        assert store is not None
        assert {m for _, m in store.share_group_records(mine)} == {"", "m1"}
        nursery.cancel_scope.cancel()


class OwnsNoStatePartition:
    """Leadership of no ``__share_group_state`` partition (never asked here)."""

    def partition(self, topic: str, partition: int) -> None:
        return None


async def test_delete_groups_again_after_the_share_state_was_not_deleted() -> None:
    """A DeleteGroups whose share state deletion failed (a share coordinator moving after
    a kill: COORDINATOR_NOT_AVAILABLE) dropped the group from memory and kept its
    records; the Admin client's retry deletes it, where it answered GROUP_ID_NOT_FOUND."""
    mine = group_in(2, "share")
    async with trio.open_nursery() as nursery:
        broker, coordinator = await start(nursery)
        # A share coordinator leading no __share_group_state partition: the group has no
        # share state left to delete, its records alone stay.
        broker.share_coordinator = PartitionedShareCoordinator(1, OwnsNoStatePartition())
        lead(broker, coordinator, 2, 0, MemoryLog())
        await coordinator.led[2].loaded.wait()
        write = coordinator.store_share_group(mine, StoredShareGroup(epoch=3))
        assert write is not None
        await coordinator.wait_offsets_durable(write)
        assert mine not in broker.shares.groups  # as the failed delete left it
        deleted = await handle_delete_groups(
            context(broker, m.ApiKey.DELETE_GROUPS, 2),
            m.DeleteGroupsRequest(groups_names=[mine]),
        )
        if not isinstance(deleted, m.DeleteGroupsResponse):
            deleted = await deleted.finish()
        assert [(r.group_id, r.error_code) for r in deleted.results] == [(mine, ErrorCode.NONE)]
        assert coordinator.share_group(mine) is None
        nursery.cancel_scope.cancel()
