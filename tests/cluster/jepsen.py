"""A Jepsen-style run: a 3-broker cluster under random faults, checked twice.

Three ``trio-broker serve`` processes (RF=3, ``min.insync.replicas=2``), each behind a
replication proxy and a ZooKeeper proxy (tests/cluster/netproxy.py) and capturing its
traffic (``--capture``). While idempotent acks=all confluent-kafka producers write
unique values and a consumer group reads, a seeded nemesis injects one fault at a time
(kill -9 and restart, SIGSTOP then SIGCONT, a leader cut off from its followers, a
broker cut off from ZooKeeper, a follower cut off from its leader, every replication
connection reset), each held a few seconds, then healed. The schedule is drawn from the
seed up front and logged as it happens.

Afterwards everything is healed, every acknowledged value is read back (none lost, none
twice, per-partition ack order kept) and ``trio-broker verify`` checks the captures of
all brokers together. Used by tests/cluster/test_jepsen.py (26 s of faults, ``settle``) and
bench/jepsen.py (``--minutes 30``).
"""

from __future__ import annotations

import collections
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from confluent_kafka import Consumer, KafkaException

from bench.crash_loop import verify_cli
from tests.cluster.netproxy import fetcher_of
from tests.cluster.test_cluster_e2e import eventually, partitions
from tests.cluster.test_cluster_faults import (
    BackgroundProducer,
    admin_of,
    create_topic,
    full_isr,
    read_partitions,
    servers,
)
from tests.cluster.test_network_faults import ProxiedCluster, start_proxied_cluster, stop_cluster

TOPIC = "jepsen"
PARTITIONS = 3
#: How often the group member asks for its committed offsets (OffsetFetch).
OFFSET_PROBE_S = 2.0
#: Records each producer gets acknowledged after a fault heals before the next one
#: (``settle``): the cluster takes writes again, with the faults apart.
SETTLED_ACKS = 200
FAULTS = ("kill9", "pause", "leader_cut_from_followers", "zookeeper_cut", "follower_cut",
          "reset_replication")  # fmt: skip
#: Faults that are over once injected (every replication connection reset: the fetchers
#: reconnect at once, and healing does nothing): their drawn hold is not waited out.
INSTANT = ("reset_replication",)


@attrs.define
class Fault:
    at_s: float  # seconds after the start of the faults
    kind: str
    broker: int
    hold_s: float


def schedule(
    seed: int, duration_s: float, ids: tuple[int, ...], *, every_kind: bool = False
) -> list[Fault]:
    """The faults of a run, drawn from ``seed``: one at a time, a quiet gap after each.

    ``every_kind``: the first faults are each kind of :data:`FAULTS` once, in a seeded
    order, even past ``duration_s`` (a short run then covers them all; random draws
    alone left one out of a 2-minute run); random kinds follow while time remains."""
    rng = random.Random(seed)
    first = rng.sample(FAULTS, len(FAULTS)) if every_kind else []
    faults, t = [], rng.uniform(2.0, 4.0)
    while True:
        hold = rng.uniform(3.0, 8.0)
        if t + hold > duration_s and len(faults) >= len(first):
            return faults
        kind = first[len(faults)] if len(faults) < len(first) else rng.choice(FAULTS)
        faults.append(Fault(round(t, 2), kind, rng.choice(ids), round(hold, 2)))
        t += hold + rng.uniform(4.0, 8.0)


def _log(line: str) -> None:
    print(f"[jepsen {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def _leader_of_some_partition(cluster: ProxiedCluster, fallback: int) -> int:
    try:
        state = partitions(admin_of(cluster), TOPIC)
    except Exception:  # a fault may make Metadata fail: pick the drawn one
        return fallback
    leading = sorted({leader for leader, _, _ in state.values() if leader in cluster})
    return fallback if not leading else leading[fallback % len(leading)]


def inject(cluster: ProxiedCluster, fault: Fault) -> Callable[[], None]:
    """Start ``fault``; returns what heals it."""
    broker = cluster[fault.broker]
    if fault.kind == "kill9":
        broker.kill9()
        return broker.start
    if fault.kind == "pause":
        broker.signal(signal.SIGSTOP)
        return lambda: broker.signal(signal.SIGCONT)
    if fault.kind == "leader_cut_from_followers":
        leader = cluster[_leader_of_some_partition(cluster, fault.broker)]
        leader.replication.blackhole()
        return leader.replication.heal
    if fault.kind == "zookeeper_cut":
        broker.zookeeper_link.blackhole()
        return broker.zookeeper_link.heal
    if fault.kind == "follower_cut":
        for other in cluster.values():
            other.replication.blackhole([fetcher_of(fault.broker)])
        return cluster.heal
    if fault.kind == "reset_replication":
        for other in cluster.values():
            other.replication.reset()
        return lambda: None
    raise ValueError(fault.kind)


class GroupReader:
    """A consumer group member reading the topic while the faults go on (bounded)."""

    def __init__(self, bootstrap: str, group: str, limit: int = 2_000_000) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 1000,
            "session.timeout.ms": 10000, "topic.metadata.refresh.interval.ms": 1000,
        })  # fmt: skip
        self.consumer.subscribe([TOPIC])
        self.read = 0
        self.offset_fetches = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.limit = limit
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_probe = time.monotonic() + OFFSET_PROBE_S
        while not self.stopping.is_set() and self.read < self.limit:
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + OFFSET_PROBE_S
                self._probe_committed()
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                self.errors[msg.error().name()] += 1
            else:
                self.read += 1

    def _probe_committed(self) -> None:
        """OffsetFetch for the assigned partitions: verify checks each answer against
        the commits accepted before it (``offset_fetch_current``)."""
        assigned = self.consumer.assignment()
        if not assigned:
            return
        try:
            self.consumer.committed(assigned, timeout=5)
            self.offset_fetches += 1
        except KafkaException as exc:
            self.errors["committed: " + exc.args[0].name()] += 1

    def stop(self) -> None:
        """Stop reading and leave the group (idempotent: see BackgroundProducer.abandon)."""
        self.stopping.set()
        self.thread.join(10)
        if hasattr(self, "consumer"):
            self.consumer.close()
            del self.consumer


def run(
    work_dir: Path,
    zookeeper: str,
    *,
    duration_s: float,
    seed: int,
    producers: int = 2,
    verify: bool = True,
    every_kind: bool = False,
    settle: bool = False,
    spark: Any = None,
) -> dict[str, Any]:
    """One checked run; returns its figures (see the module docstring). ``every_kind``:
    see :func:`schedule` (the faults may then outlast ``duration_s``).

    ``settle``: the faults' kinds, brokers and holds as drawn, but the quiet time after
    each is however long the cluster takes to be whole again (every ISR full, every
    producer acknowledging), not the drawn gap; ``duration_s`` then only bounds the
    draw. A short run (the CI test) spends its time in faults rather than in waiting."""
    ids = (1, 2, 3)
    faults = schedule(seed, duration_s, ids, every_kind=every_kind)
    if faults and not settle:
        duration_s = max(duration_s, faults[-1].at_s + faults[-1].hold_s)
    when = "each once the cluster settled" if settle else f"over {duration_s:.0f} s"
    _log(f"seed {seed}: {len(faults)} faults {when}: "
         + ", ".join(f"{f.at_s}s {f.kind}@{f.broker} for {f.hold_s}s" for f in faults))  # fmt: skip
    work_dir.mkdir(parents=True, exist_ok=True)
    captures = work_dir / "captures"
    cluster = start_proxied_cluster(work_dir, zookeeper, ids, capture_root=captures)
    figures: dict[str, Any] = {"seed": seed, "duration_s": duration_s,
                               "schedule": [attrs.asdict(f) for f in faults]}  # fmt: skip
    writers: list[BackgroundProducer] = []
    reader: GroupReader | None = None
    try:
        create_topic(cluster, TOPIC, PARTITIONS)
        writers = [BackgroundProducer(servers(cluster), TOPIC, start=i * 10_000_000,
                                      limit=5_000_000) for i in range(producers)]  # fmt: skip
        reader = GroupReader(servers(cluster), f"jepsen-{seed}")
        started = time.monotonic()
        applied: list[dict[str, Any]] = []
        for fault in faults:
            if settle:
                _settle(cluster, writers)
            else:
                time.sleep(max(0.0, started + fault.at_s - time.monotonic()))
            _log(f"fault: {fault.kind} on broker {fault.broker} for {fault.hold_s}s")
            heal = inject(cluster, fault)
            applied.append({"wall_time": time.time(), **attrs.asdict(fault)})
            if fault.kind not in INSTANT:
                time.sleep(fault.hold_s)  # the fault itself (its length is drawn from the seed)
            heal()
            _log(f"healed: {fault.kind} on broker {fault.broker}")
        if settle:
            _settle(cluster, writers)
        else:
            time.sleep(max(0.0, started + duration_s - time.monotonic()))
        # Every broker up, every link healed, every replica back in sync.
        cluster.heal()
        for broker in cluster.values():
            if not broker.running:
                broker.start()
            broker.signal(signal.SIGCONT)
        full_isr(admin_of(cluster), TOPIC, PARTITIONS, timeout_s=90)
        acked: dict[int, int] = {}
        errors: collections.Counter[int] = collections.Counter()
        for writer in writers:
            done = writer.stop()
            acked.update(done.partition_of)
            errors.update(done.errors)
        reader.stop()
        read = read_partitions(servers(cluster), TOPIC, PARTITIONS)
        figures.update(outcome(read, acked))
        figures.update({
            "faults_injected": dict(collections.Counter(f.kind for f in faults)),
            "applied": applied, "produce_errors": {str(k): v for k, v in errors.items()},
            "group_read": reader.read, "group_errors": dict(reader.errors),
            "group_offset_fetches": reader.offset_fetches,
        })  # fmt: skip
    finally:
        # On a failure (a timeout too) the clients go with the cluster, not later.
        for writer in writers:
            writer.abandon()
        if reader is not None:
            reader.stop()
        stop_cluster(cluster)
    if verify:
        figures.update(run_verify(captures, work_dir / "report", spark))
    _log(json.dumps({k: v for k, v in figures.items() if k not in ("schedule", "applied")}))
    return figures


def _settle(cluster: ProxiedCluster, writers: list[BackgroundProducer]) -> None:
    """Until the cluster is whole again: every broker serving, every partition's ISR
    full, and every producer acknowledging (a few hundred records more)."""
    full_isr(admin_of(cluster), TOPIC, PARTITIONS, timeout_s=90)
    for writer in writers:
        acked_then = writer.acked_count()
        eventually(lambda w=writer, n=acked_then: w.acked_count() > n + SETTLED_ACKS,
                   "a producer acknowledging again", 60)  # fmt: skip
    _log("settled: every ISR full, every producer acknowledging")


def outcome(read: dict[int, list[int]], acked: dict[int, int]) -> dict[str, Any]:
    """Lost, duplicated and reordered acknowledged values in the final read."""
    everything = [v for values in read.values() for v in values]
    counts = collections.Counter(everything)
    where = {v: p for p, values in read.items() for v in values}
    lost = sorted(v for v in acked if v not in where)
    moved = sorted(v for v, p in acked.items() if v in where and where[v] != p)
    reordered = []
    for p, values in read.items():
        for writer_values in _by_writer([v for v in values if v in acked]).values():
            if writer_values != sorted(writer_values):
                reordered.append(p)
    return {
        "records_acked": len(acked),
        "records_read": len(everything),
        "lost": len(lost), "lost_examples": lost[:10],
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "moved": len(moved), "reordered_partitions": sorted(set(reordered)),
    }  # fmt: skip


def _by_writer(values: list[int]) -> dict[int, list[int]]:
    """Each producer's values (they start at multiples of 10 million), in read order:
    one producer's acknowledged values must stay in the order it produced them."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for v in values:
        out[v // 10_000_000].append(v)
    return out


def run_verify(captures: Path, report: Path, spark: Any = None) -> dict[str, Any]:
    """``trio-broker verify`` over every broker's capture (a directory per broker): a
    subprocess, or in this process on ``spark`` (bench/crash_loop.py's verify_cli)."""
    dirs = sorted(d for d in captures.iterdir() if d.is_dir())
    started = time.monotonic()
    proc = verify_cli([*map(str, dirs), "--report", str(report)], spark, timeout=1800)
    _log(f"verify exit {proc.returncode} in {time.monotonic() - started:.0f} s\n{proc.stdout}")
    result: dict[str, Any] = {"verify_exit_code": proc.returncode,
                              "verify_summary": proc.stdout[-4000:]}  # fmt: skip
    report_json = report / "report.json"
    if report_json.exists():
        doc = json.loads(report_json.read_text())
        result["verify_violations"] = {
            name: check["violations"] for name, check in doc["checks"].items()
        }
        result["verify_acknowledged_batches"] = doc.get("acknowledged_batches")
    if proc.returncode != 0:  # 1 is also what an uncaught exception gives
        result["verify_stderr"] = proc.stderr[-4000:]
    return result
