"""Writing a share group's share-partition state to ``__share_group_state``.

After a request changes share partitions (acquisitions, acknowledgements, a partition
made on assignment), the snapshots of the group's partitions whose durable state moved
are appended, in one batch, through the coordinators' append path
(``services/internal_topics.py``). The append is made before the request yields, so the
log holds the snapshots in the order the state changed; a request whose answer must not
be taken back by a crash (acknowledgements, a new start offset) then waits until the log
is synced through the last snapshot appended, its own or an earlier request's.

Snapshots are keyed by (group, topic id, partition); a deleted topic's go with it
(:func:`forget_topic`, called by the topic manager). Nothing is written without a store
(a cluster: docs/share-groups.md).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from trio_broker.groups.share_state import ShareKey, encode_batch
from trio_broker.handlers.base import RequestContext
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
