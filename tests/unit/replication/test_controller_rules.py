"""The controller's pure decisions: replica placement and leader election."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.replication.controller_rules import (
    NO_LEADER,
    InvalidReplicationFactor,
    LeaderAndIsr,
    after_broker_loss,
    after_broker_return,
    assign_replicas,
    elect_leader,
    preferred_leader_move,
)

clusters = st.dictionaries(
    st.integers(0, 50), st.one_of(st.none(), st.sampled_from("abc")), min_size=1, max_size=7
)


@given(clusters, st.integers(1, 40), st.data())
def test_every_partition_gets_distinct_live_replicas_and_leaders_spread(
    brokers: dict[int, str | None], partitions: int, data: st.DataObject
) -> None:
    rf = data.draw(st.integers(1, len(brokers)), label="replication factor")
    start = data.draw(st.integers(0, 100), label="start index")
    assignment = assign_replicas(partitions, rf, brokers, start_index=start)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == rf == len(set(replicas))
        assert set(replicas) <= set(brokers)
    leaders = Counter(replicas[0] for replicas in assignment)
    # Preferred leaders round-robin over the brokers: counts differ by at most one.
    counts = [leaders.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= 1


@given(clusters, st.integers(1, 20), st.data())
def test_replicas_span_as_many_racks_as_they_can(
    brokers: dict[int, str | None], partitions: int, data: st.DataObject
) -> None:
    if not all(brokers.values()):
        brokers = {b: rack or "a" for b, rack in brokers.items()}
    rf = data.draw(st.integers(1, len(brokers)), label="replication factor")
    racks = Counter(brokers.values())
    for replicas in assign_replicas(partitions, rf, brokers):
        spanned = {brokers[b] for b in replicas}
        # Every partition covers min(rf, #racks) racks, in every round of the follower
        # shift and whether the racks are even or not (Kafka's rack-aware rule).
        assert len(spanned) == min(rf, len(racks)), replicas


def test_too_few_brokers_is_invalid_replication_factor() -> None:
    with pytest.raises(InvalidReplicationFactor, match="larger than the 2 available"):
        assign_replicas(3, 3, {1: None, 2: None})
    with pytest.raises(InvalidReplicationFactor):
        assign_replicas(3, 0, {1: None})


def test_followers_of_consecutive_rounds_are_shifted() -> None:
    assignment = assign_replicas(6, 2, {1: None, 2: None, 3: None})
    assert assignment[:3] == [[1, 2], [2, 3], [3, 1]]
    assert assignment[3:] == [[1, 3], [2, 1], [3, 2]]  # a different follower per leader


def test_leader_is_the_first_live_in_sync_replica_and_unclean_only_when_allowed() -> None:
    assert elect_leader([3, 1, 2], [1, 2], frozenset({1, 2, 3})) == 1
    assert elect_leader([3, 1, 2], [1], frozenset({2, 3})) == NO_LEADER
    assert elect_leader([3, 1, 2], [1], frozenset({2, 3}), unclean=True) == 3


def test_losing_the_leader_elects_from_the_isr_with_a_new_epoch() -> None:
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    after = after_broker_loss(state, [1, 2, 3], 1, frozenset({2, 3}))
    assert after == LeaderAndIsr(2, 5, (2, 3))
    # A follower lost: it leaves the ISR, the leader stays, the epoch still moves.
    assert after_broker_loss(state, [1, 2, 3], 3, frozenset({1, 2})) == LeaderAndIsr(1, 5, (1, 2))
    # Not a replica in the ISR and not the leader: nothing to do.
    assert after_broker_loss(LeaderAndIsr(1, 4, (1, 2)), [1, 2, 3], 3, frozenset({1, 2})) is None


def test_the_last_isr_member_stays_and_leads_again_when_it_returns() -> None:
    state = LeaderAndIsr(1, 7, (1,))
    offline = after_broker_loss(state, [1, 2, 3], 1, frozenset({2, 3}))
    assert offline == LeaderAndIsr(NO_LEADER, 8, (1,))
    assert after_broker_return(offline, [1, 2, 3], 1, frozenset({2, 3})) == LeaderAndIsr(1, 9, (1,))
    assert after_broker_return(offline, [1, 2, 3], 2, frozenset({2, 3})) is None
    unclean = after_broker_loss(state, [1, 2, 3], 1, frozenset({2, 3}), unclean=True)
    assert unclean == LeaderAndIsr(2, 8, (2,))  # data the ISR had may be lost: opt-in only


def test_preferred_leader_returns_when_alive_and_in_sync() -> None:
    state = LeaderAndIsr(2, 5, (2, 3))
    assert preferred_leader_move(state, [1, 2, 3], frozenset({1, 2, 3})) is None  # 1 not in ISR
    state = LeaderAndIsr(2, 5, (2, 3, 1))
    assert preferred_leader_move(state, [1, 2, 3], frozenset({1, 2, 3})) == LeaderAndIsr(
        1, 6, (2, 3, 1)
    )
    assert preferred_leader_move(state, [1, 2, 3], frozenset({2, 3})) is None  # 1 is down


def test_losing_a_broker_again_changes_nothing() -> None:
    offline = LeaderAndIsr(NO_LEADER, 8, (1,))
    assert after_broker_loss(offline, [1, 2, 3], 1, frozenset({2, 3})) is None


# Edges found by mutation testing (issue 31).


def test_placement_without_racks_is_kafkas_documented_layout() -> None:
    # The table in Kafka's AdminUtils.assignReplicasToBrokers (5 brokers, 10 partitions,
    # 3 replicas, start index 0): broker b leads p_b and p_b+5; followers are shifted by
    # one more broker in the second round.
    assignment = assign_replicas(10, 3, {b: None for b in range(5)})
    assert assignment == [
        [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
        [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    ]  # fmt: skip


@given(st.integers(2, 6), st.integers(1, 4))
def test_followers_pair_with_every_other_broker_equally_often(brokers: int, rounds: int) -> None:
    # Over n(n-1) partitions per round each (leader, first follower) pair appears once
    # per round, so a broker's followers (and the load a failure moves) spread evenly.
    n = brokers
    assignment = assign_replicas(n * (n - 1) * rounds, 2, {b: None for b in range(n)})
    pairs = Counter((replicas[0], replicas[1]) for replicas in assignment)
    assert set(pairs.values()) == {rounds}
    assert len(pairs) == n * (n - 1)


def test_new_partitions_continue_the_layout_of_the_first_ones() -> None:
    brokers = {b: None for b in range(4)}
    whole = assign_replicas(9, 2, brokers, start_index=1)
    assert assign_replicas(4, 2, brokers, start_index=1, first_partition=5) == whole[5:]


def test_replicas_are_on_different_racks_in_every_round() -> None:
    # A bug found by mutation testing: from the second round (partition n on) the grown
    # follower shift put both replicas in one rack, here [1, 2] for partition 4.
    brokers = {1: "a", 2: "a", 3: "b", 4: "b"}
    for replicas in assign_replicas(8, 2, brokers):
        assert {brokers[b] for b in replicas} == {"a", "b"}, replicas


def test_a_replication_factor_below_one_says_so() -> None:
    # The message is what CreateTopics returns to the admin client.
    with pytest.raises(InvalidReplicationFactor) as refused:
        assign_replicas(3, 0, {1: None})
    assert str(refused.value) == "the replication factor must be at least 1"


def test_losing_a_broker_outside_the_isr_leaves_an_offline_partition_alone() -> None:
    # Only a returning ISR member may bring an offline partition back (clean election).
    offline = LeaderAndIsr(NO_LEADER, 7, (1,))
    assert after_broker_loss(offline, [1, 2, 3], 3, frozenset({2})) is None


def test_leaders_alternate_racks_and_brokers_without_a_rack_form_one() -> None:
    # Kafka's rack-alternated broker list: a1, b1, c1, a2, ... so that consecutive
    # partitions' leaders (and a topic of few partitions) land on different racks.
    brokers = {0: "r1", 1: "r1", 2: "r1", 3: "r2", 4: "r2", 5: "r2", 6: "r3", 7: "r3", 8: "r3"}
    leaders = [replicas[0] for replicas in assign_replicas(9, 1, brokers)]
    assert leaders == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    # Brokers without a rack count as one rack of their own: a replica of each group.
    mixed = {1: None, 2: None, 3: "b"}
    for replicas in assign_replicas(6, 2, mixed):
        assert {mixed[b] for b in replicas} == {None, "b"}, replicas
