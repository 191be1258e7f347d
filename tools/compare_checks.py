"""Old and new checks SQL on random fact tables: the same violation rows, or the differences.

A change to :mod:`trio_broker.verify.checks` (a view rewritten, cached or gated, a check
reading another table) must not change a verdict. This builds random fact tables (each
a capture of one job, ``cap``), small key domains so that joins meet and checks find
violations, runs the views and checks of two trees' ``checks.py`` the way
:mod:`trio_broker.verify.job` does (each materialized view cached in order, its gates
knowing the kinds and the views made before it; checks left out by their needs) and
compares each check's violation rows per capture, as multisets.

    .venv/bin/python tools/compare_checks.py /tmp/old/trio_broker/verify/checks.py \\
        --jobs 4 --captures 8 --facts 600 [--missing 0.4] [--seed N]

``--missing``: the fraction of the rare kinds left out of a whole job (so gates are off
and checks left out). Prints per job the checks that found violations and any
difference; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trio_broker.verify.compact import COMPACT_FIELDS, KINDS  # noqa: E402

#: The kinds a capture holds by the million: always present.
COMMON = ("produce_batch", "produce_ack", "fetch_part", "fetch_batch", "fetch_request")


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_fact(rng: random.Random, kind: str, run: int, cap: int, ts: int) -> dict[str, Any]:
    offset = rng.randrange(0, 8)
    return {
        "run": run, "conn": rng.randrange(1, 3), "corr": rng.randrange(0, 4), "ts": ts,
        "kind": KINDS.index(kind), "topic": rng.randrange(1, 3),
        "partition": rng.randrange(0, 2), "idx": rng.randrange(0, 3),
        "error": rng.choice((0, 0, 0, 1)), "offset": offset,
        "last_offset": offset + rng.randrange(-1, 3), "crc": rng.randrange(1, 4),
        "record_count": rng.randrange(1, 3), "producer_id": rng.choice((-1, 7, 7, 8)),
        "producer_epoch": rng.randrange(0, 2), "base_sequence": rng.randrange(-1, 6),
        "group_id": rng.choice(("g1", "g2")), "generation": rng.randrange(1, 3),
        "member_id": rng.choice(("m1", "m2")), "note": rng.choice(("tx1", "tx2", None)),
        "attributes": rng.choice((0, 0, 16, 16, 48)), "isolation_level": rng.randrange(0, 2),
        "committed": rng.randrange(0, 2), "leader_id": rng.randrange(1, 3),
        "leader_epoch": rng.randrange(-1, 3), "cap": cap, "tname": None,
    }  # fmt: skip


def make_job(rng: random.Random, captures: int, facts: int, missing: float) -> list[dict[str, Any]]:
    rare = [k for k in KINDS if k not in COMMON and k not in ("topic_name", "undecodable")]
    kinds = list(COMMON) + [k for k in rare if rng.random() >= missing]
    rows = []
    for cap in range(captures):
        # Each capture holds a random subset of the job's kinds.
        own = list(COMMON) + [k for k in kinds if k not in COMMON and rng.random() < 0.7]
        times = rng.sample(range(facts * 10), facts)  # no ties in time
        for ts in times:
            row = random_fact(rng, rng.choice(own), 2 * cap + rng.randrange(0, 2), cap, ts)
            row["tname"] = row["topic"]
            rows.append(row)
    return rows


def run_tree(spark: Any, checks: ModuleType, kinds: set[str], gated: bool) -> Counter[str]:
    """Every check's violation rows (JSON, with the check's name) as the job finds them."""
    counted: dict[str, int] = {}
    kept = []
    for name, view in checks.VIEWS.items():
        known = kinds | {v for v in checks.MATERIALIZED if v not in counted or counted[v]}
        table = spark.sql(checks.sql(view, known if gated else None))
        if name in checks.MATERIALIZED:
            table = table.localCheckpoint(eager=True)
            kept.append(table)
            counted[name] = table.count()
        table.createOrReplaceTempView(name)
    present = kinds | {name for name, n in counted.items() if n}
    parts = [
        f"SELECT '{name}' AS check_name, to_json(struct(*)) AS row "
        f"FROM ({checks.sql(checks.CHECKS[name][1], present)})"
        for name in checks.checks_to_run(present)
    ]
    out: Counter[str] = Counter()
    if parts:
        for r in spark.sql("\nUNION ALL\n".join(parts)).collect():
            out[f"{r['check_name']} {r['row']}"] += 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the other tree's trio_broker/verify/checks.py")
    parser.add_argument("--new", type=Path, default=ROOT / "trio_broker/verify/checks.py")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--captures", type=int, default=8)
    parser.add_argument("--facts", type=int, default=600)
    parser.add_argument("--missing", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from trio_broker.verify.compact import COMPACT_DDL

    old, new = load(args.old, "checks_old"), load(args.new, "checks_new")
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    rng = random.Random(args.seed)
    differences = 0
    for job in range(args.jobs):
        rows = make_job(rng, args.captures, args.facts, args.missing)
        brokers = sorted({(r["cap"], r["run"]) for r in rows})
        # Some jobs' captures are clusters (runs with brokers), some are brokers alone.
        cluster = [(cap, run, 1 + run % 2) for cap, run in brokers if cap % 2 == job % 2]
        spark.sql(old.run_brokers_view_sql(cluster)).createOrReplaceTempView("run_brokers")
        alone = [cap % 2 != job % 2 for cap in range(args.captures)]
        spark.sql(old.captures_view_sql(alone)).createOrReplaceTempView("captures")
        ddl = f"{COMPACT_DDL}, cap int, tname bigint"
        names = [name for name, _, _ in COMPACT_FIELDS] + ["cap", "tname"]
        facts = spark.createDataFrame([tuple(r[n] for n in names) for r in rows], ddl)
        facts = facts.repartition(2, "tname", "partition").localCheckpoint(eager=True)
        facts.createOrReplaceTempView("named")
        # The capture rows acked_topic_kept dates Metadata answers by: one request per
        # (run, connection, correlation id), just before its first fact.
        spark.sql("""
            SELECT cap, run, conn AS connection_id, corr AS correlation_id,
                   'request' AS direction, min(ts) - 1 AS monotonic_ns
            FROM named GROUP BY cap, run, conn, corr
        """).localCheckpoint(eager=True).createOrReplaceTempView("frames")
        kinds = {KINDS[r["kind"]] for r in rows}
        before = run_tree(spark, old, kinds, gated=False)
        after = run_tree(spark, new, kinds, gated=True)
        found = Counter(key.split(" ", 1)[0] for key in before.elements())
        diff = (before - after) + (after - before)
        differences += sum(diff.values())
        print(json.dumps({"job": job, "kinds": len(kinds), "violations": dict(found),
                          "differences": sum(diff.values())}), flush=True)  # fmt: skip
        for key, n in list(diff.items())[:10]:
            side = "old only" if before[key] > after[key] else "new only"
            print(f"  {side} x{n}: {key}", flush=True)
    spark.stop()
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
