"""The controller's rule for replicas in a failed log dir (Kafka's OfflineReplica):
``after_replicas_offline`` (its use in the controller's rounds: tests/unit/cluster/
test_offline_replicas.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.replication.controller_rules import (
    NO_LEADER,
    LeaderAndIsr,
    after_broker_loss,
    after_replicas_offline,
)

REPLICAS = (1, 2, 3)
ALL = frozenset(REPLICAS)


def test_a_leader_whose_dir_failed_hands_over_to_the_next_in_sync_replica() -> None:
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    assert after_replicas_offline(state, REPLICAS, frozenset({1}), ALL) == LeaderAndIsr(
        2, 5, (2, 3)
    )


def test_a_follower_whose_dir_failed_leaves_the_isr_in_a_new_epoch() -> None:
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    assert after_replicas_offline(state, REPLICAS, frozenset({3}), ALL) == LeaderAndIsr(
        1, 5, (1, 2)
    )


def test_a_replica_outside_the_isr_changes_nothing() -> None:
    state = LeaderAndIsr(1, 4, (1, 2))
    assert after_replicas_offline(state, REPLICAS, frozenset({3}), ALL) is None
    assert after_replicas_offline(state, REPLICAS, frozenset(), ALL) is None


def test_the_last_in_sync_replica_stays_and_the_partition_waits_for_its_dir() -> None:
    """As for a lost broker: the last ISR member is kept (it has every committed
    record), the partition has no leader until the dir comes back."""
    state = LeaderAndIsr(1, 4, (1,))
    offline = after_replicas_offline(state, REPLICAS, frozenset({1}), ALL)
    assert offline == LeaderAndIsr(NO_LEADER, 5, (1,))
    assert after_replicas_offline(offline, REPLICAS, frozenset({1}), ALL) is None


def test_unclean_election_passes_over_offline_replicas() -> None:
    state = LeaderAndIsr(1, 4, (1,))
    after = after_replicas_offline(state, REPLICAS, frozenset({1, 2}), ALL, unclean=True)
    assert after == LeaderAndIsr(3, 5, (3,))


def test_several_offline_replicas_cost_one_epoch() -> None:
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    assert after_replicas_offline(state, REPLICAS, frozenset({1, 2}), ALL) == LeaderAndIsr(
        3, 5, (3,)
    )


brokers = st.sampled_from(REPLICAS)


@st.composite
def states(draw: st.DrawFn) -> LeaderAndIsr:
    isr = tuple(draw(st.lists(brokers, min_size=1, max_size=3, unique=True)))
    leader = draw(st.sampled_from((*isr, NO_LEADER)))
    return LeaderAndIsr(leader, draw(st.integers(0, 10)), isr)


@given(states(), st.frozensets(brokers), st.frozensets(brokers), st.booleans())
def test_offline_replicas_never_lead_and_stay_in_sync_only_as_the_last_member(
    state: LeaderAndIsr,
    offline: frozenset[int],
    live: frozenset[int],
    unclean: bool,
) -> None:
    after = after_replicas_offline(state, REPLICAS, offline, live, unclean=unclean)
    touched = offline & {state.leader, *state.isr}
    if after is None:
        # Nothing to do: no offline replica leads or is in sync, or the state is already
        # what the rule gives (an offline partition's last member, nobody to elect).
        assert not touched or (state.leader == NO_LEADER and len(state.isr) == 1)
        return
    assert after.leader_epoch == state.leader_epoch + 1
    assert after.leader not in offline
    if after.leader != state.leader:  # (a dead leader is the broker-loss rule's business)
        assert after.leader == NO_LEADER or after.leader in live
    assert after.isr and set(after.isr) <= set(REPLICAS)
    stale = set(after.isr) & offline
    assert not stale or (len(after.isr) == 1 and after.leader == NO_LEADER), after
    if after.leader != NO_LEADER and not unclean:
        assert after.leader in state.isr  # clean: from the ISR only
    # The same as losing those brokers for this partition alone, one at a time.
    alike = state
    for broker in (state.leader, *state.isr):
        if broker in offline:
            alike = (
                after_broker_loss(alike, REPLICAS, broker, live - offline, unclean=unclean) or alike
            )
    assert (after.leader, after.isr) == (alike.leader, alike.isr)
