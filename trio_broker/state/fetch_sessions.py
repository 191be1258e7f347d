"""Incremental fetch sessions (KIP-227), sans-I/O: the session cache and its rules.

A fetcher that opens a session sends its whole partition list once (a *full*
fetch, epoch 0); the broker caches the list and answers with a session id.
From then on the fetcher sends only what changed (an *incremental* fetch: the
session id, the next epoch, partitions added or with a new fetch offset, and
partitions to forget), and the broker answers only the partitions with
something new: records, a moved high watermark, last stable offset or log start
offset, or an error. Epoch -1 closes a session; session id 0 with epoch -1 is a
plain sessionless fetch, answered in full as before sessions existed.

The cache is bounded (``max.incremental.fetch.session.cache.slots``). When it
is full, a new session may take a slot by Kafka's rules (FetchSession.scala's
``tryEvict``): first the least recently used session if it has been idle longer
than :data:`EVICTION_MS`; otherwise the cheapest evictable session, if the new
one is worth more. Sessions compare by (privileged, partition count at last
use, id): a follower's session (privileged) outranks a consumer's, and a bigger
one a smaller. A session becomes evictable by anyone only once it is older
than :data:`EVICTION_MS`; a consumer's session is evictable by a follower at
once. Both facts are taken when the session is last used (``touch``), as Kafka
does.

Everything here is pure and synchronous: the fetch handler passes the clock in.
Partitions are keys of any hashable type (the handler uses ``(topic name,
index)`` before Fetch v13 and ``(topic id, index)`` from v13); what the fetcher
asked of a partition (``R``) is kept opaque.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

import attrs

from trio_broker.protocol.error_codes import ErrorCode

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

#: Session id 0: no session.
INVALID_SESSION_ID = 0
#: Epoch 0 in a request: a full fetch that asks for a new session.
INITIAL_EPOCH = 0
#: Epoch -1 in a request: a full fetch that closes the session and opens none.
FINAL_EPOCH = -1
#: Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: how long a session is safe.
EVICTION_MS = 120_000
#: ``max.incremental.fetch.session.cache.slots``'s default.
DEFAULT_SLOTS = 1000


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: it wraps to 1 (0 means "new"), -1 stays -1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


@attrs.frozen
class PartitionAnswer:
    """What a fetch answered for one partition, as far as a session cares."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    has_records: bool


@attrs.define
class CachedPartition(Generic[R]):
    #: What the fetcher last asked of this partition (fetch offset, max bytes, ...).
    request: R
    #: What the fetcher was last told; -1 until told, and after an error (so that the
    #: partition is sent again once the error goes away).
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def must_send(self, answer: PartitionAnswer, remember: bool) -> bool:
        """Whether an incremental answer must include this partition; ``remember``
        records what it says (only for the answer actually sent)."""
        changed = (
            answer.has_records
            or answer.error_code != ErrorCode.NONE
            or answer.high_watermark != self.high_watermark
            or answer.last_stable_offset != self.last_stable_offset
            or answer.log_start_offset != self.log_start_offset
        )
        if remember:
            self.remember(answer)
        return changed

    def remember(self, answer: PartitionAnswer) -> None:
        self.high_watermark = -1 if answer.error_code else answer.high_watermark
        self.last_stable_offset = answer.last_stable_offset
        self.log_start_offset = answer.log_start_offset


@attrs.define(eq=False)
class FetchSession(Generic[K, R]):
    id: int
    #: A follower's session: it outranks consumers' sessions in eviction.
    privileged: bool
    #: Opened with Fetch v13+ (partitions keyed by topic id); the other kind of
    #: request cannot continue it (FETCH_SESSION_TOPIC_ID).
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    #: The epoch the next incremental request must carry.
    epoch: int
    #: In answer order: a partition that was sent moves to the end, so that
    #: partitions share ``max_bytes`` in turn.
    partitions: dict[K, CachedPartition[R]]
    #: Taken at the last ``touch`` (Kafka's cachedSize and evictable trees).
    cached_size: int = 0
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False

    def update(self, changed: Mapping[K, R], forgotten: Iterable[K]) -> None:
        """An incremental request: add or update ``changed``, then drop ``forgotten``."""
        for key, request in changed.items():
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = CachedPartition(request)
            else:
                cached.request = request
        for key in forgotten:
            self.partitions.pop(key, None)

    def select(self, answers: Iterable[tuple[K, PartitionAnswer]]) -> set[K]:
        """The partitions an incremental answer keeps; remembers what they say and
        moves them to the end of the session's order."""
        keep: set[K] = set()
        for key, answer in answers:
            cached = self.partitions.get(key)
            if cached is None or cached.must_send(answer, remember=True):
                keep.add(key)
                if cached is not None:
                    del self.partitions[key]
                    self.partitions[key] = cached
        return keep


@attrs.frozen
class SessionError:
    """The fetch names a session it cannot use: the answer is this error, no partitions."""

    error_code: ErrorCode


@attrs.frozen
class Sessionless:
    """Answer every partition asked for; no session (id 0)."""


@attrs.frozen
class FullFetch:
    """Answer every partition asked for, then try to open a session for them."""

    privileged: bool
    uses_topic_ids: bool


@attrs.frozen
class IncrementalFetch(Generic[K, R]):
    """Read every partition of the session; answer only those with news."""

    session: FetchSession[K, R]
    #: The session's epoch once this request is taken: still so when answering,
    #: unless another request for the session came in between.
    epoch_after: int


FetchContext = SessionError | Sessionless | FullFetch | IncrementalFetch[K, R]


class FetchSessionCache(Generic[K, R]):
    """The broker's fetch sessions by id, bounded; see the module docstring for eviction."""

    def __init__(
        self,
        max_entries: int = DEFAULT_SLOTS,
        eviction_ms: int = EVICTION_MS,
        rng: random.Random | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self._rng = rng if rng is not None else random.Random()
        self.sessions: dict[int, FetchSession[K, R]] = {}
        #: Sessions pushed out to make room (Kafka's IncrementalFetchSessionEvictionsPerSec).
        self.evictions = 0
        #: Incremental requests taken (they passed the id and epoch checks).
        self.incremental_fetches = 0
        #: Incremental requests refused, per error code.
        self.errors: dict[ErrorCode, int] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def cached_partitions(self) -> int:
        """Kafka's NumIncrementalFetchPartitionsCached (sizes as of each last use)."""
        return sum(session.cached_size for session in self.sessions.values())

    # -- a request -----------------------------------------------------------

    def open(
        self,
        session_id: int,
        epoch: int,
        changed: Mapping[K, R],
        forgotten: Iterable[K],
        *,
        uses_topic_ids: bool,
        privileged: bool,
        now_ms: int,
    ) -> FetchContext[K, R]:
        """What to do with a fetch carrying ``session_id`` and ``epoch``.

        ``changed`` is the request's partition list; ``forgotten`` its forgotten
        partitions (ignored by full fetches, as Kafka does). An incremental request
        updates its session here, once, whatever the answer turns out to be.
        """
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.remove(session_id)  # a full fetch closes the session it names
            if epoch == FINAL_EPOCH:
                return Sessionless()
            return FullFetch(privileged=privileged, uses_topic_ids=uses_topic_ids)
        session = self.sessions.get(session_id)
        if session is None:
            return self.refuse(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return self.refuse(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_topic_ids:
            return self.refuse(ErrorCode.FETCH_SESSION_TOPIC_ID)
        session.update(changed, forgotten)
        if not session.partitions:
            self.remove(session_id)  # forgot everything: nothing left to cache
            return Sessionless()
        self.touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        self.incremental_fetches += 1
        return IncrementalFetch(session, session.epoch)

    def refuse(self, error_code: ErrorCode) -> SessionError:
        """Count a refused request (for /metrics) and say so."""
        self.errors[error_code] = self.errors.get(error_code, 0) + 1
        return SessionError(error_code)

    def create(
        self,
        partitions: Mapping[K, CachedPartition[R]],
        *,
        privileged: bool,
        uses_topic_ids: bool,
        now_ms: int,
    ) -> int:
        """A new session for a full fetch's answer, if there is room: its id, else 0."""
        if len(self.sessions) >= self.max_entries and not self._try_evict(
            privileged, len(partitions), now_ms
        ):
            return INVALID_SESSION_ID
        session_id = self._new_session_id()
        session = FetchSession(
            id=session_id, privileged=privileged, uses_topic_ids=uses_topic_ids,
            creation_ms=now_ms, last_used_ms=now_ms, epoch=next_epoch(INITIAL_EPOCH),
            partitions=dict(partitions),
        )  # fmt: skip
        self.sessions[session_id] = session
        self.touch(session, now_ms)
        return session_id

    def remove(self, session_id: int) -> FetchSession[K, R] | None:
        return self.sessions.pop(session_id, None)

    # -- bookkeeping ---------------------------------------------------------

    def touch(self, session: FetchSession[K, R], now_ms: int) -> None:
        """The session was used now: its place in the eviction order moves."""
        session.last_used_ms = now_ms
        session.cached_size = len(session.partitions)
        old_enough = now_ms - session.creation_ms > self.eviction_ms
        session.evictable_by_all = old_enough
        session.evictable_by_privileged = old_enough or not session.privileged

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        if not self.sessions:
            return False
        least_recent = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - least_recent.last_used_ms > self.eviction_ms:
            victim = least_recent  # stale: anyone may take its slot
        else:
            evictable = [
                s for s in self.sessions.values()
                if (s.evictable_by_privileged if privileged else s.evictable_by_all)
            ]  # fmt: skip
            if not evictable:
                return False
            victim = min(evictable, key=_worth)
            # The newcomer is compared with id 0: a tie in rank and size keeps the old one.
            if (privileged, size, 0) < _worth(victim):
                return False
        del self.sessions[victim.id]
        self.evictions += 1
        return True

    def _new_session_id(self) -> int:
        while True:
            session_id = self._rng.randrange(1, 2**31 - 1)
            if session_id not in self.sessions:
                return session_id


def _worth(session: FetchSession[K, R]) -> tuple[bool, int, int]:
    return (session.privileged, session.cached_size, session.id)
