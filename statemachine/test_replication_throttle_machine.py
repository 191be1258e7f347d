"""Replication throttles (KIP-73) of a real replica manager against a plain model.

The replica manager answers its data path (``leader_throttle_budget``: may this leader
serve a follower's fetch of a partition at full speed, or at most how many bytes) and its
fetchers (``follower_throttled``) through ``cluster/replication_throttles.py`` and the
pure rules of ``replication/throttle.py``. No other model configures a throttle: the
replication machine and the simulator never set the lists or the rates. This machine sets
them as an operator does at runtime (the topic's lists by AlterConfigs, the rates as
dynamic broker configs at this broker's level and the cluster default, over a static
rate), moves the ISR (the view's, and the leader term's, which is ahead of it), starts
and ends reassignments, lets time pass and spends the leader's budget, and states the
rules directly:

1. nothing is throttled while the rate in force (this broker's dynamic rate, else the
   cluster default, else the static one) is unlimited (Long.MAX_VALUE);
2. a replica in the ISR is never throttled, on either side (Kafka's
   ``ReplicaManager.shouldLeaderThrottle`` checks ``isReplicaInSync`` first; a
   follower's own throttle skips a partition it is in sync for); the leader's ISR is
   its term's when it leads, the view's otherwise;
3. a topic that sets either list is throttled exactly as the lists say: the leader list
   names the *leading* broker (``partition:leader``), the follower list the *fetching*
   one; ``*`` names every replica; an unset list in a topic that sets the other names
   nobody;
4. a topic that sets neither keeps this broker's own rule: a replica a reassignment adds
   is throttled on both sides, and the leader also throttles a fetcher its view does
   not list as a replica;
5. the leader's budget: ``rate`` bytes a second for every throttled fetch together,
   full when a rate comes into force, refilled with time, never above one second's
   worth, spent by what throttled fetches read (it may go below zero once).
"""

from __future__ import annotations

import uuid

import attrs
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.replication.leader import LeaderPartition
from trio_broker.replication.throttle import UNLIMITED_RATE
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo
from trio_broker.services.topics import TopicManager
from trio_broker.storage.broker_configs import CLUSTER_DEFAULT, THIS_BROKER
from trio_broker.storage.log import LogConfig
from trio_broker.storage.throttled_replicas import (
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_REPLICAS,
)

ME = 1
BROKERS = (1, 2, 3, 4, 5)  # 5 is never a replica: a fetcher the view does not list
PARTITIONS = (0, 1)
TOPIC = "t"
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
#: The rates drawn: small enough that a fetch or two spends a second's worth, and
#: Long.MAX_VALUE (unlimited) as a value set explicitly.
RATES = (0, 1000, 5000, UNLIMITED_RATE)

PAIRS = [(p, b) for p in PARTITIONS for b in BROKERS[:4]]
#: A list's value: unset (None), empty, every replica, pairs naming this broker (the
#: leader list then throttles what it serves), or any pairs.
LISTS = st.one_of(
    st.sampled_from((None, "", "*", " * ", "0:1", "1:1", "0:1,1:2", " 1:1 , 0:3")),
    st.lists(st.sampled_from(PAIRS), min_size=1, max_size=4, unique=True).map(
        lambda pairs: ",".join(f"{p}:{b}" for p, b in pairs)
    ),
)


@attrs.define
class ModelBudget:
    """Rule 5: a token bucket of ``rate`` bytes, at most one second's worth."""

    rate: int
    tokens: float
    at_ms: int

    def refill(self, now_ms: int) -> None:
        if now_ms > self.at_ms:
            self.tokens += (now_ms - self.at_ms) * self.rate / 1000
        self.tokens = min(self.tokens, float(self.rate))
        self.at_ms = max(self.at_ms, now_ms)


def _names(value: str | None, partition: int, broker: int) -> bool:
    if value is None:
        return False
    elements = [element.strip() for element in value.split(",")]
    if "".join(elements) == "*":
        return True
    return f"{partition}:{broker}" in elements


class ReplicationThrottleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 0
        self.topics = TopicManager(None, LogConfig(), lambda: self.now_ms)
        self.manager: ReplicaManager | None = None
        self.static: dict[str, int] = {}
        self.dynamic: dict[str, dict[str, str]] = {THIS_BROKER: {}, CLUSTER_DEFAULT: {}}
        self.lists: dict[str, str | None] = {
            LEADER_THROTTLED_REPLICAS: None,
            FOLLOWER_THROTTLED_REPLICAS: None,
        }
        self.infos: dict[int, PartitionInfo] = {}
        #: The model's leader budget and the rate it was made for (None: unlimited).
        self.budget: ModelBudget | None = None

    @initialize(
        leader_rate=st.sampled_from(RATES),
        follower_rate=st.sampled_from(RATES),
        leads=st.lists(st.booleans(), min_size=2, max_size=2),
    )
    def start(self, leader_rate: int, follower_rate: int, leads: list[bool]) -> None:
        self.static = {LEADER_RATE: leader_rate, FOLLOWER_RATE: follower_rate}
        self.manager = ReplicaManager(
            ClusterView(ME), MemoryCoordination(MemoryZooKeeper()), self.topics,
            min_insync_replicas=1, replica_lag_time_max_ms=1000, now_ms=lambda: self.now_ms,
            durability=None,  # type: ignore[arg-type]  # nothing here waits for a sync
            leader_throttle_rate=leader_rate,
            follower_throttle_rate=follower_rate,
        )  # fmt: skip
        topic = self.topics.create(TOPIC, len(PARTITIONS))
        for partition, leads_it in zip(PARTITIONS, leads, strict=True):
            leader = ME if leads_it else 2
            self.infos[partition] = PartitionInfo((ME, 2, 3), leader, 1, (ME, 2, 3))
        self.manager.view.topics[TOPIC] = TopicInfo(
            TOPIC, topic.topic_id or uuid.uuid4(), self.infos
        )
        for partition in PARTITIONS:
            self._new_term(partition)
        note(f"static rates {self.static}, leaders {[i.leader for i in self.infos.values()]}")

    # ------------------------------------------------------------------ the model

    def _rate(self, key: str) -> int:
        """Rule 1: the rate in force."""
        for level in (THIS_BROKER, CLUSTER_DEFAULT):
            if key in self.dynamic[level]:
                return int(self.dynamic[level][key])
        return self.static[key]

    def _lists_set(self) -> bool:
        return any(value is not None for value in self.lists.values())

    def _model_isr(self, partition: int) -> frozenset[int]:
        assert self.manager is not None
        term = self.manager.terms.get((TOPIC, partition))
        if term is not None:
            return term.isr
        return frozenset(self.infos[partition].isr)

    def _leader_throttles(self, partition: int, replica: int) -> bool:
        info = self.infos[partition]
        if replica in self._model_isr(partition):
            return False  # rule 2
        if self._lists_set():  # rule 3
            return _names(self.lists[LEADER_THROTTLED_REPLICAS], partition, ME)
        return replica in info.adding_replicas or replica not in info.replicas  # rule 4

    def _follower_throttles(self, partition: int) -> bool:
        info = self.infos[partition]
        if self._rate(FOLLOWER_RATE) >= UNLIMITED_RATE:
            return False  # rule 1
        if ME in info.isr:
            return False  # rule 2 (a follower knows the ISR from its view)
        if self._lists_set():
            return _names(self.lists[FOLLOWER_THROTTLED_REPLICAS], partition, ME)
        return ME in info.adding_replicas

    def _model_budget(self) -> ModelBudget | None:
        """Rule 5: a rate coming into force (or changing) starts a full budget."""
        rate = self._rate(LEADER_RATE)
        if rate >= UNLIMITED_RATE:
            self.budget = None
        elif self.budget is None or self.budget.rate != max(1, rate):
            self.budget = ModelBudget(max(1, rate), float(max(1, rate)), self.now_ms)
        return self.budget

    # ------------------------------------------------------------------ the operator

    def _publish(self, partition: int, info: PartitionInfo) -> None:
        self.infos[partition] = info
        note(f"partition {partition}: {info}")

    def _new_term(self, partition: int) -> None:
        """This broker leads ``partition`` in the view: a term with the view's ISR."""
        assert self.manager is not None
        info = self.infos[partition]
        if info.leader != ME:
            self.manager.terms.pop((TOPIC, partition), None)
            return
        self.manager.terms[(TOPIC, partition)] = LeaderPartition.become_leader(
            ME, info.leader_epoch, info.replicas, frozenset(info.isr) | {ME}, 0, 0,
            self.now_ms,
        )  # fmt: skip

    @rule(key=st.sampled_from((LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS)),
          value=LISTS)  # fmt: skip
    def set_list(self, key: str, value: str | None) -> None:
        self.lists[key] = value
        configs = {k: v for k, v in self.lists.items() if v is not None}
        self.topics.set_configs(TOPIC, configs)
        note(f"topic configs {configs}")

    @rule(
        level=st.sampled_from((THIS_BROKER, CLUSTER_DEFAULT)),
        key=st.sampled_from((LEADER_RATE, FOLLOWER_RATE)),
        rate=st.sampled_from((None, *RATES)),
    )
    def set_rate(self, level: str, key: str, rate: int | None) -> None:
        configs = dict(self.dynamic[level])
        if rate is None:
            configs.pop(key, None)
        else:
            configs[key] = str(rate)
        self.topics.set_broker_configs(level, configs)
        self.dynamic[level] = configs
        note(f"dynamic {level or 'this broker'}: {configs}")

    @rule(partition=st.sampled_from(PARTITIONS), isr=st.sets(st.sampled_from(BROKERS[:4])))
    def isr_changes(self, partition: int, isr: set[int]) -> None:
        """The view's ISR moves (the leader stays in it; the term keeps its own ISR)."""
        info = self.infos[partition]
        members = {b for b in isr if b in info.replicas} | {info.leader}
        self._publish(partition, attrs.evolve(info, isr=tuple(sorted(members))))

    @rule(partition=st.sampled_from(PARTITIONS), drop=st.sampled_from((2, 3, 4)))
    def term_shrinks_its_isr(self, partition: int, drop: int) -> None:
        """The leader's term drops a follower ahead of the view (its proposal is out)."""
        assert self.manager is not None
        term = self.manager.terms.get((TOPIC, partition))
        if term is not None and drop in term.isr:
            term.isr = term.isr - {drop}
            note(f"term of {partition}: ISR {sorted(term.isr)}")

    @rule(partition=st.sampled_from(PARTITIONS), leader=st.sampled_from((ME, 2)))
    def leader_changes(self, partition: int, leader: int) -> None:
        info = self.infos[partition]
        isr = tuple(sorted(set(info.isr) | {leader}))
        self._publish(
            partition, attrs.evolve(info, leader=leader, leader_epoch=info.leader_epoch + 1,
                                    isr=isr),
        )  # fmt: skip
        self._new_term(partition)

    @rule(
        partition=st.sampled_from(PARTITIONS),
        adding=st.sets(st.sampled_from((ME, 4)), min_size=1),
    )
    def reassignment_starts(self, partition: int, adding: set[int]) -> None:
        info = self.infos[partition]
        if info.adding_replicas:
            return
        joining = tuple(sorted(adding - set(info.replicas))) or tuple(sorted(adding))
        replicas = tuple(dict.fromkeys((*info.replicas, *joining)))
        isr = tuple(b for b in info.isr if b not in joining)
        if info.leader in joining or not isr:
            return  # the leader stays in sync through a move
        self._publish(
            partition, attrs.evolve(info, replicas=replicas, isr=isr, adding_replicas=joining)
        )

    @rule(partition=st.sampled_from(PARTITIONS))
    def reassignment_ends(self, partition: int) -> None:
        info = self.infos[partition]
        if info.adding_replicas:
            isr = tuple(sorted(set(info.isr) | set(info.adding_replicas)))
            self._publish(partition, attrs.evolve(info, isr=isr, adding_replicas=()))

    @rule(ms=st.sampled_from((1, 10, 100, 400, 1000, 2500)))
    def time_passes(self, ms: int) -> None:
        self.now_ms += ms

    # ------------------------------------------------------------------ the data path

    @rule(
        partition=st.sampled_from(PARTITIONS),
        replica=st.sampled_from(BROKERS[1:]),
        read=st.sampled_from((0, 1, 300, 900, 4000)),
    )
    def follower_fetches(self, partition: int, replica: int, read: int) -> None:
        """A follower's fetch reaches the leader: it reads all it may (a whole batch at
        least when the budget allows nothing; ``read`` bytes are there to read)."""
        assert self.manager is not None
        got = self.manager.leader_throttle_budget(TOPIC, partition, replica)
        budget = self._model_budget()  # the rate in force is read first, throttled or not
        throttled = budget is not None and self._leader_throttles(partition, replica)
        note(f"{replica} fetches {partition} at {self.now_ms}: budget {got}")
        if not throttled:
            assert got is None, (
                f"broker {replica}'s fetch of {partition} throttled to {got} bytes"
                f" (ISR {sorted(self._model_isr(partition))}, lists {self.lists},"
                f" {self.infos[partition]})"
            )
            return
        assert budget is not None
        budget.refill(self.now_ms)
        expected = max(0, int(budget.tokens))
        assert got == expected, (
            f"broker {replica}'s fetch of {partition}: budget {got}, the model says"
            f" {expected} ({self.lists}, rate {budget.rate})"
        )
        taken = min(read, expected) if expected else min(read, 300)  # one batch over
        self.manager.leader_throttle_used(taken)
        budget.tokens -= taken

    @rule(partition=st.sampled_from(PARTITIONS), data=st.data())
    def in_sync_follower_fetches(self, partition: int, data: st.DataObject) -> None:
        """Rule 2's case: a follower the leader's ISR holds fetches (a fetch of any
        replica is drawn above, and the ISR is often all of them, but a list naming
        the leader with a rate in force is a few steps away)."""
        members = sorted(self._model_isr(partition) - {ME})
        if members:
            replica = data.draw(st.sampled_from(members), label="replica")
            self.follower_fetches(partition, replica, 300)

    @invariant()
    def the_follower_side_follows_the_rules(self) -> None:
        if self.manager is None:
            return
        for partition in PARTITIONS:
            got = self.manager.follower_throttled(TOPIC, partition)
            expected = self._follower_throttles(partition)
            assert got == expected, (
                f"this broker {'throttles' if got else 'does not throttle'} its fetching"
                f" of {partition} ({self.infos[partition]}, lists {self.lists},"
                f" rate {self._rate(FOLLOWER_RATE)})"
            )


TestReplicationThrottleMachine = ReplicationThrottleMachine.TestCase
TestReplicationThrottleMachine.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
