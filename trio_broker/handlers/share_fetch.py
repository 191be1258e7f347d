"""ShareFetch (API 78, KIP-932): acquire records for a share-group member, and take its
acknowledgements of earlier ones.

A member keeps a share session (epoch 0 opens it, -1 closes it, each request carries the
next epoch) naming the partitions it fetches from. Acknowledgements in the request are
applied first; then each session partition hands the member up to ``MaxRecords`` records
under an acquisition lock (``trio_broker.state.share_partition``), sent as the log's
whole batches plus the acquired offset ranges the client keeps to. With nothing to
acquire the request waits up to ``MaxWaitMs`` for an append, or until a lock held in its
partitions runs out. As Kafka: READ on the group
and on each topic. The share state is read from and written to the share
coordinator (handlers/share_persist.py; docs/share-groups.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from trio_broker.groups.share import next_epoch
from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.handlers.list_offsets import offset_for_reset
from trio_broker.handlers.share_persist import ensure_loaded, persist_each
from trio_broker.protocol import batch_header
from trio_broker.protocol import messages as m
from trio_broker.protocol.codec import RecordsChunks
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.partition_txns import AbortedTxn
from trio_broker.state.share_partition import Acquired, SharePartition

Resp = m.ShareFetchResponse
TopicResp = Resp.ShareFetchableTopicResponse
PartResp = TopicResp.PartitionData
#: A member that asks for no limit (MaxRecords <= 0) gets at most this many a fetch.
DEFAULT_MAX_RECORDS = 500
INT32_MAX = 2**31 - 1
#: A request's acknowledgements applied but not yet stored, by (topic id, partition):
#: the share partition and each range acknowledged (settled by :func:`settle`).
Pending = dict[tuple[uuid.UUID, int], list[tuple[SharePartition, int, int]]]


def resolve(ctx: RequestContext, topic_id: uuid.UUID, partition: int) -> tuple[ErrorCode, Any]:
    """(NONE, (topic name, log)) or the partition's error: unknown id, READ refused."""
    topic = ctx.services.topics.by_id.get(topic_id)
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_ID, None
    if not authorized(ctx, Operation.READ, ResourceType.TOPIC, topic.name):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
    if not 0 <= partition < len(topic.logs):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
    if not ctx.services.leaders.leader_term(topic.name, partition):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
    return ErrorCode.NONE, (topic.name, topic.logs[partition])


def acknowledge(
    ctx: RequestContext, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int,
    batches: Sequence[Any], touched: set[tuple[uuid.UUID, int]], pending: Pending,
) -> ErrorCode:  # fmt: skip
    """Apply one partition's acknowledgement batches, all or none: the first batch
    that cannot be applied ends them and undoes those of this request applied before
    it, and its error is the partition's (Kafka's share partition rolls back every
    state change of the request's batches for the partition, and writes none). Else
    the partition goes into ``touched`` (its share state may have changed), the batches
    applied into ``pending``: the caller writes the touched partitions, then
    :func:`settle` keeps or undoes what is pending by how each write went."""
    error, _ = resolve(ctx, topic_id, partition)
    if error is not ErrorCode.NONE:
        return error
    share_partition = ctx.services.shares.partition(group_id, topic_id, partition)
    if share_partition is None:
        return ErrorCode.INVALID_RECORD_STATE if batches else ErrorCode.NONE
    applied: list[tuple[SharePartition, int, int]] = []
    for batch in batches:
        code = share_partition.acknowledge(
            member_id, batch.first_offset, batch.last_offset, batch.acknowledge_types,
            ctx.now_ms(), pending=True,
        )  # fmt: skip
        if code is not ErrorCode.NONE:
            for _, first, last in reversed(applied):
                share_partition.settle(first, last, stored=False)
            return code
        applied.append((share_partition, batch.first_offset, batch.last_offset))
    touched.add((topic_id, partition))
    if applied:
        pending.setdefault((topic_id, partition), []).extend(applied)
    return ErrorCode.NONE


def settle(
    ctx: RequestContext, group_id: str, member_id: str, pending: Pending,
    stored: Mapping[tuple[uuid.UUID, int], ErrorCode],
) -> None:  # fmt: skip
    """Keep the acknowledgements whose partition's write counted (``stored``: each
    partition's error), undo the others, as Kafka's share partition does: their records
    are acquired by the member again, their locks running, so that the member's retry
    finds them, and nothing unstored counts as done. A member whose session ended with
    this request gets them back at once (Kafka releases a closing session's records
    once its acknowledgements complete, whatever their outcome)."""
    closed = ctx.services.shares.session(group_id, member_id) is None
    for key, applied in pending.items():
        kept = stored.get(key, ErrorCode.NONE) is ErrorCode.NONE
        for share_partition, first, last in applied:
            share_partition.settle(first, last, kept)
            if not kept and closed:
                share_partition.release_member(member_id)


def request_error(group_id: str | None, member_id: str | None) -> str | None:
    if not group_id:
        return "GroupId can't be empty."
    if not member_id:
        return "MemberId can't be empty."
    return None


def readable_end(ctx: RequestContext, topic: str, partition: int, log: Any) -> int:
    # Alone the term's high watermark is the durable end (services/local_replication.py).
    term = ctx.services.leaders.leader_term(topic, partition)
    return int(term.high_watermark) if term else log.log_end_offset


def is_aborted(header: batch_header.BatchHeader, aborted_txns: Sequence[AbortedTxn]) -> bool:
    """A transactional data batch of a producer, inside one of its aborted
    transactions (from its first offset to its abort marker)."""
    attributes = header.attributes
    if not attributes & batch_header.TRANSACTIONAL_BIT or attributes & batch_header.CONTROL_BIT:
        return False
    base = header.base_offset
    return any(
        a.producer_id == header.producer_id and a.first_offset <= base <= a.last_offset
        for a in aborted_txns
    )


def batch_end(log: Any, offset: int, limit: int) -> int:
    """The last offset of the log batch holding ``offset``, below ``limit`` (the high
    watermark or the last stable offset): where a share fetch stops acquiring new
    records once ``MaxRecords`` reached ``offset``, as Kafka's, whose MaxRecords is a
    soft limit in its default (batch-optimized) acquire mode: a batch is acquired whole."""
    for base, header in log.iter_batch_headers(offset):
        if base > offset:
            break
        return min(base + batch_header.last_offset_delta(header), limit - 1)
    return offset


@attrs.frozen
class LogRead:
    """What a share fetch read of one partition's log: the offset after its last
    batch, and the offsets of aborted transactions' records in it (read_committed)."""

    end: int
    aborted: frozenset[int]


def read_batches(
    log: Any, first: int, end: int, max_bytes: int, min_one: bool,
    aborted_txns: Sequence[AbortedTxn] = (),
) -> LogRead:  # fmt: skip
    """The whole batches a read of ``max_bytes`` from the batch holding ``first``
    returns, below ``end``: as Kafka's log read, it stops before a batch that would
    pass the limit, but takes the first one whatever its size when ``min_one`` (the
    request's first partition to return records), so a small ``MaxBytes`` still makes
    progress, a batch a fetch. Batches of ``aborted_txns`` are noted as aborted."""
    used, bound = 0, first
    aborted: set[int] = set()
    for base, header in log.iter_batch_headers(first):
        if base >= end:
            break
        size = batch_header.base_offset_and_size(header)[1]
        if used + size > max_bytes and not (min_one and used == 0):
            break
        used += size
        last = base + batch_header.last_offset_delta(header)
        if aborted_txns and is_aborted(batch_header.unpack_header(header), aborted_txns):
            # The whole batch: its records past ``end`` may be acquired with it.
            aborted.update(range(max(base, first), last + 1))
        bound = min(end, last + 1)
        if bound >= end:
            break
    return LogRead(bound, frozenset(aborted))


class Fetch:
    """One ShareFetch's answer being put together: its partitions' errors and
    acknowledgement results, then what each acquires (maybe after a wait)."""

    def __init__(self, ctx: RequestContext, group_id: str, member_id: str) -> None:
        self.ctx = ctx
        self.group_id = group_id
        self.member_id = member_id
        self.parts: dict[tuple[uuid.UUID, int], PartResp] = {}
        #: (topic id, partition)s whose share state this request may have changed.
        self.touched: set[tuple[uuid.UUID, int]] = set()
        #: Its acknowledgements applied, until their write settles them.
        self.pending: Pending = {}

    def part(self, topic_id: uuid.UUID, partition: int) -> PartResp:
        key = (topic_id, partition)
        if key not in self.parts:
            self.parts[key] = PartResp(
                partition_index=partition, error_code=ErrorCode.NONE,
                acknowledge_error_code=ErrorCode.NONE, records=b"", acquired_records=[],
                current_leader=PartResp.LeaderIdAndEpoch(
                    leader_id=self.ctx.services.config.node_id, leader_epoch=0
                ),
            )  # fmt: skip
        return self.parts[key]

    def acquire(
        self, partitions: Iterable[tuple[uuid.UUID, int]], max_records: int, max_bytes: int
    ) -> int:
        """Acquire in each partition in turn while records are wanted; how many.

        Bytes bound it as Kafka's share fetch: each partition reads at most
        ``max_bytes`` split evenly among the partitions (Kafka's uniform partition
        max bytes), the request at most ``max_bytes`` in all, the first partition
        with records at least one whole batch; only offsets in the batches read are
        acquired. ``max_bytes`` <= 0 reads nothing (Kafka refuses to split it)."""
        shares = self.ctx.services.shares
        now = self.ctx.now_ms()
        read_committed = shares.read_committed(self.group_id)
        # Kafka's leader loads a share partition's state (from the share coordinator)
        # on the first fetch naming it, one partition at a time, and the fetch completes
        # as soon as one loaded partition has records: partitions already loaded come
        # first, and one loaded by this fetch is acquired from only if nothing was
        # before it. A new member's first fetch of several partitions thus gets one
        # partition's records (librdkafka's test 0179 counts on it); the next fetch
        # the others'.
        ordered = sorted(partitions, key=lambda k: (not self._loaded(k), str(k[0]), k[1]))
        partition_max_bytes = max_bytes // max(1, len(ordered))
        total = 0
        bytes_left = max_bytes
        for topic_id, partition in ordered:
            error, found = resolve(self.ctx, topic_id, partition)
            if error is not ErrorCode.NONE:
                self.part(topic_id, partition).error_code = error
                continue
            name, log = found
            if total >= max_records or max_bytes <= 0:
                continue
            self.touched.add((topic_id, partition))
            share_partition = shares.partition(self.group_id, topic_id, partition)
            if share_partition is None:
                reset = shares.auto_offset_reset(self.group_id)
                share_partition = shares.ensure_partition(
                    self.group_id, topic_id, partition, offset_for_reset(log, reset, now)
                )
            loading = not share_partition.loaded
            share_partition.loaded = True
            if loading and total > 0:
                continue
            share_partition.skip_to(log.log_start_offset)
            wanted = max_records - total
            limit = readable_end(self.ctx, name, partition, log)
            producers = self.ctx.services.producers
            if read_committed:
                # Only below the last stable offset, and aborted records are archived
                # as they are acquired, never delivered (Kafka's share.isolation.level).
                limit = min(limit, producers.last_stable_offset(name, partition, log, limit))
            # Fresh offsets are acquired up to end_offset + wanted, then on to the end of
            # the batch holding the last of them (below): the walk of batch headers stops
            # there.
            end = min(limit, share_partition.end_offset + wanted)
            first = share_partition.next_fetch_offset(now)
            aborted_txns: list[AbortedTxn] = []
            if read_committed:
                aborted_txns = producers.aborted_between(name, partition, log, first, end)
            read = read_batches(
                log, first, end, min(partition_max_bytes, max(bytes_left, 0)),
                min_one=bytes_left == max_bytes, aborted_txns=aborted_txns,
            )  # fmt: skip
            runs = share_partition.acquire(
                self.member_id, read.end, wanted, now, archive=read.aborted,
                round_fresh=partial(batch_end, log, limit=limit),
            )  # fmt: skip
            if not runs:
                continue
            total += sum(r.last_offset - r.first_offset + 1 for r in runs)
            bytes_left -= self._attach(self.part(topic_id, partition), log, runs)
        return total

    def _loaded(self, key: tuple[uuid.UUID, int]) -> bool:
        found = self.ctx.services.shares.partition(self.group_id, *key)
        return found is not None and found.loaded

    @staticmethod
    def _attach(part: PartResp, log: Any, runs: list[Acquired]) -> int:
        """Put the batches holding the acquired offsets in ``part``; their size."""
        # Every batch holding an acquired offset goes out (acquire read them within
        # MaxBytes): an acquired record the client does not see would sit locked until
        # its lock ran out.
        first, last = runs[0].first_offset, runs[-1].last_offset
        regions = log.read(first, INT32_MAX, last + 1, min_one=True)
        chunks = RecordsChunks(regions)
        part.records = chunks
        part.acquired_records = [
            PartResp.AcquiredRecords(
                first_offset=r.first_offset,
                last_offset=r.last_offset,
                delivery_count=r.delivery_count,
            )
            for r in runs
        ]
        return chunks.nbytes

    async def stored(self) -> None:
        """Write the share state and wait until it is durable, so the acknowledgements
        answered are never delivered again after a restart; a partition whose write
        failed answers why, its acknowledgements undone (:func:`settle`). Acquisitions
        alone are not written (as in Kafka): a leader lost before the next write costs a
        delivery count, never a record."""
        errors = await persist_each(self.ctx, self.group_id, self.touched)
        settle(self.ctx, self.group_id, self.member_id, self.pending, errors)
        for key, part in self.parts.items():
            code = errors.get(key, ErrorCode.NONE)
            if part.acknowledge_error_code == ErrorCode.NONE and code is not ErrorCode.NONE:
                part.acknowledge_error_code = code

    def response(self) -> Resp:
        per_topic: dict[uuid.UUID, list[PartResp]] = {}
        for (topic_id, _), part in sorted(
            self.parts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])
        ):
            per_topic.setdefault(topic_id, []).append(part)
        return Resp(
            throttle_time_ms=0, error_code=ErrorCode.NONE,
            # The group's lock duration, which its acquisitions took (Kafka reports the
            # group config's share.record.lock.duration.ms, else the broker's).
            acquisition_lock_timeout_ms=self.ctx.services.shares.lock_duration_ms(self.group_id),
            responses=[TopicResp(topic_id=t, partitions=ps) for t, ps in per_topic.items()],
            node_endpoints=[],
        )  # fmt: skip


def top_level(ctx: RequestContext, code: ErrorCode, message: str | None = None) -> Resp:
    # Nothing acquired: no lock to report (0, as Kafka's error response).
    return Resp(
        throttle_time_ms=0, error_code=code, error_message=message,
        acquisition_lock_timeout_ms=0, responses=[], node_endpoints=[],
    )  # fmt: skip


# Version 2 brings acquire modes and Renew acknowledgements (KIP-1206, KIP-1222).
@handles(m.ApiKey.SHARE_FETCH, max_version=1)
async def handle_share_fetch(ctx: RequestContext, request: m.ShareFetchRequest) -> Resp | Deferred:
    group_id, member_id = request.group_id, request.member_id
    if (why := request_error(group_id, member_id)) is not None:
        return top_level(ctx, ErrorCode.INVALID_REQUEST, why)
    assert group_id is not None and member_id is not None
    if not authorized(ctx, Operation.READ, ResourceType.GROUP, group_id):
        return top_level(ctx, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    shares = ctx.services.shares
    epoch = request.share_session_epoch
    has_acks = any(p.acknowledgement_batches for t in request.topics for p in t.partitions)
    if epoch == 0:
        if has_acks:
            return top_level(ctx, ErrorCode.INVALID_REQUEST,
                             "Acknowledgements are not allowed in the request opening a session.")  # fmt: skip
        session = shares.open_session(group_id, member_id, ctx.client.connection_id)
    else:
        if (error := shares.session_error(group_id, member_id, epoch)) is not ErrorCode.NONE:
            return top_level(ctx, error)
        found = shares.session(group_id, member_id)
        assert found is not None
        session = found
    fetch = Fetch(ctx, group_id, member_id)
    # In a cluster, the share state of partitions first served in this leader epoch is
    # read from the share coordinator first; those it cannot read now answer its error.
    named = {(t.topic_id, p.partition_index) for t in request.topics for p in t.partitions}
    # The group's first session here since its sessions all ended reads its partitions
    # again: the admin APIs may have reset or deleted their state at the coordinator (the
    # group was empty). As Kafka's leader, which drops a group's share partitions when
    # its last share session on the broker ends (onGroupEmpty), not while one is open.
    first_session = epoch == 0 and not shares.other_sessions(group_id, member_id)
    unread = await ensure_loaded(
        ctx, group_id, named | session.partitions, again_if_idle=first_session
    )
    for (topic_id, partition), error in unread.items():
        part = fetch.part(topic_id, partition)
        part.error_code = error
        if (topic_id, partition) in named:
            part.acknowledge_error_code = error
    for topic in request.topics:
        for p in topic.partitions:
            if (topic.topic_id, p.partition_index) in unread:
                continue
            if p.acknowledgement_batches:
                fetch.part(topic.topic_id, p.partition_index).acknowledge_error_code = acknowledge(
                    ctx, group_id, member_id, topic.topic_id, p.partition_index,
                    p.acknowledgement_batches, fetch.touched, fetch.pending,
                )  # fmt: skip
    if epoch == -1:  # the last request of the session: acknowledgements only
        shares.close_session(group_id, member_id)
        await fetch.stored()
        return fetch.response()
    if epoch != 0:
        session.epoch = next_epoch(session.epoch)
    session.partitions.update(
        (t.topic_id, p.partition_index) for t in request.topics for p in t.partitions
    )
    for forgotten in request.forgotten_topics_data:
        session.partitions.difference_update((forgotten.topic_id, p) for p in forgotten.partitions)
    max_records = request.max_records if request.max_records > 0 else DEFAULT_MAX_RECORDS
    partitions = set(session.partitions) - unread.keys()
    if has_acks:
        await fetch.stored()
    if (
        fetch.acquire(partitions, max_records, request.max_bytes) > 0
        or request.max_wait_ms <= 0
        or any(p.error_code for p in fetch.parts.values())
    ):
        return fetch.response()

    names: list[tuple[str, int]] = []
    known_ids: list[tuple[uuid.UUID, int]] = []
    for topic_id, partition in partitions:
        known = ctx.services.topics.by_id.get(topic_id)
        if known is not None:
            names.append((known.name, partition))
            known_ids.append((topic_id, partition))

    def current() -> bool:
        return ctx.services.shares.session(group_id, member_id) is session

    async def wait() -> Resp:
        # Woken by appends to the session's partitions; a lock running out is what the
        # deadline below is for.
        while True:
            with ctx.services.appends.watch(names) as watch:
                # Acquire after the watch starts: an append in between still wakes it.
                if not current() or fetch.acquire(partitions, max_records, request.max_bytes) > 0:
                    return fetch.response()
                await watch.changed()

    def at_deadline() -> Resp:
        # The wait ends at MaxWaitMs, or sooner when a lock held in these partitions runs
        # out: its record may be acquired now.
        if current():
            fetch.acquire(partitions, max_records, request.max_bytes)
        return fetch.response()

    wait_ms = request.max_wait_ms
    deadlines = [
        d
        for topic_id, partition in known_ids
        if (sp := ctx.services.shares.partition(group_id, topic_id, partition)) is not None
        and (d := sp.next_lock_deadline()) is not None
    ]
    if deadlines:
        wait_ms = min(wait_ms, max(0, min(deadlines) - ctx.now_ms()))
    return Deferred(wait, timeout_s=wait_ms / 1000, on_timeout=at_deadline)
