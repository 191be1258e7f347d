"""Capture overhead: the seed W1 workload (pipelined) with and without ``serve --capture``.

Same confluent-kafka producer as bench/produce.py (one partition, acks=all,
fsync before every ack, 64 KiB records), against a fresh broker per run;
rounds alternate off / on so drift on a shared machine hits both sides. Prints
each run, the medians and the throughput ratio, and writes JSON.

``--workload consume`` measures the other side: the producer fills the
partition first (captured too, not timed), then one consumer (W3's) reads it
all from offset 0, and the consumer's MB/s is compared.

    .venv/bin/python bench/capture_overhead.py --records 2048 --rounds 3 --json out.json
    .venv/bin/python bench/capture_overhead.py --workload consume --records 4096
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce import ROOT, BrokerProcess, create_topic, run_producer
from workloads import w3

#: The target from issue 7: capture may cost at most this share of throughput.
TARGET_LOSS = 0.10


def capture_size(directory: Path) -> tuple[int, int]:
    files = list(directory.glob("*.parquet"))
    return len(files), sum(p.stat().st_size for p in files)


def one_run(capture: bool, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    capture_dir = Path(tempfile.mkdtemp(prefix="bench-capture-", dir=ROOT / "bench"))
    flags = ["--capture", str(capture_dir), *extra] if capture else []
    broker = BrokerProcess("pipelined", args.storage, flags)
    try:
        create_topic(broker.bootstrap, "overhead")
        cpu_before = broker.cpu_seconds()
        result = run_producer(broker.bootstrap, "overhead", args.records, args.record_size, {})
        result["broker_cpu_s"] = broker.cpu_seconds() - cpu_before
        if args.workload == "consume":
            produced = result
            result = w3(broker, args.records, topic="overhead")
            result["errors"] += produced["errors"] + produced["undelivered"]
            result["undelivered"] = (
                0 if result["complete"] else args.records + 1 - result["records"]
            )
        result["broker_peak_rss_mib"] = broker.rss_mib()
    finally:
        broker.stop()
    result["capture"] = capture
    result["capture_files"], result["capture_bytes"] = capture_size(capture_dir)
    stats = [json.loads(p.read_text()) for p in capture_dir.glob("*.stats.json")]
    result["capture_rows"] = sum(s.get("rows_written", 0) for s in stats)
    result["capture_dropped"] = sum(s.get("dropped", 0) for s in stats)
    shutil.rmtree(capture_dir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--record-size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default="file", choices=["file", "memory"])
    parser.add_argument("--workload", default="produce", choices=["produce", "consume"])
    parser.add_argument(
        "--capture-flag", action="append", default=[], help="extra serve flag with --capture"
    )
    parser.add_argument("--json", type=Path, help="write results here")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    nan = math.nan  # consumers report no per-record latency
    print(
        f"{'capture':<8} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu s':>6} {'cap MB':>7} {'rows':>6} {'drop':>5} {'err':>4}"
    )
    for _ in range(args.rounds):
        for capture in (False, True):
            r = one_run(capture, args, args.capture_flag)
            runs.append(r)
            print(
                f"{'on' if capture else 'off':<8} {r['mb_per_s']:>8.1f} {r.get('p50_ms', nan):>8.1f} "
                f"{r.get('p99_ms', nan):>8.1f} {r['broker_cpu_s']:>6.1f} {r['capture_bytes'] / 1e6:>7.1f} {r['capture_rows']:>6} {r['capture_dropped']:>5} "
                f"{r['errors'] + r['undelivered']:>4}",
                flush=True,
            )
    off = [r["mb_per_s"] for r in runs if not r["capture"]]
    on = [r["mb_per_s"] for r in runs if r["capture"]]
    summary: dict[str, Any] = {
        "workload": (
            f"W1 pipelined, {args.records} x {args.record_size} B, acks=all, fsync"
            if args.workload == "produce"
            else f"W3: one consumer reading {args.records} x {args.record_size} B from offset 0"
        ),
        "runs": runs,
        "median_mb_per_s_off": statistics.median(off),
        "median_mb_per_s_on": statistics.median(on),
        "spread_off": [min(off), max(off)],
        "spread_on": [min(on), max(on)],
    }
    summary["ratio_on_off"] = summary["median_mb_per_s_on"] / summary["median_mb_per_s_off"]
    summary["throughput_loss"] = 1 - summary["ratio_on_off"]
    summary["target_met"] = summary["throughput_loss"] <= TARGET_LOSS
    print(
        f"median MB/s off {summary['median_mb_per_s_off']:.1f} (range {min(off):.1f}-{max(off):.1f}), "
        f"on {summary['median_mb_per_s_on']:.1f} (range {min(on):.1f}-{max(on):.1f}): "
        f"on/off x{summary['ratio_on_off']:.3f}, loss {summary['throughput_loss']:.1%} "
        f"(target <= {TARGET_LOSS:.0%}: {'met' if summary['target_met'] else 'MISSED'})"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
