"""Direct property tests of the replication rules (issue 31): the leader's term
(``replication/leader.py``) driven by generated event sequences, and the follower's
high watermark (``replication/follower.py``) and the follower's truncation rounds
(``replication/truncation.py``), each checked against the sentences of
their docstrings rather than against a second implementation.

The leader machine's invariants, after every step:

- the HW never goes back and stays at or below the leader's durable end, which stays
  at or below its log end;
- the HW is at or below the log end every member of the (maximal) ISR reported;
- a follower is proposed into the ISR only by a fetch at or past both the HW and the
  term's start offset (KAFKA-7128: a follower that does not hold the new leader's first
  offset would count toward the HW for records it may not hold);
- a follower is proposed out of the ISR only after lagging longer than the lag time;
- an acks=all write is answered DONE only once the HW passed it and the stored ISR has
  the effective min.insync.replicas members.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trio_broker.replication.follower import (
    high_watermark_after_fetch,
    high_watermark_after_truncation,
)
from trio_broker.replication.leader import AckState, IsrProposal, LeaderPartition
from trio_broker.replication.truncation import plan_truncation
from trio_broker.storage.epoch_cache import LeaderEpochCache

LEADER = 1
LAG_MS = 1_000


class LeaderTermMachine(RuleBasedStateMachine):
    term: LeaderPartition

    @initialize(
        followers=st.integers(1, 3),
        isr_followers=st.integers(0, 3),
        start=st.integers(0, 20),
        hw_behind=st.integers(0, 20),
        min_isr=st.integers(1, 4),
    )
    def begin(
        self, followers: int, isr_followers: int, start: int, hw_behind: int, min_isr: int
    ) -> None:
        replicas = (LEADER, *range(2, 2 + followers))
        isr = frozenset(replicas[: 1 + min(isr_followers, followers)])
        self.now = 0
        # A new leader's HW may lag its log end (its predecessor's HW reached it late).
        self.term = LeaderPartition.become_leader(
            LEADER, 5, replicas, isr, start, start - min(hw_behind, start), self.now,
            min_insync_replicas=min_isr, replica_lag_time_max_ms=LAG_MS,
        )  # fmt: skip
        self.last_hw = self.first_hw = self.term.high_watermark
        # What each follower last reported (the truth the leader's state must respect).
        self.reported: dict[int, int] = {}

    @rule(records=st.integers(1, 5))
    def append(self, records: int) -> None:
        self.term.leader_appended(self.term.log_end_offset + records)

    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        t = self.term
        t.leader_synced(data.draw(st.integers(t.durable_end_offset, t.log_end_offset)))

    @rule(data=st.data(), elapsed=st.integers(0, 2 * LAG_MS))
    def follower_fetches(self, data: st.DataObject, elapsed: int) -> None:
        t = self.term
        follower = data.draw(st.sampled_from(sorted(t.followers)))
        # A follower fetches from what it holds: never past the leader's log end, and
        # (it only moves forward within a term) not before its previous fetch.
        low = max(self.reported.get(follower, 0), 0)
        offset = data.draw(st.integers(min(low, t.log_end_offset), t.log_end_offset))
        self.now += elapsed
        was_pending = t.pending
        _, proposal = t.follower_fetched(follower, offset, self.now)
        self.reported[follower] = offset
        if proposal is not None:
            assert was_pending is None
            added = proposal.isr - t.isr
            assert added == {follower}
            assert offset >= t.high_watermark, "proposed into the ISR below the HW"
            assert offset >= t.epoch_start_offset, (
                "proposed into the ISR without the leader's term start (KAFKA-7128)"
            )

    @rule(elapsed=st.integers(0, 2 * LAG_MS))
    def check_lagging(self, elapsed: int) -> None:
        t = self.term
        self.now += elapsed
        proposal = t.check_lagging(self.now)
        if proposal is not None:
            for removed in t.isr - proposal.isr:
                assert removed != LEADER
                assert self.now - t.followers[removed].last_caught_up_ms > LAG_MS

    @precondition(lambda self: self.term.pending is not None)
    @rule(stored=st.booleans())
    def coordination_answers(self, stored: bool) -> None:
        t = self.term
        pending = t.pending
        assert isinstance(pending, IsrProposal)
        if stored:
            t.isr_stored(pending)
        else:
            t.isr_refused()

    @rule(data=st.data())
    def producer_asks(self, data: st.DataObject) -> None:
        t = self.term
        last_offset = data.draw(st.integers(0, max(t.log_end_offset, 1)))
        if t.ack_state(last_offset) is AckState.DONE:
            assert t.high_watermark > last_offset
            assert len(t.isr) >= min(t.min_insync_replicas, len(t.replicas))

    @invariant()
    def high_watermark_bounds(self) -> None:
        t = self.term
        assert self.last_hw <= t.high_watermark, "the HW went back"
        self.last_hw = t.high_watermark
        assert t.high_watermark <= t.durable_end_offset <= t.log_end_offset
        # Once the HW moved in this term it was the minimum over the ISR (the HW it
        # began with was the predecessor's, and is kept: it never goes back).
        for replica in t.maximal_isr - {LEADER}:
            if replica in self.reported and t.high_watermark > self.first_hw:
                assert t.high_watermark <= self.reported[replica], (
                    f"HW {t.high_watermark} above ISR member {replica}'s log end "
                    f"{self.reported[replica]}"
                )


#: tools/mutation.sh runs this machine once per mutant and asks for fewer examples.
EXAMPLES = int(os.environ.get("MUTATION_EXAMPLES", "300"))
LeaderTermMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=40)
test_leader_term = LeaderTermMachine.TestCase


def test_a_follower_past_the_hw_but_short_of_the_term_start_stays_out_of_the_isr() -> None:
    # A new leader at log end 10 with HW 4 (its predecessor's HW reached it late); the
    # follower fetching at 6 holds everything below the HW, not the term's first offset.
    term = LeaderPartition.become_leader(1, 3, (1, 2), frozenset({1}), 10, 4, 0)
    _, proposal = term.follower_fetched(2, 6, 1)
    assert proposal is None
    _, proposal = term.follower_fetched(2, 10, 2)
    assert proposal == IsrProposal(3, frozenset({1, 2}))


offsets = st.integers(0, 1_000)


@given(current=offsets, leader_hw=offsets, log_end=offsets)
def test_a_followers_hw_is_capped_by_its_log_end_and_never_goes_back(
    current: int, leader_hw: int, log_end: int
) -> None:
    current = min(current, log_end)  # what the follower kept so far, within its log
    hw = high_watermark_after_fetch(current, leader_hw, log_end)
    assert hw >= current
    assert hw <= log_end, "a follower's HW above the records it holds"
    assert hw == current or hw == min(leader_hw, log_end)


@given(current=offsets, log_end=offsets)
def test_truncation_cuts_the_hw_to_the_log_end(current: int, log_end: int) -> None:
    hw = high_watermark_after_truncation(current, log_end)
    assert hw == min(current, log_end)


# -- KIP-279 truncation as a whole: rounds of plan_truncation end at the divergence ----


@st.composite
def diverged_logs(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """(common prefix, follower suffix, leader suffix), as the epoch of each offset.

    Both logs hold the common prefix. After it, one of them may hold more records of the
    prefix's last epoch (its leader wrote them; the other replica missed them); then each
    continues with epochs of its own, never the other's (one leader per epoch, so the
    same epoch at the same offset is the same record). The leader holds the newest epoch.
    """

    def run(epochs: list[int]) -> list[int]:
        return [e for e in epochs for _ in range(draw(st.integers(1, 3)))]

    common_epochs = sorted(draw(st.sets(st.integers(0, 6), max_size=3)))
    common = run(common_epochs)
    top = common_epochs[-1] if common_epochs else -1
    later = sorted(draw(st.sets(st.integers(top + 1, top + 12), max_size=6)))
    mine = draw(st.lists(st.booleans(), min_size=len(later), max_size=len(later)))
    follower = run([e for e, m in zip(later, mine, strict=True) if m])
    leader = run([e for e, m in zip(later, mine, strict=True) if not m])
    if not leader or (follower and max(follower) > max(leader)):
        leader.append(top + 13)  # the current leader's epoch is the newest
    extra = [top] * draw(st.integers(0, 2)) if common else []
    if draw(st.booleans()):
        leader = extra + leader
    else:
        follower = extra + follower
    return common, follower, leader


def cache_for(epochs: list[int]) -> LeaderEpochCache:
    cache = LeaderEpochCache()
    for offset, epoch in enumerate(epochs):
        if offset == 0 or epochs[offset - 1] != epoch:
            cache.assign(epoch, offset)
    return cache


@given(logs=diverged_logs(), data=st.data())
def test_truncation_rounds_cut_the_follower_to_the_common_prefix(
    logs: tuple[list[int], list[int], list[int]], data: st.DataObject
) -> None:
    common, follower_suffix, leader_suffix = logs
    follower_log = common + follower_suffix
    leader_log = common + leader_suffix
    follower, leader = cache_for(follower_log), cache_for(leader_log)
    end = len(follower_log)
    hw = data.draw(st.integers(0, len(common)))  # a HW only counts records both hold
    asked = follower.latest_epoch
    for _ in range(20):
        step = plan_truncation(follower, end, hw, *leader.end_offset_for(asked, len(leader_log)))
        assert step.truncate_to <= end, "a cut past the follower's own log end"
        end = step.truncate_to
        follower.truncate_from_end(end)
        if step.done:
            break
        asked = step.next_epoch
    else:
        raise AssertionError("truncation did not converge")
    # Everything the two logs share stays, everything after the divergence goes.
    assert end == len(common)
