"""Transactional produce beside idempotent produce: same records, same batching, one broker.

One ``trio-broker serve`` subprocess (file storage, fsync before acks as always) and
one topic; three confluent-kafka producer runs against it, one after the other, each
writing ``--transactions`` x ``--per-txn`` records of ``--record-size`` bytes, spread
round-robin over the partitions, with ``acks=all`` and the same linger/batch settings:

- ``idempotent``: ``enable.idempotence``, records streamed, one flush at the end;
- ``idempotent-sync``: the same, but ``flush()`` after every ``--per-txn`` records, so
  it waits for its acks exactly where a transaction commits (the fair comparison);
- ``transactional``: ``begin_transaction``, ``--per-txn`` records,
  ``commit_transaction`` (AddPartitionsToTxn, Produce, EndTxn with its markers).

Reported per run: records/s, MB/s, groups (transactions)/s, and p50/p99/max of the
time ``commit_transaction()`` (or the per-group ``flush()``) took; for the
transactional run also of a whole transaction, begin to committed.

    .venv/bin/python bench/transactions.py                      # 300 x 100 x 1 KiB
    .venv/bin/python bench/transactions.py --transactions 1000 --json txn.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce import BrokerProcess, percentile

TOPIC = "bench-txn"
MODES = ("idempotent", "idempotent-sync", "transactional")


def create_topic(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(TOPIC, partitions, replication_factor=1)])
    for future in futures.values():
        future.result(30)


def _produce(producer: Any, value: bytes, partition: int) -> None:
    """produce(), serving callbacks while librdkafka's queue is full (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            producer.produce(TOPIC, value, partition=partition)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise
            producer.poll(0.05)


def run_mode(mode: str, bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": args.linger_ms, "batch.size": 1024 * 1024,
        "compression.type": "none", "queue.buffering.max.kbytes": 512 * 1024,
    }  # fmt: skip
    transactional = mode == "transactional"
    if transactional:
        conf["transactional.id"] = f"bench-txn-{os.getpid()}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(30)
    # Warm up: metadata, connections, InitProducerId (outside the measurement).
    for partition in range(args.partitions):
        if transactional:
            producer.begin_transaction()
        _produce(producer, b"warmup", partition)
        if transactional:
            producer.commit_transaction(30)
        else:
            producer.flush(30)

    payload = os.urandom(args.record_size)
    end_latencies: list[float] = []  # commit_transaction() or the per-group flush()
    group_latencies: list[float] = []  # first produce() of a group to its end
    start = time.perf_counter()
    for group in range(args.transactions):
        group_start = time.perf_counter()
        if transactional:
            producer.begin_transaction()
        for i in range(args.per_txn):
            _produce(producer, payload, (group * args.per_txn + i) % args.partitions)
        if mode == "idempotent":
            producer.poll(0)
            continue
        end_start = time.perf_counter()
        if transactional:
            producer.commit_transaction(60)
        else:
            remaining = producer.flush(60)
            assert remaining == 0, f"{remaining} records undelivered after 60 s"
        done = time.perf_counter()
        end_latencies.append(done - end_start)
        group_latencies.append(done - group_start)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - start
    assert remaining == 0, f"{mode}: {remaining} records undelivered"
    records = args.transactions * args.per_txn
    end_latencies.sort()
    group_latencies.sort()

    def ms(values: list[float], q: float) -> float | None:
        return percentile(values, q) * 1000 if values else None

    return {
        "mode": mode, "records": records, "record_bytes": args.record_size,
        "groups": args.transactions, "per_group": args.per_txn, "seconds": elapsed,
        "records_per_s": records / elapsed, "mb_per_s": records * args.record_size / elapsed / 1e6,
        "groups_per_s": args.transactions / elapsed,
        "end_p50_ms": ms(end_latencies, 0.50), "end_p99_ms": ms(end_latencies, 0.99),
        "end_max_ms": ms(end_latencies, 1.0),
        "group_p50_ms": ms(group_latencies, 0.50), "group_p99_ms": ms(group_latencies, 0.99),
    }  # fmt: skip


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'mode':<16} {'records/s':>10} {'MB/s':>7} {'groups/s':>9} "
        f"{'end p50 ms':>10} {'end p99 ms':>10} {'end max ms':>10} "
        f"{'group p50':>9} {'group p99':>9}"
    ]
    for r in results:
        lines.append(
            f"{r['mode']:<16} {r['records_per_s']:>10.0f} {r['mb_per_s']:>7.2f} "
            f"{r['groups_per_s']:>9.1f} {_f(r['end_p50_ms'], '.1f'):>10} "
            f"{_f(r['end_p99_ms'], '.1f'):>10} {_f(r['end_max_ms'], '.1f'):>10} "
            f"{_f(r['group_p50_ms'], '.1f'):>9} {_f(r['group_p99_ms'], '.1f'):>9}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=300, help="groups of records")
    parser.add_argument("--per-txn", type=int, default=100, help="records per transaction")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--storage", default="file", choices=["file", "memory"])
    parser.add_argument("--model", default="pipelined", choices=["serial", "pipelined"])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path, help="write results here")
    args = parser.parse_args()

    broker = BrokerProcess(args.model, args.storage)
    results: list[dict[str, Any]] = []
    try:
        create_topic(broker.bootstrap, args.partitions)
        for mode in args.modes.split(","):
            assert mode in MODES, f"unknown mode {mode}"
            cpu_before = broker.cpu_seconds()
            result = run_mode(mode, broker.bootstrap, args)
            result["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
            results.append(result)
            print(f"{mode}: done in {result['seconds']:.1f}s", flush=True)
    finally:
        broker.stop()
    print(
        f"{args.transactions} groups x {args.per_txn} records x {args.record_size} B, "
        f"{args.partitions} partitions, acks=all, linger.ms={args.linger_ms}, "
        f"{args.model}/{args.storage}"
    )
    print(table(results))
    by_mode = {r["mode"]: r for r in results}
    if "transactional" in by_mode and "idempotent-sync" in by_mode:
        ratio = (
            by_mode["transactional"]["records_per_s"] / by_mode["idempotent-sync"]["records_per_s"]
        )
        print(f"transactional / idempotent-sync records/s: {ratio:.2f}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(json.dumps({"settings": settings, "results": results}, indent=2))


if __name__ == "__main__":
    main()
