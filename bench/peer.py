"""`bench/run_all.py --peer kafka`: every workload on trio-broker and on Apache Kafka, one run.

Three brokers per workload, each started fresh for it, in an order that rotates from one
workload to the next (so no broker always runs first, on a cold or a warm disk):

* ``trio`` - ``trio-broker serve``, pipelined model, fsync before every acks=all answer;
* ``kafka`` - Kafka 4.4 with its defaults: acknowledged once in the page cache;
* ``kafka_fsync`` - Kafka with ``log.flush.interval.messages=1``: fsync before the ack.

W3 reads W1's log on the broker W1 wrote it to. Before a workload is measured, each broker
is warmed up alike (:func:`warm_up`: a JVM compiles its hot paths in the first seconds of
load; without it Kafka's figures of a short run would be its interpreter's). The physical
limits (bench/limits.py, plus a 16 KiB append+fsync rate for W6) are measured in the same run.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kafka_peer
import limits
import workloads
from produce import BrokerProcess, create_topic, run_producer

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- run_all_peer:begin -->", "<!-- run_all_peer:end -->"


def targets(config: Path | None = None) -> dict[str, tuple[str, Callable[[], workloads.Broker]]]:
    """The three brokers; with ``config`` each starts from that one server.properties."""
    trio_config = (
        None
        if config is None
        else lambda data_dir: kafka_peer.write_properties(
            data_dir / "server.properties", config, kafka_peer.trio_node_keys(data_dir)
        )
    )
    return {
        "trio": ("trio-broker (fsync)", lambda: BrokerProcess("pipelined", config=trio_config)),
        "kafka": (
            "Kafka (page cache)",
            lambda: kafka_peer.KafkaProcess(label="kafka", config=config),
        ),
        "kafka_fsync": (
            "Kafka (fsync)",
            lambda: kafka_peer.KafkaProcess(kafka_peer.FSYNC_EVERY_MESSAGE, "kafka-fsync", config),
        ),
    }


TARGETS = targets()
WORKLOADS = ["w1", "w2", "w4", "w5", "w6"]  # W3 runs with W1
#: Goal of the issue: trio-broker >= Kafka (fsync) everywhere, >= Kafka (page cache) on these.
PAGE_CACHE_GOAL = {"w1", "w3", "w6"}
#: The figure each workload is judged by, and whether lower is better.
HEADLINE = {
    "w1": ("mb_per_s", False), "w3": ("mb_per_s", False), "w6": ("mb_per_s", False),
    "w2": ("records_per_s", False), "w4": ("records_per_s", False), "w5": ("p99_ms", True),
}  # fmt: skip
TITLES = {
    "w1": "W1 64 KiB, batch 1 MiB",
    "w2": "W2 1 KiB, linger 5 ms",
    "w3": "W3 consume W1's log",
    "w4": "W4 = W2 idempotent",
    "w5": "W5 fan-in",
    "w6": "W6 16 KiB, one batch per request",
}

W3_MIN_BYTES = 1024 * 1024 * 1024
WARM_UP_LARGE = 256  # x 64 KiB
WARM_UP_SMALL = 20_000  # x 1 KiB


def warm_up(broker: workloads.Broker) -> None:
    """16 MiB of W1's records, read back once, and 20k of W2's, on topics of their own."""
    create_topic(broker.bootstrap, "warmup-large")
    run_producer(broker.bootstrap, "warmup-large", WARM_UP_LARGE, 64 * 1024, {})
    workloads.w3(broker, WARM_UP_LARGE, time_limit=30.0, topic="warmup-large")
    create_topic(broker.bootstrap, "warmup-small")
    run_producer(broker.bootstrap, "warmup-small", WARM_UP_SMALL, 1024, {"linger.ms": 5})


def warmed(start: workloads.StartBroker) -> workloads.StartBroker:
    def start_and_warm_up() -> workloads.Broker:
        broker = start()
        try:
            warm_up(broker)
        except BaseException:
            broker.stop()
            raise
        return broker

    return start_and_warm_up


Step = Callable[[dict[str, Any], str, float, Callable[[], Any]], Any]


def config_overrides() -> dict[str, dict[str, str]]:
    """What each broker gets on top of the shared file (ports and dirs shown as placeholders)."""
    node_dir = Path("<node dir>")
    kafka = kafka_peer.kafka_node_keys(0, 0, node_dir)
    for key in ("controller.quorum.voters", "listeners", "advertised.listeners"):
        kafka[key] = kafka[key].replace(":0", ":<free port>")
    return {
        "trio": kafka_peer.trio_node_keys(node_dir),
        "kafka": kafka,
        "kafka_fsync": {**kafka, **kafka_peer.FSYNC_EVERY_MESSAGE},
    }


def run(sizes: dict[str, Any], quick: bool, time_limit: float, step: Step,
        only: list[str] | None = None, warm: bool = True,
        config: Path | None = None) -> dict[str, Any]:  # fmt: skip
    if only is not None:
        unknown = set(only) - {*WORKLOADS, "w3"}
        if unknown:
            raise ValueError(f"unknown workloads {sorted(unknown)}; known: {WORKLOADS}")
        only = [*only, "w1"] if "w3" in only else only  # W3 reads W1's log
    res: dict[str, Any] = {
        "peer": "kafka", "kafka_version": kafka_peer.KAFKA_VERSION, "quick": quick,
        "sizes": dict(sizes), "targets": {k: v[0] for k, v in TARGETS.items()},
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "loadavg_before": os.getloadavg(), "order": {}, "results": {}, "warm_up": warm,
    }  # fmt: skip
    brokers = targets(config)
    if config is not None:
        res["config"] = {"file": str(config), "overrides": config_overrides()}
        print(f"every broker starts from {config}, plus (appended to its copy):", flush=True)
        for target, keys in res["config"]["overrides"].items():
            print(f"  {target}: " + ", ".join(f"{k}={v}" for k, v in keys.items()), flush=True)
    # Resolving Kafka (a download on the first run) is not part of any figure nor of the bound.
    resolving = time.monotonic() + kafka_peer.RESOLVE_TIMEOUT_S
    if step(res, "kafka_libs", resolving, lambda: str(kafka_peer.resolve())) is None:
        return res
    deadline = time.monotonic() + time_limit

    def measure_limits() -> dict[str, Any]:
        found = limits.measure(ROOT / "bench", 3.0)
        found["append_fsync_16kib_per_s"] = limits.append_fsync_per_s(
            ROOT / "bench", 3.0, 16 * 1024
        )
        return found

    step(res, "limits", deadline, measure_limits)
    out: dict[str, Any] = res["results"]
    names = list(brokers)
    chosen = [w for w in WORKLOADS if only is None or w in only]
    for i, workload in enumerate(chosen):
        order = names[i % len(names) :] + names[: i % len(names)]
        res["order"][workload] = order
        for target in order:
            start = warmed(brokers[target][1]) if warm else brokers[target][1]
            if workload == "w1":
                _w1_then_w3(sizes["w1_records"], start, target, out, deadline, step)
            else:
                step(out.setdefault(workload, {}), target, deadline, _job(workload, sizes, start))
    res["loadavg_after"] = os.getloadavg()
    res["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())
    return res


def _job(workload: str, sizes: dict[str, Any], start: workloads.StartBroker) -> Callable[[], Any]:
    if workload in ("w2", "w4"):
        return lambda: workloads.w2(sizes["w2_records"], idempotent=workload == "w4", start=start)
    if workload == "w5":
        producers, partitions, rate, seconds, idle = sizes["w5"]
        return lambda: workloads.w5(producers, partitions, rate, seconds, idle, start=start)
    if workload == "w6":
        return lambda: workloads.w6("pipelined", sizes["w6_records"], start=start)
    raise ValueError(f"unknown workload {workload}")


def _w1_then_w3(records: int, start: Callable[[], workloads.Broker], target: str,
                out: dict[str, Any], deadline: float, step: Step) -> None:  # fmt: skip
    kept: list[workloads.Broker] = []

    def w1() -> dict[str, Any]:
        r, broker = workloads.w1("pipelined", records, keep=True, start=start)
        assert broker is not None
        kept.append(broker)
        return r

    try:
        step(out.setdefault("w1", {}), target, deadline, w1)
        # W3 reads at least 1 GiB: W1's log as many times as that takes.
        passes = max(1, math.ceil(W3_MIN_BYTES / (records * 64 * 1024)))
        if kept:
            step(out.setdefault("w3", {}), target, deadline,
                 lambda: workloads.w3(kept[0], records, passes=passes))  # fmt: skip
    finally:
        for broker in kept:
            broker.stop()


# --------------------------------------------------------------------------- report


def _num(cell: dict[str, Any], key: str) -> float | None:
    value = cell.get(key)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def derived(workload: str, cell: dict[str, Any]) -> dict[str, float | None]:
    """The table's columns for one broker's result of one workload."""
    if workload == "w3":
        nbytes, records = _num(cell, "bytes"), _num(cell, "records")
    elif workload == "w5":
        sent, size = _num(cell, "sent"), _num(cell, "record_bytes")
        nbytes = None if sent is None or size is None else sent * size
        records = sent
    else:
        records, size = _num(cell, "records"), _num(cell, "record_bytes")
        nbytes = None if records is None or size is None else records * size
    seconds, cpu = _num(cell, "seconds"), _num(cell, "broker_cpu_s")
    return {
        "mb_per_s": None if not (nbytes and seconds) else nbytes / seconds / 1e6,
        "records_per_s": None if not (records and seconds) else records / seconds,
        "p50_ms": _num(cell, "p50_ms"),
        "p99_ms": _num(cell, "p99_ms"),
        "cpu_s_per_gb": None if cpu is None or not nbytes else cpu / (nbytes / 1e9),
        "rss_mib": _num(cell, "broker_peak_rss_mib"),
    }


def _f(x: float | None) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _limit(workload: str, row: dict[str, float | None], lim: dict[str, Any]) -> str:
    """The figure as a share of the physical limit that bounds it, from the same run."""

    def share(value: float | None, limit: Any, name: str) -> str:
        if value is None or not isinstance(limit, (int, float)) or not limit:
            return ""
        return f"{value / limit:.2f} of {name} {_f(float(limit))}"

    if workload == "w3":
        return share(row["mb_per_s"], lim.get("loopback_tcp_mb_per_s"), "loopback MB/s")
    if workload == "w6":
        return share(row["records_per_s"], lim.get("append_fsync_16kib_per_s"), "16 KiB fsyncs/s")
    if workload in ("w1", "w2", "w4"):
        return share(row["mb_per_s"], lim.get("fdatasync_1mib_mb_per_s"), "fdatasync MB/s")
    return ""


def _advantage(workload: str, trio: dict[str, Any], other: dict[str, Any]) -> float | None:
    """trio-broker's headline figure over the peer's; >= 1 means trio-broker is as good."""
    key, lower_is_better = HEADLINE[workload]
    mine, theirs = derived(workload, trio)[key], derived(workload, other)[key]
    if mine is None or theirs is None or not mine or not theirs:
        return None
    return theirs / mine if lower_is_better else mine / theirs


def _cell(res: dict[str, Any], workload: str, target: str) -> dict[str, Any]:
    cell = res.get("results", {}).get(workload, {}).get(target, {})
    return cell if isinstance(cell, dict) else {}


def table(res: dict[str, Any]) -> str:
    lim = res.get("limits", {}) if isinstance(res.get("limits"), dict) else {}
    lines = [
        "| workload | broker | MB/s | records/s | p50 ms | p99 ms | broker core-s per GB "
        "| peak RSS MiB | errors | share of physical limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = ["w1", "w3", "w2", "w4", "w5", "w6"]
    for workload in order:
        for target, (label, _) in TARGETS.items():
            cell = _cell(res, workload, target)
            if not cell:
                continue
            if "failed" in cell or "skipped" in cell:
                why = cell.get("failed") or cell.get("skipped")
                lines.append(f"| {TITLES[workload]} | {label} | {why} |||||||")
                continue
            row = derived(workload, cell)
            errors = int(cell.get("errors", 0)) + int(cell.get("undelivered", 0))
            if workload == "w3" and not cell.get("complete", True):
                errors += 1
            lines.append(
                f"| {TITLES[workload]} | {label} | {_f(row['mb_per_s'])} | "
                f"{_f(row['records_per_s'])} | {_f(row['p50_ms'])} | {_f(row['p99_ms'])} | "
                f"{_f(row['cpu_s_per_gb'])} | {_f(row['rss_mib'])} | {errors} | "
                f"{_limit(workload, row, lim)} |"
            )
    lines += [
        "",
        "| workload | judged by | trio-broker / Kafka (fsync) | trio-broker / Kafka (page cache) "
        "| goal |",
        "|---|---|---|---|---|",
    ]
    for workload in order:
        trio = _cell(res, workload, "trio")
        if not trio or "failed" in trio or "skipped" in trio:
            continue
        vs_fsync = _advantage(workload, trio, _cell(res, workload, "kafka_fsync"))
        vs_cache = _advantage(workload, trio, _cell(res, workload, "kafka"))
        wanted = [("fsync", vs_fsync)]
        if workload in PAGE_CACHE_GOAL:
            wanted.append(("page cache", vs_cache))
        short = [name for name, ratio in wanted if ratio is not None and ratio < 1]
        unknown = [name for name, ratio in wanted if ratio is None]
        goal = (
            "**short** of Kafka (" + ", ".join(short) + ")"
            if short
            else "n/a"
            if unknown
            else "met"
        )
        key = HEADLINE[workload][0]
        judged = {"mb_per_s": "MB/s", "records_per_s": "records/s"}.get(
            key, "p99 (lower is better)"
        )
        lines.append(
            f"| {TITLES[workload]} | {judged} | {_ratio(vs_fsync)} | {_ratio(vs_cache)} | {goal} |"
        )
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def write_doc(res: dict[str, Any], doc: Path) -> None:
    """Replace the marked peer block of docs/performance.md (appended if it is not there)."""
    lim = res.get("limits", {}) if isinstance(res.get("limits"), dict) else {}
    sizes = res["sizes"]
    w5 = sizes["w5"]

    def lim_f(key: str) -> str:
        value = lim.get(key)
        return _f(float(value)) if isinstance(value, (int, float)) else "n/a"

    block = "\n".join([
        BEGIN,
        f"Run: {res['started_utc']} -> {res.get('finished_utc')}, Kafka "
        f"{res['kafka_version']}, {'`--quick`' if res['quick'] else 'full'} sizes, "
        f"{res['cpus']} CPUs, load average before "
        f"{tuple(round(x, 2) for x in res['loadavg_before'])}, after "
        f"{tuple(round(x, 2) for x in res.get('loadavg_after', (0, 0, 0)))}.",
        "",
        f"Sizes: W1 {sizes['w1_records']} x 64 KiB; W2/W4 {sizes['w2_records']:,} x 1 KiB; "
        f"W5 {w5[0]} producers / {w5[1]} partitions / {w5[2]:g} msgs/s each / {w5[3]:g} s / "
        f"{w5[4]} idle connections; W6 {sizes['w6_records']} x 16 KiB. Warm-up before each "
        f"workload: {'yes' if res.get('warm_up') else 'no'}. Order of the brokers "
        f"per workload: " + "; ".join(f"{w} {', '.join(o)}" for w, o in res["order"].items()) + "."
        + (f" Every broker from `{res['config']['file']}` plus its per-node keys."
           if res.get("config") else ""),
        "",
        f"Physical limits (same run): loopback TCP {lim_f('loopback_tcp_mb_per_s')} MB/s; "
        f"1 MiB write+fdatasync {lim_f('fdatasync_1mib_mb_per_s')} MB/s; append+fsync "
        f"{lim_f('append_fsync_64kib_per_s')}/s at 64 KiB, "
        f"{lim_f('append_fsync_16kib_per_s')}/s at 16 KiB.",
        "",
        table(res),
        "",
        "Raw numbers: `bench/results/run_all_peer.json` (not committed).",
        END,
    ])  # fmt: skip
    text = doc.read_text() if doc.exists() else "# Performance\n"
    if BEGIN in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1] if END in rest else "\n"
        doc.write_text(pre + block + post)
    else:
        doc.write_text(text.rstrip("\n") + "\n\n" + block + "\n")
