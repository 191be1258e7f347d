"""ElectLeaders' decision (replication/controller_rules.requested_election), case by case."""

from __future__ import annotations

from trio_broker.replication.controller_rules import (
    NO_LEADER,
    ElectionRefused,
    ElectionType,
    LeaderAndIsr,
    requested_election,
)

PREFERRED, UNCLEAN = ElectionType.PREFERRED, ElectionType.UNCLEAN
REPLICAS = (1, 2, 3)
ALL = frozenset(REPLICAS)


def test_preferred_moves_leadership_to_the_first_replica_in_a_new_epoch() -> None:
    state = LeaderAndIsr(2, 4, (1, 2, 3))
    assert requested_election(state, REPLICAS, ALL, PREFERRED) == LeaderAndIsr(1, 5, (1, 2, 3))


def test_preferred_not_needed_when_the_preferred_replica_leads() -> None:
    state = LeaderAndIsr(1, 4, (1, 2))
    assert requested_election(state, REPLICAS, ALL, PREFERRED) is ElectionRefused.NOT_NEEDED


def test_preferred_not_available_when_down_or_out_of_sync() -> None:
    out_of_sync = LeaderAndIsr(2, 4, (2, 3))
    assert (
        requested_election(out_of_sync, REPLICAS, ALL, PREFERRED)
        is ElectionRefused.PREFERRED_NOT_AVAILABLE
    )
    down = LeaderAndIsr(2, 4, (1, 2, 3))
    assert (
        requested_election(down, REPLICAS, frozenset({2, 3}), PREFERRED)
        is ElectionRefused.PREFERRED_NOT_AVAILABLE
    )


def test_unclean_not_needed_while_a_live_leader_leads() -> None:
    state = LeaderAndIsr(2, 4, (2,))
    assert requested_election(state, REPLICAS, ALL, UNCLEAN) is ElectionRefused.NOT_NEEDED


def test_unclean_prefers_a_live_in_sync_replica() -> None:
    # The leader is dead but not yet noticed; broker 3 is in sync, broker 1 (first) is not.
    state = LeaderAndIsr(2, 4, (2, 3))
    assert requested_election(state, REPLICAS, frozenset({1, 3}), UNCLEAN) == LeaderAndIsr(
        3, 5, (3,)
    )


def test_unclean_takes_any_live_replica_as_the_whole_isr() -> None:
    offline = LeaderAndIsr(NO_LEADER, 4, (1,))
    assert requested_election(offline, REPLICAS, frozenset({2, 3}), UNCLEAN) == LeaderAndIsr(
        2, 5, (2,)
    )


def test_unclean_without_any_live_replica() -> None:
    offline = LeaderAndIsr(NO_LEADER, 4, (1,))
    assert (
        requested_election(offline, REPLICAS, frozenset({9}), UNCLEAN)
        is ElectionRefused.NO_ELIGIBLE_LEADER
    )
