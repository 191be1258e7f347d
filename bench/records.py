"""Micro-benchmarks for the record batch module.

.venv/bin/python bench/records.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trio_broker.protocol.compression import Compression
from trio_broker.protocol.records import Header, Record, build_batch, iter_batches, parse_header


def bench(name: str, fn: Callable[[], object], unit_count: float, unit: str) -> None:
    fn()  # warm up
    runs = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < 1.0:
        fn()
        runs += 1
    per_run = elapsed / runs
    print(f"{name:<44} {per_run * 1e6:10.1f} us/run  {unit_count / per_run:14,.1f} {unit}/s")


def main() -> None:
    records = [
        Record(i, i, b"key-%d" % i, b"v" * 100, (Header("trace-id", b"0123456789abcdef"),))
        for i in range(1000)
    ]
    one = build_batch([(b"k", b"v" * 1000)] * 4)
    blob = bytearray(one * (1024 * 1024 // len(one)))
    n_batches = len(list(iter_batches(blob)))

    def split_and_check() -> None:
        for v in iter_batches(blob):
            v.crc_is_valid()

    def split_only() -> None:
        for v in iter_batches(blob):
            v.base_offset  # noqa: B018

    bench(f"iter_batches, 1 MiB ({n_batches} batches)", split_only, n_batches, "batches")
    bench("iter_batches + crc_is_valid, 1 MiB", split_and_check, len(blob) / 2**20, "MiB")
    for codec in Compression:
        batch = build_batch(records, compression=codec, base_timestamp=0)
        view = parse_header(batch)
        bench(f"records() 1000 x 100 B, {codec.name}", view.records, 1000, "records")
    bench("build_batch 1000 x 100 B, NONE", lambda: build_batch(records), 1000, "records")
    bench(
        "build_batch 1000 x 100 B, LZ4",
        lambda: build_batch(records, compression=Compression.LZ4),
        1000,
        "records",
    )
    batch = build_batch(records)
    view = parse_header(batch)
    bench("set_base_offset", lambda: view.set_base_offset(5), 1, "calls")
    bench("set_log_append_time (CRC over ~130 KB)", lambda: view.set_log_append_time(5), 1, "calls")


if __name__ == "__main__":
    main()
