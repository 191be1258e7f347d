"""Fetch sessions (KIP-227): the fetch handler's answers and the session cache's eviction.

The handler runs on the sans-I/O services of test_handler_effects (topics in memory,
an autojump clock); the cache's eviction rules are checked on the pure cache.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import trio
import trio.testing

from tests.unit.handlers.test_handler_effects import (
    Services,
    _run_deferred,
    context,
    produce_request,
)
from trio_broker.config import BrokerConfig, ConfigError
from trio_broker.handlers.base import Deferred
from trio_broker.handlers.fetch import handle_fetch
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.fetch_sessions import (
    EVICTION_MS,
    CachedPartition,
    FetchSessionCache,
    FullFetch,
    IncrementalFetch,
    Sessionless,
    next_epoch,
)

Req = m.FetchRequest
Part = Req.FetchTopic.FetchPartition


def fetch(
    partitions: dict[str, list[tuple[int, int]]],
    session_id: int = 0,
    epoch: int = 0,
    forgotten: dict[str, list[int]] | None = None,
    max_wait_ms: int = 0,
    ids: dict[str, uuid.UUID] | None = None,
) -> Any:
    """A Fetch: {topic: [(partition, fetch offset)]}; with ``ids``, topics go by id (v13+)."""

    def topic_fields(name: str) -> dict[str, Any]:
        return {"topic_id": ids[name]} if ids else {"topic": name}

    def part(index: int, offset: int) -> Any:
        return Part(partition=index, fetch_offset=offset, partition_max_bytes=1 << 20)

    topics = [
        Req.FetchTopic(**topic_fields(name), partitions=[part(p, o) for p, o in wanted])
        for name, wanted in partitions.items()
    ]
    forgotten_topics = [
        Req.ForgottenTopic(**topic_fields(name), partitions=indexes)
        for name, indexes in (forgotten or {}).items()
    ]
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=session_id, session_epoch=epoch, topics=topics,
               forgotten_topics_data=forgotten_topics, rack_id="")  # fmt: skip


async def answer(services: Services, request: Any, version: int = 12) -> Any:
    result = await handle_fetch(context(services, m.ApiKey.FETCH, version), request)
    return await _run_deferred(result) if isinstance(result, Deferred) else result


async def produce(services: Services, topic: str, partition: int = 0) -> None:
    """An acks=1 produce, and the group commit's sync after it (the high watermark of
    a node alone is its durable end)."""
    request = produce_request(topic, 30_000)
    request.acks = 1
    request.topic_data[0].partition_data[0].index = partition
    await _run_deferred_or_value(services, request)
    services.sync(topic, partition)


async def _run_deferred_or_value(services: Services, request: Any) -> None:
    from trio_broker.handlers.produce import handle_produce

    result = await handle_produce(context(services, m.ApiKey.PRODUCE, 9), request)
    if isinstance(result, Deferred):
        await _run_deferred(result)


def listed(response: Any) -> list[tuple[str, int]]:
    return [(t.topic, p.partition_index) for t in response.responses for p in t.partitions]


def two_topics() -> Services:
    services = Services()
    services.topics.create("a", 2)
    services.topics.create("b", 1)
    return services


async def test_a_full_fetch_opens_a_session_and_incremental_fetches_send_only_news(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    full = await answer(services, fetch({"a": [(0, 0), (1, 0)], "b": [(0, 0)]}))
    assert full.error_code == ErrorCode.NONE and full.session_id > 0
    assert listed(full) == [("a", 0), ("a", 1), ("b", 0)]
    session = full.session_id
    # Nothing changed: an empty answer, the session id again.
    quiet = await answer(services, fetch({}, session, 1))
    assert quiet.error_code == ErrorCode.NONE and quiet.session_id == session
    assert listed(quiet) == []
    # A record in a-1: only a-1 comes back, with it and its new high watermark.
    await produce(services, "a", 1)
    news = await answer(services, fetch({}, session, 2))
    assert listed(news) == [("a", 1)]
    part = news.responses[0].partitions[0]
    assert part.records and part.high_watermark == 1
    # The fetcher moves a-1 past the record (sent because its offset changed): no news.
    moved = await answer(services, fetch({"a": [(1, 1)]}, session, 3))
    assert listed(moved) == []
    assert services.fetch_sessions.incremental_fetches == 3


async def test_session_errors_have_their_kafka_codes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    session = (await answer(services, fetch({"a": [(0, 0)]}))).session_id
    stale = await answer(services, fetch({}, session, 7))
    assert stale.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH and not stale.responses
    unknown = await answer(services, fetch({}, session + 1, 1))
    assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND and not unknown.responses
    # A session opened with names (v12) cannot go on with topic ids (v13).
    by_id = await answer(
        services, fetch({}, session, 1, ids={"a": services.topics.get("a").topic_id}), 13
    )
    assert by_id.error_code == ErrorCode.FETCH_SESSION_TOPIC_ID
    assert services.fetch_sessions.errors == {
        ErrorCode.INVALID_FETCH_SESSION_EPOCH: 1,
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND: 1,
        ErrorCode.FETCH_SESSION_TOPIC_ID: 1,
    }
    # The errors did not move the epoch: 1 is still the next one.
    assert (await answer(services, fetch({}, session, 1))).error_code == ErrorCode.NONE


async def test_epoch_minus_one_closes_the_session_and_a_full_fetch_replaces_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    first = (await answer(services, fetch({"a": [(0, 0)]}))).session_id
    # A full fetch naming the session closes it and opens another.
    second = (await answer(services, fetch({"a": [(0, 0)]}, first, 0))).session_id
    assert second not in (0, first) and len(services.fetch_sessions) == 1
    closing = await answer(services, fetch({"a": [(0, 0)]}, second, -1))
    assert closing.session_id == 0 and listed(closing) == [("a", 0)]
    assert len(services.fetch_sessions) == 0
    gone = await answer(services, fetch({}, second, 1))
    assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


async def test_sessionless_fetches_are_answered_in_full_and_open_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    for _ in range(3):
        plain = await answer(services, fetch({"a": [(0, 0)], "b": [(0, 0)]}, 0, -1))
        assert plain.session_id == 0 and listed(plain) == [("a", 0), ("b", 0)]
    assert len(services.fetch_sessions) == 0


async def test_forgetting_partitions_and_forgetting_all_of_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    session = (await answer(services, fetch({"a": [(0, 0), (1, 0)], "b": [(0, 0)]}))).session_id
    await answer(services, fetch({}, session, 1, forgotten={"a": [0]}))
    await produce(services, "a", 0)
    await produce(services, "b", 0)
    # a-0 was forgotten: its record is not news for this session.
    assert listed(await answer(services, fetch({}, session, 2))) == [("b", 0)]
    last = await answer(services, fetch({}, session, 3, forgotten={"a": [1], "b": [0]}))
    # Nothing left to cache: the session is closed, the answer sessionless.
    assert last.session_id == 0 and session not in services.fetch_sessions.sessions


async def test_sessions_by_topic_id_from_v13(autojump_clock: trio.testing.MockClock) -> None:
    services = two_topics()
    ids = {name: services.topics.get(name).topic_id for name in ("a", "b")}
    full = await answer(services, fetch({"a": [(0, 0)], "b": [(0, 0)]}, ids=ids), 13)
    assert full.session_id > 0 and [t.topic_id for t in full.responses] == [ids["a"], ids["b"]]
    await produce(services, "a", 0)
    await produce(services, "b", 0)
    news = await answer(services, fetch({}, full.session_id, 1, forgotten={"b": [0]}, ids=ids), 13)
    assert [(t.topic_id, p.partition_index) for t in news.responses for p in t.partitions] == [
        (ids["a"], 0)
    ]
    # An unknown topic id stays in the session, answered with its error each time.
    # (a-0 moves past its record at the same time: no news there.)
    with_stranger = {**ids, "x": uuid.uuid4()}
    added = await answer(
        services, fetch({"a": [(0, 1)], "x": [(0, 0)]}, full.session_id, 2, ids=with_stranger), 13
    )
    assert [p.error_code for t in added.responses for p in t.partitions] == [
        ErrorCode.UNKNOWN_TOPIC_ID
    ]
    again = await answer(services, fetch({}, full.session_id, 3), 13)
    assert [p.error_code for t in again.responses for p in t.partitions] == [
        ErrorCode.UNKNOWN_TOPIC_ID
    ]


async def test_an_incremental_long_poll_waits_for_an_append_then_sends_only_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    session = (await answer(services, fetch({"a": [(0, 0), (1, 0)], "b": [(0, 0)]}))).session_id
    started = trio.current_time()
    idle = await answer(services, fetch({}, session, 1, max_wait_ms=5_000))
    assert trio.current_time() - started == 5.0 and listed(idle) == []
    waiting = await handle_fetch(
        context(services, m.ApiKey.FETCH, 12), fetch({}, session, 2, max_wait_ms=5_000)
    )
    assert isinstance(waiting, Deferred)
    async with trio.open_nursery() as nursery:

        async def produce_later() -> None:
            await trio.sleep(1)
            await produce(services, "b", 0)

        nursery.start_soon(produce_later)
        started = trio.current_time()
        woken = await _run_deferred(waiting)
    assert trio.current_time() - started == 1.0
    assert listed(woken) == [("b", 0)] and woken.session_id == session
    # The epoch moved once per request, not once per look at the logs.
    assert services.fetch_sessions.sessions[session].epoch == 3


async def test_a_request_taken_during_a_long_poll_makes_the_polls_answer_stale(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = two_topics()
    session = (await answer(services, fetch({"a": [(0, 0)]}))).session_id
    waiting = await handle_fetch(
        context(services, m.ApiKey.FETCH, 12), fetch({}, session, 1, max_wait_ms=5_000)
    )
    assert isinstance(waiting, Deferred)
    # The client (say, after a timeout) sends the next epoch: the session takes it.
    assert (await answer(services, fetch({}, session, 2))).error_code == ErrorCode.NONE
    late = await _run_deferred(waiting)
    assert late.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH and not late.responses
    assert late.session_id == session


async def test_no_slots_means_no_sessions(autojump_clock: trio.testing.MockClock) -> None:
    services = two_topics()
    services.fetch_sessions = FetchSessionCache(max_entries=0)
    full = await answer(services, fetch({"a": [(0, 0)]}))
    assert full.session_id == 0 and listed(full) == [("a", 0)]


# ---------------------------------------------------------------------- the cache itself


def new_session(
    cache: FetchSessionCache[Any, Any], size: int, now_ms: int, privileged: bool = False
) -> int:
    context = cache.open(0, 0, {}, [], uses_topic_ids=False, privileged=privileged, now_ms=now_ms)
    assert isinstance(context, FullFetch)
    partitions = {("t", i): CachedPartition(i) for i in range(size)}
    return cache.create(partitions, privileged=privileged, uses_topic_ids=False, now_ms=now_ms)


def use(cache: FetchSessionCache[Any, Any], session_id: int, now_ms: int) -> None:
    epoch = cache.sessions[session_id].epoch
    context = cache.open(session_id, epoch, {}, [], uses_topic_ids=False, privileged=False,
                         now_ms=now_ms)  # fmt: skip
    assert isinstance(context, IncrementalFetch)


def test_a_full_cache_takes_a_stale_sessions_slot_first() -> None:
    cache: FetchSessionCache[Any, Any] = FetchSessionCache(2, rng=random.Random(1))
    idle = new_session(cache, 5, now_ms=0)
    busy = new_session(cache, 5, now_ms=0)
    assert idle and busy
    use(cache, busy, EVICTION_MS)
    # Young sessions and equal sizes: no room for a consumer's one-partition session...
    assert new_session(cache, 1, now_ms=EVICTION_MS) == 0
    # ...until the idle one has been unused longer than EVICTION_MS.
    newcomer = new_session(cache, 1, now_ms=EVICTION_MS + 1)
    assert newcomer and set(cache.sessions) == {busy, newcomer} and cache.evictions == 1
    assert idle not in cache.sessions


def test_a_follower_evicts_a_consumer_at_once_a_consumer_only_a_smaller_old_one() -> None:
    cache: FetchSessionCache[Any, Any] = FetchSessionCache(2, rng=random.Random(2))
    small = new_session(cache, 1, now_ms=0)
    large = new_session(cache, 10, now_ms=0)
    # A bigger consumer session may not evict a session younger than EVICTION_MS.
    assert new_session(cache, 20, now_ms=1000) == 0
    # A follower's session (privileged) evicts the smallest consumer session at once.
    follower = new_session(cache, 1, now_ms=1000, privileged=True)
    assert follower and set(cache.sessions) == {large, follower}
    # Once old enough (as of its last use), the large session yields to a larger one
    # and not to a same-sized one; the follower's session outranks every consumer's.
    use(cache, large, EVICTION_MS + 1)
    use(cache, follower, EVICTION_MS + 1)
    assert new_session(cache, 10, now_ms=EVICTION_MS + 2) == 0
    bigger = new_session(cache, 11, now_ms=EVICTION_MS + 2)
    assert bigger and set(cache.sessions) == {follower, bigger}
    assert small not in cache.sessions and cache.evictions == 2


def test_full_fetch_with_epoch_minus_one_is_sessionless() -> None:
    cache: FetchSessionCache[Any, Any] = FetchSessionCache()
    opened = new_session(cache, 1, now_ms=0)
    context = cache.open(opened, -1, {}, [], uses_topic_ids=False, privileged=False, now_ms=1)
    assert isinstance(context, Sessionless) and not cache.sessions


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(2**31 - 1) == 1 and next_epoch(-1) == -1


def test_the_slots_setting_must_not_be_negative() -> None:
    assert BrokerConfig(max_incremental_fetch_session_cache_slots=0).validate()
    with pytest.raises(ConfigError, match=r"max\.incremental\.fetch\.session\.cache\.slots"):
        BrokerConfig(max_incremental_fetch_session_cache_slots=-1).validate()
