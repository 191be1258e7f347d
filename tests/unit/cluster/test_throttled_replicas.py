"""KIP-73 replication throttles: the topic configs ``leader.replication.throttled.replicas``
and ``follower.replication.throttled.replicas`` (storage/throttled_replicas.py), who is
throttled (replication/throttle.py), and the rates as dynamic broker configs
(storage/broker_configs.py) that the replica manager applies without a restart."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.handlers.incremental_alter_configs import APPEND, SUBTRACT, apply_operations
from trio_broker.protocol import messages as m
from trio_broker.replication.throttle import follower_throttles, leader_throttles
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import TopicError, TopicManager
from trio_broker.storage.broker_configs import (
    CLUSTER_DEFAULT,
    THIS_BROKER,
    BrokerConfigStore,
    check_broker_configs,
)
from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.log import LogConfig
from trio_broker.storage.throttled_replicas import (
    FOLLOWER_THROTTLED_REPLICAS as FOLLOWER_LIST,
)
from trio_broker.storage.throttled_replicas import (
    LEADER_THROTTLED_REPLICAS as LEADER_LIST,
)
from trio_broker.storage.throttled_replicas import (
    ThrottledReplicas,
    parse_throttled_replicas,
)
from trio_broker.storage.topic_configs import TOPIC_CONFIGS, check_topic_configs

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"

# ---------------------------------------------------------------------- the lists


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0:1,0:2,1:3", ThrottledReplicas(replicas=frozenset({(0, 1), (0, 2), (1, 3)}))),
        (" 0:1 , 12:345 ", ThrottledReplicas(replicas=frozenset({(0, 1), (12, 345)}))),
        ("", ThrottledReplicas()),
        ("0:1,,2:3", ThrottledReplicas(replicas=frozenset({(0, 1), (2, 3)}))),
        ("*", ThrottledReplicas(everything=True)),
        (" * ", ThrottledReplicas(everything=True)),
    ],
)
def test_lists_kafka_accepts(value: str, expected: ThrottledReplicas) -> None:
    assert parse_throttled_replicas(LEADER_LIST, value) == expected
    check_topic_configs({LEADER_LIST: value, FOLLOWER_LIST: value})


@pytest.mark.parametrize(
    "value", ["0", "a:1", "0:b", "0:-1", "-1:0", "0:1:2", "0:1,*", "*,*", "**", "0 :1", "1:0;2:0",
              "0:2147483648"],
)  # fmt: skip
def test_anything_else_is_an_invalid_config(value: str) -> None:
    for key in (LEADER_LIST, FOLLOWER_LIST):
        with pytest.raises(InvalidConfigError, match=key) as refused:
            check_topic_configs({key: value})
        assert refused.value.error_code == 40  # INVALID_CONFIG


def test_the_lists_are_topic_configs_of_list_type() -> None:
    for key in (LEADER_LIST, FOLLOWER_LIST):
        assert TOPIC_CONFIGS[key].type == 7  # LIST, as DescribeConfigs v3+ reports it
        assert TOPIC_CONFIGS[key].fixed_default == ""


@given(st.sets(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)), max_size=8))
def test_a_written_list_reads_back(pairs: set[tuple[int, int]]) -> None:
    value = ",".join(f"{p}:{b}" for p, b in sorted(pairs))
    parsed = parse_throttled_replicas(FOLLOWER_LIST, value)
    assert parsed.replicas == pairs and not parsed.everything
    for p, b in pairs:
        assert parsed.names(p, b)
    assert not parsed.names(-1, 0)


def test_incremental_append_and_subtract_work_on_the_lists() -> None:
    Resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    Op = Resource.AlterableConfig

    def change(op: int, value: str) -> Resource:
        return Resource(resource_type=2, resource_name="t",
                        configs=[Op(name=LEADER_LIST, config_operation=op, value=value)])  # fmt: skip

    configs = apply_operations({}, change(APPEND, "0:1,0:2"))
    assert configs == {LEADER_LIST: "0:1,0:2"}
    configs = apply_operations(configs, change(APPEND, "0:2,1:3"))
    assert configs == {LEADER_LIST: "0:1,0:2,1:3"}
    assert apply_operations(configs, change(SUBTRACT, "0:1")) == {LEADER_LIST: "0:2,1:3"}


# ---------------------------------------------------------------------- who is throttled

# Partition 0 moves from brokers {1, 2} to {2, 3}, led by broker 1; broker 3 is joining.
ADDING, ISR = (3,), (1, 2)
# The leader's view of the replicas during that move: the union, target replicas first.
REPLICAS = (2, 3, 1)
# What Kafka's reassignment tool sets for that move: the existing replicas on the leader
# side, the joining one on the follower side.
TOOL = {LEADER_LIST: "0:1,0:2", FOLLOWER_LIST: "0:3"}


def test_without_lists_the_replicas_a_move_adds_are_throttled_on_both_sides() -> None:
    assert leader_throttles({}, 0, 1, 3, ADDING, ISR, REPLICAS)
    assert not leader_throttles({}, 0, 1, 2, ADDING, ISR, REPLICAS)
    assert follower_throttles({}, 0, 3, ADDING, ISR)
    assert not follower_throttles({}, 0, 2, ADDING, ISR)


def test_without_lists_a_joiner_in_sync_is_no_longer_throttled() -> None:
    # Broker 3 caught up and joined the ISR; the move ends at the controller's next pass.
    # Until then it is still listed as adding, but in sync it is never throttled, on
    # either side (Kafka checks the ISR before any list). Found by
    # statemachine/test_replication_throttle_machine.py: both were throttled.
    assert not leader_throttles({}, 0, 1, 3, ADDING, (1, 2, 3), REPLICAS)
    assert not follower_throttles({}, 0, 3, ADDING, (1, 2, 3))


def test_without_lists_the_leader_throttles_a_fetcher_its_view_does_not_list_yet() -> None:
    # Broker 3 heard of the move from its own watch and fetches before the leader's view
    # has it: no adding replicas, replicas {1, 2}. Served free, it would copy the whole
    # log before the throttle applied (a race seen in CI); the leader throttles it.
    assert leader_throttles({}, 0, 1, 3, (), ISR, (1, 2))
    assert not leader_throttles({}, 0, 1, 2, (), ISR, (1, 2))
    # With the lists set, they decide, as in Kafka: broker 1 listed, 3 out of sync.
    assert leader_throttles(TOOL, 0, 1, 3, (), ISR, (1, 2))


def test_the_leader_list_names_the_leading_broker_and_spares_the_isr() -> None:
    # Broker 1 leads and is listed: it throttles what it serves to the joining replica,
    # but never to an in-sync one (broker 2), as Kafka's leader quota.
    assert leader_throttles(TOOL, 0, 1, 3, ADDING, ISR, REPLICAS)
    assert not leader_throttles(TOOL, 0, 1, 2, ADDING, ISR, REPLICAS)
    # Listed pairs name the leader, not the fetcher: 0:3 on the leader list alone does
    # not slow broker 1 serving broker 3.
    assert not leader_throttles({LEADER_LIST: "0:3"}, 0, 1, 3, ADDING, ISR, REPLICAS)
    # Another partition, or the list set empty: nothing (a move no longer throttled).
    assert not leader_throttles(TOOL, 1, 1, 3, ADDING, ISR, REPLICAS)
    assert not leader_throttles({LEADER_LIST: ""}, 0, 1, 3, ADDING, ISR, REPLICAS)
    # Not a move at all: a listed leader throttles any out-of-sync follower.
    assert leader_throttles({LEADER_LIST: "*"}, 0, 1, 2, (), (1,), REPLICAS)
    assert not leader_throttles({LEADER_LIST: "*"}, 0, 1, 2, (), (1, 2), REPLICAS)


def test_the_follower_list_names_the_fetching_broker() -> None:
    assert follower_throttles(TOOL, 0, 3, ADDING, ISR)
    assert not follower_throttles(TOOL, 0, 2, ADDING, ISR)  # in sync, and not listed
    assert follower_throttles({FOLLOWER_LIST: "*"}, 0, 2, (), (1,))  # out of sync
    assert not follower_throttles({FOLLOWER_LIST: "*"}, 0, 2, (), (1, 2))  # in sync
    # One list set: the other side throttles nothing (the lists decide, not the move).
    assert not leader_throttles({FOLLOWER_LIST: "0:3"}, 0, 1, 3, ADDING, ISR, REPLICAS)
    assert not follower_throttles({LEADER_LIST: "0:1,0:2"}, 0, 3, ADDING, ISR)


# ---------------------------------------------------------------------- the rates


def test_the_rates_are_dynamic_broker_configs(tmp_path: Path) -> None:
    store = BrokerConfigStore(tmp_path)
    assert store.throttle_rate(LEADER_RATE, 123) == 123
    store.set(CLUSTER_DEFAULT, {LEADER_RATE: "1000", FOLLOWER_RATE: "2000"})
    store.set(THIS_BROKER, {LEADER_RATE: "500", "log.retention.ms": "60000"})
    assert store.throttle_rate(LEADER_RATE, 123) == 500  # this broker's over the default
    assert store.throttle_rate(FOLLOWER_RATE, 123) == 2000
    assert store.effective() == {"retention.ms": "60000"}  # no log default among them
    again = BrokerConfigStore(tmp_path)  # persisted as the other dynamic configs
    assert again.throttle_rate(LEADER_RATE, 123) == 500
    again.set(THIS_BROKER, {})  # DELETE: back to the default level, then the static value
    again.set(CLUSTER_DEFAULT, {FOLLOWER_RATE: "2000"})
    assert again.throttle_rate(LEADER_RATE, 123) == 123


@pytest.mark.parametrize("value", ["-1", "fast", "1.5", str(2**63)])
def test_a_bad_rate_is_refused(value: str) -> None:
    with pytest.raises(InvalidConfigError, match=LEADER_RATE):
        check_broker_configs({LEADER_RATE: value})
    check_broker_configs({LEADER_RATE: "0", FOLLOWER_RATE: str(2**63 - 1)})


# ---------------------------------------------------------------------- the replica manager


def _manager(me: int, info: PartitionInfo, **rates: int) -> ReplicaManager:
    topics = TopicManager(None, LogConfig(), lambda: 0)
    manager = ReplicaManager(
        ClusterView(me), MemoryCoordination(MemoryZooKeeper()), topics,
        min_insync_replicas=1, replica_lag_time_max_ms=1000, now_ms=lambda: 0,
        durability=None, **rates,
    )  # fmt: skip
    topic = topics.create("t", 1)
    manager.view.topics["t"] = TopicInfo("t", topic.topic_id or uuid.uuid4(), {0: info})
    return manager


MOVING = PartitionInfo((2, 3, 1), 1, 5, (1, 2), adding_replicas=(3,), removing_replicas=(1,))


async def test_the_leader_applies_a_rate_and_lists_set_at_runtime() -> None:
    manager = _manager(1, MOVING)  # no static rate
    assert manager.leader_throttle_budget("t", 0, 3) is None
    manager.topics.set_broker_configs(THIS_BROKER, {LEADER_RATE: "200000"})
    assert manager.leader_throttle_budget("t", 0, 3) == 200_000  # a second's worth
    manager.leader_throttle_used(150_000)
    assert manager.leader_throttle_budget("t", 0, 3) == 50_000
    assert manager.leader_throttle_budget("t", 0, 2) is None  # in sync, never throttled
    manager.topics.set_configs("t", {LEADER_LIST: "0:2", FOLLOWER_LIST: "0:3"})
    assert manager.leader_throttle_budget("t", 0, 3) is None  # broker 1 is not listed
    manager.topics.set_configs("t", {LEADER_LIST: "0:1,0:2", FOLLOWER_LIST: "0:3"})
    assert manager.leader_throttle_budget("t", 0, 3) == 50_000
    manager.topics.set_broker_configs(THIS_BROKER, {LEADER_RATE: "1000"})  # a new budget
    assert manager.leader_throttle_budget("t", 0, 3) == 1000
    manager.topics.set_broker_configs(THIS_BROKER, {})  # DELETE: the static value, none
    assert manager.leader_throttle_budget("t", 0, 3) is None


async def test_a_static_rate_stays_until_a_dynamic_one_overrides_it() -> None:
    manager = _manager(1, MOVING, leader_throttle_rate=5000)
    assert manager.leader_throttle_budget("t", 0, 3) == 5000
    manager.topics.set_broker_configs(CLUSTER_DEFAULT, {LEADER_RATE: "9223372036854775807"})
    assert manager.leader_throttle_budget("t", 0, 3) is None  # unlimited, cluster-wide
    manager.topics.set_broker_configs(CLUSTER_DEFAULT, {})
    assert manager.leader_throttle_budget("t", 0, 3) == 5000


async def test_the_follower_applies_a_rate_and_lists_set_at_runtime() -> None:
    manager = _manager(3, MOVING)
    assert not manager.follower_throttled("t", 0)  # no rate: nothing to throttle
    manager.topics.set_broker_configs(CLUSTER_DEFAULT, {FOLLOWER_RATE: "200000"})
    assert manager.follower_throttled("t", 0)  # being added, no lists: throttled
    assert manager.follower_throttle_rate == 200_000
    manager.topics.set_configs("t", {FOLLOWER_LIST: ""})
    assert not manager.follower_throttled("t", 0)  # the lists say: nobody
    manager.topics.set_configs("t", {FOLLOWER_LIST: "*"})
    assert manager.follower_throttled("t", 0)
    with pytest.raises(TopicError):
        manager.topics.set_configs("t", {FOLLOWER_LIST: "0:x"})
    # A rate of 0, as Kafka allows: at most one byte a second (never stuck for good).
    manager.topics.set_broker_configs(THIS_BROKER, {FOLLOWER_RATE: "0"})
    assert manager.follower_throttle_rate == 1
