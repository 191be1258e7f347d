"""Fetch: whole batches from the log, sent with sendfile; long polls wait for appends.

A fetch that finds fewer than min_bytes waits (in the delayed-operations
nursery, not in the handler) until a change to one of the partitions it reads wakes it
(an append, a moved high watermark, the end of this broker's leadership: the purgatory
of server/fetch_waits.py) or max_wait_ms passes; as Kafka, it answers at once instead
when one of its partitions failed to read (:func:`answers_at_once`). A follower's fetch
offsets are recorded once, when its request arrives, by the replica manager.
Fetch sessions (KIP-227, state/fetch_sessions.py): a request is matched to its
session once, when it arrives (:func:`plan_fetch`); the partitions to read come
from the request or the session; the answer is trimmed to the partitions with
news and the session remembers what it told the fetcher (:func:`finish`), once,
when the answer leaves, however long it polled.
"""

from __future__ import annotations

import uuid
from collections.abc import Set as AbstractSet

import attrs

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import NOT_READY, Deferred, NotReady, Polled, RequestContext, handles
from trio_broker.handlers.leadership import fetch_leader_hints
from trio_broker.handlers.producer_state import prepare_producer_states
from trio_broker.handlers.topic_lookup import find_topic, leading_partition
from trio_broker.partition.read import Isolation, ReplicaRead, read, read_by_replica
from trio_broker.protocol import messages as m
from trio_broker.protocol.codec import RecordsChunks
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.fetch_sessions import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchContext,
    FullFetch,
    IncrementalFetch,
    PartitionAnswer,
    SessionError,
    Sessionless,
)
from trio_broker.state.quota import CONSUMER_BYTE_RATE

Resp = m.FetchResponse
TopicResp = Resp.FetchableTopicResponse
PartResp = TopicResp.PartitionData
AbortedTxnResp = PartResp.AbortedTransaction
FetchTopic = m.FetchRequest.FetchTopic
FetchPartition = FetchTopic.FetchPartition
READ_COMMITTED = 1
NO_TOPIC_ID = uuid.UUID(int=0)
#: A partition in a fetch session: (topic name, index) before v13, (topic id, index) after.
SessionKey = tuple[str | uuid.UUID, int]
#: A partition's errors found before reading it: its topic is not authorized, unknown by
#: id, or has no such partition. Kafka's KafkaApis answers these itself and hands the
#: rest to ReplicaManager.fetchMessages, so they neither answer a long poll early nor
#: are waited on. Any other error is a read's (another leader, a leader epoch that
#: differs, an offset out of range, a storage error).
NOT_READ = frozenset(
    {ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_TOPIC_ID,
     ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
)  # fmt: skip


def read_partitions(
    ctx: RequestContext,
    request: m.FetchRequest,
    wanted_topics: list[FetchTopic],
    look: bool = False,
    first: bool = False,
) -> tuple[Resp, int]:
    """Build the response from the logs as they are now; return it and its record bytes.

    ``wanted_topics``: the request's own list, or an incremental fetch's session.
    ``look``: a waiting fetch looks at what changed; nothing it reads is sent, so a
    follower's bytes are not charged to the leader's throttle (its answer's read is).
    ``first``: the request's first read, where a follower's reads record its progress
    (``partition/read.py``); a long poll's later reads record nothing.
    """
    remaining = request.max_bytes if ctx.api_version >= 3 else 2**31 - 1
    quota_limit = ctx.services.quotas.max_bytes(ctx, CONSUMER_BYTE_RATE)
    if quota_limit is not None:  # one response never exceeds the quota on its own
        remaining = min(remaining, quota_limit)
    total = 0
    topic_responses: list[TopicResp] = []
    # A follower (replica id >= 0) reads up to the log end, its first read recording its
    # progress; consumers read up to the high watermark, read_committed ones up to the
    # LSO (partition/read.py, the one read entry).
    replica = fetching_replica(ctx, request)
    leaders = ctx.services.leaders
    follower = is_follower(ctx, request)
    progress = ReplicaRead(replica, ctx.now_ms(), leaders) if follower and first else None
    if follower:
        isolation = Isolation.LOG_END
    elif request.isolation_level == READ_COMMITTED:
        isolation = Isolation.TXN_COMMITTED
    else:
        isolation = Isolation.HIGH_WATERMARK
    for wanted in wanted_topics:
        topic, name, missing = find_topic(ctx, wanted.topic, wanted.topic_id)
        partitions: list[PartResp] = []
        # An unknown topic id has no name to authorize: it stays UNKNOWN_TOPIC_ID.
        allowed = not name or authorized(ctx, Operation.READ, ResourceType.TOPIC, name)
        for p in wanted.partitions:
            part = PartResp(
                partition_index=p.partition, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, records=b"",
                aborted_transactions=[] if request.isolation_level == READ_COMMITTED else None,
            )  # fmt: skip
            partitions.append(part)
            if not allowed:
                part.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            led = leading_partition(
                ctx, topic, name, p.partition, missing,
                p.current_leader_epoch if ctx.api_version >= 9 else -1, fence_alone=False,
            )  # fmt: skip
            if isinstance(led, ErrorCode):
                part.error_code = led
                continue
            # leader.replication.throttled.rate: a replica this leader throttles (the
            # topic's leader.replication.throttled.replicas, else one a reassignment is
            # adding) gets what the leader's byte budget allows (nothing while it is spent).
            budget = None
            max_bytes: int | None = None  # None: the partition's offsets only, no read
            if remaining > 0 or total == 0:
                budget = (
                    leaders.leader_throttle_budget(led.topic, p.partition, replica)
                    if follower
                    else None
                )
                if budget is None:
                    max_bytes = min(p.partition_max_bytes, max(remaining, 0))
                elif budget > 0:
                    max_bytes = min(p.partition_max_bytes, max(remaining, 0), budget)
            # A throttled read still takes one whole batch (a batch bigger than the
            # budget would never fit); the budget then goes below zero for a while.
            if progress is None:  # a consumer, or a follower's read that records nothing
                regions, aborted = read(
                    part, led, p.fetch_offset, max_bytes, isolation,
                    min_one=total == 0 or budget is not None,
                )  # fmt: skip
            else:  # a follower's first read of the request records its progress
                regions, aborted = read_by_replica(
                    part, led, p.fetch_offset, max_bytes, progress, p.log_start_offset,
                    min_one=total == 0 or budget is not None,
                )  # fmt: skip
            if aborted is not None:
                part.aborted_transactions = [
                    AbortedTxnResp(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in aborted
                ]
            if regions:
                chunks = RecordsChunks(regions)
                part.records = chunks
                total += chunks.nbytes
                remaining -= chunks.nbytes
                if budget is not None and not look:
                    leaders.leader_throttle_used(chunks.nbytes)
        topic_responses.append(
            TopicResp(topic=wanted.topic, topic_id=wanted.topic_id, partitions=partitions)
        )
    response = Resp(throttle_time_ms=0, error_code=0, session_id=0, responses=topic_responses)
    fetch_leader_hints(ctx, response)  # KIP-951
    return response, total


def fetching_replica(ctx: RequestContext, request: m.FetchRequest) -> int:
    return request.replica_id if ctx.api_version < 15 else request.replica_state.replica_id


def is_follower(ctx: RequestContext, request: m.FetchRequest) -> bool:
    """A replica's fetch (replica id >= 0) from a broker allowed to act for the cluster."""
    if fetching_replica(ctx, request) < 0 or not ctx.services.leaders.accepts_follower_fetches:
        return False
    # Anyone else is treated as a consumer: no replica bookkeeping for strangers.
    return authorized(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)


# ---------------------------------------------------------------------- fetch sessions


@attrs.frozen
class FetchPlan:
    """What a fetch reads, and what its session (if any) makes of the answer."""

    context: FetchContext[SessionKey, FetchPartition]
    topics: list[FetchTopic]


def topic_key(ctx: RequestContext, name: str, topic_id: uuid.UUID) -> str | uuid.UUID:
    return topic_id if ctx.api_version >= 13 else name


def plan_fetch(ctx: RequestContext, request: m.FetchRequest) -> FetchPlan:
    """Match the request with its session (Fetch v7+), once: the session changes here."""
    if request.session_id == INVALID_SESSION_ID and request.session_epoch == FINAL_EPOCH:
        # No session named, none wanted (before v7, librdkafka): the session cache has
        # nothing to do, and the request's partitions need no map.
        return FetchPlan(Sessionless(), request.topics)
    changed = {
        (topic_key(ctx, t.topic, t.topic_id), p.partition): p
        for t in request.topics
        for p in t.partitions
    }
    forgotten = [
        (topic_key(ctx, t.topic, t.topic_id), index)
        for t in request.forgotten_topics_data
        for index in t.partitions
    ]
    context = ctx.services.fetch_sessions.open(
        request.session_id, request.session_epoch, changed, forgotten,
        uses_topic_ids=ctx.api_version >= 13, privileged=is_follower(ctx, request),
        now_ms=int(ctx.services.monotonic_ms()),
    )  # fmt: skip
    if not isinstance(context, IncrementalFetch):
        return FetchPlan(context, request.topics)
    # Read the whole session, topic by topic in the session's order.
    topics: dict[str | uuid.UUID, FetchTopic] = {}
    for (key, _), cached in context.session.partitions.items():
        topic = topics.get(key)
        if topic is None:
            name, topic_id = ("", key) if isinstance(key, uuid.UUID) else (key, NO_TOPIC_ID)
            topic = topics[key] = FetchTopic(topic=name, topic_id=topic_id, partitions=[])
        topic.partitions.append(cached.request)
    return FetchPlan(context, list(topics.values()))


def answer_of(part: PartResp) -> PartitionAnswer:
    records = part.records
    size = records.nbytes if isinstance(records, RecordsChunks) else len(records or b"")
    return PartitionAnswer(
        error_code=part.error_code, high_watermark=part.high_watermark,
        last_stable_offset=part.last_stable_offset, log_start_offset=part.log_start_offset,
        has_records=size > 0,
    )  # fmt: skip


def finish(ctx: RequestContext, plan: FetchPlan, response: Resp) -> Resp:
    """The answer as the session has it: a new session's id, or only the news."""
    context = plan.context
    sessions = ctx.services.fetch_sessions
    now_ms = int(ctx.services.monotonic_ms())
    if isinstance(context, FullFetch):
        if response.throttle_time_ms > 0:
            return response  # as Kafka: a throttled full fetch opens no session
        cached: dict[SessionKey, CachedPartition[FetchPartition]] = {}
        for wanted, topic in zip(plan.topics, response.responses, strict=True):
            key = topic_key(ctx, wanted.topic, wanted.topic_id)
            for asked, part in zip(wanted.partitions, topic.partitions, strict=True):
                entry = cached[key, asked.partition] = CachedPartition(asked)
                entry.remember(answer_of(part))
        response.session_id = sessions.create(
            cached, privileged=context.privileged, uses_topic_ids=context.uses_topic_ids,
            now_ms=now_ms,
        )  # fmt: skip
    elif isinstance(context, IncrementalFetch):
        session = context.session
        response.session_id = session.id
        if session.epoch != context.epoch_after:
            # Another request for this session came in while this one polled.
            response.error_code = sessions.refuse(ErrorCode.INVALID_FETCH_SESSION_EPOCH).error_code
            response.responses = []
        elif response.throttle_time_ms > 0:
            response.responses = []  # nothing sent: the session remembers nothing new
        else:
            answers = [
                ((topic_key(ctx, topic.topic, topic.topic_id), part.partition_index), part)
                for topic in response.responses
                for part in topic.partitions
            ]
            keep = session.select((key, answer_of(part)) for key, part in answers)
            for topic in response.responses:
                key = topic_key(ctx, topic.topic, topic.topic_id)
                topic.partitions = [p for p in topic.partitions if (key, p.partition_index) in keep]
            response.responses = [topic for topic in response.responses if topic.partitions]
    return response


def throttled(ctx: RequestContext, response: Resp, total: int) -> Resp:
    """Count the records against the consumer quota (KIP-219: answer now, mute after).

    Over the quota the answer is empty, as in Kafka: the records are taken back
    from the quota and fetched again once the throttle time has passed.
    """
    quotas = ctx.services.quotas
    response.throttle_time_ms = quotas.throttle(ctx, CONSUMER_BYTE_RATE, total)
    if response.throttle_time_ms > 0 and total > 0:
        quotas.unrecord(ctx, CONSUMER_BYTE_RATE, total)
        for topic in response.responses:
            for part in topic.partitions:
                part.records = b""
    elif total > 0:
        count_bytes_out(ctx, response)
    return response


def count_bytes_out(ctx: RequestContext, response: Resp) -> None:
    """Per-topic record bytes sent (/metrics): one dict increment per topic with data."""
    services = ctx.services
    counts = services.stats.topic_bytes_out
    for topic in response.responses:
        sent = 0
        for part in topic.partitions:
            records = part.records
            sent += records.nbytes if isinstance(records, RecordsChunks) else len(records or b"")
        if sent:
            name = topic.topic
            if not name:  # v13+: addressed by id
                known = services.topics.by_id.get(topic.topic_id)
                name = "" if known is None else known.name
            counts[name] = counts.get(name, 0) + sent


def resolved(ctx: RequestContext, topics: list[FetchTopic]) -> list[tuple[str, FetchTopic]]:
    """Each wanted topic with its name ("" for a v13+ topic id this broker lacks)."""
    by_id = ctx.services.topics.by_id
    out = []
    for wanted in topics:
        name = wanted.topic
        if not name:
            known = by_id.get(wanted.topic_id)
            name = "" if known is None else known.name
        out.append((name, wanted))
    return out


def answers_at_once(response: Resp) -> bool:
    """As Kafka's fetchMessages: no partition got as far as a read (nothing to wait
    for), or one failed to read. (Kafka's other two reasons, a diverging epoch and a
    preferred read replica, are not answered by this broker.)"""
    read = [
        p.error_code
        for t in response.responses
        for p in t.partitions
        if p.error_code not in NOT_READ
    ]
    return not read or any(read)


def outcomes(
    topics: list[tuple[str, FetchTopic]], response: Resp
) -> dict[tuple[str, int], tuple[int, bool]]:
    """(record bytes, failed) per partition of a read of ``topics``, by name."""
    out = {}
    for (name, _), topic in zip(topics, response.responses, strict=True):
        for part in topic.partitions:
            records = part.records
            size = records.nbytes if isinstance(records, RecordsChunks) else len(records or b"")
            out[name, part.partition_index] = (size, part.error_code != ErrorCode.NONE)
    return out


class LongPoll:
    """What a waiting fetch has gathered, partition by partition, since its first read,
    as Kafka's delayed fetch accumulates it; a look at the partitions that changed
    costs what they do, not what the whole fetch does."""

    def __init__(self, topics: list[tuple[str, FetchTopic]], first: Resp, needed: int) -> None:
        self.topics = topics
        self.needed = needed
        self.by_key = {
            (name, p.partition): (name, wanted, p)
            for name, wanted in topics
            for p in wanted.partitions
        }
        read = outcomes(topics, first)
        # Failed before any read (NOT_READ, the only failures a waiting fetch starts
        # with): not waited on. It waits on exactly the others.
        self.erroneous = {key for key, (_, failed) in read.items() if failed}
        self.watched = frozenset(key for key in self.by_key if key[0]) - self.erroneous
        self.sizes = {key: size for key, (size, _) in read.items()}
        self.gathered = sum(self.sizes.values())
        self.failed = False

    def read_all(self, response: Resp) -> None:
        """Take in a read of the whole fetch (what it had gathered is out of date)."""
        self.sizes.clear()
        self.gathered, self.failed = 0, False
        self.update(self.topics, response)

    @property
    def complete(self) -> bool:
        """As Kafka's delayed fetch: enough bytes, or a partition it waits on failed
        (its leadership moved, its topic was deleted)."""
        return self.gathered >= self.needed or self.failed

    def only(self, keys: AbstractSet[tuple[str, int]]) -> list[tuple[str, FetchTopic]]:
        """The wanted topics cut to the partitions in ``keys``."""
        cut: dict[int, tuple[str, FetchTopic]] = {}
        for key in keys:
            name, wanted, part = self.by_key[key]
            topic = cut.get(id(wanted))
            if topic is None:
                topic = cut[id(wanted)] = (
                    name, FetchTopic(topic=wanted.topic, topic_id=wanted.topic_id, partitions=[])
                )  # fmt: skip
            topic[1].partitions.append(part)
        return list(cut.values())

    def update(self, topics: list[tuple[str, FetchTopic]], response: Resp) -> None:
        """Take in a read of ``topics`` (some of the fetch's)."""
        sizes = self.sizes
        for key, (size, failed) in outcomes(topics, response).items():
            self.gathered += size - sizes.get(key, 0)
            sizes[key] = size
            if failed and key not in self.erroneous:
                self.failed = True


@handles(m.ApiKey.FETCH)
async def handle_fetch(ctx: RequestContext, request: m.FetchRequest) -> m.FetchResponse | Deferred:
    plan = plan_fetch(ctx, request)
    if isinstance(plan.context, SessionError):
        return Resp(error_code=plan.context.error_code, session_id=0, responses=[])

    def answer(response: Resp, total: int) -> Resp:
        return finish(ctx, plan, throttled(ctx, response, total))

    # The LSO needs each partition's producer state: loaded off the loop if not yet.
    await prepare_producer_states(
        ctx, ((t.topic, t.topic_id, [p.partition for p in t.partitions]) for t in plan.topics)
    )
    response, total = read_partitions(ctx, request, plan.topics, first=True)
    if total >= request.min_bytes or request.max_wait_ms <= 0 or answers_at_once(response):
        return answer(response, total)
    poll = LongPoll(resolved(ctx, plan.topics), response, max(request.min_bytes, 1))
    # Watched from the handler's read on, so that read is the long poll's first: a
    # change before the long poll runs is kept for it. A change elsewhere never wakes it.
    waiter = ctx.services.appends.watch(poll.watched)

    response_now: Resp | None = None
    total_now = 0

    def long_poll() -> m.FetchResponse | NotReady:
        # Called by the shell now and whenever a watched partition changed (Polled).
        nonlocal response_now, total_now
        while not poll.complete and not ctx.services.shutting_down:
            changed = waiter.take()
            if not changed:
                return NOT_READY
            if not changed >= poll.watched:  # read only what changed
                again = poll.only(changed)
                looked = read_partitions(ctx, request, [t for _, t in again], look=True)
                poll.update(again, looked[0])
                response_now = None
            else:
                response_now, total_now = read_partitions(ctx, request, plan.topics)
                poll.read_all(response_now)
        if response_now is None:
            response_now, total_now = read_partitions(ctx, request, plan.topics)
        return answer(response_now, total_now)

    def waited_long_enough() -> m.FetchResponse:
        return answer(*read_partitions(ctx, request, plan.topics))

    return Polled(long_poll, waiter.subscribe, timeout_s=request.max_wait_ms / 1000,
                  on_timeout=waited_long_enough)  # fmt: skip
