"""The log cleaner's speed: MB/s of log a cleaning pass reads (and writes) on this disk.

    .venv/bin/python bench/cleaner.py [--mb 64] [--keys 10000] [--codec none|lz4|zstd|gzip]
                                       [--rounds 3] [--json FILE]

Writes a compacted partition log of about ``--mb`` MiB (batches of 100 keyed updates of
100-byte values over ``--keys`` keys, in 16 MiB segments), syncs it, then times one
pass of ``storage/cleaner.py``'s ``clean_log`` over every closed segment (the key
map, the filtering, re-encoding, the writes with their fsyncs and the swaps). Each
round starts from a fresh copy of the log. Prints MB/s read (the figure Kafka's
cleaner reports) and written, the median over the rounds; ``--json`` saves them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trio_broker.protocol.compression import Compression
from trio_broker.protocol.records import Record, build_batch
from trio_broker.storage.cleaner import clean_log, plan_for
from trio_broker.storage.log import LogConfig, PartitionLog

RECORDS_PER_BATCH = 100
VALUE_BYTES = 100
MIB = 1024 * 1024


def build_log(directory: Path, mb: int, keys: int, codec: Compression, seed: int) -> int:
    """Write the log; returns its size in bytes."""
    config = LogConfig(
        segment_bytes=16 * MIB,
        retention_ms=None,
        compact=True,
        delete=False,
        min_cleanable_dirty_ratio=0.0,
    )
    log = PartitionLog.open(directory, config)
    rng = random.Random(seed)
    now = int(time.time() * 1000) - 3_600_000
    try:
        while log.size_bytes < mb * MIB:
            records = [
                Record(
                    i,
                    0,
                    b"key-%d" % rng.randrange(keys),
                    rng.randbytes(VALUE_BYTES // 2).hex().encode(),
                )
                for i in range(RECORDS_PER_BATCH)
            ]
            log.append(build_batch(records, base_timestamp=now, compression=codec), now_ms=now)
        log.roll(now)
        log.flush()
        return log.size_bytes
    finally:
        log.close()


def one_round(mb: int, keys: int, codec: Compression, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-cleaner-") as tmp:
        directory = Path(tmp) / "log"
        size = build_log(directory, mb, keys, codec, seed)
        log = PartitionLog.open(
            directory,
            LogConfig(
                segment_bytes=16 * MIB,
                retention_ms=None,
                compact=True,
                delete=False,
                min_cleanable_dirty_ratio=0.0,
            ),
        )
        try:
            now = int(time.time() * 1000)
            plan = plan_for(log, now)
            assert plan is not None, "nothing to clean"
            started = time.perf_counter()
            result = clean_log(log, now, plan=plan)
            seconds = time.perf_counter() - started
            assert result is not None
            return {
                "log_bytes": size,
                "bytes_read": result.bytes_read,
                "bytes_written": result.bytes_written,
                "segments_in": result.segments_in,
                "records_dropped": result.records_dropped,
                "seconds": seconds,
                "read_mb_per_s": result.bytes_read / MIB / seconds,
                "written_mb_per_s": result.bytes_written / MIB / seconds,
            }
        finally:
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="log size to clean (MiB)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    parser.add_argument(
        "--codec", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="save the figures here")
    args = parser.parse_args()
    codec = Compression[args.codec.upper()]
    rounds = []
    for i in range(args.rounds):
        figures = one_round(args.mb, args.keys, codec, seed=i)
        rounds.append(figures)
        print(
            f"round {i + 1}: {figures['bytes_read'] / MIB:.1f} MiB in {figures['seconds']:.2f} s"
            f" -> {figures['read_mb_per_s']:.1f} MB/s read,"
            f" {figures['written_mb_per_s']:.2f} MB/s written"
            f" ({figures['records_dropped']} records dropped)"
        )
    summary = {
        "bench": "cleaner",
        "mb": args.mb,
        "keys": args.keys,
        "codec": args.codec,
        "rounds": rounds,
        "median_read_mb_per_s": statistics.median(r["read_mb_per_s"] for r in rounds),
        "median_written_mb_per_s": statistics.median(r["written_mb_per_s"] for r in rounds),
    }
    print(
        f"cleaner: {summary['median_read_mb_per_s']:.1f} MB/s read (median of {args.rounds},"
        f" {args.mb} MiB, {args.keys} keys, codec {args.codec})"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
