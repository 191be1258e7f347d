"""Followers copy their leaders' logs: one fetcher task per leader broker.

A fetcher serves every partition this broker follows from one leader, over one
connection, and writes each through the partition's :class:`Partition` (``Topic.replica``:
the replica manager took it as a follower), never the log's append or truncation itself
(``tests/unit/partition/test_one_append_path.py``):

1. **Truncate** a partition whose leader changed: OffsetForLeaderEpoch rounds
   (``replication/truncation.py``) find where this log stops agreeing with the leader's,
   and the partition is cut there (``Partition.truncate_to``: the log, its epoch cache
   and the producer state of the cut records).
2. **Fetch** with this broker's replica id, from each log's end. Before asking for more,
   what was fetched is synced (the flusher's group commit): the leader counts a fetch
   at offset X as "the follower holds everything below X", and by default that means
   on disk (docs/cluster.md, "Durability stays explicit").
3. **Append** the batches as they are (``Partition.append_as_follower``, then its
   ``replica_appended``: a producer snapshot at a segment roll), keep the
   leader's high watermark, and move the log start up to the leader's (DeleteRecords,
   retention there; ``follower_log_start``). Out of range below the leader's log start
   empties the log and starts it there (``out_of_range_reset``,
   ``Partition.truncate_fully_and_start_at``).
4. **Throttle** the partitions this broker throttles its own fetching of
   (``FetcherHost.follower_throttled``: the topic's
   ``follower.replication.throttled.replicas`` names this replica and it is out of the
   ISR, or, for a topic without throttled-replica lists, a reassignment is adding it) to
   ``follower.replication.throttled.rate`` bytes per second, both decided afresh for
   every fetch (topic and broker configs change at runtime): their fetch size is capped
   at one second's worth, and after a fetch that
   brought them N bytes the fetcher pauses N / rate seconds (the other partitions it
   copies from the same leader wait too, as Kafka's shared fetcher thread does).

The decisions (sync before fetching, drop a stale answer, what an error means) are
``replication/fetcher_rules.py``'s, which the replication machine and the simulator
drive too. Errors that mean "the cluster moved on" (not leader, fenced or unknown epoch) wait for
the next view change, or a pause, whichever comes first: a follower often learns its role
before its leader does and is refused until the leader catches up, which changes nothing
the follower watches. Connection errors reconnect after a pause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from trio_broker.cluster.broker_client import BrokerClient, BrokerConnectionError
from trio_broker.cluster.waiting import RETRY_S, Signal, Watch, wait_any
from trio_broker.partition.append import Durability
from trio_broker.partition.partition import Follows, Partition
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.fetcher_rules import (
    AnswerAction,
    FetchPosition,
    ResetKind,
    answer_action,
    answer_applies,
    follower_log_start,
    out_of_range_reset,
    sync_before_fetch,
)
from trio_broker.replication.follower import (
    high_watermark_after_fetch,
    high_watermark_after_truncation,
)
from trio_broker.replication.truncation import plan_truncation
from trio_broker.services.cluster_view import ClusterView
from trio_broker.services.topics import TopicManager
from trio_broker.storage.errors import LogError, StorageError

__all__ = ["FetcherHost", "FollowerRole", "run_fetchers"]

log = logging.getLogger(__name__)

FETCH_VERSION = 12  # the last with replica_id at the top level, topics by name
EPOCH_VERSION = 4
LIST_OFFSETS_VERSION = 4  # the first with current_leader_epoch
#: ListOffsets' timestamp for "the log start offset".
EARLIEST = -2
MAX_WAIT_MS = 500
PARTITION_MAX_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 30.0
#: Rounds of OffsetForLeaderEpoch before giving up for now (each goes an epoch back).
MAX_TRUNCATION_ROUNDS = 64

Key = tuple[str, int]


@attrs.define
class FollowerRole:
    """A partition this broker follows: whom, in which epoch (the :class:`Follows` its
    Partition holds too, one object for both), and how far the fetcher got. The replica
    manager sets whom it follows; the fetcher keeps the progress."""

    follows: Follows
    #: Cut the log to agree with the leader before fetching (after every leader change).
    needs_truncation: bool = True
    #: The leader's high watermark as last fetched, capped at the local log end.
    high_watermark: int = 0

    @property
    def leader(self) -> int:
        return self.follows.leader

    @property
    def leader_epoch(self) -> int:
        return self.follows.leader_epoch


class FetcherHost(Protocol):
    """What the fetchers ask of their replica manager (``ReplicaManager`` is the one;
    tests stand in for it). Declared here, so the manager depends on the fetchers it
    starts and not the other way round."""

    view: ClusterView
    #: inter.broker.listener.name: whose endpoint followers fetch from (None: first).
    inter_broker_listener: str | None
    topics: TopicManager
    #: The flusher's durability service (``wait_durable``, ``mark_dirty``).
    durability: Durability
    sync_before_counting: bool
    #: (topic, partition) -> what this broker follows, set by the manager.
    following: dict[Key, FollowerRole]
    #: Set (and replaced) whenever ``following`` changed.
    roles_changed: Signal
    now_ms: Callable[[], int]

    @property
    def follower_throttle_rate(self) -> int: ...

    def follower_throttled(self, name: str, partition: int) -> bool: ...

    def partition_changed(self, topic: str, partition: int) -> None: ...

    def view_event(self) -> Watch:
        """Set (and replaced) whenever the cluster view changed."""
        ...


async def run_fetchers(manager: FetcherHost) -> None:
    """One fetcher per leader this broker follows something from; kept in step with roles."""
    running: dict[int, trio.CancelScope] = {}
    async with trio.open_nursery() as nursery:
        while True:
            changed = manager.roles_changed
            leaders = {role.leader for role in manager.following.values()}
            for leader in list(running):
                if leader not in leaders:
                    running.pop(leader).cancel()
            for leader in leaders - set(running):
                scope = trio.CancelScope()
                running[leader] = scope
                nursery.start_soon(_fetcher, manager, leader, scope)
            await changed.wait()


async def _fetcher(manager: FetcherHost, leader: int, scope: trio.CancelScope) -> None:
    with scope:
        client: BrokerClient | None = None
        try:
            while True:
                roles_changed = manager.roles_changed
                mine = {k: r for k, r in manager.following.items() if r.leader == leader}
                if not mine:
                    # Nothing from this leader right now, but only run_fetchers ends a
                    # fetcher: it counts this one as running, and if roles move back to
                    # this leader before it looks (two changes, one wakeup), a fetcher
                    # that had returned would leave those partitions unfetched for good.
                    await roles_changed.wait()
                    continue
                try:
                    if client is None:
                        client = await _connect(manager, leader)
                    for key, role in mine.items():
                        if role.needs_truncation:
                            await _truncate(manager, client, key, role)
                    ready = {k: r for k, r in mine.items() if not r.needs_truncation}
                    if not ready:
                        # Truncation was refused (often: the leader has not yet learnt it
                        # leads). Ask again after a pause even if nothing changes: the
                        # leader learning its role changes nothing this broker watches.
                        with trio.move_on_after(RETRY_S):
                            await wait_any(manager.roles_changed, manager.view_event())
                        continue
                    await _fetch_once(manager, client, ready)
                except BrokerConnectionError as exc:
                    log.info("fetching from broker %d: %s", leader, exc)
                    if client is not None:
                        await client.close()
                    client = None
                    await trio.sleep(RETRY_S)
        finally:
            if client is not None:
                await client.close()


async def _connect(manager: FetcherHost, leader: int) -> BrokerClient:
    return await connect_to_broker(manager, leader, f"replica-fetcher-{manager.view.broker_id}")


async def connect_to_broker(manager: FetcherHost, broker_id: int, client_id: str) -> BrokerClient:
    """A connection to ``broker_id``'s inter-broker listener, as its view registers it
    (logged in, when that listener is secured: the manager's ``open_stream``)."""
    info = manager.view.brokers.get(broker_id)
    if info is None:
        raise BrokerConnectionError(f"broker {broker_id} is not registered")
    address = info.endpoint(manager.inter_broker_listener)
    if address is None:
        raise BrokerConnectionError(
            f"broker {broker_id} has no {manager.inter_broker_listener} listener registered"
        )
    # getattr: stand-in managers of tests may predate the simulation's hook.
    open_stream = getattr(manager, "open_stream", None)
    host, port = address
    client = BrokerClient(host, port, client_id, open_stream)
    await client.connect()
    return client


def _replica(manager: FetcherHost, key: Key) -> Partition | None:
    """The :class:`Partition` this broker follows ``key`` in (``Topic.replica``: the
    replica manager took it, ``_become_follower``), the fetcher's only way into its
    log; None when there is none (the topic deleted, the partition moved away)."""
    topic = manager.topics.get(key[0])
    if topic is None or not 0 <= key[1] < len(topic.logs):
        return None
    return topic.replica(key[1])


def _offline(manager: FetcherHost, partition_: Partition) -> bool:
    """Whether the replica's log is offline (a disk error took its log dir offline:
    storage/log_dir_state.py). Then it is neither truncated nor fetched for, as Kafka
    removes the fetchers of a failed dir's partitions; the dir is probed in the
    background (the flusher's back-off), and the replica fetched for again once the
    whole dir is back."""
    if not partition_.log.offline:
        return False
    # getattr: the flusher probes (Flusher.recover_soon); a stand-in durability of the
    # tests may have no probe, and no disk to fail.
    recover_soon = getattr(manager.durability, "recover_soon", None)
    if recover_soon is not None:
        recover_soon(partition_.log)
    return True


async def _truncate(
    manager: FetcherHost, client: BrokerClient, key: Key, role: FollowerRole
) -> None:
    partition_ = _replica(manager, key)
    if partition_ is None or _offline(manager, partition_):
        return
    log_ = partition_.log
    Req = m.OffsetForLeaderEpochRequest
    epoch = log_.epoch_cache.latest_epoch
    for _ in range(MAX_TRUNCATION_ROUNDS):
        partition = Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=key[1], current_leader_epoch=role.leader_epoch, leader_epoch=epoch
        )
        request = Req(
            replica_id=manager.view.broker_id,
            topics=[Req.OffsetForLeaderTopic(topic=key[0], partitions=[partition])],
        )
        response: m.OffsetForLeaderEpochResponse = await client.call(
            m.ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, request, REQUEST_TIMEOUT_S
        )
        answer = response.topics[0].partitions[0]
        if answer.error_code != ErrorCode.NONE:
            log.info("%s-%d: OffsetForLeaderEpoch answered %s; waiting", *key,
                     ErrorCode(answer.error_code).name)  # fmt: skip
            await trio.sleep(RETRY_S)
            return
        step = plan_truncation(
            log_.epoch_cache, log_.log_end_offset, role.high_watermark,
            answer.leader_epoch, answer.end_offset,
        )  # fmt: skip
        if step.truncate_to < log_.log_end_offset:
            before = log_.log_end_offset
            # The producer state of the cut records goes with them (Partition.truncate_to).
            await trio.to_thread.run_sync(partition_.truncate_to, step.truncate_to)
            log.info("%s-%d: truncated from %d to %d (leader epoch %d ends at %d)", *key,
                     before, log_.log_end_offset, answer.leader_epoch, answer.end_offset)  # fmt: skip
        if step.done:
            role.needs_truncation = False
            role.high_watermark = high_watermark_after_truncation(
                role.high_watermark, log_.log_end_offset
            )
            return
        epoch = step.next_epoch


async def _reset_out_of_range(
    manager: FetcherHost, client: BrokerClient, key: Key, role: FollowerRole
) -> None:
    """OFFSET_OUT_OF_RANGE: below the leader's log start, empty the log and start there;
    otherwise agree with the leader again (``fetcher_rules.out_of_range_reset``)."""
    Req = m.ListOffsetsRequest
    partition = Req.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=key[1], current_leader_epoch=role.leader_epoch, timestamp=EARLIEST
    )
    request = Req(
        replica_id=manager.view.broker_id, isolation_level=0,
        topics=[Req.ListOffsetsTopic(name=key[0], partitions=[partition])],
    )  # fmt: skip
    response: m.ListOffsetsResponse = await client.call(
        m.ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, request, REQUEST_TIMEOUT_S
    )
    answer = response.topics[0].partitions[0]
    partition_ = _replica(manager, key)
    if partition_ is None or manager.following.get(key) is not role:
        return  # the role changed while the request was out
    log_ = partition_.log
    if answer.error_code != ErrorCode.NONE:
        # The leader moved on (not leader, fenced): truncating asks it again, and waits.
        role.needs_truncation = True
        return
    reset = out_of_range_reset(log_.log_end_offset, int(answer.offset))
    if reset.kind is ResetKind.TRUNCATE:
        role.needs_truncation = True
        return
    before = log_.log_end_offset
    await trio.to_thread.run_sync(partition_.truncate_fully_and_start_at, reset.offset)
    # Nothing below the new start is here; the HW is at least where the log starts.
    role.high_watermark = log_.log_start_offset
    manager.partition_changed(*key)
    log.warning("%s-%d: log ended at %d, below the leader's log start %d: emptied, starts there",
                *key, before, reset.offset)  # fmt: skip


async def _fetch_once(
    manager: FetcherHost, client: BrokerClient, ready: dict[Key, FollowerRole]
) -> None:
    Req = m.FetchRequest
    durability = manager.durability
    topics: dict[str, list[m.FetchRequest.FetchTopic.FetchPartition]] = {}
    replicas: dict[Key, Partition] = {}
    sent: dict[Key, FetchPosition] = {}
    throttled: set[Key] = set()
    for key, role in ready.items():
        partition_ = _replica(manager, key)
        if partition_ is None:
            continue
        if _offline(manager, partition_):
            role.needs_truncation = True  # back online, its log may end elsewhere
            continue
        log_ = partition_.log
        # Sync what was fetched before: the next fetch offset promises it is durable
        # (unless acks.all.fsync=false: then it promises what is in page cache).
        if sync_before_fetch(
            manager.sync_before_counting, log_.durable_end_offset, log_.log_end_offset
        ):
            await durability.wait_durable(log_, log_.log_end_offset - 1)
        replicas[key] = partition_
        sent[key] = FetchPosition(role.leader, role.leader_epoch, log_.log_end_offset)
        max_bytes = PARTITION_MAX_BYTES
        if manager.follower_throttled(*key):
            throttled.add(key)
            max_bytes = max(1, min(max_bytes, manager.follower_throttle_rate))
        topics.setdefault(key[0], []).append(
            Req.FetchTopic.FetchPartition(
                partition=key[1],
                current_leader_epoch=role.leader_epoch,
                fetch_offset=sent[key].fetch_offset,
                last_fetched_epoch=log_.epoch_cache.latest_epoch,
                log_start_offset=log_.log_start_offset,
                partition_max_bytes=max_bytes,
            )
        )
    if not replicas:
        await trio.sleep(RETRY_S)
        return
    request = Req(
        replica_id=manager.view.broker_id, max_wait_ms=MAX_WAIT_MS, min_bytes=1,
        max_bytes=64 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[Req.FetchTopic(topic=name, partitions=parts) for name, parts in topics.items()],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    response: m.FetchResponse = await client.call(
        m.ApiKey.FETCH, FETCH_VERSION, request, REQUEST_TIMEOUT_S + MAX_WAIT_MS / 1000
    )
    moved_on = False
    throttled_bytes = 0
    for topic in response.responses:
        for part in topic.partitions:
            key = (topic.topic, part.partition_index)
            current, partition_ = manager.following.get(key), replicas.get(key)
            if partition_ is None or key not in sent:
                continue  # not asked for
            log_ = partition_.log
            now = None
            if current is not None and not current.needs_truncation:
                # A new leader or epoch is a new FollowerRole, which truncates first.
                now = FetchPosition(current.leader, current.leader_epoch, log_.log_end_offset)
            if current is None or not answer_applies(sent[key], now):
                continue  # the role changed while the fetch was out
            role = current
            action = answer_action(part.error_code)
            if action is AnswerAction.RESET:
                await _reset_out_of_range(manager, client, key, role)
                continue
            if action is AnswerAction.WAIT:
                moved_on = True
                continue
            records = part.records
            if records:
                data = records if isinstance(records, (bytes, bytearray, memoryview)) else b""
                try:
                    results = partition_.append_as_follower(data, now_ms=manager.now_ms())
                except (StorageError, ValueError) as exc:
                    log.warning("%s-%d: fetched batches refused (%s); truncating again", *key, exc)
                    role.needs_truncation = True
                    continue
                if results:
                    durability.mark_dirty(log_, len(results))
                    # At a segment roll, a producer snapshot: it replays a segment's
                    # headers, so off the event loop (this fetcher alone writes the log);
                    # only then (a worker thread's hop per fetch was half its CPU).
                    if partition_.rolled(results):
                        await trio.to_thread.run_sync(partition_.replica_appended, results)
                if key in throttled:
                    throttled_bytes += len(data)
            high_watermark = high_watermark_after_fetch(
                role.high_watermark, part.high_watermark, log_.log_end_offset
            )
            moved, role.high_watermark = high_watermark != role.high_watermark, high_watermark
            start = follower_log_start(
                log_.log_start_offset, part.log_start_offset, role.high_watermark
            )
            if start is not None:
                try:
                    await trio.to_thread.run_sync(log_.delete_records, start)
                except LogError as exc:  # offline, closed, or moved meanwhile
                    log.warning("%s-%d: log start not moved to %d (%s)", *key, start, exc)
            if records or moved:
                manager.partition_changed(*key)
    if throttled_bytes:
        await trio.sleep(throttled_bytes / manager.follower_throttle_rate)
    if moved_on:  # not leader / fenced: the view will tell who leads now
        with trio.move_on_after(RETRY_S):
            await manager.roles_changed.wait()
