"""Writing a share group's share-partition state to ``__share_group_state``.

After a request changes share partitions (acquisitions, acknowledgements, a partition
made on assignment), the snapshots of the group's partitions whose durable state moved
are appended, in one batch, through the coordinators' append path
(``services/internal_topics.py``). The append is made before the request yields, so the
log holds the snapshots in the order the state changed; a request whose answer must not
be taken back by a crash (acknowledgements, a new start offset) then waits until the log
is synced through the last snapshot appended, its own or an earlier request's.

Snapshots are keyed by (group, topic id, partition); a deleted topic's go with it
(:func:`forget_topic`, called by the topic manager).

In a cluster there is no store here: the share state is the share coordinator's
(``groups/share_coordinator.py``, ``handlers/share_group_state.py``). A leader reads a
share partition's state from it the first time it serves the partition in its leader
epoch (:func:`ensure_loaded`), and :func:`persist` sends it the snapshots that moved,
stamped with that epoch, waiting until they count there. Acquisitions alone are not
sent (:func:`append_changes` writes nothing in a cluster): the next write carries
their delivery counts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from trio_broker.groups.share_coordinator import StateWrite
from trio_broker.groups.share_state import (
    SHARE_GROUP_STATE,
    ShareKey,
    encode_batch,
    snapshot_of,
)
from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.share_group_state import read_local, write_local
from trio_broker.partition.append import NotLeader, leader_epoch_of
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.internal_topics import NotCommitted, append_as_leader, wait_counted
from trio_broker.services.local_replication import OwnLog
from trio_broker.storage.log_protocol import Log

log = logging.getLogger("trio_broker.groups")

#: A share partition of a group: (topic id, partition).
Partition = tuple[uuid.UUID, int]


def append_changes(
    ctx: RequestContext,
    group_id: str,
    deleted: Sequence[Partition] = (),
    *,
    only: Collection[Partition] | None = None,
) -> bool:
    """Append the group's changed snapshots now (no waiting), and tombstones for its
    ``deleted`` (topic id, partition)s; whether anything was appended. ``only``: the
    (topic id, partition)s the request may have changed (None: all of the group's); what
    else happens to a share partition (locks running out, a member's records given
    back) leaves its snapshot as it was."""
    shares = ctx.services.shares
    store = shares.store
    if store is None:
        return False
    current = [
        (ShareKey(group_id, topic_id, partition), share_partition)
        for topic_id, partition, share_partition in shares.partitions_of(group_id)
        if only is None or (topic_id, partition) in only
    ]
    gone = [ShareKey(group_id, topic_id, partition) for topic_id, partition in deleted]
    now = ctx.now_ms()
    entries = store.changes(current, now) + store.tombstones(gone)
    if not entries:
        return False
    appended = append_as_leader(
        store.log, encode_batch(entries, now), now_ms=now, durability=ctx.services.durability,
        replication=_own(ctx.services.config.node_id, store.log), messages=len(entries),
    )  # fmt: skip
    store.appended(entries, appended.last_offset)
    return True


async def persist(
    ctx: RequestContext,
    group_id: str,
    deleted: Sequence[Partition] = (),
    *,
    only: Collection[Partition] | None = None,
) -> ErrorCode:
    """Append the group's changes (:func:`append_changes`), then wait until everything
    appended so far is durable. NONE, or the error to answer."""
    if ctx.services.share_coordinator is not None:
        return await _persist_in_cluster(ctx, group_id, only)
    try:
        append_changes(ctx, group_id, deleted, only=only)
        store = ctx.services.shares.store
        if store is None or store.last_appended < 0:
            return ErrorCode.NONE
        await wait_counted(
            store.log, store.last_appended, durability=ctx.services.durability,
            replication=_own(ctx.services.config.node_id, store.log),
        )  # fmt: skip
    except NotCommitted as exc:
        return exc.error_code
    return ErrorCode.NONE


#: What a leader answers for a share partition whose coordinator cannot answer now
#: (the clients fetch or acknowledge again).
_RETRY_LATER = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT,
})  # fmt: skip


def _for_client(error: ErrorCode) -> ErrorCode:
    return ErrorCode.COORDINATOR_NOT_AVAILABLE if error in _RETRY_LATER else error


def _leader_epoch(ctx: RequestContext, topic_id: uuid.UUID, partition: int) -> int | None:
    """This broker's leader epoch of the data partition, None when it does not lead it."""
    topic = ctx.services.topics.by_id.get(topic_id)
    if topic is None:
        return None
    try:
        return leader_epoch_of(ctx.services.leaders, topic.name, partition)
    except NotLeader:
        return None


def _coordinator_of(ctx: RequestContext, key: ShareKey) -> int | ErrorCode:
    """The broker leading the key's ``__share_group_state`` partition (made on first use)."""
    services = ctx.services
    coordinator = services.share_coordinator
    assert coordinator is not None
    state_partition = coordinator.partition_of(key)
    info = services.leaders.partition(SHARE_GROUP_STATE, state_partition)
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


async def ensure_loaded(
    ctx: RequestContext, group_id: str, partitions: Collection[Partition]
) -> dict[Partition, ErrorCode]:
    """In a cluster: the share state of each of ``partitions`` this broker leads, read
    from the share coordinator unless it was read in this leader epoch already; the
    partitions that could not be read, with the error to answer for them (nothing in a
    node alone: its state was restored at start). A partition without stored state keeps
    the share partition made here in this epoch (on assignment), or is made where
    ``share.auto.offset.reset`` says on its first fetch. A partition read again in a
    new epoch keeps the share partition in memory when the coordinator holds what this
    broker wrote last (no other leader wrote since)."""
    services = ctx.services
    coordinator = services.share_coordinator
    if coordinator is None:
        return {}
    shares = services.shares
    failed: dict[Partition, ErrorCode] = {}
    for topic_id, partition in partitions:
        epoch = _leader_epoch(ctx, topic_id, partition)
        key = ShareKey(group_id, topic_id, partition)
        if epoch is None or shares.loaded.get(key) == epoch:
            continue  # not led here (the fetch answers why), or read already
        leader = _coordinator_of(ctx, key)
        if isinstance(leader, ErrorCode):
            failed[topic_id, partition] = leader
            continue
        if leader == services.config.node_id:
            error, snapshot = read_local(services, key, epoch)
        elif coordinator.remote is None:
            error, snapshot = ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        else:
            error, snapshot = await coordinator.remote.read(leader, key, epoch)
        if error is not ErrorCode.NONE:
            failed[topic_id, partition] = _for_client(error)
            continue
        if _leader_epoch(ctx, topic_id, partition) != epoch:
            failed[topic_id, partition] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            continue
        known = shares.written.get(key)
        held = shares.partition(group_id, topic_id, partition)
        if snapshot is not None and not (
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


async def _persist_in_cluster(
    ctx: RequestContext, group_id: str, only: Collection[Partition] | None
) -> ErrorCode:
    """Send the snapshots of the group's share partitions led and read here whose state
    moved to their share coordinators; NONE once each counts there, else the error.

    Each coordinator's snapshots are taken right before they are handed to it (appended
    there, or queued on its connection), with no wait in between: two requests' writes
    of a key reach its coordinator in the order their snapshots were taken, so an older
    snapshot never lands after a newer one (which an acknowledgement was answered on)."""
    services = ctx.services
    coordinator = services.share_coordinator
    assert coordinator is not None
    shares = services.shares
    by_coordinator: dict[int, list[tuple[ShareKey, int]]] = {}
    result = ErrorCode.NONE
    for topic_id, partition, _ in shares.partitions_of(group_id):
        if only is not None and (topic_id, partition) not in only:
            continue
        key = ShareKey(group_id, topic_id, partition)
        epoch = _leader_epoch(ctx, topic_id, partition)
        if epoch is None or shares.loaded.get(key) != epoch:
            continue  # not this broker's to write (a coordinator's copy, a stale one)
        leader = _coordinator_of(ctx, key)
        if isinstance(leader, ErrorCode):
            result = leader
            continue
        by_coordinator.setdefault(leader, []).append((key, epoch))
    answers: dict[ShareKey, ErrorCode] = {}
    for leader, keys in by_coordinator.items():
        writes = []
        for key, epoch in keys:
            share_partition = shares.partition(key.group_id, key.topic_id, key.partition)
            if share_partition is None:
                continue  # dropped while an earlier coordinator's write was waited for
            fresh = snapshot_of(share_partition)
            known = shares.written.get(key)
            if known is None or not known.same_state(fresh):
                writes.append(StateWrite(key, fresh, epoch))
        if not writes:
            continue
        if leader == services.config.node_id:
            answers.update(await write_local(services, writes, ctx.now_ms()))
        elif coordinator.remote is None:
            answers.update((w.key, ErrorCode.COORDINATOR_NOT_AVAILABLE) for w in writes)
        else:
            answers.update(await coordinator.remote.write(leader, group_id, writes))
        for write in writes:
            if answers.get(write.key) is ErrorCode.NONE:
                shares.written[write.key] = write.snapshot
    for error in answers.values():
        if error is not ErrorCode.NONE and result is ErrorCode.NONE:
            result = error
    return _for_client(result)


def forget_topic(
    shares: Any, durability: Any, topic_id: uuid.UUID, now_ms: int, broker_id: int
) -> None:
    """A topic is deleted: every group's share state of it goes, from memory and (with
    tombstones, not waited for) from the log. A topic created again under the name has
    another id and starts with no share state. Were the tombstones lost in a crash, the
    snapshots would still not come back: restoring skips ids no topic has."""
    dropped = shares.forget_topic(topic_id)
    store = shares.store
    if store is None:
        return
    stored = [key for key in store.snapshots if key.topic_id == topic_id]
    entries = store.tombstones({*dropped, *stored})
    if not entries:
        return
    try:
        appended = append_as_leader(
            store.log, encode_batch(entries, now_ms), now_ms=now_ms, durability=durability,
            replication=_own(broker_id, store.log), messages=len(entries),
        )  # fmt: skip
    except NotCommitted as exc:
        log.warning("share state of deleted topic %s not tombstoned: %s", topic_id, exc)
        return
    store.appended(entries, appended.last_offset)


def _own(broker_id: int, log_: Log) -> OwnLog:
    """The share state's log is this broker's own, replicated nowhere, in a cluster too:
    a write counts once synced."""
    return OwnLog(broker_id, log_)
