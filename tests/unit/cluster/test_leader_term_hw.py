"""A broker that leads a partition again, after a term of its own ended (fenced from
ZooKeeper and back, or led by another in between), starts the new term at the HW its
earlier term reached, not lower: its consumers never see the HW go back.

Those records were on every ISR member when that HW was shown, so a clean election kept
them (the new term's log holds them); a follower's HW, learned from its leader's fetch
answers, can lag, and a fenced term used to start again at the followers' next fetches.
Found by the 30-minute Jepsen run (``high_watermark_backwards`` on one broker run).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import trio

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.protocol.records import build_batch
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

KEY = ("t", 0)


async def _leading(records: int) -> ReplicaManager:
    coord = MemoryCoordination(MemoryZooKeeper())
    topics = TopicManager(None, LogConfig(), lambda: 0)
    manager = ReplicaManager(
        ClusterView(1), coord, topics, min_insync_replicas=1, replica_lag_time_max_ms=1000,
        now_ms=lambda: 0, durability=None,
    )  # fmt: skip
    topic = topics.create("t", 1)
    manager.view.topics["t"] = TopicInfo("t", topic.topic_id or uuid.uuid4(), {})
    log = topics.log(*KEY)
    assert log is not None
    for i in range(records):
        log.append(build_batch([(None, b"v%d" % i)], base_timestamp=0), now_ms=0)
    return manager


async def _lead(manager: ReplicaManager, epoch: int) -> None:
    await manager._become_leader("t", 0, PartitionInfo((1, 2), 1, epoch, (1, 2)))


def _followers_reach(manager: ReplicaManager, offset: int) -> None:
    term = manager.terms[KEY]
    term.leader_synced(term.log_end_offset)
    term.follower_fetched(2, offset, now_ms=0)


def hold_flush(log: Any) -> tuple[threading.Event, threading.Event]:
    """Make ``log.flush`` wait until the second event is set; the first is set when the
    flush starts (in its worker thread)."""
    flushing, release = threading.Event(), threading.Event()
    flush = log.flush

    def held_flush() -> int:
        flushing.set()
        release.wait(30)
        return int(flush())

    log.flush = held_flush
    return flushing, release


async def test_a_term_after_a_fence_starts_at_the_hw_the_fenced_term_reached() -> None:
    manager = await _leading(10)
    await _lead(manager, 3)
    _followers_reach(manager, 8)
    assert manager.terms[KEY].high_watermark == 8
    manager.fence(True)  # ZooKeeper gone past the session timeout: every term ends
    assert KEY not in manager.terms
    manager.fence(False)
    await _lead(manager, 3)  # the session held: same epoch, a new term
    assert manager.terms[KEY].high_watermark == 8
    # The follower's next fetch reports less than it had (it was restarted meanwhile,
    # say): the HW stays.
    manager.terms[KEY].follower_fetched(2, 6, now_ms=0)
    assert manager.terms[KEY].high_watermark == 8


async def test_a_term_after_following_starts_at_least_at_the_hw_it_reached_before() -> None:
    manager = await _leading(10)
    await _lead(manager, 3)
    _followers_reach(manager, 9)
    manager._end_term(KEY)  # broker 2 leads epoch 4; this broker follows it
    await _lead(manager, 5)
    assert manager.terms[KEY].high_watermark == 9


async def test_the_floor_is_capped_at_the_log_end_and_forgotten_with_the_copy() -> None:
    manager = await _leading(10)
    await _lead(manager, 3)
    _followers_reach(manager, 10)
    manager._end_term(KEY)
    log = manager.topics.log(*KEY)
    assert log is not None
    log.truncate_to(7)  # only an unclean election could cut committed records
    await _lead(manager, 4)
    assert manager.terms[KEY].high_watermark == 7
    manager.copies.delete("t", "deleted by the cluster")
    assert KEY not in manager.hw_floors


class _Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def elected(self, partition: int, leader_epoch: int, log: object) -> None:
        self.calls.append(("elected", partition))

    def resigned(self, partition: int) -> None:
        self.calls.append(("resigned", partition))


async def test_a_fence_tells_the_internal_topics_owner_it_resigned() -> None:
    """Else a later election on the same log looks like a new epoch of one leadership,
    and the coordinator keeps the table it had before the fence (another broker wrote
    on meanwhile): found as stale committed offsets by verify's offset_fetch_current."""
    manager = await _leading(3)
    listener = _Listener()
    manager.leadership_listeners["t"] = listener
    await _lead(manager, 3)
    manager.fence(True)
    manager.fence(False)
    await _lead(manager, 5)
    assert listener.calls == [("elected", 0), ("resigned", 0), ("elected", 0)]


async def test_a_new_epoch_of_the_same_leader_starts_at_the_hw_its_last_term_reached() -> None:
    """The controller bumps the epoch and this broker leads on (a follower left the ISR
    when its broker died or lost its session): the old term answers fetches until the
    new one is in place, while the log is flushed in a worker thread, and its HW moves
    on meanwhile. The new term starts at that HW, not at what the old one had before
    the flush: a consumer's next fetch would see the HW go back (the Jepsen run's
    ``high_watermark_backwards`` on one broker run)."""
    manager = await _leading(10)
    await _lead(manager, 3)
    _followers_reach(manager, 8)
    log = manager.topics.log(*KEY)
    assert log is not None
    # The new term is on its way (its flush held); the old one still answers.
    flushing, release = hold_flush(log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_lead, manager, 4)
        assert await trio.to_thread.run_sync(flushing.wait, 30), "the flush never started"
        old = manager.terms[KEY]
        assert old.leader_epoch == 3
        old.follower_fetched(2, 10, now_ms=0)  # a fetch in epoch 3, during the flush
        assert old.high_watermark == 10  # shown to that fetch and the consumers after it
        release.set()
    assert manager.terms[KEY].leader_epoch == 4
    assert manager.terms[KEY].high_watermark == 10


async def test_a_fence_during_the_flush_starts_no_term() -> None:
    """ZooKeeper is lost past the session timeout while the new term's flush runs:
    the view that named this broker leader is stale (another may lead in a newer epoch
    by now), so no term starts; the next view, once ZooKeeper answers, decides."""
    manager = await _leading(10)
    await _lead(manager, 3)
    log = manager.topics.log(*KEY)
    assert log is not None
    flushing, release = hold_flush(log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_lead, manager, 4)
        assert await trio.to_thread.run_sync(flushing.wait, 30), "the flush never started"
        manager.fence(True)
        release.set()
    assert KEY not in manager.terms
