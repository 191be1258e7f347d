"""Sans-I/O handlers: waiting is an effect the shell performs, driven here by an autojump clock.

A handler that must wait returns a Deferred whose coroutine awaits only service
calls, with ``timeout_s`` and ``on_timeout``; the handler pool's ``_run_deferred``
enforces the deadline. The services below are real (topics in memory, producer
states, quotas) except the two waits under test: a group commit that never
completes and an append signal, both plain Trio objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio
import trio.testing

from trio_broker.config import BrokerConfig
from trio_broker.handlers.base import ClientInfo, Deferred, RequestContext
from trio_broker.handlers.fetch import handle_fetch
from trio_broker.handlers.produce import handle_produce
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import RequestHeader
from trio_broker.protocol.records import build_batch
from trio_broker.server.fetch_waits import FetchWaits
from trio_broker.server.handler_pool import _run_deferred
from trio_broker.services.local_replication import LocalReplication, LocalView
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.quotas import QuotaService
from trio_broker.services.stats import BrokerStats
from trio_broker.services.topics import TopicManager
from trio_broker.state.fetch_sessions import FetchSessionCache
from trio_broker.storage.log import LogConfig


class GroupCommit:
    """Durability whose fsync completes only when the test says so (:meth:`sync`)."""

    def __init__(self) -> None:
        self.synced = trio.Event()
        self._wakes: list[Callable[[], None]] = []

    def sync(self) -> None:
        self.synced.set()
        for wake in self._wakes:
            wake()

    def mark_dirty(self, log: Any, messages: int = 1) -> None:
        pass

    async def wait_durable(self, log: Any, offset: int) -> None:
        await self.synced.wait()

    def watch_durable(self, log: Any, offset: int, wake: Callable[[], None]) -> Any:
        self._wakes.append(wake)
        group_commit = self

        class Watch:
            def check(self) -> bool:
                return group_commit.synced.is_set()

            def cancel(self) -> None:
                pass

        return Watch()

    def recover_soon(self, log: Any) -> None:
        pass


@attrs.define
class Services:
    config: BrokerConfig = attrs.Factory(BrokerConfig)
    cluster_id: str = "effects"
    topics: TopicManager = attrs.Factory(lambda: TopicManager(None, LogConfig(), lambda: 0))
    producers: ProducerStateRegistry = attrs.Factory(lambda: ProducerStateRegistry(None, lambda: 0))
    quotas: QuotaService = attrs.Factory(lambda: QuotaService(BrokerConfig()))
    authorizer: Any = None
    credentials: Any = None
    groups: Any = None
    durability: GroupCommit = attrs.Factory(GroupCommit)
    appends: FetchWaits = attrs.Factory(FetchWaits)
    stats: BrokerStats = attrs.Factory(BrokerStats)
    fetch_sessions: FetchSessionCache[Any, Any] = attrs.Factory(FetchSessionCache)
    #: A node alone's internal topics clients read: none here.
    own_internal_topics: dict[str, Any] = attrs.Factory(dict)
    shutting_down: bool = False
    replication: Any = None  # alone: no cluster
    transactions: Any = None  # no transaction coordinator
    #: The node alone's replication, made on first use (after the test set its fields).
    alone: LocalReplication | None = None

    @property
    def leaders(self) -> LocalReplication:
        """Services.leaders: alone, a cluster of one, which takes the partitions with
        entries of this registry (one for the services' life, as a broker's)."""
        if self.alone is None:
            endpoints = [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
            view = LocalView(0, None, self.topics, lambda: endpoints)
            self.alone = LocalReplication(view, producers=self.producers)
        return self.alone

    def sync(self, topic: str, partition: int) -> None:
        """The flusher's sync of a partition, which ``durability`` leaves to the test:
        its log durable to its end, which a node alone's high watermark is, and the
        partition's long polls woken (the broker's ``Flusher.on_synced``)."""
        log = self.topics.log(topic, partition)
        assert log is not None
        log.flush()
        self.appends.notify(topic, partition)

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def monotonic_ms(self) -> float:
        return trio.current_time() * 1000

    def advertised_for(self, connection_id: int | None) -> tuple[str, int]:
        return ("127.0.0.1", 9092)

    def listener_name_for(self, connection_id: int | None) -> str:
        return "PLAINTEXT"

    async def run_off_loop(self, fn: Callable[[], Any]) -> Any:
        return fn()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def context(services: Services, api_key: int, version: int) -> RequestContext:
    header = RequestHeader(api_key, version, 1, "effects")
    return RequestContext(header=header, services=services, client=ClientInfo(1, "127.0.0.1", 1))


def produce_request(topic: str, timeout_ms: int) -> Any:
    Req = m.ProduceRequest
    batch = bytearray(build_batch([(b"k", b"v")], base_timestamp=0))
    data = Req.TopicProduceData(
        name=topic,
        partition_data=[Req.TopicProduceData.PartitionProduceData(index=0, records=batch)],
    )
    return Req(transactional_id=None, acks=-1, timeout_ms=timeout_ms, topic_data=[data])


async def test_acks_all_answers_request_timed_out_when_the_fsync_never_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = Services()
    services.topics.create("t", 1)
    result = await handle_produce(
        context(services, m.ApiKey.PRODUCE, 9), produce_request("t", 30_000)
    )
    assert isinstance(result, Deferred) and result.timeout_s == 30.0
    started = trio.current_time()
    response = await _run_deferred(result)
    # The shell's deadline, not a handler's sleep: 30 virtual seconds, then the answer.
    assert trio.current_time() - started == 30.0
    part = response.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.REQUEST_TIMED_OUT and part.base_offset == -1


async def test_acks_all_answers_once_the_group_commit_covers_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = Services()
    services.topics.create("t", 1)
    result = await handle_produce(
        context(services, m.ApiKey.PRODUCE, 9), produce_request("t", 30_000)
    )
    assert isinstance(result, Deferred)
    async with trio.open_nursery() as nursery:

        async def fsync_after_a_while() -> None:
            await trio.sleep(2)
            services.durability.sync()

        nursery.start_soon(fsync_after_a_while)
        started = trio.current_time()
        response = await _run_deferred(result)
    assert trio.current_time() - started == 2.0
    part = response.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.NONE and part.base_offset == 0


def fetch_request(topic: str, max_wait_ms: int) -> Any:
    Req = m.FetchRequest
    partition = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    wanted = Req.FetchTopic(topic=topic, partitions=[partition])
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1, topics=[wanted],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def test_a_long_poll_ends_at_max_wait_or_at_a_synced_append(
    autojump_clock: trio.testing.MockClock,
) -> None:
    services = Services()
    services.topics.create("t", 1)
    ctx = context(services, m.ApiKey.FETCH, 11)
    idle = await handle_fetch(ctx, fetch_request("t", 5_000))
    assert isinstance(idle, Deferred) and idle.timeout_s == 5.0
    started = trio.current_time()
    empty = await _run_deferred(idle)
    assert trio.current_time() - started == 5.0
    assert not empty.responses[0].partitions[0].records
    # An append wakes the next long poll before its deadline.
    waiting = await handle_fetch(ctx, fetch_request("t", 5_000))
    assert isinstance(waiting, Deferred)
    async with trio.open_nursery() as nursery:

        async def produce_later() -> None:
            await trio.sleep(1)
            produced = await handle_produce(
                context(services, m.ApiKey.PRODUCE, 9), produce_request("t", 30_000)
            )
            assert isinstance(produced, Deferred)  # acks=all waits; the data is in the log
            # Its sync moves the high watermark (a node alone's is the durable end).
            services.sync("t", 0)

        nursery.start_soon(produce_later)
        started = trio.current_time()
        answer = await _run_deferred(waiting)
    assert trio.current_time() - started == 1.0
    assert answer.responses[0].partitions[0].records
