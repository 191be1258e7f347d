"""The fetch session cache (trio_broker/state/fetch_sessions.py) against a plain model.

The model keeps each session as a dict of partitions and what the fetcher was last
told of them, and states Kafka's rules directly: an incremental answer holds the
partitions with records, an error or a changed high watermark / last stable offset /
log start offset; a full cache gives a slot to a newcomer by FetchSession.scala's
``tryEvict`` (the least recently used session if idle longer than the eviction time,
else the lowest (privileged, size, id) among the sessions the newcomer may evict, if
the newcomer ranks at least as high with id 0). Where the cache keeps flags taken at
each use, the model recomputes them from the times.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.fetch_sessions import (
    CachedPartition,
    FetchSessionCache,
    FullFetch,
    IncrementalFetch,
    PartitionAnswer,
    SessionError,
    Sessionless,
)

SLOTS = 3
EVICT_MS = 100
PARTITIONS = range(4)
partition_sets = st.frozensets(st.sampled_from(PARTITIONS))


@attrs.define
class ModelSession:
    privileged: bool
    created: int
    last_used: int
    epoch: int
    #: partition -> fetch offset asked
    asked: dict[int, int]
    #: partition -> (high watermark, last stable offset, log start offset) last told
    told: dict[int, tuple[int, int, int]]


class FetchSessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache: FetchSessionCache[int, int] = FetchSessionCache(
            SLOTS, EVICT_MS, rng=random.Random(0)
        )
        self.model: dict[int, ModelSession] = {}
        self.now = 0
        # The logs as the next fetch sees them, per partition.
        self.facts = {p: (0, 0, 0) for p in PARTITIONS}  # hw, lso, log start
        self.failing: set[int] = set()
        self.with_records: set[int] = set()
        self.evictions = 0

    # -- the world -------------------------------------------------------------

    @rule(ms=st.integers(0, 2 * EVICT_MS))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(p=st.sampled_from(PARTITIONS), what=st.sampled_from(["hw", "lso", "start", "records"]))
    def log_changes(self, p: int, what: str) -> None:
        hw, lso, start = self.facts[p]
        if what == "hw":
            self.facts[p] = (hw + 1, lso, start)
        elif what == "lso":
            self.facts[p] = (hw, min(lso + 1, hw), start)
        elif what == "start":
            self.facts[p] = (hw, lso, min(start + 1, lso))
        else:
            self.with_records ^= {p}

    @rule(p=st.sampled_from(PARTITIONS))
    def error_toggles(self, p: int) -> None:
        self.failing ^= {p}

    def answer(self, p: int) -> PartitionAnswer:
        if p in self.failing:
            return PartitionAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1, -1, False)
        hw, lso, start = self.facts[p]
        return PartitionAnswer(ErrorCode.NONE, hw, lso, start, p in self.with_records)

    def told(self, p: int) -> tuple[int, int, int]:
        a = self.answer(p)
        return (-1 if a.error_code else a.high_watermark, a.last_stable_offset, a.log_start_offset)

    # -- fetches ---------------------------------------------------------------

    @rule(
        partitions=partition_sets,
        privileged=st.booleans(),
        close=st.booleans(),
        final=st.booleans(),
        data=st.data(),
    )
    def full_fetch(
        self, partitions: frozenset[int], privileged: bool, close: bool, final: bool, data: Any
    ) -> None:
        named = data.draw(st.sampled_from(sorted(self.model))) if close and self.model else 0
        asked = {p: 0 for p in sorted(partitions)}
        context = self.cache.open(named, -1 if final else 0, asked, [],
                                  uses_topic_ids=False, privileged=privileged, now_ms=self.now)  # fmt: skip
        self.model.pop(named, None)
        if final:
            assert isinstance(context, Sessionless)
            return
        assert isinstance(context, FullFetch) and context.privileged == privileged
        cached = {}
        for p in asked:
            cached[p] = CachedPartition(0)
            cached[p].remember(self.answer(p))
        expect_room, victim = self.model_room(privileged, len(asked))
        session_id = self.cache.create(
            cached, privileged=privileged, uses_topic_ids=False, now_ms=self.now
        )
        note(f"full fetch {sorted(asked)} privileged={privileged}: id {session_id}, "
             f"expected room {expect_room}, victim {victim}")  # fmt: skip
        assert (session_id != 0) == expect_room
        if victim is not None:
            del self.model[victim]
            self.evictions += 1
        if session_id:
            assert session_id not in self.model
            self.model[session_id] = ModelSession(
                privileged, self.now, self.now, 1, dict(asked), {p: self.told(p) for p in asked}
            )

    def model_room(self, privileged: bool, size: int) -> tuple[bool, int | None]:
        """Whether a new session fits, and which session it pushes out."""
        if len(self.model) < SLOTS:
            return True, None
        if not self.model:
            return False, None
        lru = min(self.model, key=lambda i: (self.model[i].last_used, i))
        if self.now - self.model[lru].last_used > EVICT_MS:
            return True, lru

        def old(s: ModelSession) -> bool:
            return s.last_used - s.created > EVICT_MS

        may_go = [i for i, s in self.model.items() if old(s) or (privileged and not s.privileged)]
        if not may_go:
            return False, None
        rank = {i: (self.model[i].privileged, len(self.model[i].asked), i) for i in may_go}
        cheapest = min(may_go, key=rank.__getitem__)
        if (privileged, size, 0) < rank[cheapest]:
            return False, None
        return True, cheapest

    @precondition(lambda self: self.model)
    @rule(
        data=st.data(),
        epoch_off=st.sampled_from([0, 0, 0, 1, -1]),
        changed=partition_sets,
        forgotten=partition_sets,
        offset=st.integers(0, 3),
    )
    def incremental_fetch(
        self,
        data: Any,
        epoch_off: int,
        changed: frozenset[int],
        forgotten: frozenset[int],
        offset: int,
    ) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.model)))
        self._incremental(session_id, epoch_off, changed, forgotten, offset)

    def _incremental(
        self,
        session_id: int,
        epoch_off: int,
        changed: frozenset[int],
        forgotten: frozenset[int],
        offset: int,
    ) -> None:
        session = self.model[session_id]
        epoch = session.epoch + epoch_off
        if epoch in (0, -1):
            epoch = session.epoch + 2  # those are full fetches, not this rule
        asked = {p: offset for p in sorted(changed)}
        context = self.cache.open(session_id, epoch, asked, sorted(forgotten),
                                  uses_topic_ids=False, privileged=False, now_ms=self.now)  # fmt: skip
        if epoch != session.epoch:
            assert context == SessionError(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            return
        for p in asked:
            session.told.setdefault(p, (-1, -1, -1))
        session.asked.update(asked)
        for p in forgotten:
            session.asked.pop(p, None)
            session.told.pop(p, None)
        if not session.asked:
            assert isinstance(context, Sessionless)
            del self.model[session_id]
            return
        session.last_used = self.now
        session.epoch += 1
        assert isinstance(context, IncrementalFetch) and context.epoch_after == session.epoch
        expected = {
            p for p in session.asked
            if p in self.failing or p in self.with_records or self.told(p) != session.told[p]
        }  # fmt: skip
        answers = [(p, self.answer(p)) for p in context.session.partitions]
        keep = context.session.select(answers)
        note(f"incremental {session_id}@{epoch}: sent {sorted(keep)}, expected {sorted(expected)}")
        assert keep == expected
        for p in session.asked:
            session.told[p] = self.told(p)
        # Sent partitions went to the back of the order, in the order they were sent.
        order = list(context.session.partitions)
        assert order[len(order) - len(keep) :] == [p for p in order if p in keep]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), what=st.sampled_from(["hw", "lso", "start", "records", "error"]))
    def one_kind_of_news(self, data: Any, what: str) -> None:
        """A session's partition with exactly one kind of news since its last answer,
        each of which must bring it back into the next incremental answer (the random
        rules rarely leave a partition with a lone LSO or log start move: both need an HW
        ahead of them first). Fetched once so that everything is told, once more with
        the one change."""
        with_partitions = sorted(i for i, s in self.model.items() if s.asked)
        if not with_partitions:
            return
        session_id = data.draw(st.sampled_from(with_partitions))
        p = data.draw(st.sampled_from(sorted(self.model[session_id].asked)))
        hw, lso, start = self.facts[p]
        self.facts[p] = (hw + 2, lso + 1, start)  # room for the LSO and the start to move
        self.failing.discard(p)
        self.with_records.discard(p)
        self._incremental(session_id, 0, frozenset(), frozenset(), 0)
        if what == "error":  # an error, told, then gone at the same offsets
            self.error_toggles(p)
            self._incremental(session_id, 0, frozenset(), frozenset(), 0)
            self.error_toggles(p)
        else:
            self.log_changes(p, what)
        self._incremental(session_id, 0, frozenset(), frozenset(), 0)

    @rule(session_id=st.integers(1, 2**31 - 2))
    def unknown_session(self, session_id: int) -> None:
        if session_id in self.model:
            return
        context = self.cache.open(session_id, 1, {}, [], uses_topic_ids=False,
                                  privileged=False, now_ms=self.now)  # fmt: skip
        assert context == SessionError(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)

    # -- agreement ---------------------------------------------------------------

    @invariant()
    def same_sessions(self) -> None:
        assert len(self.cache) <= SLOTS
        assert set(self.cache.sessions) == set(self.model)
        assert self.cache.evictions == self.evictions
        for session_id, expected in self.model.items():
            session = self.cache.sessions[session_id]
            assert session.epoch == expected.epoch
            assert session.last_used_ms == expected.last_used
            assert {p: c.request for p, c in session.partitions.items()} == expected.asked
            told = {
                p: (c.high_watermark, c.last_stable_offset, c.log_start_offset)
                for p, c in session.partitions.items()
            }
            assert told == expected.told


TestFetchSessionMachine = FetchSessionMachine.TestCase
TestFetchSessionMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
