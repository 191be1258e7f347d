"""A share partition's leader and its share coordinator: reading and writing the state.

A share partition (group, topic id, partition) lives on its data partition's leader;
its durable state is its share coordinator's, the leader of the key's
``__share_group_state`` partition (``groups/share_coordinator.py``,
``handlers/share_group_state.py``): in a cluster one of 50 replicated partitions, on a
node alone the one partition of its own log, led by an ``OwnPartition``. One path for
both: a leader reads a share partition's state from its coordinator the first time it
serves the partition in its leader epoch (:func:`ensure_loaded`), and :func:`persist`
sends the coordinator the snapshots that moved (acknowledgements, a start offset made
on assignment or reset), stamped with that epoch, and the tombstones of share
partitions deleted, waiting until they count there (synced; in a cluster below the
high watermark too). When the coordinator is this broker the calls are direct, else
they are requests (``cluster/share_state_channel.py``). Acquisitions alone are not
written, as in Kafka: the next write carries their delivery counts.

A deleted topic's share state goes with it: from the brokers that held the topic
(:func:`forget_topic`, called by the topic manager), and from every share coordinator
holding state of it, told by the groups' coordinators (:func:`deleted_topics_of_groups`,
:func:`delete_deleted_topics_state`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from trio_broker.groups.share_coordinator import NO_LEADER_EPOCH, StateWrite
from trio_broker.groups.share_state import SHARE_GROUP_STATE, ShareKey, ShareSnapshot, snapshot_of
from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.share_group_state import (
    append_entries,
    delete_local,
    read_local,
    write_local,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError
from trio_broker.services.internal_topics import NotCommitted

log = logging.getLogger("trio_broker.groups")

#: A share partition of a group: (topic id, partition).
Partition = tuple[uuid.UUID, int]


async def persist(
    ctx: RequestContext,
    group_id: str,
    deleted: Sequence[Partition] = (),
    *,
    only: Collection[Partition] | None = None,
) -> ErrorCode:
    """Tombstone the group's ``deleted`` share partitions at their share coordinators,
    then write its share partitions whose durable state moved (:func:`_write_changes`);
    NONE once all of it counts there, else the error to answer."""
    result = ErrorCode.NONE
    if deleted:
        gone = [ShareKey(group_id, topic_id, partition) for topic_id, partition in deleted]
        answers = await delete_state(ctx.services, gone)
        result = next((e for e in answers.values() if e is not ErrorCode.NONE), result)
    written = await _write_changes(ctx, group_id, only)
    first_error = next((e for e in written.values() if e is not ErrorCode.NONE), ErrorCode.NONE)
    return error_for_client(first_error if result is ErrorCode.NONE else result)


async def persist_each(
    ctx: RequestContext, group_id: str, partitions: Collection[Partition]
) -> dict[Partition, ErrorCode]:
    """Write the group's ``partitions`` whose durable state moved, as :func:`persist`:
    each partition's error for a client, NONE once its state counts at its coordinator
    (or nothing of it moved). What an acknowledgement is answered, and what settles it
    (kept, or undone: ``SharePartition.settle``). A partition not led here in the leader
    epoch it was read in is not written: NOT_LEADER_OR_FOLLOWER."""
    written = await _write_changes(ctx, group_id, partitions)
    return {
        p: error_for_client(written.get(p, ErrorCode.NOT_LEADER_OR_FOLLOWER)) for p in partitions
    }


#: What a leader answers for a share partition whose coordinator cannot answer now
#: (the clients fetch or acknowledge again).
_RETRY_LATER = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT,
})  # fmt: skip


def error_for_client(error: ErrorCode) -> ErrorCode:
    """What a client is answered for a share coordinator's error: one it cannot reach,
    or that is moving, is COORDINATOR_NOT_AVAILABLE (the client asks again)."""
    return ErrorCode.COORDINATOR_NOT_AVAILABLE if error in _RETRY_LATER else error


def _leader_epoch(ctx: RequestContext, topic_id: uuid.UUID, partition: int) -> int | None:
    """This broker's leader epoch of the data partition, None when it does not lead it."""
    topic = ctx.services.topics.by_id.get(topic_id)
    if topic is None:
        return None
    # A node alone leads every partition it holds, in epoch 0 (services/local_replication.py).
    term = ctx.services.leaders.leader_term(topic.name, partition)
    return term.leader_epoch if term else None


def leader_epoch_here(ctx: RequestContext, topic_id: uuid.UUID, partition: int) -> int | None:
    """This broker's leader epoch of the data partition, None when it does not lead it."""
    return _leader_epoch(ctx, topic_id, partition)


def _coordinator_of(services: Any, key: ShareKey) -> int | ErrorCode:
    """The broker leading the key's ``__share_group_state`` partition (made on first use)."""
    coordinator = services.share_coordinator
    state_partition = coordinator.partition_of(key)
    info = coordinator.replication.partition(SHARE_GROUP_STATE, state_partition)
    if info is None:
        config = services.config
        if SHARE_GROUP_STATE not in services.admin.view.topics:
            services.admin.ensure_internal_topic_soon(
                SHARE_GROUP_STATE, coordinator.num_partitions,
                config.share_coordinator_state_topic_replication_factor,
                {"cleanup.policy": "compact", "compression.type": "uncompressed",
                 "min.insync.replicas": str(config.share_coordinator_state_topic_min_isr),
                 "segment.bytes": str(config.share_coordinator_state_topic_segment_bytes)},
            )  # fmt: skip
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if info.leader not in services.admin.view.brokers:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return info.leader


async def read_state(
    ctx: RequestContext, key: ShareKey, leader_epoch: int = NO_LEADER_EPOCH
) -> tuple[ErrorCode, ShareSnapshot | None]:
    """ReadShareGroupState of ``key`` at its share coordinator (this broker's directly):
    (NONE, the snapshot or None for no state), or (the error, None). A leader reads in
    its ``leader_epoch`` (which fences its predecessors); without one it is a summary
    read, for the admin APIs, which fences no one."""
    return await read_state_of(ctx.services, key, leader_epoch)


async def read_state_of(
    services: Any, key: ShareKey, leader_epoch: int = NO_LEADER_EPOCH
) -> tuple[ErrorCode, ShareSnapshot | None]:
    """:func:`read_state` for a caller holding the services."""
    leader = _coordinator_of(services, key)
    if isinstance(leader, ErrorCode):
        return leader, None
    if leader == services.config.node_id:
        return read_local(services, key, leader_epoch)
    remote = services.share_coordinator.remote
    if remote is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
    return await remote.read(leader, key, leader_epoch)


async def ensure_loaded(
    ctx: RequestContext,
    group_id: str,
    partitions: Collection[Partition],
    *,
    again_if_idle: bool = False,
) -> dict[Partition, ErrorCode]:
    """The share state of each of ``partitions`` this broker leads, read from its share
    coordinator unless it was read in this leader epoch already (``again_if_idle``: read
    again those whose records no member holds, as the group's first share session here
    since its sessions all ended does: the admin APIs may have reset or deleted the
    state at the coordinator since); the partitions
    that could not be read, with the error to answer for them. A partition without
    stored state keeps the share partition made here in this epoch (on assignment), or
    is made where ``share.auto.offset.reset`` says on its first fetch; one whose stored
    state was deleted since this broker wrote it starts afresh so too. A partition read
    again keeps the share partition in memory when the coordinator holds what this
    broker wrote last (no other leader, no reset, wrote since)."""
    shares = ctx.services.shares
    failed: dict[Partition, ErrorCode] = {}
    for topic_id, partition in partitions:
        epoch = _leader_epoch(ctx, topic_id, partition)
        key = ShareKey(group_id, topic_id, partition)
        held = shares.partition(group_id, topic_id, partition)
        idle = held is None or held.next_lock_deadline() is None
        if epoch is None or (shares.loaded.get(key) == epoch and not (again_if_idle and idle)):
            continue  # not led here (the fetch answers why), or read already
        error, snapshot = await read_state(ctx, key, epoch)
        if error is not ErrorCode.NONE:
            failed[topic_id, partition] = error_for_client(error)
            continue
        if _leader_epoch(ctx, topic_id, partition) != epoch:
            failed[topic_id, partition] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            continue
        known = shares.written.get(key)
        held = shares.partition(group_id, topic_id, partition)
        if snapshot is None and known is not None:
            # Deleted at the coordinator since this broker wrote it (the admin APIs).
            shares.forget(key)
        elif snapshot is not None and not (
            held is not None and known is not None and known.same_state(snapshot)
        ):
            shares.restore({key: snapshot})
            shares.written[key] = snapshot
        # Else the stored state is this broker's own last write (or there is none): the
        # share partition in memory is current, its locks included. That is the case
        # when the leader epoch moved while this broker kept leading (a reassignment):
        # restoring would drop the records its members hold.
        shares.loaded[key] = epoch
    return failed


async def _write_changes(
    ctx: RequestContext, group_id: str, only: Collection[Partition] | None
) -> dict[Partition, ErrorCode]:
    """Send the snapshots of the group's share partitions led and read here whose state
    moved to their share coordinators; each partition's error (as the coordinator
    answered it), NONE once its snapshot counts there or when nothing of it moved. A
    share partition not this broker's to write is left out.

    Each coordinator's snapshots are taken right before they are handed to it (appended
    there, or queued on its connection), with no wait in between: two requests' writes
    of a key reach its coordinator in the order their snapshots were taken, so an older
    snapshot never lands after a newer one (which an acknowledgement was answered on)."""
    services = ctx.services
    coordinator = services.share_coordinator
    shares = services.shares
    by_coordinator: dict[int, list[tuple[ShareKey, int]]] = {}
    results: dict[Partition, ErrorCode] = {}
    for topic_id, partition, _ in shares.partitions_of(group_id):
        if only is not None and (topic_id, partition) not in only:
            continue
        key = ShareKey(group_id, topic_id, partition)
        epoch = _leader_epoch(ctx, topic_id, partition)
        if epoch is None or shares.loaded.get(key) != epoch:
            continue  # not this broker's to write (a coordinator's copy, a stale one)
        leader = _coordinator_of(services, key)
        if isinstance(leader, ErrorCode):
            results[topic_id, partition] = leader
            continue
        by_coordinator.setdefault(leader, []).append((key, epoch))
    for leader, keys in by_coordinator.items():
        writes = []
        for key, epoch in keys:
            share_partition = shares.partition(key.group_id, key.topic_id, key.partition)
            # NONE unless written below and refused: nothing of it moved, or it was
            # dropped (its state deleted) while an earlier coordinator's write was waited for.
            results[key.topic_id, key.partition] = ErrorCode.NONE
            if share_partition is None:
                continue
            fresh = snapshot_of(share_partition)
            known = shares.written.get(key)
            if known is None or not known.same_state(fresh):
                writes.append(StateWrite(key, fresh, epoch))
        if not writes:
            continue
        answers: dict[ShareKey, ErrorCode]
        if leader == services.config.node_id:
            answers = await write_local(services, writes, ctx.now_ms())
        elif coordinator.remote is None:
            answers = {w.key: ErrorCode.COORDINATOR_NOT_AVAILABLE for w in writes}
        else:
            answers = await coordinator.remote.write(leader, group_id, writes)
        for write in writes:
            error = answers.get(write.key, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            results[write.key.topic_id, write.key.partition] = error
            if error is ErrorCode.NONE:
                shares.written[write.key] = write.snapshot
            elif error is ErrorCode.FENCED_STATE_EPOCH:
                # Reset at the coordinator since this broker read it (AlterShareGroupOffsets):
                # the next request reads it again, as Kafka's leader does.
                shares.unload(write.key)
    return results


async def delete_state(services: Any, keys: Sequence[ShareKey]) -> dict[ShareKey, ErrorCode]:
    """DeleteShareGroupState of ``keys`` at their share coordinators (this broker's
    directly): each key's error, NONE once its tombstone counts. The keys are no longer
    read or written here: a share partition made for them again starts afresh."""
    coordinator = services.share_coordinator
    shares = services.shares
    answers: dict[ShareKey, ErrorCode] = {}
    by_coordinator: dict[int, list[ShareKey]] = {}
    for key in keys:
        shares.forget(key)
        leader = _coordinator_of(services, key)
        if isinstance(leader, ErrorCode):
            answers[key] = leader
        else:
            by_coordinator.setdefault(leader, []).append(key)
    for leader, led in by_coordinator.items():
        if leader == services.config.node_id:
            answers.update(await delete_local(services, led, services.now_ms()))
        elif coordinator.remote is None:
            answers.update(dict.fromkeys(led, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        else:
            answers.update(await coordinator.remote.delete(leader, led))
    return answers


async def initialize_state(
    services: Any, group_id: str, starts: dict[Partition, int]
) -> dict[Partition, ErrorCode]:
    """AlterShareGroupOffsets at the share coordinators (InitializeShareGroupState, as
    Kafka's group coordinator sends it): each share partition starts over at its start
    offset, nothing in flight, in a state epoch above the stored one (which fences its
    leader's writes of the old one: that leader reads it again). Each partition's error."""
    answers: dict[Partition, ErrorCode] = {}
    by_coordinator: dict[int, list[StateWrite]] = {}
    for (topic_id, partition), start_offset in starts.items():
        key = ShareKey(group_id, topic_id, partition)
        error, stored = await read_state_of(services, key)
        leader = error if error is not ErrorCode.NONE else _coordinator_of(services, key)
        if isinstance(leader, ErrorCode):
            answers[topic_id, partition] = error_for_client(leader)
            continue
        state_epoch = (0 if stored is None else stored.state_epoch) + 1
        snapshot = ShareSnapshot(start_offset, state_epoch=state_epoch)
        by_coordinator.setdefault(leader, []).append(StateWrite(key, snapshot, NO_LEADER_EPOCH))
    for leader, writes in by_coordinator.items():
        if leader == services.config.node_id:
            written = await write_local(services, writes, services.now_ms())
        elif services.share_coordinator.remote is None:
            written = dict.fromkeys((w.key for w in writes), ErrorCode.COORDINATOR_NOT_AVAILABLE)
        else:
            written = await services.share_coordinator.remote.initialize(leader, group_id, writes)
        for key, error in written.items():
            answers[key.topic_id, key.partition] = error_for_client(error)
            if error is ErrorCode.NONE:
                services.shares.unload(key)  # read again where it is next served here
    return answers


def forget_topic(services: Any, topic_id: uuid.UUID) -> list[ShareKey]:
    """A topic is deleted: every group's share state of it goes, from memory and, with
    tombstones appended now (not waited for), from the share coordinator's tables this
    broker leads (a node alone: all of them). The keys dropped from memory whose
    coordinator is another broker are returned: the caller sends their deletion
    (:func:`delete_state`). A topic created again under the name has another id and
    starts with no share state; were the tombstones lost in a crash, the snapshots would
    still not be read again: no topic has their id."""
    coordinator = services.share_coordinator
    shares = services.shares
    dropped = shares.forget_topic(topic_id)
    for key in dropped:
        shares.forget(key)
    now_ms = services.now_ms()
    for table in list(coordinator.tables.values()):
        entries = table.store.tombstones(k for k in table.store.snapshots if k.topic_id == topic_id)
        if not entries:
            continue
        try:
            append_entries(services, table, entries, now_ms)
        except NotCommitted as exc:
            log.warning("share state of deleted topic %s not tombstoned: %s", topic_id, exc)
    return [key for key in dropped if coordinator.partition_of(key) not in coordinator.tables]


def deleted_topics_of_groups(services: Any) -> dict[str, set[uuid.UUID]]:
    """The share groups this broker coordinates whose records (groups/share_records.py)
    name topics that no longer exist: group -> those topic ids. What Kafka's group
    coordinator learns from a topic's deletion (``onTopicsDeleted``); asked here of the
    topics as this broker sees them (``services.leaders.view``: the cluster's), so a
    coordinator that missed the deletion (down, or not the coordinator then) still finds
    them when it loads the group."""
    groups = services.groups
    existing = {topic.topic_id for topic in services.leaders.view.topics.values()}
    gone: dict[str, set[uuid.UUID]] = {}
    for group_id, stored in list(groups.share_groups.items()):
        missing = {t for t in stored.recorded_topics() if t not in existing}
        if missing and groups.coordinator_error(group_id) is ErrorCode.NONE:
            gone[group_id] = missing
    return gone


async def delete_deleted_topics_state(
    services: Any, group_id: str, topic_ids: Collection[uuid.UUID]
) -> ErrorCode:
    """DeleteShareGroupState for the group's share partitions of the deleted topics, at
    whichever brokers coordinate them (a broker holding share state of a topic it has no
    replica of is told only so), then the group's records without the topics: NONE once
    both count. On an error the records keep the topics, and the broker tries again
    (server/broker.py: on a timer with backoff, and at the next change of the topics or
    load of the group)."""
    groups = services.groups
    stored = groups.share_group(group_id)
    if stored is None:
        return ErrorCode.NONE
    recorded = stored.recorded_topics()
    keys = [
        ShareKey(group_id, topic_id, partition)
        for topic_id in topic_ids
        if topic_id in recorded
        for partition in sorted(recorded[topic_id].partitions)
    ]
    answers = await delete_state(services, keys)
    if failed := {k: e for k, e in answers.items() if e is not ErrorCode.NONE}:
        log.warning("share state of deleted topics not deleted yet: %s", failed)
        return next(iter(failed.values()))
    now = groups.share_group(group_id)
    if now is None:
        return ErrorCode.NONE  # the group was deleted meanwhile
    try:
        write = groups.store_share_group(group_id, now.without_topics(topic_ids))
        if write is not None:
            await groups.wait_offsets_durable(write)
    except KafkaError as exc:
        log.warning("share group %r: deleted topics not removed from its records: %s",
                    group_id, exc)  # fmt: skip
        return exc.error_code
    return ErrorCode.NONE
