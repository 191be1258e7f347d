"""A failed log dir in a cluster, over the in-memory ZooKeeper: the broker's
``publish_offline_replicas`` (cluster/log_dir_events.py) and the controller's rounds
(cluster/controller.py) that read what it wrote.

- ``decide`` given offline replicas (the pure rule is tested in
  tests/unit/replication/test_offline_replica_rules.py);
- the znodes' layout (``OfflineReplicas``, Kafka's ``LogDirEvent``);
- a broker with two log dirs whose first fails: its znode names exactly that dir's
  partitions, a notification is written (and deleted by the controller), the controller
  elects other in-sync replicas, leaves the other dir's partitions alone and keeps a
  partition with no other in-sync replica leaderless; the dir comes back, the znode goes
  and that partition's replica leads again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.cluster.controller import decide, imbalanced_moves, offline_in, run_controller
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.log_dir_events import publish_offline_replicas
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER_EPOCH,
    LOG_DIR_EVENT_PREFIX,
    LOG_DIR_EVENTS,
    BrokerRegistration,
    LogDirEvent,
    OfflineReplicas,
    PartitionState,
    TopicAssignment,
    encode_controller_epoch,
    offline_replicas_path,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import NO_LEADER, LeaderAndIsr
from trio_broker.services.cluster_view import ClusterView, PartitionInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

REPLICAS = (1, 2, 3)
ALL = frozenset(REPLICAS)


def info(leader: int, epoch: int, isr: tuple[int, ...]) -> PartitionInfo:
    return PartitionInfo(leader=leader, leader_epoch=epoch, replicas=REPLICAS, isr=isr)


def test_the_last_in_sync_replica_leads_again_once_its_dir_is_back() -> None:
    assert decide(info(1, 4, (1,)), ALL, offline=frozenset({1})) == LeaderAndIsr(NO_LEADER, 5, (1,))
    assert decide(info(NO_LEADER, 5, (1,)), ALL, offline=frozenset({1})) is None
    assert decide(info(NO_LEADER, 5, (1,)), ALL) == LeaderAndIsr(1, 6, (1,))


def test_decide_combines_a_dead_broker_and_an_offline_replica() -> None:
    """Broker 1 (the leader) died and broker 2's replica is offline: 3 leads alone."""
    target = decide(info(1, 4, (1, 2, 3)), frozenset({2, 3}), offline=frozenset({2}))
    assert target is not None and (target.leader, target.isr) == (3, (3,))
    assert target.leader_epoch > 4


def test_a_new_partition_is_not_led_by_an_offline_replica() -> None:
    target = decide(info(NO_LEADER, -1, ()), ALL, offline=frozenset({1}))
    assert target == LeaderAndIsr(2, 0, (2, 3))


def test_rebalance_does_not_move_leadership_to_an_offline_preferred_replica() -> None:
    """Broker 1 is preferred and (still) in the ISR of a partition led by 2, but its
    replica is offline: no move back to it."""
    partitions = {("t", 0): info(2, 5, (1, 2, 3))}
    assert imbalanced_moves(partitions, ALL, 0, {("t", 0): frozenset({1})}) == {}
    assert imbalanced_moves(partitions, ALL, 0)[("t", 0)].leader == 1


def test_offline_in_names_the_brokers_per_partition() -> None:
    offline = {1: frozenset({("t", 0), ("u", 1)}), 2: frozenset({("t", 0)})}
    assert offline_in(offline, "t", 0) == frozenset({1, 2})
    assert offline_in(offline, "u", 1) == frozenset({1})
    assert offline_in(offline, "u", 0) == frozenset()


brokers = st.sampled_from(REPLICAS)


@st.composite
def states(draw: st.DrawFn) -> LeaderAndIsr:
    isr = tuple(draw(st.lists(brokers, min_size=1, max_size=3, unique=True)))
    leader = draw(st.sampled_from((*isr, NO_LEADER)))
    return LeaderAndIsr(leader, draw(st.integers(0, 10)), isr)


@given(states(), st.frozensets(brokers), st.frozensets(brokers))
def test_deciding_twice_is_deciding_once(
    state: LeaderAndIsr, offline: frozenset[int], live: frozenset[int]
) -> None:
    """The controller's rounds are idempotent with offline replicas too."""
    first = decide(info(state.leader, state.leader_epoch, state.isr), live, offline=offline)
    settled = first or state
    assert decide(info(settled.leader, settled.leader_epoch, settled.isr), live,
                  offline=offline) is None  # fmt: skip


def test_the_znodes_read_back() -> None:
    offline = OfflineReplicas(1, ("/data/a",), frozenset({("t", 0), ("t", 2), ("u", 1)}))
    assert OfflineReplicas.decode(1, offline.encode()) == offline
    assert LogDirEvent.decode(LogDirEvent(3).encode()) == LogDirEvent(3, 1)
    # Kafka's notification layout.
    assert LogDirEvent(3).encode() == b'{"broker":3,"event":1,"version":1}'


async def test_memory_zookeeper_numbers_sequential_znodes() -> None:
    coord = MemoryCoordination(MemoryZooKeeper())
    first = await coord.create_sequential(LOG_DIR_EVENT_PREFIX, b"1")
    second = await coord.create_sequential(LOG_DIR_EVENT_PREFIX, b"2")
    assert (first, second) == (f"{LOG_DIR_EVENT_PREFIX}0000000000",
                               f"{LOG_DIR_EVENT_PREFIX}0000000001")  # fmt: skip
    await coord.delete(second)
    assert await coord.create_sequential(LOG_DIR_EVENT_PREFIX, b"3") == (
        f"{LOG_DIR_EVENT_PREFIX}0000000002"  # never reused
    )


async def _wait_for(
    coord: MemoryCoordination, path: str, ok: Callable[[bytes | None], bool]
) -> None:
    """Until the znode at ``path`` (its data, None: absent) satisfies ``ok``."""
    with trio.fail_after(60):
        while True:
            node, changed = await coord.get_and_watch(path)
            if ok(None if node is None else node.data):
                return
            await changed.wait()


def _state(raw: bytes | None) -> LeaderAndIsr | None:
    return None if raw is None else PartitionState.decode(raw).leader_and_isr


async def test_a_failed_dir_moves_leadership_off_its_replicas(tmp_path: Path) -> None:
    server = MemoryZooKeeper()
    admin = MemoryCoordination(server)
    sessions = {b: MemoryCoordination(server) for b in REPLICAS}
    await admin.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
    for broker, session in sessions.items():
        registration = BrokerRegistration(broker, "127.0.0.1", 19000 + broker).encode()
        await session.create(f"{BROKER_IDS}/{broker}", registration, ephemeral=True)
    # Broker 1's copies: partitions 0 and 2 in dir a, 1 in dir b (the fewest first).
    assignment = {0: (1, 2, 3), 1: (2, 3, 1), 2: (1,)}
    await admin.create(topic_path("t"), TopicAssignment(uuid.uuid4(), assignment).encode())
    topics = TopicManager(tmp_path / "a", LogConfig(), lambda: 0, log_dirs=[tmp_path / "b"])
    topics.create("t", 3)
    dir_a = topics.log("t", 0).dir_state  # type: ignore[union-attr]
    assert topics.log("t", 2).dir_state is dir_a  # type: ignore[union-attr]
    assert topics.log("t", 1).dir_state is not dir_a  # type: ignore[union-attr]
    paths = {p: partition_state_path("t", p) for p in assignment}
    view = ClusterView(0, controller_id=0, controller_epoch=1)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_controller, admin, view)
            nursery.start_soon(publish_offline_replicas, sessions[1], 1, topics)
            for path in paths.values():
                await _wait_for(admin, path, lambda raw: raw is not None)
            assert _state((await admin.get(paths[1])).data) == LeaderAndIsr(2, 0, (2, 3, 1))  # type: ignore[union-attr]

            dir_a.fail("EIO in a test")
            await _wait_for(admin, paths[0], lambda raw: _state(raw) == LeaderAndIsr(2, 1, (2, 3)))
            await _wait_for(
                admin, paths[2], lambda raw: _state(raw) == LeaderAndIsr(NO_LEADER, 1, (1,))
            )
            node = await admin.get(offline_replicas_path(1))
            assert node is not None
            assert OfflineReplicas.decode(1, node.data) == OfflineReplicas(
                1, (str(tmp_path / "a"),), frozenset({("t", 0), ("t", 2)})
            )
            # The notification was written, and the controller deleted it.
            with trio.fail_after(60):
                while True:
                    names, changed = await admin.children_and_watch(LOG_DIR_EVENTS)
                    if not names and server.sequences.get(LOG_DIR_EVENTS):
                        break
                    await changed.wait()
            # The other dir's partition is untouched.
            assert _state((await admin.get(paths[1])).data) == LeaderAndIsr(2, 0, (2, 3, 1))  # type: ignore[union-attr]

            dir_a.restore()  # the probe brought the whole dir back
            await _wait_for(admin, offline_replicas_path(1), lambda raw: raw is None)
            await _wait_for(admin, paths[2], lambda raw: _state(raw) == LeaderAndIsr(1, 2, (1,)))
            # Broker 1 rejoins partition 0's ISR by the leader's rule, not the controller's.
            assert _state((await admin.get(paths[0])).data) == LeaderAndIsr(2, 1, (2, 3))  # type: ignore[union-attr]
            nursery.cancel_scope.cancel()
    finally:
        topics.close()
