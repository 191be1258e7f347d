"""Run W1-W6 plus bench/limits.py; write JSON and the table in docs/performance.md.

.venv/bin/python bench/run_all.py            # full sizes (W1 256 MiB, W2/W4 200k, W5 100+1000)
.venv/bin/python bench/run_all.py --quick    # smaller sizes, a few minutes
.venv/bin/python bench/run_all.py --quick --peer kafka   # each workload on Kafka 4.4 too
.venv/bin/python bench/run_all.py --peer kafka --config bench/server.properties
    # both brokers from one server.properties (per-node keys appended; printed at the start)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import limits
import peer
import plots
import workloads

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"

FULL: dict[str, Any] = {"w1_records": 4096, "w2_records": 200_000, "w5": (100, 50, 20.0, 20.0, 1000),
        "w6_records": 8192}  # fmt: skip
QUICK: dict[str, Any] = {"w1_records": 512, "w2_records": 50_000, "w5": (30, 50, 20.0, 10.0, 300),
         "w6_records": 2048}  # fmt: skip


class Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout()


def step(results: dict[str, Any], name: str, deadline: float, fn: Any) -> Any:
    left = deadline - time.monotonic()
    if left < 5:
        results[name] = {"skipped": "total time bound reached"}
        print(f"{name}: skipped (time bound)", flush=True)
        return None
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(left))
    t0 = time.monotonic()
    try:
        value = fn()
        results[name] = value
        print(f"{name}: done in {time.monotonic() - t0:.0f}s", flush=True)
        return value
    except Timeout:
        results[name] = {"skipped": "total time bound reached while running"}
    except Exception as exc:
        results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
    finally:
        signal.alarm(0)
    print(f"{name}: {results[name]}", flush=True)
    return None


def run(
    quick: bool, time_limit: float, only: set[str] | None = None, w5_consumers: int = 0
) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    deadline = time.monotonic() + time_limit

    def step_if(name: str, fn: Any) -> Any:
        # --only w1,w5: the other workloads (and the limits) are not run.
        if only is not None and name.split("_")[0] not in only:
            return None
        return step(res, name, deadline, fn)

    res: dict[str, Any] = {
        "quick": quick, "sizes": {k: v for k, v in sizes.items()},
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "loadavg_before": os.getloadavg(),
    }  # fmt: skip
    step_if("limits", lambda: limits.measure(ROOT / "bench", 3.0))
    n1 = sizes["w1_records"]
    step_if("w1_serial", lambda: workloads.w1("serial", n1)[0])
    kept: list[Any] = []

    def w1_pipelined() -> dict[str, Any]:
        r, broker = workloads.w1("pipelined", n1, keep=True)
        kept.append(broker)
        return r

    try:
        step_if("w1_pipelined", w1_pipelined)
        if kept:
            step_if("w3", lambda: workloads.w3(kept[0], n1))
    finally:
        for b in kept:
            b.stop()
    n2 = sizes["w2_records"]
    step_if("w2", lambda: workloads.w2(n2))
    step_if("w4", lambda: workloads.w2(n2, idempotent=True))
    step_if("w5", lambda: workloads.w5(*sizes["w5"], consumers=w5_consumers))
    n6 = sizes["w6_records"]
    step_if("w6_serial", lambda: workloads.w6("serial", n6))
    step_if("w6_pipelined", lambda: workloads.w6("pipelined", n6))
    res["loadavg_after"] = os.getloadavg()
    res["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())
    return res


def _get(res: dict[str, Any], name: str, key: str) -> float | None:
    value = res.get(name, {}).get(key)
    return value if isinstance(value, (int, float)) else None


def _f(x: float | None, fmt: str | None = None) -> str:
    if x is None:
        return "n/a"
    if fmt is None:
        fmt = (
            "{:,.0f}"
            if abs(x) >= 100
            else "{:.1f}"
            if abs(x) >= 10
            else "{:.2f}"
            if abs(x) >= 1
            else "{:.3f}"
        )
    return fmt.format(x)


def _ratio(x: float | None, y: float | None) -> str:
    return "n/a" if x is None or not y else f"{x / y:.2f}"


def table(res: dict[str, Any]) -> str:
    lim = res.get("limits", {})
    tcp = lim.get("loopback_tcp_mb_per_s")
    disk = lim.get("fdatasync_1mib_mb_per_s")
    rate = lim.get("append_fsync_64kib_per_s")
    g = lambda n, k: _get(res, n, k)  # noqa: E731
    rows: list[tuple[str, str, str, str, str, str]] = []

    def row(
        fig: str,
        val: float | None,
        unit: str,
        target: float | None,
        better: str,
        limit: float | None = None,
        limit_name: str = "",
    ) -> None:
        met = "n/a"
        if val is not None and target is not None:
            ok = val >= target if better == ">=" else val <= target
            met = "met" if ok else f"**missed** ({val / target:.2f}x of target)"
        lim_txt = "" if limit is None else f"{limit_name} {limit:,.0f} (ratio {_ratio(val, limit)})"
        tgt = "" if target is None else f"{better} {target:g}"
        rows.append((fig, f"{_f(val)} {unit}", tgt, met, lim_txt, ""))

    row("W1 serial MB/s", g("w1_serial", "mb_per_s"), "MB/s", None, ">=", disk, "fdatasync MB/s")
    row(
        "W1 pipelined MB/s",
        g("w1_pipelined", "mb_per_s"),
        "MB/s",
        250,
        ">=",
        disk,
        "fdatasync MB/s",
    )
    s_mb, p_mb = g("w1_serial", "mb_per_s"), g("w1_pipelined", "mb_per_s")
    row(
        "W1 pipelined/serial throughput",
        None if not (s_mb and p_mb) else p_mb / s_mb,
        "x",
        2.0,
        ">=",
    )
    row("W1 serial p99", g("w1_serial", "p99_ms"), "ms", None, "<=")
    row("W1 pipelined p99", g("w1_pipelined", "p99_ms"), "ms", None, "<=")
    s99, p99 = g("w1_serial", "p99_ms"), g("w1_pipelined", "p99_ms")
    row("W1 pipelined/serial p99", None if not (s99 and p99) else p99 / s99, "x", 0.2, "<=")
    row("W1 pipelined broker peak RSS", g("w1_pipelined", "broker_peak_rss_mib"), "MiB", 200, "<=")
    row("W2 records/s", g("w2", "records_per_s"), "rec/s", 180_000, ">=")
    row("W2 broker CPU per 100k records", g("w2", "broker_cpu_s_per_100k"), "core-s", 0.4, "<=")
    row("W2 client process CPU", g("w2", "client_cpu_s"), "core-s", None, "<=")
    row("W2 broker CPU per Produce request", g("w2", "broker_cpu_us_per_request"), "µs", None, "<=")
    row("W3 consumer MB/s", g("w3", "mb_per_s"), "MB/s", 600, ">=", tcp, "loopback MB/s")
    row("W3 broker CPU", g("w3", "broker_cpu_cores"), "cores", 0.3, "<=")
    row("W3 consumer process CPU", g("w3", "client_cpu_cores"), "cores", None, "<=")
    row("W4 records/s (idempotent)", g("w4", "records_per_s"), "rec/s", 150_000, ">=")
    row("W5 p99 produce latency", g("w5", "p99_ms"), "ms", 50, "<=")
    w5 = res.get("w5", {})
    offered = 0.98 * w5.get("producers", 0) * w5.get("rate_per_producer", 0) or None  # 2% slack
    row("W5 achieved msgs/s (offered load)", g("w5", "achieved_msgs_per_s"), "msg/s", offered, ">=")
    row("W5 broker peak RSS", g("w5", "broker_peak_rss_mib"), "MiB", 300, "<=")
    row("W6 serial MB/s", g("w6_serial", "mb_per_s"), "MB/s", None, ">=")
    row("W6 pipelined MB/s", g("w6_pipelined", "mb_per_s"), "MB/s", None, ">=")
    s6, p6 = g("w6_serial", "mb_per_s"), g("w6_pipelined", "mb_per_s")
    row("W6 pipelined/serial throughput", None if not (s6 and p6) else p6 / s6, "x", None, ">=")
    row("W6 pipelined p99", g("w6_pipelined", "p99_ms"), "ms", None, "<=")
    for model in ("serial", "pipelined"):
        cpu6 = g(f"w6_{model}", "broker_cpu_us_per_request")
        row(f"W6 {model} broker CPU per Produce request", cpu6, "µs", None, "<=")
    if rate is not None and g("w1_pipelined", "records_per_s") is not None:
        row(
            "W1 pipelined records/s vs 64 KiB fsync rate",
            g("w1_pipelined", "records_per_s"),
            "rec/s",
            None,
            ">=",
            rate,
            "64 KiB append+fsync/s",
        )
    out = [
        "| figure | measured | target | status | physical limit (same run) |",
        "|---|---|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e, _ in rows]
    return "\n".join(out)


PERF_DIR = ROOT / "docs" / "perf"


def write_plots(res: dict[str, Any]) -> list[str]:
    """docs/perf/latency-cdf.svg and docs/perf/targets.svg; returns markdown image lines."""
    series = {
        label: res[name]["cdf_ms"]
        for name, label in [
            ("w1_serial", "W1 serial"),
            ("w1_pipelined", "W1 pipelined"),
            ("w2", "W2"),
            ("w4", "W4 idempotent"),
            ("w5", "W5 fan-in"),
        ]
        if isinstance(res.get(name), dict) and res[name].get("cdf_ms")
    }
    lim = res.get("limits", {})
    g = lambda n, k: _get(res, n, k)  # noqa: E731
    bars: list[tuple[str, float, float | None]] = []

    def bar(name: str, value: float | None, target: float, limit: float | None = None,
            lower_is_better: bool = False) -> None:  # fmt: skip
        if value is None or value <= 0:
            return
        share = target / value if lower_is_better else value / target
        bars.append((name, share, None if limit is None else limit / target))

    bar("W1 pipelined MB/s (>= 250)", g("w1_pipelined", "mb_per_s"), 250,
        lim.get("fdatasync_1mib_mb_per_s"))  # fmt: skip
    s_mb, p_mb = g("w1_serial", "mb_per_s"), g("w1_pipelined", "mb_per_s")
    if s_mb and p_mb:
        bar("W1 pipelined/serial (>= 2x)", p_mb / s_mb, 2.0)
    s99, p99 = g("w1_serial", "p99_ms"), g("w1_pipelined", "p99_ms")
    if s99 and p99:
        bar("W1 p99 pipelined/serial (<= 0.2)", p99 / s99, 0.2, lower_is_better=True)
    bar("W2 records/s (>= 180k)", g("w2", "records_per_s"), 180_000)
    bar("W3 MB/s (>= 600)", g("w3", "mb_per_s"), 600, lim.get("loopback_tcp_mb_per_s"))
    bar("W4 records/s (>= 150k)", g("w4", "records_per_s"), 150_000)
    bar("W5 p99 ms (< 50)", g("w5", "p99_ms"), 50, lower_is_better=True)
    bar("W5 RSS MiB (< 300)", g("w5", "broker_peak_rss_mib"), 300, lower_is_better=True)
    PERF_DIR.mkdir(parents=True, exist_ok=True)
    (PERF_DIR / "latency-cdf.svg").write_text(
        plots.latency_cdf_svg(series, "Produce latency CDF (librdkafka's per-message latency)")
    )
    (PERF_DIR / "targets.svg").write_text(
        plots.bars_svg(bars, "Each figure as a share of its target (>= 1 is met)")
    )
    return [
        "![latency CDF](perf/latency-cdf.svg)",
        "",
        "![targets](perf/targets.svg)",
    ]


def write_doc(res: dict[str, Any]) -> None:
    w5 = res.get("w5", {})
    lim = res.get("limits", {})
    sizes = res["sizes"]
    head = [
        BEGIN,
        f"Run: {res['started_utc']} -> {res.get('finished_utc')}, "
        f"{'`--quick`' if res['quick'] else 'full'} sizes, {res['cpus']} CPUs, "
        f"load average before {tuple(round(x, 2) for x in res['loadavg_before'])}, "
        f"after {tuple(round(x, 2) for x in res.get('loadavg_after', (0, 0, 0)))}.",
        "",
        f"Sizes: W1 {sizes['w1_records']} x 64 KiB records per model "
        f"({sizes['w1_records'] * 64 // 1024} MiB); W2/W4 {sizes['w2_records']:,} x 1 KiB; "
        f"W5 {w5.get('producers', sizes['w5'][0])} producers / {sizes['w5'][1]} partitions / "
        f"{sizes['w5'][2]:g} msgs/s each / {sizes['w5'][3]:g} s / {sizes['w5'][4]} idle connections.",
        "",
        f"Physical limits (bench/limits.py, same run): loopback TCP "
        f"{_f(lim.get('loopback_tcp_mb_per_s'), '{:,.0f}')} MB/s; 1 MiB write+fdatasync "
        f"{_f(lim.get('fdatasync_1mib_mb_per_s'), '{:,.0f}')} MB/s; 64 KiB append+fsync "
        f"{_f(lim.get('append_fsync_64kib_per_s'), '{:,.0f}')}/s.",
        "",
        table(res),
        "",
        *write_plots(res),
        "",
        "Raw numbers: `bench/results/run_all.json` (not committed).",
        END,
    ]
    block = "\n".join(head)
    if DOC.exists() and BEGIN in DOC.read_text():
        text = DOC.read_text()
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1] if END in rest else ""
        DOC.write_text(pre + block + post)
    else:
        DOC.write_text(
            "# Performance\n\nTable regenerated by `bench/run_all.py`.\n\n" + block + "\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--peer",
        choices=["kafka"],
        help="run each workload on trio-broker and on Apache Kafka (default and fsync)",
    )
    parser.add_argument(
        "--no-warm-up", action="store_true", help="with --peer: measure cold brokers"
    )
    parser.add_argument(
        "--workloads",
        help=f"a comma-separated subset of {','.join(peer.WORKLOADS)} (W3 runs with W1)",
    )
    parser.add_argument(
        "--w5-consumers",
        type=int,
        default=0,
        help="W5 with this many consumers long-polling the partitions, split as a group would",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="total seconds (default 300 quick, 1200 full)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="with --peer: one server.properties for Kafka and trio-broker (bench/server.properties)",
    )
    parser.add_argument("--json", type=Path, help="default bench/results/run_all[_peer].json")
    parser.add_argument(
        "--from-json", action="store_true", help="regenerate the doc from --json, no run"
    )
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/performance.md")
    args = parser.parse_args()
    if args.config and not args.peer:
        parser.error("--config needs --peer kafka")
    if args.peer:
        run_peer(args)
        return
    args.json = args.json or ROOT / "bench" / "results" / "run_all.json"
    limit = args.time_limit or (300.0 if args.quick else 1200.0)
    if args.from_json:
        res = json.loads(args.json.read_text())
    else:
        only = set(args.workloads.split(",")) if args.workloads else None
        if only is not None and "w1" in only:
            only.add("w3")
        res = run(args.quick, limit, only, args.w5_consumers)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
    print(table(res))
    if not args.no_doc:
        write_doc(res)


def run_peer(args: argparse.Namespace) -> None:
    json_path = args.json or ROOT / "bench" / "results" / "run_all_peer.json"
    if args.from_json:
        res = json.loads(json_path.read_text())
    else:
        # Three brokers per workload; --quick stays within 8 minutes.
        limit = args.time_limit or (480.0 if args.quick else 2400.0)
        only = args.workloads.split(",") if args.workloads else None
        sizes = QUICK if args.quick else FULL
        res = peer.run(sizes, args.quick, limit, step, only, warm=not args.no_warm_up,
                       config=args.config)  # fmt: skip
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(res, indent=2))
    print(peer.table(res))
    if not args.no_doc:
        peer.write_doc(res, DOC)


if __name__ == "__main__":
    main()
