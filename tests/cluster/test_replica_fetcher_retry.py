"""A follower whose leader does not lead yet keeps asking, without waiting for news.

When the controller writes a new partition's state, every replica learns its role from
its own ZooKeeper watch; a follower often learns first, and the leader answers its
OffsetForLeaderEpoch with an error until it catches up. The leader catching up changes
nothing the follower watches, so a fetcher that only waited for its view to change sat
idle until something unrelated changed it: in a fresh three-broker cluster the Java
client's first acks=all produce took 10 s (replica.lag.time.max.ms), until the leader
dropped the idle followers from the ISR and that write woke them.

Here two real in-process brokers stand in for the replicas: the follower's fetcher runs
against a leader that does not have the topic at first (an error answer, like
LEADER_NOT_AVAILABLE), and no view change ever comes. Once the leader has the topic and
records, the follower must copy them within seconds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from tests.waits import eventually
from trio_broker.cluster.replica_fetcher import FollowerRole, _fetcher
from trio_broker.config import BrokerConfig
from trio_broker.partition.partition import Follows
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import BrokerInfo

TOPIC = "late-leader"
LEADER_ID, FOLLOWER_ID = 1, 2
RECORDS = 5
#: A deadline only: a fetcher that waited for a view change would never catch up here
#: (no view changes), so a busy machine may take long without turning the test red.
CATCH_UP_S = 60.0


async def start(nursery: trio.Nursery, data_dir: Path) -> Broker:
    broker: Broker = await nursery.start(
        Broker(BrokerConfig(port=0, data_dir=data_dir, storage="memory")).run
    )
    return broker


def stand_in_manager(
    follower: Broker, leader: Broker, following: dict[tuple[str, int], FollowerRole]
) -> Any:
    """What a fetcher asks of its replica manager; the view never changes here."""
    host, port = leader.bound[0]
    no_news = trio.Event()
    return SimpleNamespace(
        view=SimpleNamespace(
            broker_id=FOLLOWER_ID, brokers={LEADER_ID: BrokerInfo(LEADER_ID, host, port)}
        ),
        inter_broker_listener=None,
        sync_before_counting=True,
        following=following,
        roles_changed=trio.Event(),
        view_event=lambda: no_news,
        topics=follower.topics,
        durability=follower.durability,
        producers=None,
        now_ms=follower.now_ms,
        follower_throttled=lambda topic, partition: False,
        partition_changed=follower.appends.notify,
    )


async def test_a_refused_truncation_is_retried_without_a_view_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_broker.cluster.replica_fetcher")
    async with trio.open_nursery() as nursery:
        leader = await start(nursery, tmp_path / "leader")
        follower = await start(nursery, tmp_path / "follower")
        follower.topics.create(TOPIC, 1)
        key = (TOPIC, 0)
        manager = stand_in_manager(follower, leader, {key: FollowerRole(Follows(LEADER_ID, 0))})
        nursery.start_soon(_fetcher, manager, LEADER_ID, trio.CancelScope())
        # The fetcher is refused: the leader has no such topic.
        refused = f"{TOPIC}-0: OffsetForLeaderEpoch answered"
        await eventually(lambda: any(refused in r.getMessage() for r in caplog.records), refused)
        follower_log = follower.topics.log(*key)
        assert follower_log is not None and follower_log.log_end_offset == 0
        assert manager.following[key].needs_truncation

        # The leader "learns it leads": the topic appears there, with records.
        leader.topics.create(TOPIC, 1)
        leader_log = leader.topics.log(*key)
        assert leader_log is not None
        batch = build_batch([(None, b"%d" % i) for i in range(RECORDS)])
        leader_log.append(batch, now_ms=leader.now_ms())
        # Appended past the produce path: its sync is asked for here, as produce asks
        # it (a node alone's high watermark, which bounds what it serves, is its
        # durable end).
        leader.flusher.mark_dirty(leader_log)
        await eventually(
            lambda: follower_log.log_end_offset >= RECORDS,
            "the follower never asked again",
            CATCH_UP_S,
        )
        assert follower_log.log_end_offset == RECORDS
        assert not manager.following[key].needs_truncation
        nursery.cancel_scope.cancel()


async def test_a_fetcher_with_nothing_to_fetch_waits_for_roles_rather_than_ending(
    tmp_path: Path,
) -> None:
    """run_fetchers starts one fetcher per leader and ends it only when no partition
    follows that leader any more. Roles can leave a leader and come back to it between
    two looks of run_fetchers (the simulation found this: a follower of a new leader,
    which it had just stopped following for another partition, never truncated nor
    fetched again). A fetcher that ended on its own when it had nothing to fetch left
    those partitions unfetched for good; it must wait for the roles to change instead."""
    async with trio.open_nursery() as nursery:
        leader = await start(nursery, tmp_path / "leader")
        follower = await start(nursery, tmp_path / "follower")
        leader.topics.create(TOPIC, 1)
        follower.topics.create(TOPIC, 1)
        leader_log = leader.topics.log(TOPIC, 0)
        assert leader_log is not None
        leader_log.append(
            build_batch([(None, b"%d" % i) for i in range(RECORDS)]), now_ms=leader.now_ms()
        )
        leader.flusher.mark_dirty(leader_log)  # synced, as produce would ask (see above)
        key = (TOPIC, 0)
        manager = stand_in_manager(follower, leader, {})  # nothing follows this leader yet
        nursery.start_soon(_fetcher, manager, LEADER_ID, trio.CancelScope())
        # Until the fetcher has looked at its roles and found none: it waits for a change
        # (or, as before the fix, has ended), and so does every other task.
        await trio.testing.wait_all_tasks_blocked()
        # The partition follows this leader again; run_fetchers, which still counts
        # the fetcher above as running, starts no other.
        manager.following[key] = FollowerRole(Follows(LEADER_ID, 0))
        changed, manager.roles_changed = manager.roles_changed, trio.Event()
        changed.set()
        follower_log = follower.topics.log(*key)
        assert follower_log is not None
        await eventually(
            lambda: follower_log.log_end_offset >= RECORDS, "the fetcher had ended", CATCH_UP_S
        )
        assert follower_log.log_end_offset == RECORDS
        nursery.cancel_scope.cancel()
