"""Reference model of replication: a partition's replicas as plain lists, and its sentences.

A replica's log is a list of records, each written by one leader epoch. What the
implementation keeps incrementally (the leader-epoch cache, the HW, the ISR) is
recomputed here from those lists by brute force, and the guarantees of Kafka's
replication are written as checks over the whole cluster:

1. A write answered for acks=all is in the log of every ISR member, at its offset; and
   every member of the ISR a leader counts on (stored or being added) holds the leader's
   log up to the high watermark.
2. Replicas agree below their high watermarks: each replica's log up to its HW equals
   the leader's up to the same offset.
3. The high watermark that clients see never goes back, across leader changes.
4. At most one broker writes in any leader epoch.
5. After truncation a follower's log is a prefix of its leader's, and the cut never
   removes anything below the follower's high watermark.
6. The leader-epoch cache answers OffsetForLeaderEpoch as a scan of the log would.
7. Every replica's HW is at most its own log end (a follower never counts records it
   does not hold, whatever HW the leader's answer carried).
8. An acks=all write is appended only while the leader's ISR has at least
   min.insync.replicas members (else refused, NOT_ENOUGH_REPLICAS, and not appended),
   and answered only while it still has them.
9. The controller's every decision uses a new leader epoch, and names a leader from the
   ISR (an unclean election, sentence 13, names one outside it and makes it the ISR).
10. A follower tells its leader (by its fetch offset) only what it has synced, so one
    that loses power and is back before its session expires (still in the ISR) holds
    everything the leader counted it for; and it takes a fetch answer only while it
    still fetches from the same leader, in the same epoch, at the same offset (an answer
    that crossed a leader change is dropped).
11. Every record a consumer receives (plain or read_committed) is below the HW (for
    read_committed, the LSO) told in the same answer, and stays at that offset in the
    log of every later leader: it is in the final log.
12. A follower leaves the ISR when it has not caught up for longer than
    replica.lag.time.max.ms, and only then: caught up means it fetched at the leader's
    log end of that moment, or at the leader's log end as of its previous fetch (then
    it was caught up at that previous fetch); a new term counts every follower as
    caught up at its start (Kafka's ``Partition``/``Replica`` rule).
13. With unclean.leader.election.enable and no ISR member alive, the controller elects
    the first live replica (Kafka's offline-partition election), alone in the ISR, with
    a larger leader epoch. Its log is the truth from then on: the acknowledged (1),
    consumed (11) and shown (3) records it lacks at their offsets are lost, and a
    replica's HW may count records it lacks until that replica has truncated against it
    (2, and 5's floor becomes where the replica's log parts from the new leader's).
    Nothing else is relaxed: writes acknowledged, consumed or shown after the election
    are held to 1, 3 and 11; every replica converges to the new leader's log by
    truncation with the epoch cache (a prefix of it, never keeping a divergent record);
    each HW stays within its own log (7) and no consumer is served above it (11); at
    most one writer per epoch (4).

``trio_broker.replication`` is checked against this by the simulation in
``statemachine/test_replication_machine.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@attrs.frozen
class Record:
    epoch: int  # the leader epoch it was written in
    value: str


def epoch_end_offset(
    epochs: Sequence[int], announced: Mapping[int, int], requested: int
) -> tuple[int, int]:
    """OffsetForLeaderEpoch by scanning: ``epochs`` has one entry per offset.

    ``announced`` maps epochs that a leader began (at its log end, then) to that offset,
    whether or not it wrote in them: an epoch starts where its first record is, or
    where it was announced if it has none.
    """
    log_end = len(epochs)
    starts: dict[int, int] = {}
    for offset, epoch in enumerate(epochs):
        starts.setdefault(epoch, offset)
    for epoch, offset in announced.items():
        starts[epoch] = min(starts.get(epoch, offset), offset)
    known = sorted(starts)
    if requested == UNDEFINED_EPOCH or not known:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if requested == known[-1]:
        return requested, log_end
    if requested > known[-1]:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    next_start = min(offset for epoch, offset in starts.items() if epoch > requested)
    below = [epoch for epoch in known if epoch <= requested]
    return (below[-1] if below else requested), next_start


def common_prefix(a: Sequence[Record], b: Sequence[Record]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def acked_writes_missing(
    acked: dict[int, Record], logs_of_isr: Mapping[int, Sequence[Record]]
) -> list[str]:
    """Sentence 1: every acknowledged write, at its offset, in every ISR member's log."""
    problems = []
    for broker, log in logs_of_isr.items():
        for offset, record in sorted(acked.items()):
            held = log[offset] if offset < len(log) else None
            if held != record:
                problems.append(f"broker {broker} has {held} at offset {offset}, acked {record}")
    return problems


def disagreements_below_hw(
    leader_log: Sequence[Record], replicas: Mapping[int, tuple[Sequence[Record], int]]
) -> list[str]:
    """Sentence 2: each replica's log below its HW equals the leader's."""
    problems = []
    for broker, (log, high_watermark) in replicas.items():
        if high_watermark > len(log) or list(log[:high_watermark]) != list(
            leader_log[:high_watermark]
        ):
            problems.append(
                f"broker {broker} disagrees with the leader below its HW {high_watermark}"
            )
    return problems


def isr_members_short_of_hw(
    leader_log: Sequence[Record], high_watermark: int, logs_of_isr: Mapping[int, Sequence[Record]]
) -> list[str]:
    """Sentence 1, second half: the HW never counts a record an ISR member lacks."""
    expected = list(leader_log[:high_watermark])
    return [
        f"broker {broker} (in the ISR) lacks the leader's log below HW {high_watermark}"
        for broker, log in logs_of_isr.items()
        if list(log[:high_watermark]) != expected
    ]


def consumed_records_missing(
    received: Sequence[tuple[int, Record, int]], leader_log: Sequence[Record]
) -> list[str]:
    """Sentence 11: each (offset, record, HW told) a consumer got is below that HW and
    is still at that offset in the (current or final) leader's log."""
    problems = []
    for offset, record, told in received:
        if offset >= told:
            problems.append(f"a consumer got offset {offset} with HW {told}")
        held = leader_log[offset] if offset < len(leader_log) else None
        if held != record:
            problems.append(f"a consumer got {record} at {offset}; the leader has {held}")
    return problems


@attrs.define
class CatchUp:
    """Sentence 12's bookkeeping for one follower of one leader term."""

    last_caught_up_ms: int
    previous_leader_end: int = -1
    previous_fetch_ms: int = 0

    def fetched(self, fetch_offset: int, leader_end: int, now_ms: int) -> None:
        if fetch_offset >= leader_end:
            self.last_caught_up_ms = now_ms
        elif fetch_offset >= self.previous_leader_end:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.previous_fetch_ms)
        self.previous_leader_end, self.previous_fetch_ms = leader_end, now_ms

    def lagging(self, now_ms: int, lag_max_ms: int) -> bool:
        return now_ms - self.last_caught_up_ms > lag_max_ms
