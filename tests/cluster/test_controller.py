"""The controller writes partition states from topic assignments and live brokers."""

from __future__ import annotations

import uuid

import pytest
from harness import Clients, cluster

from tests.waits import eventually
from trio_broker.cluster.controller import (
    NotController,
    Rebalance,
    decide,
    imbalanced_moves,
    run_controller,
)
from trio_broker.cluster.coordination import (
    BadVersion,
    MemoryCoordination,
    MemoryZooKeeper,
    _Node,
)
from trio_broker.cluster.zk_layout import (
    CONTROLLER_EPOCH,
    PartitionState,
    TopicAssignment,
    broker_path,
    encode_controller_epoch,
    partition_state_path,
    topic_path,
)
from trio_broker.replication.controller_rules import NO_LEADER, LeaderAndIsr
from trio_broker.services.cluster_view import ClusterView, PartitionInfo

ALL = frozenset({1, 2, 3})


def test_decide_new_lost_and_returning() -> None:
    new = PartitionInfo((2, 3, 1), NO_LEADER, -1, ())
    assert decide(new, ALL) == LeaderAndIsr(2, 0, (2, 3, 1))
    assert decide(new, frozenset({1})) == LeaderAndIsr(1, 0, (1,))
    assert decide(new, frozenset()) is None  # no state until a replica is alive
    settled = PartitionInfo((2, 3, 1), 2, 0, (2, 3, 1))
    assert decide(settled, ALL) is None
    assert decide(settled, frozenset({1, 3})) == LeaderAndIsr(3, 1, (3, 1))
    # Two brokers gone in one round: one epoch step each.
    assert decide(settled, frozenset({1})) == LeaderAndIsr(1, 2, (1,))
    offline = PartitionInfo((3,), NO_LEADER, 4, (3,))
    assert decide(offline, frozenset({1, 2})) is None
    assert decide(offline, ALL) == LeaderAndIsr(3, 5, (3,))


def topic(partitions: dict[int, tuple[int, ...]]) -> bytes:
    return TopicAssignment(uuid.uuid4(), partitions).encode()


def leaders(view: ClusterView, name: str) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    info = view.topics.get(name)
    if info is None:
        return {}
    return {p: (s.leader, s.leader_epoch, s.isr) for p, s in info.partitions.items()}


async def test_states_follow_assignments_and_lost_brokers(clients: Clients) -> None:
    async with cluster(clients, 1, 2, 3) as members, clients.client() as admin:
        view = members[3].view
        await admin.create(topic_path("t"), topic({0: (1, 2, 3), 1: (2, 3, 1), 2: (3,)}))
        await eventually(
            lambda: (
                leaders(view, "t") == {0: (1, 0, (1, 2, 3)), 1: (2, 0, (2, 3, 1)), 2: (3, 0, (3,))}
            ),
            "preferred leaders, full ISRs, epoch 0",
        )
        await members[2].stop()
        await eventually(
            lambda: leaders(view, "t") == {0: (1, 1, (1, 3)), 1: (3, 1, (3, 1)), 2: (3, 0, (3,))},
            "2 left every ISR; partition 1 is led by 3 in epoch 1",
        )


async def test_an_offline_partition_returns_with_its_last_isr_member(clients: Clients) -> None:
    async with cluster(clients, 1, 2, 3) as members, clients.client() as admin:
        view = members[1].view
        await admin.create(topic_path("solo"), topic({0: (3,)}))
        await eventually(lambda: leaders(view, "solo") == {0: (3, 0, (3,))}, "3 leads")
        await members[3].stop()
        await eventually(lambda: leaders(view, "solo") == {0: (NO_LEADER, 1, (3,))}, "offline")
        await members[3].restart()
        await eventually(lambda: leaders(view, "solo") == {0: (3, 2, (3,))}, "3 leads again")


async def test_a_new_controller_takes_over_the_duties(clients: Clients) -> None:
    async with cluster(clients, 1, 2, 3) as members, clients.client() as admin:
        await members[1].stop()  # the first controller
        view = members[2].view
        await eventually(lambda: view.controller_epoch == 2, "a second controller")
        await admin.create(topic_path("late"), topic({0: (1, 2), 1: (2, 3)}))
        await eventually(
            lambda: leaders(view, "late") == {0: (2, 0, (2,)), 1: (2, 0, (2, 3))},
            "the new controller writes the new topic's states",
        )


async def test_a_broker_back_before_the_controller_looked_leads_in_a_new_epoch(
    request: pytest.FixtureRequest,
) -> None:
    """Broker 2 dies and a new process of it registers again before the controller reads
    the broker list (ZooKeeper expired the old session; the new one was waiting for
    that): the list looks unchanged, but the registration is newer than the partition's
    state (Kafka's broker epoch), so the controller gives the new process a new leader
    epoch rather than let it lead on in the old one (controller.restarted_leader)."""
    clients = Clients("memory", request)
    server = clients.memory
    async with cluster(clients, 1, 2, 3) as members, clients.client() as admin:
        view = members[1].view
        await admin.create(topic_path("t"), topic({0: (2, 3, 1)}))
        await eventually(lambda: leaders(view, "t") == {0: (2, 0, (2, 3, 1))}, "2 leads")
        path = broker_path(2)
        old = server.nodes[path]
        assert old.owner is not None
        # In one step, no checkpoint: the old session's ephemerals go (the watches fire)
        # and the new process's registration is there before anyone reads the list.
        server.expire(old.owner)
        server.nodes[path] = _Node(old.data, owner=server.open_session(),
                                   created=server.next_zxid())  # fmt: skip
        await eventually(
            lambda: leaders(view, "t") == {0: (2, 1, (2, 3, 1))},
            "2 leads in epoch 1",
            timeout_s=60,
        )


async def test_a_deposed_controller_cannot_write() -> None:
    server = MemoryZooKeeper()
    coord = MemoryCoordination(server)
    await coord.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
    path = partition_state_path("t", 0)
    await coord.create(path, PartitionState(1, 0, (1, 2), 1).encode())
    await coord.set(CONTROLLER_EPOCH, encode_controller_epoch(2), 0)  # a successor won
    with pytest.raises(BadVersion):
        await coord.set_fenced(
            path, PartitionState(2, 1, (2,), 1).encode(), 0, (CONTROLLER_EPOCH, 0)
        )
    with pytest.raises(NotController):
        await run_controller(coord, ClusterView(1, controller_id=1, controller_epoch=1))


def test_leadership_moves_back_only_past_the_imbalance_percentage() -> None:
    def partitions(led_elsewhere: int) -> dict[tuple[str, int], PartitionInfo]:
        return {
            ("t", p): PartitionInfo((1, 2), 2 if p < led_elsewhere else 1, 3, (1, 2))
            for p in range(10)
        }

    assert imbalanced_moves(partitions(1), ALL, 10) == {}  # 10 %: not more than 10 %
    moves = imbalanced_moves(partitions(2), ALL, 10)
    assert moves == {("t", 0): LeaderAndIsr(1, 4, (1, 2)), ("t", 1): LeaderAndIsr(1, 4, (1, 2))}
    assert imbalanced_moves(partitions(2), frozenset({2}), 10) == {}  # broker 1 is down


async def test_the_controller_moves_leadership_back_to_the_preferred_replica(
    clients: Clients,
) -> None:
    async with (
        cluster(clients, 1, 2, 3, rebalance=Rebalance(interval_s=0.3)) as members,
        clients.client() as admin,
    ):
        view = members[3].view
        await admin.create(topic_path("pref"), topic({0: (2, 3, 1)}))
        await eventually(lambda: leaders(view, "pref") == {0: (2, 0, (2, 3, 1))}, "2 leads")
        await members[2].stop()
        await eventually(lambda: leaders(view, "pref") == {0: (3, 1, (3, 1))}, "3 leads")
        await members[2].restart()
        # Broker 2 catches up and its leader adds it to the ISR (what a follower's fetches
        # would do); the next check moves leadership back to it.
        path = partition_state_path("pref", 0)
        node = await admin.get(path)
        assert node is not None
        await admin.set(path, PartitionState(3, 1, (3, 1, 2), 1).encode(), node.version)
        await eventually(lambda: leaders(view, "pref") == {0: (2, 2, (3, 1, 2))}, "2 leads again")
