"""Seeded fault schedules: what goes wrong, when, for how long.

A schedule is plain data drawn from one ``random.Random(seed)``, printed with a failure
so that ``python -m sim --seed N`` replays it.
"""

from __future__ import annotations

import random

import attrs

from sim.cluster import SESSION_TIMEOUT_MS

__all__ = ["KINDS", "SCHEDULED_ONLY", "Fault", "make_schedule"]

BROKERS = (1, 2, 3)
#: sim/cluster.py's zookeeper.session.timeout.ms, in seconds: the unit of a schedule's
#: times (faults last from a tenth of it to a few of it).
SESSION_TIMEOUT_S = SESSION_TIMEOUT_MS / 1000
KINDS = (
    "crash",  # kill -9: the page cache survives; restarts once its session expired
    "power_cut",  # only synced data survives; restarts once its session expired
    "partition",  # two nodes cannot reach each other (both ways), then heal
    "isolate",  # a broker cut off from every other node, then heal
    "slow",  # a link gets 10-300 ms of extra latency, then recovers
    "lossy",  # a link loses packets: some sends wait 0.2-1 s for a retransmission
    "reset",  # the connections between two nodes break
    # A broker cut off from ZooKeeper (not from the others); past the session timeout
    # its session expires and the cluster moves on without it (the zombie case).
    "zk_cut",
    # The leader of partition N (a = "pN") at that moment crashes (kill -9), as a
    # Jepsen nemesis aims at leaders.
    "crash_leader",
    # Armed at ``at``: the next time a follower of partition N truncates its log, its
    # leader crashes at that instant, before the follower fetches again (KIP-101's
    # window: a follower that cut committed records and may be elected next).
    "crash_leader_on_truncation",
    # The leader of partition N stops delivering to one follower (its fetch answer is
    # held, as by a long retransmission stall) until the partition's leader epoch moved
    # on: b = "leader", the leader is cut off from ZooKeeper and another broker leads;
    # b = "epoch", a third broker is killed and the same leader goes on in a new epoch.
    # The follower then receives an answer from before the change (sentence 10).
    "stale_fetch_answer",
)


#: Faults only a hand-written schedule names (``simulate(schedule=...)``): a kind added
#: to KINDS would change every seed's draws, and with them the schedules the planted
#: bugs are calibrated on.
#: - "delete_records": DeleteRecords on the leader of partition N (a = "pN") up to its
#:   HW, as the handler does; replicas away at the time must catch up from the new
#:   log start (the settle check) and nothing below it is checked any more.
SCHEDULED_ONLY = ("delete_records",)

#: Faults after which the cluster elects new leaders once the session expires.
LOSES_A_BROKER = (
    "crash", "power_cut", "crash_leader", "crash_leader_on_truncation", "zk_cut",
    "stale_fetch_answer",
)  # fmt: skip


@attrs.frozen
class Fault:
    at: float  # seconds from the start of the faulty phase
    kind: str
    a: str  # a node: "b1".."b3" or "client"; a partition "p0", "p1" for crash_leader
    b: str = ""
    duration: float = 0.0

    def __str__(self) -> str:
        link = f"{self.a}-{self.b}" if self.b else self.a
        lasting = f" for {self.duration:.2f}s" if self.duration else ""
        return f"t+{self.at:.2f}s {self.kind} {link}{lasting}"


def make_schedule(rng: random.Random, span_s: float, count: int) -> list[Fault]:
    faults: list[Fault] = []
    for _ in range(count):
        # Most faults follow another closely, or come just as the cluster reacts to it
        # (a session expires SESSION_TIMEOUT_S after a crash or a cut from ZooKeeper):
        # failures during a recovery, such as a new leader lost while its followers
        # truncate, are where replication bugs hide.
        draw = rng.random()
        kind = rng.choice(KINDS)
        if faults and draw < 0.3:
            at = rng.choice(faults).at + rng.uniform(0.0, 0.3) * SESSION_TIMEOUT_S
        elif faults and draw < 0.7:
            earlier = rng.choice(faults)
            at = earlier.at + SESSION_TIMEOUT_S * (1 + rng.uniform(0.0, 0.05))
            if earlier.kind in LOSES_A_BROKER and rng.random() < 0.5:
                kind = "crash_leader"  # the leader just elected: a second failover
        else:
            at = rng.uniform(0, span_s)
        at = round(min(at, span_s), 3)
        a = f"b{rng.choice(BROKERS)}"
        b = ""
        if kind in ("partition", "slow", "lossy", "reset"):
            b = rng.choice([f"b{x}" for x in BROKERS if f"b{x}" != a] + ["client"])
        duration = 0.0
        if kind == "stale_fetch_answer":
            a = f"p{rng.randrange(2)}"
            b = rng.choice(("leader", "epoch"))
            duration = round(rng.uniform(1.2, 2.5) * SESSION_TIMEOUT_S, 3)
        elif kind in ("crash_leader", "crash_leader_on_truncation"):
            a = f"p{rng.randrange(2)}"
            duration = round(rng.uniform(0.0, 2.0) * SESSION_TIMEOUT_S, 3)
        elif kind == "zk_cut":
            duration = round(rng.uniform(0.1, 2.5) * SESSION_TIMEOUT_S, 3)
        elif kind in ("partition", "isolate", "slow", "lossy"):
            duration = round(rng.uniform(0.1, 4.0) * SESSION_TIMEOUT_S, 3)
        elif kind in ("crash", "power_cut"):
            # down this long past its session's expiry
            duration = round(rng.uniform(0.0, 2.0) * SESSION_TIMEOUT_S, 3)
        faults.append(Fault(at, kind, a, b, duration))
    return sorted(faults, key=lambda f: f.at)
